"""Acceptance-weight schedules over the draft position.

COOL-SD (Li et al., AAAI 2026, arXiv 2601.09212) anneals the relaxation
weight with the 1-based position i in the draft window:

    w_i = max(1, delta * exp(-nu * i - mu))      (floor_at_one=True, the default)
    w_i = delta * exp(-nu * i - mu)              (floor_at_one=False)

mu is given, or "mean-normalised": mu = ln((1/L) sum_{j=1..L} exp(-nu j)), so
the window mean of the *unfloored* w_i equals delta and COOL-SD spends the
same total relaxation as UniformRelaxed(omega=delta) (the paper's mu is not
public; see the README, "Methods").

Why the floor. With f = min(1, w t/d) and the residual G* = Norm([t - d f]_+),
any w <= 1 gives d f = min(d, w t) <= t everywhere, so the emitted token has
exactly the target law t; among those exact weights w = 1 accepts the most
(sum_x min(d, w t) grows with w). A schedule value below 1 therefore only
lowers acceptance for no gain in fidelity, and the floored schedule dominates.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checks
from specdec_jax.rule_base import _check


def _check_window(what: str, window) -> None:
  if not (checks.is_int(window) and window >= 1):
    raise ValueError(f'{what}: window must be an int >= 1 (the number of draft positions), '
                     f'got {window!r}.')


def _check_schedule(what: str, delta, nu, mu) -> None:
  """Raises unless concrete delta > 0, nu >= 0 and mu (when given) are finite numbers."""
  _check(what, 'delta', delta, lambda v: v > 0, '> 0')
  _check(what, 'nu', nu, lambda v: v >= 0, '>= 0')
  if mu is not None:
    _check(what, 'mu', mu, lambda v: True, 'a finite number or None')


def mean_normalised_mu(nu, window: int) -> jax.Array:
  """mu such that mean_{i=1..window} exp(-nu i - mu) == 1 (traceable in nu).

  Computed as logsumexp(-nu i) - ln(window): the mean of exp(-nu i) underflows to 0
  in float32 for nu above about 87, which would make mu -inf and every weight inf.
  """
  _check_window('mean_normalised_mu', window)
  _check('mean_normalised_mu', 'nu', nu, lambda v: v >= 0, '>= 0')
  positions = jnp.arange(1, window + 1, dtype=jnp.float32)
  return (jax.nn.logsumexp(-jnp.asarray(nu, jnp.float32) * positions)
          - jnp.float32(np.log(window)))


def coolsd_weight(position, *, delta, nu, mu, floor_at_one: bool = True) -> jax.Array:
  """w_i = [max(1,] delta * exp(-nu * i - mu)[)] for 1-based position(s) i (float32)."""
  _check_schedule('coolsd_weight', delta, nu, mu)
  if not isinstance(position, jax.core.Tracer) and np.any(np.asarray(position) < 1):
    raise ValueError(f'coolsd_weight: draft positions are 1-based (>= 1), got {position!r}.')
  position = jnp.asarray(position, jnp.float32)
  weight = delta * jnp.exp(-nu * position - mu)
  return jnp.maximum(weight, 1.0) if floor_at_one else weight


def coolsd_weights(window: int, *, delta: float, nu: float = 0.7, mu: float | None = None,
                   floor_at_one: bool = True):
  """All weights w_1..w_L of a window of length L, as float32[L].

  mu=None is mean-normalised over this window (on the unfloored weights).
  """
  _check_window('coolsd_weights', window)  # with mu given, 0 would give no weights
  if mu is None:
    mu = mean_normalised_mu(nu, window)
  return coolsd_weight(jnp.arange(1, window + 1), delta=delta, nu=nu, mu=mu,
                       floor_at_one=floor_at_one)
