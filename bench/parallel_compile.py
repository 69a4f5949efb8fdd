"""Compiling the main command's methods one at a time against two at a time (not a test).

  python bench/parallel_compile.py --out bench/results/parallel_compile.json

On the bundled Fashion-MNIST family, with the main command's settings (its
`build_methods`, XLA options and one XLA thread per op), each round compiles
the batch-1 decode of every method in --methods and runs it once, untimed
work exactly as the main command's latency pass does before its timed
rounds, first with `threads` = 1 and then 2 (`generate.in_threads`; the
order alternates between rounds), from empty caches (no persistent
compilation cache, JAX's in-memory caches cleared). Reports the wall time of
each setting per round and the ratio within the round; prints a table and
writes JSON.
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

_OUT = flags.DEFINE_string('out', 'bench/results/parallel_compile.json', 'JSON results.')
_METHODS = flags.DEFINE_list('methods', ['vanilla', 'eagle', 'eagle2', 'sjd', 'sjd_pac', 'csd'],
                             'Main-command methods (vanilla first).')
_ROUNDS = flags.DEFINE_integer('rounds', 2, 'Rounds; each runs both settings.')


def main(argv):
  del argv
  generate_app.use_single_thread_xla()
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from specdec_jax import decode  # pylint: disable=g-import-not-at-top
  from specdec_jax import logits  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import family as family_lib  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import methods as methods_lib  # pylint: disable=g-import-not-at-top
  from specdec_jax.configs import generate as generate_config  # pylint: disable=g-import-not-at-top

  family = family_lib.load()
  config = generate_config.get_config()
  config.methods = tuple(_METHODS.value)
  methods = methods_lib.build_methods(config, family)
  sampling = logits.Sampling(**config.sampling.to_dict())
  options = generate_app.compiler_options(config)

  def compile_and_run(method):
    call = generate_app._timed_call(method, family, 0, sampling, config.seed, options)  # pylint: disable=protected-access
    result, _ = call()
    return result.compile_seconds

  rounds = []
  for index in range(_ROUNDS.value):
    row = {}
    for threads in ((1, 2) if index % 2 == 0 else (2, 1)):
      decode.clear_compile_cache()
      jax.clear_caches()
      started = time.perf_counter()
      compile_s = generate_app.in_threads(compile_and_run, methods, threads)
      row[f'threads_{threads}_s'] = time.perf_counter() - started
      row[f'threads_{threads}_compile_s'] = dict(zip(config.methods, compile_s))
    row['ratio'] = row['threads_1_s'] / row['threads_2_s']
    rounds.append(row)
    print(f'round {index + 1}: 1 thread {row["threads_1_s"]:.1f} s, 2 threads '
          f'{row["threads_2_s"]:.1f} s, ratio {row["ratio"]:.2f}', flush=True)
  out = dict(methods=list(config.methods), rounds=rounds,
             median_ratio=float(np.median([r['ratio'] for r in rounds])),
             cpu_count=os.cpu_count(), backend=jax.default_backend(),
             command=' '.join(sys.argv))
  print(f'{"round":>5s} {"1 thread s":>11s} {"2 threads s":>12s} {"ratio":>6s}')
  for index, r in enumerate(rounds):
    print(f'{index + 1:5d} {r["threads_1_s"]:11.1f} {r["threads_2_s"]:12.1f} {r["ratio"]:6.2f}')
  resume.write_json(_OUT.value, out)
  print(f'median ratio {out["median_ratio"]:.2f}; wrote {_OUT.value}')


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
