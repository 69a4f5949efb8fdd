"""Acceptance-weight schedules over the draft position.

COOL-SD (Li et al., AAAI 2026, arXiv 2601.09212) anneals the relaxation
weight with the 1-based position i in the draft window:

    w_i = delta * exp(-nu * i - mu)

mu is given, or "mean-normalised": mu = ln((1/L) sum_{j=1..L} exp(-nu j)), so
the window mean of w_i equals delta and COOL-SD spends the same total
relaxation as UniformRelaxed(omega=delta) (reference note 1.5, hypothesis H1:
the paper's mu is not public).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def mean_normalised_mu(nu, window: int) -> jax.Array:
  """mu such that mean_{i=1..window} exp(-nu i - mu) == 1 (traceable in nu)."""
  if window < 1:
    raise ValueError(f'window must be >= 1, got {window}.')
  positions = jnp.arange(1, window + 1, dtype=jnp.float32)
  return jnp.log(jnp.mean(jnp.exp(-jnp.asarray(nu, jnp.float32) * positions)))


def coolsd_weight(position, *, delta, nu, mu) -> jax.Array:
  """w_i = delta * exp(-nu * i - mu) for 1-based position(s) i (float32)."""
  position = jnp.asarray(position, jnp.float32)
  return delta * jnp.exp(-nu * position - mu)


def coolsd_weights(window: int, *, delta: float, nu: float = 0.7, mu: float | None = None):
  """All weights w_1..w_L of a window of length L, as float32[L]."""
  if mu is None:
    mu = mean_normalised_mu(nu, window)
  return coolsd_weight(jnp.arange(1, window + 1), delta=delta, nu=nu, mu=mu)
