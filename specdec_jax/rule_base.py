"""Base of the acceptance rules: the Rule class, mode names, hyperparameter checks, min(1, w t/d).

Legend: V vocabulary. See `specdec_jax.rules` for the interface every rule implements.
"""

from __future__ import annotations

import math
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import resampling

CHAIN, TREE, JACOBI = 'chain', 'tree', 'jacobi'
ALL_MODES = frozenset({CHAIN, TREE, JACOBI})


def _concrete(value) -> float | None:
  """The Python float of a concrete scalar hyperparameter, else None (tracer)."""
  if isinstance(value, (bool, int, float, np.number)):
    return float(value)
  if isinstance(value, np.ndarray) and value.ndim == 0:
    return float(value)
  if isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer) and value.ndim == 0:
    return float(value)
  return None


def _check(rule: str, name: str, value, ok, requirement: str) -> None:
  """Raises unless a concrete hyperparameter is one finite number meeting `ok`.

  Tracers and the placeholder leaves pytree transformations build are skipped;
  None, a string, a list or tuple, or a concrete array with more than one entry
  (a hyperparameter is one number per rule) is refused.
  """
  if value is None:
    raise ValueError(f'{rule}: {name} must be a number ({requirement}), got None.')
  if isinstance(value, (str, list, tuple)) or (isinstance(value, (np.ndarray, jax.Array))
                                and not isinstance(value, jax.core.Tracer)
                                and np.ndim(value) > 0):
    raise ValueError(f'{rule}: {name} must be one number ({requirement}), got {value!r}.')
  number = _concrete(value)
  if number is not None and not (math.isfinite(number) and ok(number)):
    raise ValueError(f'{rule}: {name} must be {requirement}, got {value!r}.')


def check_flag(rule: str, name: str, value) -> None:
  """Raises unless a static option is True or False."""
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f'{rule}: {name} must be True or False, got {value!r}.')


def reject_nonfinite(accept_probs, draft_probs, target_probs) -> jax.Array:
  """f with 0 wherever d, t or f itself is NaN or infinite: a broken distribution
  never accepts (and `metrics.DecodeMetrics.nonfinite_draft_steps` reports it)."""
  finite = jnp.isfinite(draft_probs) & jnp.isfinite(target_probs) & ~jnp.isnan(accept_probs)
  return jnp.where(finite, accept_probs, 0.0)


def is_point_mass(draft_probs: jax.Array) -> jax.Array:
  """bool[...]: whether each draft law [..., V] is a point mass (max d = 1), e.g. a
  Jacobi fresh draft or a top-k tree draft."""
  return jnp.max(draft_probs, axis=-1) >= 1.0


def ratio_accept(draft_probs: jax.Array, target_probs: jax.Array, weight=1.0) -> jax.Array:
  """min(1, weight * t / d), with f = 1 where d = 0 (such x is never drafted) and
  f = 0 where d or t is not finite (`reject_nonfinite`).

  Guarding d = 0 keeps d * f finite and equal to 0 there, so output laws and
  G* stay exact for one-hot (SJD random-init) drafts.
  """
  positive = draft_probs > 0
  safe_draft = jnp.where(positive, draft_probs, 1.0)
  accept = jnp.where(positive, jnp.minimum(1.0, weight * target_probs / safe_draft), 1.0)
  return reject_nonfinite(accept, draft_probs, target_probs)


class Rule:
  """Shared defaults. Subclasses override `accept_prob` and maybe the rest."""

  supports_modes: ClassVar[frozenset] = ALL_MODES
  # True when the residual depends on which token was rejected.
  residual_depends_on_token: ClassVar[bool] = False
  # False: the Jacobi modes verify this rule's point-mass drafts (fresh drafts)
  # losslessly (`rules.LosslessOnPointMasses`); True: as the rule says.
  jacobi_point_masses_as_given: ClassVar[bool] = False
  # True: chain and Jacobi verification map images per 'data' shard
  # (`sharding.vmap_per_image`): the rule runs a lax.top_k, whose batch XLA's
  # partitioner would gather over 'data'. False for the others: on a data x
  # model mesh the shard_map makes the partitioner gather the window's laws
  # over 'model' (docs/sharding.md).
  verify_per_data_shard: ClassVar[bool] = False

  def accept_prob(self, draft_probs, target_probs, position) -> jax.Array:
    raise NotImplementedError

  def accept_prob_at(self, draft_probs, target_probs, position, token) -> jax.Array:
    return self.accept_prob(draft_probs, target_probs, position)[token]

  def residual(self, draft_probs, target_probs, position, rejected_token=None) -> jax.Array:
    """G* = Norm([t - d f]_+) by default."""
    accept = self.accept_prob(draft_probs, target_probs, position)
    return resampling.optimal_residual(draft_probs, target_probs, accept)

  def acceptance_rate(self, draft_probs, target_probs, position=1) -> jax.Array:
    """beta = sum_x d(x) f(x): probability the draft at this position is accepted
    (draft_probs, target_probs f32[..., V] -> f32[...])."""
    return jnp.sum(draft_probs * self.accept_prob(draft_probs, target_probs, position), -1)

  def for_window(self, window: int) -> 'Rule':
    del window
    return self

  def check_vocab(self, vocab_size: int) -> None:
    """Raises ValueError if the rule's tables do not fit a vocabulary of V tokens
    (`decode.generate` calls it before compiling; rules without tables pass)."""
    del vocab_size

