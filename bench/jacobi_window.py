"""Batch-1 speed of the Jacobi methods (SJD, GSD, CSD) against the window W (not a test).

  python bench/jacobi_window.py --out bench/results/jacobi_window.json

On the bundled Fashion-MNIST family, as the main command runs them (its
`build_methods` with configs/generate.py's hyperparameters and XLA options),
for each window in --windows: one image with CFG per class of --classes,
vanilla and each method timed in interleaved rounds (every round runs every
(window, method, class) once; each keeps its best). speedup = vanilla / method
from the same rounds. The main command's `jacobi_window` is chosen from this.
Prints a table and writes JSON.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from specdec_jax.app import generate as generate_app  # pylint: disable=g-import-not-at-top
from specdec_jax.app import methods as methods_lib  # pylint: disable=g-import-not-at-top

_OUT = flags.DEFINE_string('out', 'bench/results/jacobi_window.json', 'JSON results.')
_WINDOWS = flags.DEFINE_list('windows', ['4', '6', '8', '12', '16'], 'Jacobi windows W.')
_METHODS = flags.DEFINE_list('methods', ['sjd', 'gsd', 'csd'], 'Main-command Jacobi methods.')
_CLASSES = flags.DEFINE_list('classes', ['0', '3', '6', '9'], 'One image per class.')
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Timed rounds (best per call is kept).')


def main(argv):
  del argv
  generate_app.use_single_thread_xla()
  import numpy as np  # pylint: disable=g-import-not-at-top
  from specdec_jax import logits  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import family as family_lib  # pylint: disable=g-import-not-at-top
  from specdec_jax.configs import generate as generate_config  # pylint: disable=g-import-not-at-top

  family = family_lib.load()
  classes = [int(c) for c in _CLASSES.value]
  calls = {}
  for window in [int(w) for w in _WINDOWS.value]:
    config = generate_config.get_config()
    config.jacobi_window = window
    config.methods = ('vanilla', *_METHODS.value)
    sampling = logits.Sampling(**config.sampling.to_dict())
    options = generate_app.compiler_options(config)
    for method in methods_lib.build_methods(config, family):
      if method.name == 'vanilla' and calls:
        continue  # one vanilla reference for every window
      for label in classes:
        window_key = 0 if method.name == 'vanilla' else window
        timed_call = generate_app._timed_call  # pylint: disable=protected-access
        calls[(window_key, method.name, label)] = timed_call(method, family, label, sampling,
                                                             config.seed, options)
  tokens_per_forward = {key: call()[0].metrics.summary()['tokens_per_target_forward']
                        for key, call in calls.items()}  # the first call compiles
  best = dict.fromkeys(calls, np.inf)
  for index in range(_ROUNDS.value):
    for key, call in calls.items():
      best[key] = min(best[key], call()[1])
    print(f'round {index + 1}/{_ROUNDS.value}', flush=True)
  mean = lambda table, window, name: float(np.mean([table[(window, name, c)] for c in classes]))
  vanilla_s = mean(best, 0, 'vanilla')
  rows = []
  print('| W | method | tokens / forward | ms per image | speedup |')
  print('|---|---|---|---|---|')
  for window in [int(w) for w in _WINDOWS.value]:
    for name in _METHODS.value:
      seconds = mean(best, window, name)
      row = dict(window=window, method=name, latency_s=seconds, speedup=vanilla_s / seconds,
                 tokens_per_forward=mean(tokens_per_forward, window, name))
      rows.append(row)
      print(f"| {window} | {name} | {row['tokens_per_forward']:.2f} | {1e3 * seconds:.1f} | "
            f"{row['speedup']:.2f}x |", flush=True)
  os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
  with open(_OUT.value, 'w') as f:
    json.dump({'classes': classes, 'rounds': _ROUNDS.value, 'vanilla_s': vanilla_s,
               'rows': rows}, f, indent=1)
  print('wrote', _OUT.value)


if __name__ == '__main__':
  app.run(main)
