"""Runs a bench script on another checkout's library code (not a test).

  git worktree add /tmp/before fa11e1f
  python bench/with_tree.py /tmp/before bench/tpu_compile.py --out before.json

The script itself is this checkout's; every `specdec_jax` import it makes
(models, converters and configs included) resolves to the given checkout
(`bench/trees.py`), so one script measures the code before and after a change.
With BENCH_TRACEBACK_EVERY_S=N set, every Python thread's stack is printed
to stderr every N seconds (how `bench/accelerator_check.sh` shows where a
stage stalls), by a thread that holds the GIL while it reads them:
`faulthandler.dump_traceback_later` reads them without it and crashed a
stage with SIGSEGV while JAX compiled on other threads
(tests/test_accelerator_check.py). faulthandler stays on for fatal signals.
"""

from __future__ import annotations

import faulthandler
import os
import runpy
import sys
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import trees  # pylint: disable=g-import-not-at-top  (bench/trees.py)


def print_stacks_every(seconds: float) -> None:
  """Starts a daemon thread printing every other Python thread's stack to stderr
  every `seconds`."""
  start = time.monotonic()

  def loop():
    while True:
      time.sleep(seconds)
      lines = [f'--- Python stacks at {time.monotonic() - start:.0f} s\n']
      for thread_id, frame in sys._current_frames().items():  # pylint: disable=protected-access
        if thread_id != threading.get_ident():
          lines += [f'Thread {thread_id:#x} (most recent call last):\n',
                    *traceback.format_stack(frame)]
      sys.stderr.write(''.join(lines))
      sys.stderr.flush()

  threading.Thread(target=loop, name='print_stacks_every', daemon=True).start()


def main() -> None:
  if len(sys.argv) < 3:
    raise SystemExit('usage: python bench/with_tree.py CHECKOUT SCRIPT [ARGS...]')
  tree, script = os.path.abspath(sys.argv[1]), sys.argv[2]
  if not os.path.isdir(os.path.join(tree, 'specdec_jax')):
    raise SystemExit(f'{tree} is not a checkout of this repository (no specdec_jax/ folder).')
  every = float(os.environ.get('BENCH_TRACEBACK_EVERY_S', '0'))
  faulthandler.enable()  # a stack on SIGSEGV and other fatal signals
  if every > 0:  # where a slow or stuck run is, printed to stderr every `every` seconds
    print_stacks_every(every)
  trees.forget_package()
  sys.meta_path.insert(0, trees.TreeFinder(tree))
  sys.argv = [script] + sys.argv[3:]
  sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
  runpy.run_path(script, run_name='__main__')


if __name__ == '__main__':
  main()
