"""What the decode loop asks of a decoding mode, and the pieces modes share.

Legend: B images, R cache rows (B, or 2B with CFG: rows 2b, 2b + 1 = image b's
conditional and unconditional rows, `drafting.as_rows`), V
vocabulary, E hidden width, n image tokens, T verify window (tokens per
target forward), K draft slots (the most drafts one step can accept).

A mode is a frozen dataclass (a jit static argument) deriving from `Mode`.
`decode._decode` runs one loop for every mode and calls, per decode:

  `start`   after the prefill and the first token: the first drafts;
and per iteration:
  `verify_window`  [pending, drafts] -> the T tokens the target runs;
  `verify`         target distributions -> a `Verdict` (accepted path,
                   num_accepted, next token) and the target cache to keep;
  `commit`         the tokens the verdict commits;
  `advance`        the drafts of the next iteration.

Chain verification (`verify.verify_chain`) and the commit of a chain are the
defaults here; `mode_tree.TreeDraft` overrides what a tree does differently.
`DrafterMode` holds what both draft-model modes (chain and tree) share: the
drafter cache, its catch-up forward and its checks.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import checks
from specdec_jax import drafting
from specdec_jax import kv_cache as kv
from specdec_jax import logits as logits_lib
from specdec_jax import sharding
from specdec_jax import verify

as_rows = drafting.as_rows


@dataclasses.dataclass(frozen=True)
class Plan:
  """Everything static about one compiled decode (a jit static argument).

  sampling: None in the plan `decode.generate` compiles (the Sampling is a
  traced argument and `decode._decode` puts it here, so modes read
  `plan.sampling` inside the trace); a concrete Sampling here is compiled in.
  """

  target: Any
  draft: Any
  mode: Any
  sampling: logits_lib.Sampling | None
  num_tokens: int
  num_images: int
  cfg: bool
  target_capacity: int
  draft_capacity: int
  mesh: Any
  attention_spans: tuple[int, ...] = ()

  @property
  def rows_per_image(self) -> int:
    """Cache rows per image: 2 with CFG (adjacent, `drafting.as_rows`), else 1."""
    return 2 if self.cfg else 1

  def shared_lengths(self, cache: kv.KVCache) -> kv.KVCache:
    """Marks a fresh cache's rows as sharing one length when the decode has one image
    (its CFG rows move together), so every cache write is one dynamic_update_slice."""
    return cache.replace(shared_length=self.num_images == 1)


@flax.struct.dataclass
class Drafts:
  """What a mode carries between iterations (part of the loop state).

  Attributes:
    tokens: int32[B, K] the next drafts (a tree: [B, N] node tokens).
    probs: f32[B, K, V] (a tree: [B, N, V]) the laws the drafts came from.
    cache: the drafter's cache (R rows), or None without a draft model.
    length: int32[B] drafter slots committed (incl. the pending token), or None.
    noise_seed: uint32[B, 2] each image's seed of SCD's Gumbel coupling
      (`jacobi_drafts.gumbel_noise`), or None.
  """

  tokens: jax.Array
  probs: jax.Array
  cache: Any = None
  length: Any = None
  noise_seed: Any = None


class Verdict(NamedTuple):
  """One verification per image.

  path: int32[B, K+1] window indices of the committed tokens (path[:, 0] = 0,
    the pending token; -1 pads a tree path shorter than K+1).
  num_accepted: int32[B] drafts accepted.
  next_token: int32[B] the resampled (or bonus) token committed after them.
  """

  path: jax.Array
  num_accepted: jax.Array
  next_token: jax.Array


class Step(NamedTuple):
  """One verified iteration, as `Mode.advance` sees it.

  window: int32[B, T] the tokens the target ran; hidden: [R, T, E] its hidden
  states; target_probs: what `Mode.target_probs` gave (by default f32[B, T, V]);
  verdict: the `Verdict`; commit:
  int32[B, K+1] committed tokens (accepted drafts, then the next token);
  num_generated: int32[B] committed tokens after this step; keep: bool[B]
  rows that still decode (their lengths move; finished rows stay frozen).
  """

  window: jax.Array
  hidden: jax.Array
  target_probs: jax.Array
  verdict: Verdict
  commit: jax.Array
  num_generated: jax.Array
  keep: jax.Array


class Mode:
  """Base of the decoding modes: subclasses are frozen dataclasses.

  Defaults describe a chain: the window is [pending, drafts], drafts are
  verified with `verify.verify_chain`, and the accepted tokens are the
  window's prefix. A new mode is a new subclass overriding what differs.
  """

  # The `rules` mode name the acceptance rule must support (None: no rule).
  rule_mode: ClassVar[str | None] = None

  @property
  def width(self) -> int:
    """T: tokens per verify forward."""
    raise NotImplementedError

  @property
  def slots(self) -> int:
    """K: the most drafts one step can accept."""
    return self.width - 1

  @property
  def verify_uniforms(self) -> int:
    """Uniforms `verify` uses per step (`randomness`): a chain's K tests and the next token."""
    return self.slots + 1

  @property
  def draft_uniforms(self) -> int:
    """Uniforms `start` and `advance` use per step (a chain: one per draft)."""
    return self.slots

  def check(self, *, target, draft, draft_params, cond, num_tokens: int) -> None:
    """Mode-specific argument checks of `generate` (ValueError naming the fix)."""

  def draft_capacity(self, *, draft, cond, prefix: int, num_tokens: int) -> int:
    """Drafter cache slots (1: the mode has no drafter cache)."""
    del draft, cond, prefix, num_tokens
    return 1

  def layout(self, drafts: Drafts):
    """(window_mask, depths) of the verify forward of this iteration's drafts.

    None, None: a causal chain whose window entry j predicts image token
    num_generated + j. A tree shared by every image: bool[T, T] and
    int32[T]; a tree per image (built by the drafter, e.g. EAGLE-2):
    bool[B, T, T] and int32[B, T]. Entry j predicts image token
    num_generated + depths[j].
    """
    del drafts
    return None, None

  def start(self, plan: Plan, draft_params, draft_cond, prefill, first, first_index,
            uniforms) -> tuple[Drafts, int]:
    """The first drafts, after the prefill `prefill` and the first token first int32[B].

    first_index: int32[B] image-token index of the first draft; uniforms:
    f32[B, draft_uniforms]. Returns (drafts, drafter forwards run).
    """
    raise NotImplementedError

  def target_probs(self, plan: Plan, logits, token_index):
    """What `verify` (and `advance`, through `Step`) read of the verify forward:
    by default the target distributions f32[B, T, V] at every window entry
    (logits [R, T, V]; token_index int32[B, T])."""
    return drafting.guided_probs(plan.sampling, logits, token_index, plan.cfg)

  def verify_window(self, pending, drafts: Drafts) -> jax.Array:
    """pending int32[B, 1] -> the verify window int32[B, T]."""
    return jnp.concatenate([pending, drafts.tokens], axis=1)

  def verify(self, plan: Plan, rule, uniforms, window, drafts: Drafts, target_probs,
             cache: kv.KVCache, start) -> tuple[Verdict, kv.KVCache]:
    """Verifies the window per image (vmapped; for a rule with
    `verify_per_data_shard`, over a 'data' mesh each device its own images:
    `sharding.vmap_per_image`) against target_probs [B, T, V].

    uniforms: f32[B, verify_uniforms]. cache: the target cache after the
    verify forward (lengths = start, the row lengths before it). Returns the
    verdict and the cache to keep.
    """
    del start
    mesh = plan.mesh if getattr(rule, 'verify_per_data_shard', False) else None
    per_image = sharding.vmap_per_image(verify.verify_chain_with_uniforms,
                                        (None, 0, 0, 0, 0), mesh)
    num_accepted, next_token = per_image(rule, uniforms, drafts.tokens, drafts.probs,
                                         target_probs)
    path = jnp.broadcast_to(jnp.arange(self.slots + 1), (plan.num_images, self.slots + 1))
    return Verdict(path, num_accepted, next_token), cache

  def commit(self, window, verdict: Verdict) -> jax.Array:
    """int32[B, K+1]: the accepted path's drafts, then next_token at index num_accepted."""
    path_tokens = jnp.take_along_axis(window, jnp.maximum(verdict.path, 0), axis=1)
    slot = jnp.arange(self.slots + 1)[None, :]
    return jnp.where(slot < verdict.num_accepted[:, None],
                     jnp.roll(path_tokens, -1, axis=1), verdict.next_token[:, None])

  def advance(self, plan: Plan, draft_params, drafts: Drafts, step: Step,
              uniforms) -> tuple[Drafts, int]:
    """The drafts of the next iteration (uniforms f32[B, draft_uniforms]); returns
    (drafts, drafter forwards)."""
    raise NotImplementedError


