"""Acceptance rules: f(x) for every candidate token, and the residual after a rejection.

Legend: V vocabulary, K stored neighbours per token, C embedding width.
Notation (SPEC section 1): `target_probs` = t, `draft_probs` = d, both after
the same logits processing. A draft token x ~ d is accepted with probability
f(x); on rejection a token is drawn from the residual G.

Every rule is a `flax.struct` dataclass: float hyperparameters (delta, omega,
lam, ...) are pytree leaves, so sweeping them does not recompile a jitted
decoder; structural options (k, modes, transforms) are static. All methods are
pure and work on one position; `jax.vmap` them over rows and positions.

Interface of every rule:
  accept_prob(draft_probs[V], target_probs[V], position) -> f32[V]
      f(x) for every candidate x; `position` is the 1-based index in the draft
      window (int or traced int32).
  accept_prob_at(draft_probs, target_probs, position, token) -> f32[]
      f at one token (cheaper for neighbour-based rules).
  residual(draft_probs, target_probs, position, rejected_token) -> f32[V]
      the distribution to resample from after rejecting `rejected_token`.
  supports_modes: the decoding modes the rule makes sense in.
  for_window(window): the rule specialised to a draft window length (only
      COOL-SD's mean-normalised schedule needs it).

Hyperparameter checks run in the constructor on concrete values (inside jit
the leaves are tracers and are not re-checked).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import resampling
from specdec_jax import schedules

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
  number = _concrete(value)
  if number is not None and not (math.isfinite(number) and ok(number)):
    raise ValueError(f'{rule}: {name} must be {requirement}, got {value!r}.')


def ratio_accept(draft_probs: jax.Array, target_probs: jax.Array, weight=1.0) -> jax.Array:
  """min(1, weight * t / d), with f = 1 where d = 0 (such x is never drafted).

  Guarding d = 0 keeps d * f finite and equal to 0 there, so output laws and
  G* stay exact for one-hot (SJD random-init) drafts.
  """
  positive = draft_probs > 0
  safe_draft = jnp.where(positive, draft_probs, 1.0)
  return jnp.where(positive, jnp.minimum(1.0, weight * target_probs / safe_draft), 1.0)


class Rule:
  """Shared defaults. Subclasses override `accept_prob` and maybe the rest."""

  supports_modes: ClassVar[frozenset] = ALL_MODES
  # True when the residual depends on which token was rejected.
  residual_depends_on_token: ClassVar[bool] = False

  def accept_prob(self, draft_probs, target_probs, position) -> jax.Array:
    raise NotImplementedError

  def accept_prob_at(self, draft_probs, target_probs, position, token) -> jax.Array:
    return self.accept_prob(draft_probs, target_probs, position)[token]

  def residual(self, draft_probs, target_probs, position, rejected_token=None) -> jax.Array:
    """G* = Norm([t - d f]_+) by default."""
    accept = self.accept_prob(draft_probs, target_probs, position)
    return resampling.optimal_residual(draft_probs, target_probs, accept)

  def acceptance_rate(self, draft_probs, target_probs, position=1) -> jax.Array:
    """beta = sum_x d(x) f(x): probability the draft at this position is accepted."""
    return jnp.sum(draft_probs * self.accept_prob(draft_probs, target_probs, position), -1)

  def for_window(self, window: int) -> 'Rule':
    del window
    return self


@flax.struct.dataclass
class Lossless(Rule):
  """Standard speculative sampling: f = min(1, t/d), G = Norm([t - d]_+).

  In Jacobi mode this is SJD's rule (Teng et al., ICLR 2025).
  """

  def accept_prob(self, draft_probs, target_probs, position=1):
    del position
    return ratio_accept(draft_probs, target_probs)

  def residual(self, draft_probs, target_probs, position=1, rejected_token=None):
    return resampling.standard_residual(draft_probs, target_probs)


SJD = Lossless


@flax.struct.dataclass
class UniformRelaxed(Rule):
  """UniformRSD: f = min(1, omega t/d) with a constant omega > 0, residual G*.

  omega >= 1 relaxes; omega <= 1 is exactly lossless (G* then equals
  Norm(max(t - d, (1 - omega) t))).
  """

  omega: Any = 1.0

  def __post_init__(self):
    _check('UniformRelaxed', 'omega', self.omega, lambda v: v > 0, '> 0')

  def accept_prob(self, draft_probs, target_probs, position=1):
    del position
    return ratio_accept(draft_probs, target_probs, self.omega)


@flax.struct.dataclass
class CoolSD(Rule):
  """COOL-SD (Li et al., AAAI 2026): f_i = min(1, w_i t/d) with the annealed weight

      w_i = max(1, delta exp(-nu i - mu))      (default, floor_at_one=True)
      w_i = delta exp(-nu i - mu)              (floor_at_one=False)

  at the 1-based draft position i. Residual G* = Norm([t - d f_i]_+) (their
  Eq. 5). `mu=None` means mean-normalised over the draft window: the window
  mean of the *unfloored* w_i is delta (the window length is set by the
  decoder through `for_window(k)` or given here).

  Why the floor is the default: under G*, any w <= 1 is exactly lossless
  (d f = min(d, w t) <= t everywhere, so the emitted token has law t), and
  among those exact weights w = 1 accepts the most (sum_x min(d, w t) grows
  with w). Flooring at 1 therefore changes nothing where w_i >= 1 and, where
  the schedule dips below 1, keeps the output exact while accepting as much as
  lossless speculative sampling: the floored rule dominates the unfloored one
  (which can accept *less* than `Lossless` on a strong drafter). The
  unfloored schedule, with its below-lossless late positions, is kept as
  `floor_at_one=False`.
  """

  delta: Any = 1.0
  nu: Any = 0.7
  mu: Any = None
  window: int | None = flax.struct.field(pytree_node=False, default=None)
  floor_at_one: bool = flax.struct.field(pytree_node=False, default=True)

  def __post_init__(self):
    _check('CoolSD', 'delta', self.delta, lambda v: v > 0, '> 0')
    _check('CoolSD', 'nu', self.nu, lambda v: v >= 0, '>= 0')
    if self.window is not None and self.window < 1:
      raise ValueError(f'CoolSD: window must be >= 1, got {self.window}.')
    if not isinstance(self.floor_at_one, (bool, np.bool_)):
      raise ValueError(f'CoolSD: floor_at_one must be True or False, got {self.floor_at_one!r}.')

  def for_window(self, window: int) -> 'CoolSD':
    if window < 1:
      raise ValueError(f'CoolSD.for_window: window must be >= 1, got {window}.')
    return self.replace(window=window)

  def weight(self, position) -> jax.Array:
    """w_i at 1-based draft position(s) i (floored at 1 unless floor_at_one=False)."""
    mu = self.mu
    if mu is None:
      if self.window is None:
        raise ValueError(
            'CoolSD(mu=None) is mean-normalised over the draft window: pass '
            'window=k or call rule.for_window(k) (the decoders do this).')
      mu = schedules.mean_normalised_mu(self.nu, self.window)
    return schedules.coolsd_weight(position, delta=self.delta, nu=self.nu, mu=mu,
                                   floor_at_one=self.floor_at_one)

  def accept_prob(self, draft_probs, target_probs, position):
    return ratio_accept(draft_probs, target_probs, self.weight(position))


NO_NEIGHBOR = -1  # table entry of a token without (more) neighbours


def _neighbor_mass_bound_check(rule, neighbors, k):
  """Checks the table's layout when it is concrete (tracers and pytree
  placeholders, which flax builds while unflattening, are skipped)."""
  if neighbors is None:
    raise ValueError(f'{rule}: neighbors is required: an int array [V, K] with one row per '
                     'vocabulary id (see specdec_jax.models.neighbors.neighbor_table).')
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
    return self.neighbors

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
    'published_lumina': the Lumina path zeroes the target there instead."""
    if self.residual_mode == 'optimal':
      return resampling.standard_residual(draft_probs, target_probs)
    if rejected_token is None:
      raise ValueError(f'{type(self).__name__}(residual_mode={self.residual_mode!r}) '
                       'needs the rejected token.')
    vocab = target_probs.shape[-1]
    _, relaxed = self._neighbor_mass(target_probs, jnp.asarray(rejected_token))
    columns = min(self.k + 1, self.neighbors.shape[1])
    zero_ids = self._table(vocab)[rejected_token, :columns]
    zero_ids = jnp.where(zero_ids >= 0, zero_ids, vocab)  # padding: dropped below
    if self.residual_mode == 'published_llamagen':
      zeroed = draft_probs.at[zero_ids].set(0.0, mode='drop')
      draft_probs = jnp.where(relaxed, zeroed, draft_probs)
    else:
      zeroed = target_probs.at[zero_ids].set(0.0, mode='drop')
      target_probs = jnp.where(relaxed, zeroed, target_probs)
    return resampling.standard_residual(draft_probs, target_probs)


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
    if self.residual_mode not in _LANTERN_RESIDUALS:
      raise ValueError(f'Lantern: residual_mode must be one of {_LANTERN_RESIDUALS}, '
                       f'got {self.residual_mode!r}.')

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
    if self.residual_mode not in _LANTERN_RESIDUALS:
      raise ValueError(f'LanternPP: residual_mode must be one of {_LANTERN_RESIDUALS}, '
                       f'got {self.residual_mode!r}.')

  def _bound(self, target_probs, tokens):
    return (self.lam - 1.0) * target_probs[tokens]


