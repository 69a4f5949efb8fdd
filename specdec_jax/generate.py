"""The main job: generate one class-conditional batch with vanilla AR and every SD method.

  python -m specdec_jax.generate --out results          (also: specdec-generate)

On the bundled Fashion-MNIST family (VQ tokenizer, LlamaGen-architecture
target, EAGLE-1 head, small draft GPT, evaluation classifier) it runs each
method of `configs/generate.py` on the same labels, saves one PNG grid per
method, prints a table and writes `results.json` with, per method:
tokens_per_forward, speedup (wall clock against vanilla in this run),
nll_gap (target NLL of the generated tokens minus that of the vanilla
samples, under the same guided distribution), frechet (in the classifier's
feature space, against the test split), class_accuracy and the
hyperparameters used. It needs no data set: the bundle carries the test
split's feature statistics.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np

from specdec_jax import decode
from specdec_jax import demo
from specdec_jax import evaluation
from specdec_jax import family as family_lib
from specdec_jax import images as images_lib
from specdec_jax import logits as logits_lib
from specdec_jax import rules
from specdec_jax.configs import generate as default_config



@dataclasses.dataclass(frozen=True)
class Method:
  """One row of the comparison: a decoding mode, a rule and a drafter."""

  name: str
  mode: Any
  rule: Any = None
  drafter: str | None = None  # 'eagle' | 'draft_model' | None
  seed_offset: int = 0
  hyperparameters: dict = dataclasses.field(default_factory=dict)


METHOD_NAMES = ('vanilla', 'vanilla_seed1', 'eagle', 'draft_model', 'lantern_pp', 'uniform',
                'coolsd', 'sjd', 'gsd', 'csd')


def build_methods(config, family: family_lib.Family) -> list[Method]:
  """The methods named in config.methods, with their hyperparameters."""
  unknown = [m for m in config.methods if m not in METHOD_NAMES]
  if unknown:
    raise ValueError(f'config.methods has unknown names {unknown}; known: {METHOD_NAMES}.')
  if config.methods[0] != 'vanilla':
    raise ValueError("config.methods must start with 'vanilla' (the speed/drift reference).")
  k, window = config.draft_length, config.jacobi_window
  eagle_chain = decode.ChainDraft(k=k, drafter='eagle')
  jacobi = decode.Jacobi(window=window, init='random')
  neighbors = family.neighbors(config.lantern_k)
  catalogue = {
      'vanilla': Method('vanilla', decode.Vanilla()),
      'vanilla_seed1': Method('vanilla_seed1', decode.Vanilla(), seed_offset=1),
      'eagle': Method('eagle', eagle_chain, rules.Lossless(), 'eagle', hyperparameters=dict(k=k)),
      'draft_model': Method('draft_model', decode.ChainDraft(k=k, drafter='model'),
                            rules.Lossless(), 'draft_model', hyperparameters=dict(k=k)),
      'lantern_pp': Method(
          'lantern_pp', eagle_chain,
          rules.LanternPP(neighbors=neighbors, k=config.lantern_k, lam=config.lantern_lam,
                          residual_mode=config.lantern_residual), 'eagle',
          hyperparameters=dict(k=k, lantern_k=config.lantern_k, lam=config.lantern_lam,
                               residual=config.lantern_residual)),
      'uniform': Method('uniform', eagle_chain, rules.UniformRelaxed(omega=config.uniform_omega),
                        'eagle', hyperparameters=dict(k=k, omega=config.uniform_omega)),
      'coolsd': Method('coolsd', eagle_chain, rules.CoolSD(delta=config.coolsd_delta), 'eagle',
                       hyperparameters=dict(k=k, delta=config.coolsd_delta, nu=0.7,
                                            mu='mean-normalised')),
      'sjd': Method('sjd', jacobi, rules.Lossless(), hyperparameters=dict(window=window)),
      'gsd': Method('gsd', jacobi,
                    rules.Grouped(embeddings=family.token_embeddings(),
                                  prob_threshold=config.gsd_prob_threshold,
                                  dist_threshold=config.gsd_dist_threshold),
                    hyperparameters=dict(window=window, prob_threshold=config.gsd_prob_threshold,
                                         dist_threshold=config.gsd_dist_threshold)),
      'csd': Method('csd', jacobi,
                    rules.ContentAware(lam=config.csd_lam, tv_threshold=config.csd_tv_threshold),
                    hyperparameters=dict(window=window, lam=config.csd_lam,
                                         tv_threshold=config.csd_tv_threshold,
                                         transform='normalized', sign=1)),
  }
  return [catalogue[m] for m in config.methods]


def run_method(method: Method, family: family_lib.Family, labels: np.ndarray, sampling,
               seed: int, repeats: int):
  """Compiles and runs one method; returns (tokens [B, n], metrics summary, seconds)."""
  target_cond = family.target.cfg_cond(family.target_params, jnp.asarray(labels))
  kwargs = dict(num_tokens=family.num_tokens, mode=method.mode, sampling=sampling,
                rule=method.rule)
  if method.drafter == 'eagle':
    kwargs.update(draft=family.eagle, draft_params=family.eagle_params)
  elif method.drafter == 'draft_model':
    kwargs.update(draft=family.draft_gpt, draft_params=family.draft_gpt_params,
                  draft_cond=family.draft_gpt.cfg_cond(family.draft_gpt_params,
                                                       jnp.asarray(labels)))
  keys = jax.random.split(jax.random.key(seed + 1000 * method.seed_offset), len(labels))
  first = decode.generate(family.target, family.target_params, target_cond, key=keys, **kwargs)
  jax.block_until_ready(first.tokens)
  seconds = []
  for _ in range(repeats):
    start = time.perf_counter()
    result = decode.generate(family.target, family.target_params, target_cond, key=keys,
                             **kwargs)
    jax.block_until_ready(result.tokens)
    seconds.append(time.perf_counter() - start)
  np.testing.assert_array_equal(result.tokens, first.tokens)  # same keys -> same tokens
  summary = result.metrics.summary()
  summary['compile_seconds'] = first.compile_seconds
  return np.asarray(result.tokens), summary, min(seconds)


def evaluate(config, family: family_lib.Family, out_dir: str) -> dict:
  """Runs every method, writes PNG grids and results.json; returns the results."""
  os.makedirs(out_dir, exist_ok=True)
  sampling = logits_lib.Sampling(**config.sampling.to_dict())
  labels = np.repeat(np.arange(family.num_classes), config.images_per_class).astype(np.int32)
  methods = build_methods(config, family)
  results, reference_nll, vanilla_seconds = {}, None, None
  logging.info('generating %d images (%d tokens each) with %d methods', len(labels),
               family.num_tokens, len(methods))
  for index, method in enumerate(methods):
    tokens, summary, seconds = run_method(method, family, labels, sampling, config.seed,
                                          config.timing_repeats)
    images = family.decode(tokens)
    images_lib.save_png(os.path.join(out_dir, f'{method.name}.png'),
                        images_lib.make_grid(images, columns=config.images_per_class),
                        scale=config.grid_scale)
    class_logits, features = family.classify(images)
    nll = family.guided_nll(labels, tokens, sampling)
    if method.name == 'vanilla':
      reference_nll, vanilla_seconds = nll, seconds
    results[method.name] = dict(
        tokens_per_forward=summary['tokens_per_target_forward'],
        speedup=vanilla_seconds / seconds,
        seconds=seconds,
        nll=nll,
        nll_gap=nll - reference_nll,
        frechet=family.frechet(features),
        class_accuracy=evaluation.class_accuracy(class_logits, labels),
        acceptance_per_position=summary.get('acceptance_per_position'),
        compile_seconds=summary['compile_seconds'],
        rule=type(method.rule).__name__ if method.rule is not None else None,
        mode=type(method.mode).__name__,
        hyperparameters=method.hyperparameters)
    row = results[method.name]
    logging.info('[%d/%d] %-14s tokens/forward %.2f  speedup %.2fx  nll_gap %+.4f  '
                 'frechet %.2f  accuracy %.2f', index + 1, len(methods), method.name,
                 row['tokens_per_forward'], row['speedup'], row['nll_gap'], row['frechet'],
                 row['class_accuracy'])
  output = dict(
      methods=results,
      sampling=config.sampling.to_dict(),
      num_images=len(labels), tokens_per_image=family.num_tokens,
      classifier_test_accuracy=family.classifier_test_accuracy,
      backend=jax.default_backend(), devices=[str(d) for d in jax.devices()],
      bundle=family.manifest_summary())
  path = os.path.join(out_dir, 'results.json')
  with open(path + '.tmp', 'w') as f:
    json.dump(output, f, indent=1)
  os.replace(path + '.tmp', path)
  print(format_table(results, family.classifier_test_accuracy))
  print(f'wrote {path} and {len(results)} PNG grids to {out_dir}')
  return output


def format_table(results: dict, classifier_accuracy: float) -> str:
  header = (f'{"method":14s} {"tokens/fwd":>10s} {"speedup":>8s} {"nll_gap":>8s} '
            f'{"frechet":>8s} {"class acc":>9s}')
  lines = [header, '-' * len(header)]
  for name, row in results.items():
    lines.append(f'{name:14s} {row["tokens_per_forward"]:10.2f} {row["speedup"]:7.2f}x '
                 f'{row["nll_gap"]:+8.4f} {row["frechet"]:8.2f} {row["class_accuracy"]:9.2f}')
  lines.append(f'(classifier test accuracy on real images: {classifier_accuracy:.3f})')
  return '\n'.join(lines)


def define_flags() -> None:
  """Defines the command-line flags (only when run as a program, so importing this
  module next to other absl apps does not clash on flag names)."""
  config_flags.DEFINE_config_file('config', os.path.abspath(default_config.__file__),
                                  'Generation configuration.')
  flags.DEFINE_string('out', 'results', 'Folder for PNG grids and results.json.')


def main(argv):
  del argv
  config, out_dir = flags.FLAGS.config, flags.FLAGS.out
  if not config.bundle_dir and not family_lib.bundle_available():
    logging.warning('The bundled Fashion-MNIST model family is not part of this build yet '
                    '(see README, "Bundled model"); running the core demo on toy Markov '
                    'models instead.')
    demo.evaluate(config, out_dir)
    return
  family = family_lib.load(config.bundle_dir or None)
  evaluate(config, family, out_dir)


def run():
  """Console-script entry point (`specdec-generate`)."""
  define_flags()
  app.run(main)


if __name__ == '__main__':
  run()
