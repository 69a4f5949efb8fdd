"""Wall-clock timing shared by the bench scripts that report the best of repeats."""

from __future__ import annotations

import sys
import time


def best_ms(fn, repeats: int) -> float:
  """Best wall time in ms of fn() over `repeats` calls, after one untimed call (compile).

  fn's result is waited for with jax.block_until_ready.
  """
  import jax  # pylint: disable=g-import-not-at-top  (scripts set XLA flags before JAX starts)
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return 1e3 * min(times)


def rotated(items, round_index: int) -> list:
  """items (a sequence) rotated left by round_index: the order of one timed round,
  so that over the rounds no item always runs first or right after a given one."""
  items = list(items)
  shift = round_index % len(items) if items else 0
  return items[shift:] + items[:shift]


def best_ms_interleaved(fns: dict, rounds: int, progress: bool = False) -> dict:
  """Best wall time in ms of each fn() over `rounds` rounds that call every fn once,
  after one untimed call of each (compile): {name: ms}, fns {name: fn}.

  Interleaving draws every fn's times from the same stretch of time, so their
  ratios hold on a host whose speed drifts between seconds; the order is rotated
  by one each round, so no fn always runs first. progress: print a line per round.
  """
  import jax  # pylint: disable=g-import-not-at-top  (scripts set XLA flags before JAX starts)
  for fn in fns.values():
    jax.block_until_ready(fn())
  names = list(fns)
  times = {name: [] for name in names}
  for index in range(rounds):
    for name in rotated(names, index):
      start = time.perf_counter()
      jax.block_until_ready(fns[name]())
      times[name].append(time.perf_counter() - start)
    if progress:
      print(f'round {index + 1}/{rounds}', flush=True)
  return {name: 1e3 * min(values) for name, values in times.items()}


def flag_values() -> dict:
  """{flag: value} of the running script's own flags (absl's main-module flags), for
  the JSON a bench writes, so a row can be reproduced from its file."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  return {flag.name: flag.value for flag in flags.FLAGS.get_key_flags_for_module(sys.argv[0])}


def host() -> dict:
  """The CPU the timings ran on (specdec_jax.app.host.describe: model name, vector
  extensions that pick XLA:CPU's kernels, core count)."""
  from specdec_jax.app import host as host_lib  # pylint: disable=g-import-not-at-top
  return host_lib.describe()
