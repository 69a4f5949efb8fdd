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
  jacobi_point_masses_as_given: False if the Jacobi modes verify the rule's
      point-mass (fresh) drafts losslessly (`LosslessOnPointMasses`).
  for_window(window): the rule specialised to a draft window length (only
      COOL-SD's mean-normalised schedule needs it).

Hyperparameter checks run in the constructor on concrete values (inside jit
the leaves are tracers and are not re-checked).
"""

from __future__ import annotations

from typing import Any, ClassVar

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import checks
from specdec_jax import resampling
from specdec_jax import schedules
# The base and the LANTERN / GSD rules live in their own modules; re-exported here.
from specdec_jax.rule_base import (ALL_MODES, CHAIN, JACOBI, TREE, Rule, _check, _concrete,
                                   check_flag, is_point_mass, ratio_accept, reject_nonfinite)
from specdec_jax.rules_grouped import Grouped
from specdec_jax.rules_neighbor import (_LANTERN_RESIDUALS, NO_NEIGHBOR, Lantern, LanternPP,
                                        _neighbor_mass_bound_check, _NeighborRelaxed,
                                        neighbor_columns)


@flax.struct.dataclass
class Lossless(Rule):
  """Standard speculative sampling: f = min(1, t/d), G = Norm([t - d]_+).

  In Jacobi mode this is SJD's rule (Teng et al., ICLR 2025).
  """

  jacobi_point_masses_as_given: ClassVar[bool] = True  # the lossless test already

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
  decoder through `for_window(k)`, or given here and then checked against it).

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
    if self.mu is not None:
      _check('CoolSD', 'mu', self.mu, lambda v: True, 'a finite number or None')
    if self.window is not None and not (checks.is_int(self.window) and self.window >= 1):
      raise ValueError(f'CoolSD: window must be an int >= 1 or None, got {self.window!r}.')
    check_flag('CoolSD', 'floor_at_one', self.floor_at_one)

  def for_window(self, window: int) -> 'CoolSD':
    if window < 1:
      raise ValueError(f'CoolSD.for_window: window must be >= 1, got {window}.')
    if self.mu is None and self.window is not None and self.window != window:
      raise ValueError(
          f'CoolSD(window={self.window}) normalises its schedule over {self.window} draft '
          f'positions, but the decoder verifies {window} per step. Leave window unset (the '
          f'decoders set it) or pass window={window}.')
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
    relax_point_masses: False by default: a draft whose law d is a point mass
      (max d = 1: a Jacobi fresh draft, a top-k tree draft) is verified
      losslessly, min(1, t(x)). The formula's relaxation is meant for drafts
      drawn from a law close to t (d ~ t makes t/d ~ 1, so lam H moves little);
      on a point mass that the TV filter passes (t(x) > 1 - tv_threshold) it
      adds lam H(t) to t(x). With SJD's random fresh drafts that almost never
      happens; with fresh drafts that repeat the left token (init 'spatial')
      it does at most positions, and lam 0.2 streaked the bundle's images
      (docs/results.md "The Jacobi points with left-neighbour fresh drafts,
      and CSD on point masses"). True applies the formula to point masses too.
  """

  jacobi_point_masses_as_given: ClassVar[bool] = True  # `relax_point_masses` decides

  lam: Any = 0.1
  tv_threshold: Any = 0.5
  entropy_of: str = flax.struct.field(pytree_node=False, default='target')
  transform: str = flax.struct.field(pytree_node=False, default='identity')
  sign: int = flax.struct.field(pytree_node=False, default=1)
  keep_target_support: bool = flax.struct.field(pytree_node=False, default=True)
  residual_mode: str = flax.struct.field(pytree_node=False, default='optimal')
  relax_point_masses: bool = flax.struct.field(pytree_node=False, default=False)

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
    check_flag('ContentAware', 'keep_target_support', self.keep_target_support)
    check_flag('ContentAware', 'relax_point_masses', self.relax_point_masses)

  def relaxation(self, draft_probs, target_probs) -> jax.Array:
    """sign * lam * h(H) where the TV filter passes (and the draft is not a point
    mass, unless relax_point_masses), else 0 (scalar)."""
    probs = target_probs if self.entropy_of == 'target' else draft_probs
    h = entropy(probs)
    if self.transform != 'identity':
      support = jnp.sum(probs > 0, axis=-1)
      log_k = jnp.log(jnp.maximum(support, 2).astype(jnp.float32))
      h = jnp.where(support > 1, h / log_k, 0.0)
      if self.transform == 'one_minus_normalized':
        h = jnp.where(support > 1, 1.0 - h, 0.0)
    tv = 0.5 * jnp.sum(jnp.abs(draft_probs - target_probs), axis=-1)
    relaxed = tv < self.tv_threshold
    if not self.relax_point_masses:
      relaxed = relaxed & ~is_point_mass(draft_probs)
    return jnp.where(relaxed, self.sign * self.lam * h, 0.0)

  def accept_prob(self, draft_probs, target_probs, position=1):
    del position
    positive = draft_probs > 0
    ratio = target_probs / jnp.where(positive, draft_probs, 1.0)
    relaxed = jnp.clip(ratio + self.relaxation(draft_probs, target_probs), 0.0, 1.0)
    if self.keep_target_support:
      relaxed = jnp.where(target_probs > 0, relaxed, 0.0)
    return reject_nonfinite(jnp.where(positive, relaxed, 1.0), draft_probs, target_probs)

  def residual(self, draft_probs, target_probs, position=1, rejected_token=None):
    if self.residual_mode == 'standard':
      return resampling.standard_residual(draft_probs, target_probs)
    return super().residual(draft_probs, target_probs, position, rejected_token)


@flax.struct.dataclass
class LosslessOnPointMasses(Rule):
  """`rule` for drafts drawn from a law, the lossless test for point-mass drafts.

  A draft whose law d is a point mass (max d = 1) is accepted with
  min(1, t(x)) and its residual is Norm([t - d]_+) (t with x removed); any
  other draft is verified by `rule`. The Jacobi modes verify with this wrapper
  (unless `relax_fresh_drafts` or the rule's `jacobi_point_masses_as_given`):
  a fresh Jacobi draft is a placeholder, a random token or the left
  neighbour, not a prediction, so a relaxation's bound on drift (a draft law
  close to t) does not hold for it. Relaxing it raises the acceptance of
  whatever the init proposes: UniformRelaxed(2) accepts a repeated left token
  with min(1, 2 t(x)), and on SCD's drafts with left-neighbour fresh drafts it
  drifted ten times the noise floor from the target's images (docs/results.md
  "The chain rules on Jacobi drafts: fresh drafts verified losslessly").
  """

  rule: Any

  jacobi_point_masses_as_given: ClassVar[bool] = True  # wrapped already

  @property
  def supports_modes(self):
    return self.rule.supports_modes

  @property
  def residual_depends_on_token(self):
    return self.rule.residual_depends_on_token

  def accept_prob(self, draft_probs, target_probs, position=1):
    return jnp.where(is_point_mass(draft_probs), ratio_accept(draft_probs, target_probs),
                     self.rule.accept_prob(draft_probs, target_probs, position))

  def accept_prob_at(self, draft_probs, target_probs, position, token):
    lossless = ratio_accept(draft_probs[token], target_probs[token])
    return jnp.where(is_point_mass(draft_probs), lossless,
                     self.rule.accept_prob_at(draft_probs, target_probs, position, token))

  def residual(self, draft_probs, target_probs, position=1, rejected_token=None):
    return jnp.where(is_point_mass(draft_probs)[..., None],
                     resampling.standard_residual(draft_probs, target_probs),
                     self.rule.residual(draft_probs, target_probs, position, rejected_token))


def jacobi_rule(rule, relax_fresh_drafts: bool):
  """The rule a Jacobi mode verifies with: `rule` itself if `relax_fresh_drafts` or
  its `jacobi_point_masses_as_given` (Lossless; ContentAware, which has its own
  `relax_point_masses`; Grouped, whose group test GSD defines on SJD's drafts,
  fresh ones included), else `LosslessOnPointMasses(rule)`."""
  if relax_fresh_drafts or rule.jacobi_point_masses_as_given:
    return rule
  return LosslessOnPointMasses(rule)


RULES = {cls.__name__: cls for cls in
         (Lossless, UniformRelaxed, CoolSD, Lantern, LanternPP, ContentAware, Grouped)}
