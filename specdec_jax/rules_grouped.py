"""GSD acceptance rule (Grouped): acceptance over a dynamic group of similar tokens.

Legend: V vocabulary, C embedding width, G group size (below + 1 + above).
"""

from __future__ import annotations

from typing import Any, ClassVar

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import resampling
from specdec_jax.rule_base import (CHAIN, JACOBI, Rule, _check, check_flag, ratio_accept,
                                   reject_nonfinite)

@flax.struct.dataclass
class Grouped(Rule):
  """GSD (So et al., ICCV 2025): f(x) = min(1, t(A)/d(A)) over a dynamic group A(x).

  A(x): the tokens ranked (by target probability) from `below` places under x
  to `above` places over it, kept if |t(y) - t(x)| < prob_threshold and, when
  `embeddings` [V, C] are given, ||e_y - e_x||^2 < dist_threshold. As in the
  released code, x with fewer than `below` tokens ranked under it falls back to
  the lossless rule, and the residual is the plain Norm([t - d]_+) (the rule
  is lossy either way; 'optimal' selects G*). Ties in rank break by token id.
  The released Lumina-mGPT code also drops the embedding test for the whole
  group when a member's id exceeds 10000 (a text id, ranked outside the
  top-k); here every member is tested.

  keep_target_support: True by default: never accept a token the target gives
  zero probability (outside its top-k / top-p support), which plain decoding
  can never emit; the group test alone accepts one whose group holds target
  mass. False applies the group test alone.
  """

  embeddings: Any = None
  prob_threshold: Any = 0.15
  dist_threshold: Any = 0.5
  below: int = flax.struct.field(pytree_node=False, default=7)
  above: int = flax.struct.field(pytree_node=False, default=6)
  residual_mode: str = flax.struct.field(pytree_node=False, default='standard')
  keep_target_support: bool = flax.struct.field(pytree_node=False, default=True)

  supports_modes: ClassVar[frozenset] = frozenset({CHAIN, JACOBI})
  # GSD's group test is defined on SJD's drafts, fresh (point-mass) ones included.
  jacobi_point_masses_as_given: ClassVar[bool] = True
  # `_group_ratio_one` runs lax.top_k per token.
  verify_per_data_shard: ClassVar[bool] = True

  def __post_init__(self):
    _check('Grouped', 'prob_threshold', self.prob_threshold, lambda v: v > 0, '> 0')
    _check('Grouped', 'dist_threshold', self.dist_threshold, lambda v: v > 0, '> 0')
    if self.below < 0 or self.above < 0:
      raise ValueError(f'Grouped: below/above must be >= 0, got {self.below}/{self.above}.')
    # Under jit the leaves are placeholders without `ndim`; only arrays are checked.
    if getattr(self.embeddings, 'ndim', 2) != 2:
      raise ValueError('Grouped: embeddings must be [V, C], got shape '
                       f'{getattr(self.embeddings, "shape", None)}.')
    check_flag('Grouped', 'keep_target_support', self.keep_target_support)
    if self.residual_mode not in ('standard', 'optimal'):
      raise ValueError(f'Grouped: residual_mode must be standard|optimal, '
                       f'got {self.residual_mode!r}.')

  def check_vocab(self, vocab_size: int) -> None:
    """The embedding table needs one row per token id (row x = token x)."""
    rows = getattr(self.embeddings, 'shape', (vocab_size,))[0]
    if rows != vocab_size:
      raise ValueError(f'Grouped: embeddings has {rows} rows but the vocabulary has '
                       f'V={vocab_size} tokens; pass one embedding row per token id [V, C].')
    if max(self.below, self.above) >= vocab_size:
      raise ValueError(f'Grouped: below={self.below} and above={self.above} (tokens ranked '
                       f'under and over the draft) must be below the vocabulary size '
                       f'V={vocab_size}; pass smaller ones.')

  def _group_ratio(self, draft_probs, target_probs, tokens):
    """min(1, t(A)/d(A)) for tokens int32[...]."""
    vocab = target_probs.shape[-1]
    self.check_vocab(vocab)
    order = jnp.argsort(target_probs, stable=True)  # ascending rank -> token
    rank = jnp.zeros_like(order).at[order].set(jnp.arange(vocab))  # token -> rank
    offsets = jnp.arange(-self.below, self.above + 1)
    member_rank = rank[tokens][..., None] + offsets  # [..., G]
    in_range = (member_rank >= 0) & (member_rank < vocab)
    members = order[jnp.clip(member_rank, 0, vocab - 1)]
    return self._ratio_over(draft_probs, target_probs, tokens, members, in_range,
                            rank[tokens] >= self.below)

  def _ratio_over(self, draft_probs, target_probs, tokens, members, valid, has_below):
    """Applies the probability/embedding filters to candidate members [..., G]."""
    keep = valid & (jnp.abs(target_probs[members] - target_probs[tokens][..., None])
                    < self.prob_threshold)
    if self.embeddings is not None:
      embeddings = jnp.asarray(self.embeddings)  # NumPy cannot be indexed by traced tokens
      diff = embeddings[members] - embeddings[tokens][..., None, :]
      keep &= jnp.sum(diff * diff, axis=-1) < self.dist_threshold
    group_target = jnp.sum(jnp.where(keep, target_probs[members], 0.0), axis=-1)
    group_draft = jnp.sum(jnp.where(keep, draft_probs[members], 0.0), axis=-1)
    grouped = ratio_accept(group_draft, group_target)
    if self.keep_target_support:
      grouped = jnp.where(target_probs[tokens] > 0, grouped, 0.0)
    lossless = ratio_accept(draft_probs[tokens], target_probs[tokens])
    # A NaN target empties the group (every comparison fails), which alone would accept.
    return reject_nonfinite(jnp.where(has_below, grouped, lossless), draft_probs[tokens],
                            target_probs[tokens])

  def _group_ratio_one(self, draft_probs, target_probs, token):
    """Same as `_group_ratio` for one token in O(V) (no sort): the members
    below are the `below` lexicographically largest (prob, id) pairs under x's,
    the members above the `above` smallest pairs over it."""
    vocab = target_probs.shape[-1]
    self.check_vocab(vocab)
    ids = jnp.arange(vocab)
    value = target_probs[token]
    is_below = (target_probs < value) | ((target_probs == value) & (ids < token))
    is_above = (target_probs > value) | ((target_probs == value) & (ids > token))
    # lax.top_k prefers the lower index among ties; reversing the array makes
    # it prefer the higher id, i.e. the larger (prob, id) pair.
    below_vals, below_rev = jax.lax.top_k(jnp.where(is_below, target_probs, -1.0)[::-1],
                                          self.below)
    above_vals, above_ids = jax.lax.top_k(jnp.where(is_above, -target_probs, -2.0),
                                          self.above)
    members = jnp.concatenate([vocab - 1 - below_rev, token[None], above_ids])
    valid = jnp.concatenate([below_vals >= 0, jnp.array([True]), above_vals > -2.0])
    has_below = jnp.sum(is_below) >= self.below
    return self._ratio_over(draft_probs, target_probs, token, members, valid, has_below)

  def accept_prob(self, draft_probs, target_probs, position=1):
    del position
    return self._group_ratio(draft_probs, target_probs, jnp.arange(target_probs.shape[-1]))

  def accept_prob_at(self, draft_probs, target_probs, position, token):
    del position
    return self._group_ratio_one(draft_probs, target_probs, jnp.asarray(token, jnp.int32))

  def residual(self, draft_probs, target_probs, position=1, rejected_token=None):
    if self.residual_mode == 'standard':
      return resampling.standard_residual(draft_probs, target_probs)
    return super().residual(draft_probs, target_probs, position, rejected_token)