def check_same_layout(target, draft) -> None:
  """Raises unless a draft model shares the target's image layout where both configs
  name one (LlamaGen's `model_type` and 2D RoPE `grid_size`): a draft for another grid
  places token i at another (row, column), and a t2i draft cannot read class ids."""
  for field, why in (('model_type', 'it reads the target\'s conditioning'),
                     ('grid_size', 'its 2D RoPE places each token at the target\'s (row, '
                                   'column)')):
    values = [getattr(getattr(model, 'config', None), field, None) for model in (target, draft)]
    if None not in values and values[0] != values[1]:
      raise ValueError(f'generate: the draft model\'s {field} {values[1]!r} differs from the '
                       f'target\'s {values[0]!r}; {why}. Use a draft model trained for the '
                       'target\'s kind and image size.')


class DrafterMode(Mode):
  """A mode drafted by a draft model: subclasses have a field `drafter`,
  'eagle' (EAGLE-style head on target hidden states) or 'model' (a small
  `DecodeModel`), and implement `draft` and `draft_forwards`."""

  drafter: str

  @property
  def draft_forwards(self) -> int:
    """Drafter forwards per iteration, the catch-up included (chain k: the catch-up
    gives the first draft's law, then k - 1 forwards; a static tree one per level;
    EAGLE-2 the catch-up, then one per expansion)."""
    raise NotImplementedError

  def draft(self, drafter: drafting.Drafter, plan: Plan, draft_params, cache, root_logits,
            root_hidden, uniforms, first_index):
    """Drafts from the drafter's root output. Returns (Drafts with tokens and probs
    (a mode may carry more: `mode_dynamic_tree.TreeDrafts`), the drafter cache)."""
    raise NotImplementedError

  def check(self, *, target, draft, draft_params, cond, num_tokens: int) -> None:
    del num_tokens
    if self.drafter not in (drafting.EAGLE, drafting.MODEL):
      raise ValueError(f"generate: drafter must be 'eagle' or 'model', got {self.drafter!r}.")
    if draft is None or draft_params is None:
      raise ValueError(f'generate: mode {self!r} needs draft= and draft_params=.')
    checks.check_drafter_kind(self.drafter, draft)
    if draft.vocab_size != target.vocab_size:
      raise ValueError(f'generate: draft vocab_size {draft.vocab_size} != target vocab_size '
                       f'{target.vocab_size}; speculative decoding needs one vocabulary.')
    if self.drafter == drafting.EAGLE and draft.hidden_size != target.hidden_size:
      raise ValueError(f'generate: EAGLE drafter hidden_size {draft.hidden_size} != target '
                       f'hidden_size {target.hidden_size}; it consumes target hidden states.')
    if self.drafter == drafting.EAGLE and hasattr(draft, 'check_target'):
      draft.check_target(target)  # e.g. a 2D RoPE table for another grid
    if self.drafter == drafting.MODEL:
      check_same_layout(target, draft)
      # The draft model checks its own conditioning, abstractly (as the target's).
      rows = jnp.shape(jax.tree.leaves(cond)[0])[0]
      cache = jax.eval_shape(lambda: draft.init_cache(rows, draft.prefix_length(cond) + 1))
      jax.eval_shape(draft.prefill, draft_params, cache, cond)

  def draft_capacity(self, *, draft, cond, prefix: int, num_tokens: int) -> int:
    # Catch-up (K+1 slots) plus drafting writes (chain k-1 more; a tree one slot
    # per drafted node) beyond the committed length; drafters are small.
    draft_prefix = int(draft.prefix_length(cond)) if hasattr(draft, 'prefix_length') else prefix
    return draft_prefix + num_tokens + 2 * self.width + 2

  def start(self, plan, draft_params, draft_cond, prefill, first, first_index, uniforms):
    drafter = drafting.Drafter(plan.draft, self.drafter)
    cache = plan.shared_lengths(plan.draft.init_cache(prefill.cache.batch_size,
                                                      plan.draft_capacity))
    cache = drafter.prefill(
        draft_params, sharding.constrain_cache(cache, plan.mesh, plan.rows_per_image),
        draft_cond, prefill.hidden)
    features = prefill.hidden[:, -1:] if drafter.kind == drafting.EAGLE else None
    zero = jnp.zeros((plan.num_images,), jnp.int32)
    committed = drafting.image_rows(cache.lengths, plan.cfg)
    drafts = self._catch_up_and_draft(plan, draft_params, cache, committed, first[:, None],
                                      features, zero, uniforms, first_index)
    return drafts, 1 + self.draft_forwards

  def advance(self, plan, draft_params, drafts, step, uniforms):
    features = None
    if self.drafter == drafting.EAGLE:
      # EAGLE pairs each committed token with the target feature that predicted it.
      rows_path = as_rows(jnp.maximum(step.verdict.path, 0), plan.cfg)
      features = jnp.take_along_axis(step.hidden, rows_path[..., None], axis=1)
    new = self._catch_up_and_draft(plan, draft_params, drafts.cache, drafts.length, step.commit,
                                   features, step.verdict.num_accepted, uniforms,
                                   step.num_generated)
    length = jnp.where(step.keep, new.length, drafts.length)
    cache = kv.set_lengths(new.cache, as_rows(length, plan.cfg))
    return new.replace(cache=cache, length=length), self.draft_forwards

  def _catch_up_and_draft(self, plan, draft_params, cache, committed, tokens, features,
                          num_accepted, uniforms, first_index) -> Drafts:
    """Drafter catch-up on the committed tokens, then `draft`; lengths = new committed."""
    drafter = drafting.Drafter(plan.draft, self.drafter)
    root_logits, root_hidden, cache = drafting.catch_up(
        drafter, draft_params, cache, committed, tokens, features, num_accepted, plan.cfg)
    committed = committed + num_accepted + 1
    drafts, cache = self.draft(drafter, plan, draft_params, cache, root_logits, root_hidden,
                               uniforms, first_index)
    cache = kv.set_lengths(cache, as_rows(committed, plan.cfg))
    return drafts.replace(cache=cache, length=committed)
