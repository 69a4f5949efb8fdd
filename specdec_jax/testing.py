"""Statistical checks for samplers: sample counts against an exact law.

Used by the test-suite and available to users who add their own rules.

Two criteria, each with a stated power (README "How correctness is tested"):
  * `bins_match`: every bin within `sigmas` binomial standard deviations
    (|count - n pi| <= sigmas * sqrt(n pi (1 - pi)) + slack), and every bin of
    exact probability zero has count exactly zero. With n = 2^16 samples and
    sigmas = 6 a bin of mass 0.1 fails beyond 0.7 percentage points and
    detects a deviation of 1.0 point with probability 0.99 (6 + 2.33 sigmas);
    the false-alarm rate per bin is at most 2.2e-9 (exact binomial tails).
  * `chi_square_pvalue`: Pearson's statistic with bins of expected count < 5
    merged into groups of similar probability, and its upper-tail p-value.
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax
import jax.scipy.special as jsp
import numpy as np


@dataclasses.dataclass(frozen=True)
class BinReport:
  ok: bool
  worst_bin: int
  worst_z: float
  zero_mass_violations: int
  message: str


def bins_match(counts, probs, *, sigmas: float = 6.0, slack: float = 5.0) -> BinReport:
  """Compares integer counts [V] with an exact law probs [V]."""
  counts = np.asarray(counts, np.float64)
  probs = np.asarray(probs, np.float64)
  if counts.shape != probs.shape:
    raise ValueError(f'counts {counts.shape} and probs {probs.shape} must match.')
  total = counts.sum()
  expected = total * probs
  sd = np.sqrt(np.maximum(total * probs * (1 - probs), 0.0))
  bound = sigmas * sd + slack * (probs > 0)
  zero_violations = int(np.sum((probs <= 0) & (counts > 0)))
  z = np.abs(counts - expected) / np.maximum(sd, 1e-12)
  z = np.where(probs > 0, z, np.where(counts > 0, np.inf, 0.0))
  worst = int(np.argmax(z))
  ok = bool(np.all(np.abs(counts - expected) <= bound) and zero_violations == 0)
  message = (f'{"ok" if ok else "MISMATCH"}: n={int(total)}, worst bin {worst} '
             f'count {int(counts[worst])} vs expected {expected[worst]:.1f} '
             f'(z={z[worst]:.2f}), zero-mass bins hit: {zero_violations}')
  return BinReport(ok, worst, float(z[worst]), zero_violations, message)


# How far from 1 the probs of `chi_square_pvalue` may sum: float32 laws, and the
# joint laws of a few tokens multiplied from them, sum to 1 within about 1e-7
# (toy.MarkovToy's 3- and 5-token laws: at most 1e-7); a law off by more than
# 1e-5 is another law.
PROBS_SUM_TOLERANCE = 1e-5


def chi_square_pvalue(counts, probs, *, min_expected: float = 5.0) -> tuple[float, int]:
  """Pearson chi-square p-value of counts [M] against probs [M].

  Bins with expected count < min_expected are sorted by probability and merged
  into consecutive groups of expected count >= min_expected; a last group still
  below it joins the smallest bin kept. So every draw counts (dropping a small
  pool made any mass landing in it invisible), and mass moved between rare bins
  of different probability stays visible (one pool of every rare bin hid it).
  Any count in a zero-probability bin gives p = 0. The p-value is the chi-square
  approximation's: with groups of expected count 5, a threshold of 1e-4 rejects a
  draw from `probs` itself about 1.4e-4 of the time (simulated on 57-409 degrees of
  freedom).
  probs must be a law: finite, >= 0 and summing to 1 within PROBS_SUM_TOLERANCE
  (a law that is off, e.g. not normalised, is refused, not renormalised).
  Returns (p_value, degrees_of_freedom).
  """
  counts = np.asarray(counts, np.float64).reshape(-1)
  probs = np.asarray(probs, np.float64).reshape(-1)
  if counts.shape != probs.shape:
    raise ValueError(f'chi_square_pvalue: counts ({counts.size} bins) and probs '
                     f'({probs.size} bins) must have one entry per bin each.')
  for name, values in (('counts', counts), ('probs', probs)):
    bad = np.flatnonzero(~(values >= 0) | ~np.isfinite(values))
    if bad.size:
      raise ValueError(f'chi_square_pvalue: {name} must be finite and >= 0, got '
                       f'{values[bad[0]]} at bin {bad[0]} ({bad.size} such bins).')
  if abs(probs.sum() - 1.0) > PROBS_SUM_TOLERANCE:
    raise ValueError(f'chi_square_pvalue: probs must sum to 1 (within {PROBS_SUM_TOLERANCE:g}), '
                     f'got a sum of {probs.sum():.10g}; pass the law itself (e.g. probs / '
                     f'probs.sum() if the weights are meant to be normalised).')
  total = counts.sum()
  if np.any((probs <= 0) & (counts > 0)):
    return 0.0, 0
  expected = total * probs
  big = expected >= min_expected
  obs, exp = list(counts[big]), list(expected[big])
  rare = np.flatnonzero(~big)
  group_obs = group_exp = 0.0
  for i in rare[np.argsort(expected[rare], kind='stable')]:
    group_obs, group_exp = group_obs + counts[i], group_exp + expected[i]
    if group_exp >= min_expected:
      obs.append(group_obs)
      exp.append(group_exp)
      group_obs = group_exp = 0.0
  if not obs:
    return 1.0, 0
  smallest = int(np.argmin(exp))
  obs[smallest] += group_obs
  exp[smallest] += group_exp
  obs, exp = np.array(obs), np.array(exp)
  exp = exp * obs.sum() / exp.sum()  # probs summing to 1 within PROBS_SUM_TOLERANCE
  statistic = float(np.sum((obs - exp) ** 2 / exp))
  dof = len(obs) - 1
  if dof < 1:
    return 1.0, 0
  p_value = float(jsp.gammaincc(dof / 2.0, statistic / 2.0))
  return p_value, dof


def histogram(samples, num_bins: int) -> np.ndarray:
  """Counts of integer samples in [0, num_bins); out-of-range samples raise."""
  samples = np.asarray(samples).reshape(-1)
  if samples.size and (samples.min() < 0 or samples.max() >= num_bins):
    raise ValueError(f'samples outside [0, {num_bins}): min {samples.min()}, max {samples.max()}.')
  return np.bincount(samples, minlength=num_bins)


def sequence_index(sequences, vocab_size: int) -> np.ndarray:
  """Maps int sequences [n, L] of tokens in [0, V) to integers in [0, V^L) (for
  joint-law tests), one to one: V^L must fit in int64."""
  sequences = np.asarray(sequences)
  if sequences.size and not np.issubdtype(sequences.dtype, np.integer):
    raise ValueError(f'sequence_index: sequences must hold ints, got dtype {sequences.dtype}.')
  if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or (
      vocab_size < 1):
    raise ValueError(f'sequence_index: vocab_size must be an int >= 1, got {vocab_size!r}.')
  length = sequences.shape[-1] if sequences.ndim else 0
  if int(vocab_size) ** length > 2 ** 63:
    raise ValueError(f'sequence_index: {vocab_size}^{length} sequences do not fit in int64 '
                     f'(distinct sequences would share an index); index fewer tokens.')
  if sequences.size and (sequences.min() < 0 or sequences.max() >= vocab_size):
    raise ValueError(f'sequence_index: tokens must be in [0, {vocab_size}), got min '
                     f'{sequences.min()}, max {sequences.max()}.')
  sequences = sequences.astype(np.int64)
  weights = vocab_size ** np.arange(sequences.shape[-1] - 1, -1, -1, dtype=np.int64)
  return sequences @ weights


_TRACE_EVENT = '/jax/core/compile/jaxpr_trace_duration'


@contextlib.contextmanager
def jaxpr_traces():
  """Records JAX's traces (one entry per jaxpr built, from `jax.monitoring`) while
  the block runs: a repeated call with the same shapes and static arguments should
  record none ("compile once").

    with testing.jaxpr_traces() as traces:
      f(x)
    assert not traces
  """
  traces = []

  def listener(event, duration, **kwargs):
    del duration, kwargs
    if event == _TRACE_EVENT:
      traces.append(event)

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield traces
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
