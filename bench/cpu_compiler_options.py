"""Batch-1 and batch-100 decode times with XLA's default compile and with
`decode.CPU_LATENCY_OPTIONS`, on the bundled Fashion-MNIST family (not a test).

  python bench/cpu_compiler_options.py --out bench/results/cpu_compiler_options.json

XLA:CPU rewrites each reduction that it does not give to its YNNPACK kernels
(those of fewer than a few thousand elements) into a reduce-window over
blocks of 32 plus a reduce. `decode.CPU_LATENCY_OPTIONS` turns that rewrite
off. The main command compiles with it (configs/generate.py,
xla_cpu_plain_reductions). This times, in one process, vanilla,
UniformRelaxed and COOL-SD as the main command defines them, compiled both
ways:
  * batch 1, the main command's latency pass: one image with CFG per class of
    `latency_classes`, --rounds rounds, each running every (options, method,
    class) once in turn, keeping each one's best;
  * batch 100, its quality pass (10 images per class): best of --batch_rounds.
speedup = vanilla / method under the same options. Prints a table and writes
JSON. Differences between processes on this machine reach 10-30%; run it
more than once before reading a few percent into it.
"""

from __future__ import annotations

import os
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import resume  # pylint: disable=g-import-not-at-top  (bench/resume.py)

from specdec_jax.app import generate as generate_app  # pylint: disable=g-import-not-at-top
from specdec_jax.app import methods as methods_lib  # pylint: disable=g-import-not-at-top

_OUT = flags.DEFINE_string('out', 'bench/results/cpu_compiler_options.json', 'JSON results.')
_ROUNDS = flags.DEFINE_integer('rounds', 7, 'Batch-1 rounds (best per call is kept).')
_BATCH_ROUNDS = flags.DEFINE_integer('batch_rounds', 3,
                                     'Batch-100 runs per program (best; 0 skips batch 100).')
_METHODS = flags.DEFINE_list('methods', ['vanilla', 'uniform', 'coolsd'],
                              "Main-command methods to time ('vanilla' first).")


def main(argv):
  del argv
  generate_app.use_single_thread_xla()
  from specdec_jax.app import compile_cache  # pylint: disable=g-import-not-at-top
  compile_cache.enable()
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from specdec_jax import decode, logits  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import family as family_lib  # pylint: disable=g-import-not-at-top
  from specdec_jax.configs import generate as generate_config  # pylint: disable=g-import-not-at-top

  config = generate_config.get_config()
  config.methods = tuple(_METHODS.value)
  family = family_lib.load()
  sampling = logits.Sampling(**config.sampling.to_dict())
  methods = methods_lib.build_methods(config, family)
  variants = {'xla_default': None, 'cpu_latency_options': dict(decode.CPU_LATENCY_OPTIONS)}
  classes = tuple(int(c) for c in config.latency_classes)

  timed_call = generate_app._timed_call  # pylint: disable=protected-access  (the main command's)
  calls = {}  # (variant, method, class) -> call
  for variant, options in variants.items():
    for method in methods:
      for label in classes:
        calls[(variant, method.name, label)] = timed_call(method, family, label, sampling,
                                                          config.seed, options)
  for call in calls.values():
    call()  # compile
  best = dict.fromkeys(calls, np.inf)
  for index in range(_ROUNDS.value):
    for key, call in calls.items():
      best[key] = min(best[key], call()[1])
    print(f'batch 1: round {index + 1}/{_ROUNDS.value}', flush=True)

  labels = np.repeat(np.arange(family.num_classes), 10).astype(np.int32)
  batch_best = {}
  for variant, options in variants.items():
    for method in methods:
      runs = []
      for _ in range(_BATCH_ROUNDS.value + 1 if _BATCH_ROUNDS.value else 0):  # 1st compiles
        started = time.perf_counter()
        generate_app.quality_pass(method, family, labels, sampling, config.seed, options)
        runs.append(time.perf_counter() - started)
      batch_best[(variant, method.name)] = min(runs[1:]) if runs else float('nan')
    print(f'batch 100: {variant} ' + ('done' if _BATCH_ROUNDS.value else 'skipped'), flush=True)

  rows = []
  print('| XLA options | method | batch 1 (ms, mean of best per class) | speedup '
        '| batch 100 (s) | speedup |')
  print('|---|---|---|---|---|---|')
  for variant in variants:
    vanilla_ms = 1e3 * np.mean([best[(variant, 'vanilla', c)] for c in classes])
    for method in methods:
      ms = 1e3 * np.mean([best[(variant, method.name, c)] for c in classes])
      batch_s = batch_best[(variant, method.name)]
      row = dict(options=variant, method=method.name, batch1_ms=float(ms),
                 batch1_speedup=float(vanilla_ms / ms), batch100_s=float(batch_s),
                 batch100_speedup=float(batch_best[(variant, 'vanilla')] / batch_s))
      rows.append(row)
      print(f"| {variant} | {method.name} | {ms:.1f} | {row['batch1_speedup']:.2f}x "
            f"| {batch_s:.2f} | {row['batch100_speedup']:.2f}x |", flush=True)
  for method in methods:
    ratio = (np.mean([best[('xla_default', method.name, c)] for c in classes])
             / np.mean([best[('cpu_latency_options', method.name, c)] for c in classes]))
    print(f'{method.name}: batch-1 time default / with options = {ratio:.2f}x')
  resume.write_json(
      _OUT.value,
      {'classes': list(classes), 'rounds': _ROUNDS.value,
       'batch_rounds': _BATCH_ROUNDS.value, 'options': variants, 'rows': rows,
       'backend': jax.default_backend()})
  print('wrote', _OUT.value)


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
