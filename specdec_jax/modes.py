"""Decoding modes and the checks `decode.generate` runs before compiling anything.

Legend: B images, R cache rows, n image tokens, k chain drafts, N tree nodes,
D tree depth, W Jacobi window, T verify width, K draft slots.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specdec_jax import drafting
from specdec_jax import logits as logits_lib
from specdec_jax import protocol
from specdec_jax import rules as rules_lib
from specdec_jax import verify


@dataclasses.dataclass(frozen=True)
class Vanilla:
  """Plain autoregressive decoding: one target forward per token."""


@dataclasses.dataclass(frozen=True)
class ChainDraft:
  """k drafts per step from an EAGLE-style head ('eagle') or a small AR model ('model')."""

  k: int
  drafter: str = drafting.EAGLE


@dataclasses.dataclass(frozen=True)
class TreeDraft:
  """EAGLE-1 static tree drafting (`verify.StaticTree`), drafter as in ChainDraft."""

  tree: verify.StaticTree
  drafter: str = drafting.EAGLE


@dataclasses.dataclass(frozen=True)
class Jacobi:
  """Speculative Jacobi decoding (SJD; GSD/CSD via their rules): window W, no draft model.

  init 'random' draws fresh drafts uniformly from the target's image tokens
  (`protocol.image_token_range`, e.g. Lumina-mGPT's 8192 ids 4..8195, as SJD's
  released code); 'spatial' repeats the token to the left.
  """

  window: int
  init: str = 'random'


DecodeMode = Vanilla | ChainDraft | TreeDraft | Jacobi


def rule_mode(mode) -> str | None:
  """The `rules` mode name a decoding mode verifies with (None for Vanilla)."""
  if isinstance(mode, ChainDraft):
    return rules_lib.CHAIN
  if isinstance(mode, TreeDraft):
    return rules_lib.TREE
  if isinstance(mode, Jacobi):
    return rules_lib.JACOBI
  return None


def window_width(mode) -> int:
  """T: tokens per verify forward."""
  if isinstance(mode, ChainDraft):
    return mode.k + 1
  if isinstance(mode, TreeDraft):
    return mode.tree.num_nodes
  if isinstance(mode, Jacobi):
    return mode.window
  return 1


def draft_slots(mode) -> int:
  """K: the most drafts one step can accept."""
  if isinstance(mode, TreeDraft):
    return mode.tree.max_depth
  return window_width(mode) - 1


def _leading_dim(cond, what: str) -> int:
  leaves = jax.tree.leaves(cond)
  if not leaves or any(jnp.ndim(x) < 1 for x in leaves):
    raise ValueError(f'generate: {what} must be an array (or pytree of arrays) with a leading '
                     f'row axis, got {cond!r}.')
  sizes = {int(jnp.shape(x)[0]) for x in leaves}
  if len(sizes) != 1:
    raise ValueError(f'generate: every array of {what} needs the same leading row count, got '
                     f'{sorted(sizes)}.')
  return sizes.pop()


def validate(target, target_params, draft, mode, sampling, rule, cond, draft_cond,
             num_tokens, key, draft_params) -> int:
  """Every check `decode.generate` can make before tracing or compiling the loop.

  Raises ValueError naming the argument, the bad value and the fix. Returns the
  number of images B (cache rows R = 2B under CFG).
  """
  if not isinstance(mode, (Vanilla, ChainDraft, TreeDraft, Jacobi)):
    raise ValueError(f'generate: mode must be Vanilla(), ChainDraft(k), TreeDraft(tree) or '
                     f'Jacobi(window), got {mode!r}.')
  if not isinstance(sampling, logits_lib.Sampling):
    raise ValueError(f'generate: sampling must be a specdec_jax.logits.Sampling, got '
                     f'{sampling!r}.')
  if int(num_tokens) < 1:
    raise ValueError(f'generate: num_tokens must be >= 1, got {num_tokens}.')
  mode_name = rule_mode(mode)
  if mode_name is not None:
    if rule is None:
      raise ValueError(f'generate: mode {mode!r} needs an acceptance rule, e.g. '
                       'rule=specdec_jax.rules.Lossless().')
    supported = getattr(rule, 'supports_modes', rules_lib.ALL_MODES)
    if mode_name not in supported:
      raise ValueError(
          f'generate: rule {type(rule).__name__} does not support {mode_name!r} decoding '
          f'(it supports {sorted(supported)}); pick another mode or rule.')
  if isinstance(mode, ChainDraft) and not 1 <= mode.k < num_tokens:
    raise ValueError(f'generate: ChainDraft.k must be in [1, num_tokens={num_tokens}), got '
                     f'{mode.k}.')
  if isinstance(mode, Jacobi):
    if not 2 <= mode.window <= num_tokens:
      raise ValueError(f'generate: Jacobi.window must be in [2, num_tokens={num_tokens}] '
                       f'(1 pending token + window-1 drafts), got {mode.window}.')
    if mode.init not in ('random', 'spatial'):
      raise ValueError(f"generate: Jacobi.init must be 'random' or 'spatial', got "
                       f'{mode.init!r}.')
    protocol.image_token_range(target)  # random drafts are drawn from it: check it now
  if isinstance(mode, TreeDraft) and not isinstance(mode.tree, verify.StaticTree):
    raise ValueError('generate: TreeDraft.tree must be a verify.StaticTree, e.g. '
                     'StaticTree.from_paths(((0,), (1,), (0, 0))).')
  if isinstance(mode, (ChainDraft, TreeDraft)):
    if mode.drafter not in (drafting.EAGLE, drafting.MODEL):
      raise ValueError(f"generate: drafter must be 'eagle' or 'model', got {mode.drafter!r}.")
    if draft is None or draft_params is None:
      raise ValueError(f'generate: mode {mode!r} needs draft= and draft_params=.')
    if draft.vocab_size != target.vocab_size:
      raise ValueError(f'generate: draft vocab_size {draft.vocab_size} != target vocab_size '
                       f'{target.vocab_size}; speculative decoding needs one vocabulary.')
    if mode.drafter == drafting.EAGLE and draft.hidden_size != target.hidden_size:
      raise ValueError(f'generate: EAGLE drafter hidden_size {draft.hidden_size} != target '
                       f'hidden_size {target.hidden_size}; it consumes target hidden states.')
  rows = _leading_dim(cond, 'cond')
  if sampling.uses_cfg and rows % 2:
    raise ValueError(f'generate: with CFG (cfg_scale={sampling.cfg_scale}) cond holds '
                     f'[cond; uncond] rows, so its row count must be even, got {rows}.')
  if draft_cond is not None and _leading_dim(draft_cond, 'draft_cond') != rows:
    raise ValueError(f'generate: draft_cond has {_leading_dim(draft_cond, "draft_cond")} rows, '
                     f'cond has {rows}; they must match.')
  num_images = rows // 2 if sampling.uses_cfg else rows
  # The model checks its own conditioning (shape, dtype, ids): trace only its
  # prefill, abstractly, so a wrong condition fails here and not mid-compile.
  cache = jax.eval_shape(lambda: target.init_cache(rows, target.prefix_length(cond) + 1))
  jax.eval_shape(target.prefill, target_params, cache, cond)
  if getattr(mode, 'drafter', None) == drafting.MODEL:
    draft_cond = cond if draft_cond is None else draft_cond
    cache = jax.eval_shape(lambda: draft.init_cache(rows, draft.prefix_length(draft_cond) + 1))
    jax.eval_shape(draft.prefill, draft_params, cache, draft_cond)
  if not is_single_key(key) and jnp.shape(key)[0] != num_images:
    raise ValueError(f'generate: per-image keys must have {num_images} rows, got shape '
                     f'{jnp.shape(key)}.')
  return num_images


def is_single_key(key) -> bool:
  """A typed key scalar or a raw uint32[2] key (else: per-image keys [B])."""
  if jnp.issubdtype(jnp.result_type(key), jax.dtypes.prng_key):
    return jnp.ndim(key) == 0
  return jnp.ndim(key) == 1


def required_capacity(prefix_length: int, num_tokens: int, mode) -> int:
  """Target cache slots one decode needs: the prefix, n - 1 committed tokens
  and one verify window (frozen finished rows never need more)."""
  return prefix_length + num_tokens - 1 + window_width(mode)
