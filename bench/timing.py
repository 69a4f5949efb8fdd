"""Wall-clock timing shared by the bench scripts that report the best of repeats."""

from __future__ import annotations

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
