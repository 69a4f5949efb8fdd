"""LANTERN and LANTERN++ acceptance rules: relaxation by latent-neighbour mass.

Legend: V vocabulary, K stored neighbours per token.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checks
from specdec_jax import resampling
from specdec_jax.rule_base import Rule, _check, ratio_accept

NO_NEIGHBOR = -1  # table entry of a token without (more) neighbours


def _neighbor_mass_bound_check(rule, neighbors, k):
  """Checks the table's layout when it is concrete (tracers and pytree
  placeholders, which flax builds while unflattening, are skipped)."""
  if neighbors is None:
    raise ValueError(f'{rule}: neighbors is required: an int array [V, K] with one row per '
                     'vocabulary id (see specdec_jax.models.neighbors.neighbor_table).')
  if not checks.is_int(k):
    raise ValueError(f'{rule}: k (neighbours per token) must be an int, got {k!r}.')
  if isinstance(neighbors, (list, tuple)):
    raise ValueError(f'{rule}: neighbors must be an int array [V, K] (np.asarray the '
                     f'table), got a {type(neighbors).__name__}.')
  shape = getattr(neighbors, 'shape', None)
  if shape is None:  # a placeholder leaf during a pytree transformation
    return
  if len(shape) != 2:
    raise ValueError(f'{rule}: neighbors must be an int array [V, K] (row x = token id x), '
                     f'got shape {shape}.')
  if not 1 <= k <= shape[1]:
    raise ValueError(
        f'{rule}: k must be in [1, K={shape[1]}] (the stored neighbour columns), got {k}. '
        'Build the table with more columns (specdec_jax.models.neighbors) or lower k.')
  if isinstance(neighbors, jax.core.Tracer) or not isinstance(neighbors, (np.ndarray, jax.Array)):
    return  # abstract (jit, eval_shape): values are checked where they are concrete
  if not jnp.issubdtype(jnp.result_type(neighbors), jnp.integer):
    raise ValueError(f'{rule}: neighbors must hold integer token ids, got dtype '
                     f'{jnp.result_type(neighbors)}.')
  if neighbors.size:
    low, high = int(jnp.min(neighbors)), int(jnp.max(neighbors))
    if low < NO_NEIGHBOR or high >= shape[0]:
      raise ValueError(
          f'{rule}: neighbors entries must be token ids in [0, V={shape[0]}) or '
          f'{NO_NEIGHBOR} (no neighbour), found values in [{low}, {high}]. The table has one '
          'row per vocabulary id, so its entries index the same vocabulary.')


_LANTERN_RESIDUALS = ('optimal', 'published_llamagen', 'published_lumina')


def neighbor_columns(k: int, residual_mode: str = 'optimal') -> int:
  """The neighbour-table columns a LANTERN rule with this k and residual reads:
  k, or k + 1 for the published residuals (they zero the rejected token's k + 1
  nearest neighbours, as LANTERN's code)."""
  return k + (residual_mode != 'optimal')


def _check_residual_mode(rule: str, residual_mode: str, neighbors, k: int) -> None:
  """A known residual mode, and a table with the columns it reads (`neighbor_columns`)."""
  if residual_mode not in _LANTERN_RESIDUALS:
    raise ValueError(f'{rule}: residual_mode must be one of {_LANTERN_RESIDUALS}, '
                     f'got {residual_mode!r}.')
  columns = getattr(neighbors, 'shape', (0, k + 1))[-1]
  if columns < neighbor_columns(k, residual_mode):
    raise ValueError(
        f'{rule}(residual_mode={residual_mode!r}) zeroes the rejected token\'s k + 1 = '
        f'{k + 1} nearest neighbours (as LANTERN\'s code), but neighbors has {columns} '
        f'columns; build the table with k + 1 columns (models.neighbors.neighbor_table).')


class _NeighborRelaxed(Rule):
  """Shared LANTERN logic: t~(x) = t(x) + c_{m*}(x), c_m = mass of the m nearest
  latent neighbours of x, m* = the largest m <= k with c_m <= bound(x).

  The table `neighbors` int[V, K] has one row per vocabulary id: row x lists
  token x's nearest neighbours as token ids, nearest first, padded with
  NO_NEIGHBOR (-1). Tokens without latent neighbours (Lumina-mGPT's text and
  layout ids) have all-(-1) rows: their neighbour mass is 0, so they follow
  the lossless rule. `models.neighbors.neighbor_table` builds such tables
  (with `token_offset`/`vocab_size` for vocabularies whose image tokens do not
  start at 0); the row count is checked against V on every call, so a table
  indexed by VQ code instead of token id fails loudly instead of silently
  pooling the wrong neighbours.
  """

  def _table(self, vocab: int) -> jax.Array:
    rows = self.neighbors.shape[0]
    if rows != vocab:
      raise ValueError(
          f'{type(self).__name__}: neighbors has {rows} rows but the vocabulary has '
          f'V={vocab} tokens. The table needs one row per token id (row x = token x); for '
          'a vocabulary whose image tokens are offset (Lumina-mGPT: token = code + 4) build it '
          'with models.neighbors.neighbor_table(codebook, k, token_offset=4, '
          f'vocab_size={vocab}).')
    return jnp.asarray(self.neighbors)  # a NumPy table cannot be indexed by traced tokens

  def check_vocab(self, vocab_size: int) -> None:
    self._table(vocab_size)

  def _bound(self, target_probs, tokens):
    raise NotImplementedError

  def _neighbor_mass(self, target_probs, tokens):
    """(c_{m*}, m* > 0) for tokens int32[...] -> (f32[...], bool[...])."""
    neighbor_ids = self._table(target_probs.shape[-1])[tokens, :self.k]  # [..., k]
    valid = neighbor_ids >= 0
    masses = jnp.where(valid, target_probs[jnp.maximum(neighbor_ids, 0)], 0.0)
    cumulative = jnp.cumsum(masses, axis=-1)
    fits = cumulative <= self._bound(target_probs, tokens)[..., None]
    # c_m is non-decreasing, so the admissible m form a prefix: take its end.
    mass = jnp.max(jnp.where(fits, cumulative, 0.0), axis=-1)
    return mass, fits[..., 0] & valid[..., 0]

  def accept_prob(self, draft_probs, target_probs, position=1):
    del position
    tokens = jnp.arange(target_probs.shape[-1])
    mass, _ = self._neighbor_mass(target_probs, tokens)
    return ratio_accept(draft_probs, target_probs + mass)

  def accept_prob_at(self, draft_probs, target_probs, position, token):
    del position
    mass, _ = self._neighbor_mass(target_probs, jnp.asarray(token))
    relaxed = target_probs[token] + mass
    return ratio_accept(draft_probs[token], relaxed)

  @property
  def residual_depends_on_token(self) -> bool:
    return self.residual_mode != 'optimal'

  def residual(self, draft_probs, target_probs, position=1, rejected_token=None):
    """'optimal': G* = Norm([t - d]_+) (f >= lossless, so G* is the plain
    residual; COOL-SD's "G* applied to LANTERN++").
    'published_llamagen': LANTERN code, LlamaGen path: if m*(x) > 0, zero the
    draft at x's first k+1 neighbours (no renormalisation), then Norm([t - d']_+).
    'published_lumina': the Lumina path zeroes the target there instead.
    Both need k + 1 neighbour columns. When [t' - d']_+ has no mass (the
    target's support within x and its k + 1 neighbours), the residual is the
    target t itself (LANTERN's code takes a uniform law over the vocabulary
    there, which can emit tokens the target excludes)."""
    if self.residual_mode == 'optimal':
      return resampling.standard_residual(draft_probs, target_probs)
    if rejected_token is None:
      raise ValueError(f'{type(self).__name__}(residual_mode={self.residual_mode!r}) '
                       'needs the rejected token.')
    vocab = target_probs.shape[-1]
    original_target = target_probs
    _, relaxed = self._neighbor_mass(target_probs, jnp.asarray(rejected_token))
    zero_ids = self._table(vocab)[rejected_token, :neighbor_columns(self.k, self.residual_mode)]
    zero_ids = jnp.where(zero_ids >= 0, zero_ids, vocab)  # padding: dropped below
    if self.residual_mode == 'published_llamagen':
      zeroed = draft_probs.at[zero_ids].set(0.0, mode='drop')
      draft_probs = jnp.where(relaxed, zeroed, draft_probs)
    else:
      zeroed = target_probs.at[zero_ids].set(0.0, mode='drop')
      target_probs = jnp.where(relaxed, zeroed, target_probs)
    return resampling.normalize_or(jnp.maximum(target_probs - draft_probs, 0.0),
                                   original_target)


@flax.struct.dataclass
class Lantern(_NeighborRelaxed):
  """LANTERN (Jang et al., ICLR 2025): neighbour mass bounded by a TV budget delta.

  neighbors: int32[V, K], row x = token id x's nearest latent neighbours as
  token ids (self excluded, nearest first, -1 padded), from
  `specdec_jax.models.neighbors.neighbor_table`.
  """

  neighbors: Any = None
  delta: Any = 0.1
  k: int = flax.struct.field(pytree_node=False, default=1000)
  residual_mode: str = flax.struct.field(pytree_node=False, default='optimal')

  def __post_init__(self):
    _neighbor_mass_bound_check('Lantern', self.neighbors, self.k)
    _check('Lantern', 'delta', self.delta, lambda v: 0 <= v <= 1, 'in [0, 1]')
    _check_residual_mode('Lantern', self.residual_mode, self.neighbors, self.k)

  def _bound(self, target_probs, tokens):
    return jnp.broadcast_to(jnp.asarray(self.delta, jnp.float32), jnp.shape(tokens))


@flax.struct.dataclass
class LanternPP(_NeighborRelaxed):
  """LANTERN++ (static-tree LANTERN): neighbour mass bounded by (lam - 1) t(x),
  i.e. t~(x) <= lam t(x), lam >= 1."""

  neighbors: Any = None
  lam: Any = 2.0
  k: int = flax.struct.field(pytree_node=False, default=10)
  residual_mode: str = flax.struct.field(pytree_node=False, default='optimal')

  def __post_init__(self):
    _neighbor_mass_bound_check('LanternPP', self.neighbors, self.k)
    _check('LanternPP', 'lam', self.lam, lambda v: v >= 1, '>= 1')
    _check_residual_mode('LanternPP', self.residual_mode, self.neighbors, self.k)

  def _bound(self, target_probs, tokens):
    return (self.lam - 1.0) * target_probs[tokens]

