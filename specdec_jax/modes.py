"""Decoding modes and the checks `decode.generate` runs before compiling anything.

Legend: B images, R cache rows, n image tokens, k chain drafts, N tree nodes,
D tree depth, W Jacobi window, T verify width, K draft slots.

The modes live one concept per module: `mode_base.Mode` (what the loop asks
of a mode, chain defaults) and `DrafterMode` (draft-model modes),
`mode_chain` (Vanilla, ChainDraft, Jacobi), `mode_tree` (TreeDraft),
`mode_dynamic_tree` (DynamicTreeDraft, EAGLE-2), `mode_pac` (JacobiPAC:
SJD-PAC). They are re-exported here; a new mode is a new `Mode` subclass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_jax import checks
from specdec_jax import logits as logits_lib
from specdec_jax import mode_base
from specdec_jax import mode_chain
from specdec_jax import mode_dynamic_tree
from specdec_jax import mode_pac
from specdec_jax import mode_tree
from specdec_jax import rules as rules_lib


Mode, DrafterMode = mode_base.Mode, mode_base.DrafterMode
Vanilla, ChainDraft, Jacobi = mode_chain.Vanilla, mode_chain.ChainDraft, mode_chain.Jacobi
TreeDraft = mode_tree.TreeDraft
DynamicTreeDraft = mode_dynamic_tree.DynamicTreeDraft
JacobiPAC = mode_pac.JacobiPAC
DecodeMode = Mode  # any subclass runs through the loop


def rule_mode(mode) -> str | None:
  """The `rules` mode name a decoding mode verifies with (None for Vanilla)."""
  return mode.rule_mode


def window_width(mode) -> int:
  """T: tokens per verify forward."""
  return mode.width


def draft_slots(mode) -> int:
  """K: the most drafts one step can accept."""
  return mode.slots


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
  if not isinstance(mode, Mode):
    raise ValueError(f'generate: mode must be Vanilla(), ChainDraft(k), TreeDraft(tree), '
                     f'Jacobi(window) or another modes.Mode, got {mode!r}.')
  if not isinstance(sampling, logits_lib.Sampling):
    raise ValueError(f'generate: sampling must be a specdec_jax.logits.Sampling, got '
                     f'{sampling!r}.')
  num_tokens = checks.check_num_tokens(num_tokens)
  checks.check_max_tokens(target, num_tokens, 'the target')
  if getattr(mode, 'drafter', None) == 'model' and draft is not None:
    checks.check_max_tokens(draft, num_tokens, 'the draft model')
  checks.check_rule(rule)
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
    rule.check_vocab(int(target.vocab_size))
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
  # The mode's own checks (its sizes, its drafter and the drafter's conditioning).
  mode.check(target=target, draft=draft, draft_params=draft_params,
             cond=cond if draft_cond is None else draft_cond, num_tokens=num_tokens)
  if hasattr(target, 'check_sampling'):  # e.g. Lumina-mGPT without its image layout
    target.check_sampling(sampling, cond)
  # Values last: the checks above made sure the conditioning has the right structure.
  checks.check_values(target, draft, mode, cond, draft_cond, sampling.uses_cfg)
  checks.check_key(key, num_images)
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
