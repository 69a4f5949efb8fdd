"""Batch-1 speedup against the draft length k, on the bundled Fashion-MNIST family (not a test).

  python bench/draft_length.py --out bench/results/draft_length.json

The main command's EAGLE-chain methods (lossless EAGLE, UniformRelaxed,
COOL-SD, with the main command's hyperparameters from configs/generate.py)
at k = 3..6, against vanilla, as the main command's latency pass times them:
one image with CFG per class of `latency_classes`, compiled first, then
--rounds rounds in which every (method, k) call and vanilla run once each,
in an order rotated by one each round (so all of them share the machine's
load drift and none always runs first), keeping each one's best. speedup =
mean over classes of vanilla's best / the method's best.
Prints a table and writes JSON. Speed only: the relaxed rules' quality at
another k is not measured here (bench/pareto.py sweeps at the main
command's k).
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from specdec_jax.app import generate as generate_app  # pylint: disable=g-import-not-at-top
from specdec_jax.app import methods as methods_lib  # pylint: disable=g-import-not-at-top
import resume  # pylint: disable=g-import-not-at-top  (bench/resume.py)
import timing  # pylint: disable=g-import-not-at-top  (bench/timing.py)

_OUT = flags.DEFINE_string('out', 'bench/results/draft_length.json', 'JSON results.')
_ROUNDS = flags.DEFINE_integer('rounds', 7, 'Timed rounds (best per call is kept).')
_LENGTHS = flags.DEFINE_list('lengths', ['3', '4', '5', '6'], 'Draft lengths k.')
_METHODS = flags.DEFINE_list('methods', ['eagle', 'uniform', 'coolsd'],
                             'EAGLE-chain methods of the main command.')


def main(argv):
  del argv
  generate_app.use_single_thread_xla()
  from specdec_jax.app import compile_cache  # pylint: disable=g-import-not-at-top
  compile_cache.enable()
  import numpy as np  # pylint: disable=g-import-not-at-top
  from specdec_jax.configs import generate as generate_config  # pylint: disable=g-import-not-at-top
  from specdec_jax import logits  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import family as family_lib  # pylint: disable=g-import-not-at-top

  config = generate_config.get_config()
  family = family_lib.load()
  sampling = logits.Sampling(**config.sampling.to_dict())
  lengths = [int(k) for k in _LENGTHS.value]
  vanilla = methods_lib.build_methods(config, family)[0]
  variants = {}  # (method, k) -> Method
  for k in lengths:
    config.draft_length = k
    config.methods = ('vanilla', *_METHODS.value)
    for method in methods_lib.build_methods(config, family)[1:]:
      variants[(method.name, k)] = method

  best = {}  # (name, k, class) -> seconds; vanilla under ('vanilla', 0, class)
  tokens_per_forward = {}
  timed_call = generate_app._timed_call  # pylint: disable=protected-access  (the main command's)
  options = generate_app.compiler_options(config)  # and its XLA options
  for label in config.latency_classes:
    calls = {('vanilla', 0): timed_call(vanilla, family, label, sampling, config.seed, options)}
    for key, method in variants.items():
      calls[key] = timed_call(method, family, label, sampling, config.seed, options)
    for key, call in calls.items():
      result, _ = call()  # compile
      tokens_per_forward.setdefault(key, []).append(
          result.metrics.summary()['tokens_per_target_forward'])
    for index in range(_ROUNDS.value):
      for key in timing.rotated(calls, index):
        seconds = calls[key]()[1]
        best[key + (label,)] = min(best.get(key + (label,), np.inf), seconds)
    print(f'class {label} done', flush=True)

  vanilla_s = float(np.mean([best[('vanilla', 0, c)] for c in config.latency_classes]))
  rows = []
  print(f'vanilla: {1e3 * vanilla_s:.1f} ms per image (mean over classes of the best)')
  print('| method | k | tokens / forward | ms per image | speedup |')
  print('|---|---|---|---|---|')
  for (name, k) in variants:
    seconds = float(np.mean([best[(name, k, c)] for c in config.latency_classes]))
    row = dict(method=name, k=k, hyperparameters=variants[(name, k)].hyperparameters,
               latency_s=seconds, speedup=vanilla_s / seconds,
               tokens_per_forward=float(np.mean(tokens_per_forward[(name, k)])))
    rows.append(row)
    print(f"| {name} | {k} | {row['tokens_per_forward']:.2f} | {1e3 * seconds:.1f} "
          f"| {row['speedup']:.2f}x |", flush=True)
  resume.write_json(
      _OUT.value,
      {'classes': list(config.latency_classes), 'rounds': _ROUNDS.value,
       'flags': timing.flag_values(), 'host': timing.host(), 'seed': config.seed,
       'sampling': config.sampling.to_dict(), 'compiler_options': options,
       'vanilla_latency_s': vanilla_s, 'rows': rows})
  print('wrote', _OUT.value)


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
