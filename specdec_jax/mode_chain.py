"""The chain-shaped decoding modes: plain sampling, drafted chains, Jacobi windows.

Legend: B images, V vocabulary, n image tokens, k chain drafts, W Jacobi
window, T verify window, K draft slots. What each method does for the loop:
`mode_base.Mode`.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from specdec_jax import categorical
from specdec_jax import checks
from specdec_jax import drafting
from specdec_jax import jacobi_drafts
from specdec_jax import mode_base
from specdec_jax import protocol
from specdec_jax import rules as rules_lib


@dataclasses.dataclass(frozen=True)
class Vanilla(mode_base.Mode):
  """Plain autoregressive decoding: one target forward per token."""

  @property
  def width(self) -> int:
    return 1

  def start(self, plan, draft_params, draft_cond, prefill, first, first_index, uniforms):
    vocab = plan.target.vocab_size
    return mode_base.Drafts(tokens=jnp.zeros((plan.num_images, 0), jnp.int32),
                            probs=jnp.zeros((plan.num_images, 0, vocab), jnp.float32)), 0

  def verify(self, plan, rule, uniforms, window, drafts, target_probs, cache, start):
    del rule, window, drafts, start
    num_accepted = jnp.zeros((plan.num_images,), jnp.int32)
    next_token = categorical.sample(uniforms[:, 0], target_probs[:, 0])
    path = jnp.zeros((plan.num_images, 1), jnp.int32)
    return mode_base.Verdict(path, num_accepted, next_token), cache

  def advance(self, plan, draft_params, drafts, step, uniforms):
    return drafts, 0


@dataclasses.dataclass(frozen=True)
class ChainDraft(mode_base.DrafterMode):
  """k drafts per step from an EAGLE-style head ('eagle') or a small AR model ('model')."""

  k: int
  drafter: str = drafting.EAGLE

  rule_mode = rules_lib.CHAIN

  @property
  def width(self) -> int:
    return self.k + 1

  @property
  def draft_forwards(self) -> int:
    return self.k

  def check(self, *, target, draft, draft_params, cond, num_tokens: int) -> None:
    checks.check_int_field(self, 'k')
    if not 1 <= self.k < num_tokens:
      raise ValueError(f'generate: ChainDraft.k must be in [1, num_tokens={num_tokens}), got '
                       f'{self.k}.')
    super().check(target=target, draft=draft, draft_params=draft_params, cond=cond,
                  num_tokens=num_tokens)

  def draft(self, drafter, plan, draft_params, cache, root_logits, root_hidden, uniforms,
            first_index):
    tokens, probs, cache = drafting.draft_chain(
        drafter, draft_params, cache, root_logits, root_hidden, num_drafts=self.k,
        sampling=plan.sampling, cfg=plan.cfg, uniforms=uniforms, first_index=first_index)
    return mode_base.Drafts(tokens=tokens, probs=probs), cache


def check_window_and_init(mode, num_tokens: int, target) -> None:
  """The Jacobi family's checks (`Jacobi`, `mode_pac.JacobiPAC`): an int window in
  [2, num_tokens], init 'random' or 'spatial', a bool relax_fresh_drafts, and a
  target whose image-token range random drafts can be drawn from (ValueError
  naming the field)."""
  name = type(mode).__name__
  checks.check_int_field(mode, 'window')
  if not 2 <= mode.window <= num_tokens:
    raise ValueError(f'generate: {name}.window must be in [2, num_tokens={num_tokens}] '
                     f'(1 pending token + window-1 drafts), got {mode.window}.')
  if mode.init not in jacobi_drafts.INITS:
    choices = ' or '.join(repr(init) for init in jacobi_drafts.INITS)
    raise ValueError(f'generate: {name}.init must be {choices}, got {mode.init!r}.')
  protocol.image_token_range(target)  # random drafts are drawn from it: check it now
  if not isinstance(mode.relax_fresh_drafts, bool):
    raise ValueError(f'generate: {name}.relax_fresh_drafts must be True or False, got '
                     f'{mode.relax_fresh_drafts!r}.')


@dataclasses.dataclass(frozen=True)
class Jacobi(mode_base.Mode):
  """Speculative Jacobi decoding (SJD; GSD/CSD via their rules): window W, no draft model.

  init 'random' draws fresh drafts uniformly from the target's image tokens
  (`protocol.image_token_range`, e.g. Lumina-mGPT's 8192 ids 4..8195, as SJD's
  released code); 'spatial' repeats the token to the left. The target's own
  distributions at the window become the next drafts (`jacobi_drafts.jacobi_next`).

  coupling 'maximal' is Speculative Coupled Decoding (SCD, arXiv 2510.24211):
  a position re-drafted after the accepted prefix keeps its previous draft
  with probability min(1, t/q_old), else draws from Norm([t - q_old]_+)
  (`jacobi_drafts.maximal_coupling`); 'gumbel' is SCD's other coupling: every
  draft of image token n is argmax(log t + g_n) with Gumbel numbers g_n fixed
  for the decode (`jacobi_drafts.gumbel_coupling`). Either way a draft's law
  is still t, so every Jacobi rule (SJD's lossless test, GSD, CSD) verifies it
  unchanged.

  relax_fresh_drafts: False verifies fresh drafts (point masses) losslessly
  under the chain rules (`rules.jacobi_rule`: UniformRelaxed, COOL-SD,
  LANTERN/LANTERN++; GSD and CSD decide themselves); True relaxes them too.
  """

  window: int
  init: str = 'random'
  coupling: str = 'none'
  relax_fresh_drafts: bool = False

  rule_mode = rules_lib.JACOBI

  @property
  def width(self) -> int:
    return self.window

  @property
  def draft_uniforms(self) -> int:
    # A draw y_i from every window position's target distribution, fresh drafts,
    # with the maximal coupling a keep test per re-drafted position, with the
    # Gumbel coupling the seed of the noise (read at the first step only).
    return jacobi_drafts.jacobi_uniforms(self.window, self.coupling)

  def check(self, *, target, draft, draft_params, cond, num_tokens: int) -> None:
    del draft, draft_params, cond
    check_window_and_init(self, num_tokens, target)
    if self.coupling not in jacobi_drafts.COUPLINGS:
      raise ValueError(f'generate: Jacobi.coupling must be one of '
                       f'{jacobi_drafts.COUPLINGS}, got {self.coupling!r}.')

  def verify(self, plan, rule, uniforms, window, drafts, target_probs, cache, start):
    return super().verify(plan, rules_lib.jacobi_rule(rule, self.relax_fresh_drafts), uniforms,
                          window, drafts, target_probs, cache, start)

  def start(self, plan, draft_params, draft_cond, prefill, first, first_index, uniforms):
    tokens, probs = jacobi_drafts.jacobi_fresh(uniforms, self.slots, plan.target.vocab_size,
                                               self.init, first,
                                               protocol.image_token_range(plan.target))
    seeds = None
    if self.coupling == 'gumbel':
      seeds = jacobi_drafts.gumbel_seeds(uniforms[:, -jacobi_drafts.GUMBEL_SEED_UNIFORMS:])
    return mode_base.Drafts(tokens=tokens, probs=probs, noise_seed=seeds), 0

  def advance(self, plan, draft_params, drafts, step, uniforms):
    noise = None
    if self.coupling == 'gumbel':
      # The next drafts are image tokens num_generated .. num_generated + W - 2.
      token_index = step.num_generated[:, None] + jnp.arange(self.slots)[None, :]
      noise = jacobi_drafts.gumbel_noise(drafts.noise_seed, token_index,
                                         plan.target.vocab_size)
    tokens, probs = jacobi_drafts.jacobi_next(
        uniforms, step.target_probs, step.verdict.num_accepted, step.verdict.next_token, self.init,
        protocol.image_token_range(plan.target), coupling=self.coupling,
        old_tokens=drafts.tokens, old_probs=drafts.probs, noise=noise)
    return drafts.replace(tokens=tokens, probs=probs), 0