def entropy(probs: jax.Array) -> jax.Array:
  """Shannon entropy in nats over the last axis, with 0 log 0 = 0."""
  positive = probs > 0
  logs = jnp.log(jnp.where(positive, probs, 1.0))
  return -jnp.sum(jnp.where(positive, probs * logs, 0.0), axis=-1)


_ENTROPY_TRANSFORMS = ('identity', 'normalized', 'one_minus_normalized')


@flax.struct.dataclass
class ContentAware(Rule):
  """CSD (Wang et al., ICML 2026): f = min(1, t/d + lam H(t)) where TV(d, t) <
  tv_threshold, else the lossless min(1, t/d); residual Norm([t - d]_+).

  The default is the paper's formula: H is the entropy of the target
  distribution t in nats (`transform='identity'`), added with a + sign. Note
  that H in nats ranges up to log K for K tokens in the target's support
  (log 2000 = 7.6 under top-k 2000), so useful lam are small. The paper body
  is not public, so the pieces are options:
    entropy_of: 'target' (default) or 'draft' distribution.
    transform h: 'identity' (default: H in nats), 'normalized' (H / log K_eff,
      K_eff = number of tokens with nonzero probability, so h is in [0, 1]) or
      'one_minus_normalized' (1 - H / log K_eff: relax confident regions).
    sign: +1 (default) raises acceptance with h, -1 lowers it.
    keep_target_support: True by default: never accept a token the target
      gives zero probability. The literal formula accepts such x with
      probability lam h(H) > 0: tokens outside the target's top-k / top-p
      support, or (on Lumina-mGPT) ids the layout forbids at that position;
      with SJD's random one-hot drafts most fresh drafts are such tokens, and
      plain decoding can never emit them. False applies the literal formula.
    residual: 'optimal' G* (default; equal to the paper's Norm([t - d]_+)
      whenever the relaxation only raises acceptance, i.e. sign +1 without
      `keep_target_support` zeroing anything the lossless rule would accept)
      or 'standard' Norm([t - d]_+).
  """

  lam: Any = 0.1
  tv_threshold: Any = 0.5
  entropy_of: str = flax.struct.field(pytree_node=False, default='target')
  transform: str = flax.struct.field(pytree_node=False, default='identity')
  sign: int = flax.struct.field(pytree_node=False, default=1)
  keep_target_support: bool = flax.struct.field(pytree_node=False, default=True)
  residual_mode: str = flax.struct.field(pytree_node=False, default='optimal')

  def __post_init__(self):
    _check('ContentAware', 'lam', self.lam, lambda v: v >= 0, '>= 0')
    _check('ContentAware', 'tv_threshold', self.tv_threshold, lambda v: 0 <= v <= 1,
           'in [0, 1]')
    for name, value, allowed in (
        ('entropy_of', self.entropy_of, ('target', 'draft')),
        ('transform', self.transform, _ENTROPY_TRANSFORMS),
        ('sign', self.sign, (1, -1)),
        ('residual_mode', self.residual_mode, ('optimal', 'standard'))):
      if value not in allowed:
        raise ValueError(f'ContentAware: {name} must be one of {allowed}, got {value!r}.')

  def relaxation(self, draft_probs, target_probs) -> jax.Array:
    """sign * lam * h(H) where the TV filter passes, else 0 (scalar)."""
    probs = target_probs if self.entropy_of == 'target' else draft_probs
    h = entropy(probs)
    if self.transform != 'identity':
      support = jnp.sum(probs > 0, axis=-1)
      log_k = jnp.log(jnp.maximum(support, 2).astype(jnp.float32))
      h = jnp.where(support > 1, h / log_k, 0.0)
      if self.transform == 'one_minus_normalized':
        h = jnp.where(support > 1, 1.0 - h, 0.0)
    tv = 0.5 * jnp.sum(jnp.abs(draft_probs - target_probs), axis=-1)
    return jnp.where(tv < self.tv_threshold, self.sign * self.lam * h, 0.0)

  def accept_prob(self, draft_probs, target_probs, position=1):
    del position
    positive = draft_probs > 0
    ratio = target_probs / jnp.where(positive, draft_probs, 1.0)
    relaxed = jnp.clip(ratio + self.relaxation(draft_probs, target_probs), 0.0, 1.0)
    if self.keep_target_support:
      relaxed = jnp.where(target_probs > 0, relaxed, 0.0)
    return jnp.where(positive, relaxed, 1.0)

  def residual(self, draft_probs, target_probs, position=1, rejected_token=None):
    if self.residual_mode == 'standard':
      return resampling.standard_residual(draft_probs, target_probs)
    return super().residual(draft_probs, target_probs, position, rejected_token)


