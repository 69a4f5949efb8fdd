"""Residual (resampling) distributions used after a rejection.

Legend: V vocabulary. `target` = t, `draft` = d (SPEC section 1).

For an acceptance function f, a step emits
    out(y) = d(y) f(y) + (1 - beta) G(y),    beta = sum_x d(x) f(x).
The TV-optimal residual is G* = Norm([t - d f]_+), giving
TV(out, t) = sum_x [d(x) f(x) - t(x)]_+ (COOL-SD, arXiv 2601.09212, Thm 2 /
Eq. 5). If f >= min(1, t/d) everywhere, G* = Norm([t - d]_+).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def normalize_or(mass: jax.Array, fallback: jax.Array) -> jax.Array:
  """mass / sum(mass), or `fallback` when the mass is (numerically) zero; mass and
  fallback f32[..., V] (fallback broadcast to mass), normalised over the last axis.

  The zero case only arises when the residual is never sampled (acceptance
  probability one), e.g. identical draft and target; returning a valid
  distribution keeps every code path finite.
  """
  total = jnp.sum(mass, axis=-1, keepdims=True)
  safe = jnp.where(total > 0, total, 1.0)
  return jnp.where(total > 0, mass / safe, fallback)


def standard_residual(draft_probs: jax.Array, target_probs: jax.Array) -> jax.Array:
  """Norm([t - d]_+): the lossless residual [..., V]."""
  return normalize_or(jnp.maximum(target_probs - draft_probs, 0.0), target_probs)


def optimal_residual(draft_probs: jax.Array, target_probs: jax.Array,
                     accept_probs: jax.Array) -> jax.Array:
  """G* = Norm([t - d f]_+) for acceptance probabilities f [..., V]."""
  mass = jnp.maximum(target_probs - draft_probs * accept_probs, 0.0)
  return normalize_or(mass, target_probs)
