"""Are the lossless methods lossless on the bundled family? Guided NLL over many images.

  python bench/lossless_nll.py --out bench/results/lossless_nll.json

The main command's quality pass has 100 images, and the per-image NLL
varies with s.d. about 0.5 nats per token, so its nll_gap has a standard error
near 0.05: a gap of a few hundredths between two runs says nothing about
bias. This decodes --batches x 100 images (10 per class, a fresh key per
batch) with vanilla, vanilla under another seed, lossless EAGLE and the
lossless draft GPT (the main command's methods), computes each image's
guided target NLL per token, and reports each method's mean with its
standard error, and each gap to vanilla with its standard error (paired:
image i has one label in every method) and z = gap / s.e. Exact methods
give |z| below 2 about 95% of the time (and below 3 about 99.7%). Prints a
table and writes JSON.
"""

from __future__ import annotations

import os
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import resume  # pylint: disable=g-import-not-at-top  (bench/resume.py)

_OUT = flags.DEFINE_string('out', 'bench/results/lossless_nll.json', 'JSON results.')
_BATCHES = flags.DEFINE_integer('batches', 10, 'Batches of 100 images per method.',
                                lower_bound=1)
METHODS = ('vanilla', 'vanilla_seed1', 'eagle', 'draft_model')


def main(argv):
  del argv
  from specdec_jax.app import compile_cache  # pylint: disable=g-import-not-at-top
  compile_cache.enable()
  import numpy as np  # pylint: disable=g-import-not-at-top
  from specdec_jax import logits  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import evaluation  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import family as family_lib  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import generate as generate_app  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import methods as methods_lib  # pylint: disable=g-import-not-at-top
  from specdec_jax.configs import generate as generate_config  # pylint: disable=g-import-not-at-top

  config = generate_config.get_config()
  config.methods = METHODS
  family = family_lib.load()
  sampling = logits.Sampling(**config.sampling.to_dict())
  options = generate_app.compiler_options(config)
  labels = np.repeat(np.arange(family.num_classes), 10).astype(np.int32)
  nlls = {}
  for method in methods_lib.build_methods(config, family):
    started, per_image = time.perf_counter(), []
    for batch in range(_BATCHES.value):
      tokens, _, _ = generate_app.quality_pass(method, family, labels, sampling,
                                               seed=10_000 + 17 * batch, options=options)
      per_image.append(family.guided_image_nlls(labels, tokens, sampling))
    nlls[method.name] = np.concatenate(per_image)
    print(f'{method.name}: {nlls[method.name].size} images in '
          f'{time.perf_counter() - started:.0f} s', flush=True)

  reference = nlls['vanilla']
  rows = []
  print('| method | images | mean NLL / token | s.e. | gap to vanilla | s.e. of gap | z |')
  print('|---|---|---|---|---|---|---|')
  for name, values in nlls.items():
    se = evaluation.standard_error(values)
    gap = float(np.mean(values) - np.mean(reference))
    gap_se = (evaluation.paired_gap_standard_error(values, reference) if name != 'vanilla'
              else 0.0)
    row = dict(method=name, images=int(values.size), nll=float(np.mean(values)), nll_se=se,
               per_image_sd=float(np.std(values, ddof=1)))
    if name != 'vanilla':
      row.update(gap=gap, gap_se=gap_se, z=gap / gap_se)
    rows.append(row)
    tail = (f"{gap:+.4f} | {gap_se:.4f} | {gap / gap_se:+.2f}" if name != 'vanilla'
            else '- | - | -')
    print(f"| {name} | {values.size} | {row['nll']:.4f} | {se:.4f} | {tail} |", flush=True)
  resume.write_json(
      _OUT.value,
      {'batches': _BATCHES.value, 'images_per_batch': int(labels.size),
       'sampling': config.sampling.to_dict(), 'draft_length': config.draft_length,
       'rows': rows})
  print('wrote', _OUT.value)


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