@flax.struct.dataclass
class Grouped(Rule):
  """GSD (So et al., ICCV 2025): f(x) = min(1, t(A)/d(A)) over a dynamic group A(x).

  A(x): the tokens ranked (by target probability) from `below` places under x
  to `above` places over it, kept if |t(y) - t(x)| < prob_threshold and, when
  `embeddings` [V, C] are given, ||e_y - e_x||^2 < dist_threshold. As in the
  released code, x with fewer than `below` tokens ranked under it falls back to
  the lossless rule, and the residual is the plain Norm([t - d]_+) (the rule
  is lossy either way; 'optimal' selects G*). Ties in rank break by token id.
  """

  embeddings: Any = None
  prob_threshold: Any = 0.15
  dist_threshold: Any = 0.5
  below: int = flax.struct.field(pytree_node=False, default=7)
  above: int = flax.struct.field(pytree_node=False, default=6)
  residual_mode: str = flax.struct.field(pytree_node=False, default='standard')

  supports_modes: ClassVar[frozenset] = frozenset({CHAIN, JACOBI})

  def __post_init__(self):
    _check('Grouped', 'prob_threshold', self.prob_threshold, lambda v: v > 0, '> 0')
    _check('Grouped', 'dist_threshold', self.dist_threshold, lambda v: v > 0, '> 0')
    if self.below < 0 or self.above < 0:
      raise ValueError(f'Grouped: below/above must be >= 0, got {self.below}/{self.above}.')
    # Under jit the leaves are placeholders without `ndim`; only arrays are checked.
    if getattr(self.embeddings, 'ndim', 2) != 2:
      raise ValueError('Grouped: embeddings must be [V, C], got shape '
                       f'{getattr(self.embeddings, "shape", None)}.')
    if self.residual_mode not in ('standard', 'optimal'):
      raise ValueError(f'Grouped: residual_mode must be standard|optimal, '
                       f'got {self.residual_mode!r}.')

  def _group_ratio(self, draft_probs, target_probs, tokens):
    """min(1, t(A)/d(A)) for tokens int32[...]."""
    vocab = target_probs.shape[-1]
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
      diff = self.embeddings[members] - self.embeddings[tokens][..., None, :]
      keep &= jnp.sum(diff * diff, axis=-1) < self.dist_threshold
    group_target = jnp.sum(jnp.where(keep, target_probs[members], 0.0), axis=-1)
    group_draft = jnp.sum(jnp.where(keep, draft_probs[members], 0.0), axis=-1)
    grouped = ratio_accept(group_draft, group_target)
    lossless = ratio_accept(draft_probs[tokens], target_probs[tokens])
    return jnp.where(has_below, grouped, lossless)

  def _group_ratio_one(self, draft_probs, target_probs, token):
    """Same as `_group_ratio` for one token in O(V) (no sort): the members
    below are the `below` lexicographically largest (prob, id) pairs under x's,
    the members above the `above` smallest pairs over it."""
    vocab = target_probs.shape[-1]
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


RULES = {cls.__name__: cls for cls in
         (Lossless, UniformRelaxed, CoolSD, Lantern, LanternPP, ContentAware, Grouped)}
