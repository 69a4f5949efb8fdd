"""LlamaGen GPT (class- and text-conditional), implementing the engine's `DecodeModel`.

Legend: B batch rows (with CFG: conditional rows first, then unconditional
rows), P condition tokens (cls_token_num: 1 for c2i, 120 for t2i), N image
tokens (G x G grid, block_size), T new tokens, S cache slots, V vocabulary,
E width (dim), H heads, D head dim, C caption feature width.

Architecture (FoundationVision/LlamaGen `autoregressive/models/gpt.py`): the
sequence is [P condition embeddings, image token embeddings]; N pre-norm Llama
blocks (RMSNorm, bias-free attention with interleaved-pair 2D RoPE, SwiGLU),
final RMSNorm, untied `output` head, float32 logits.

2D RoPE (`rope_2d`): the position id p of a slot is its index in the sequence.
Condition slots (p < P) get cos = sin = 0, so their rotated queries and keys
are exactly zero (they contribute through the values only). Image token n
(p = P + n) sits at row n // G, column n % G; the first D/4 rotation pairs use
the row, the last D/4 the column, with frequencies base^(-2k / (D/2)).
Positions past the grid (only reachable by draft windows running beyond the
last image token) get zero rotation too, like LANTERN's padded table.

Conditioning:
  c2i: class ids int32[B]; id `num_classes` is the null class used by CFG.
  t2i: `CaptionCond(features [B, P, C], mask bool[B, P])`, left padded (real
    tokens at the end, see `left_pad_captions`). Padding slots are invalid
    keys for every later query; a padding position attends to itself only,
    as in the original's `emb_masks` handling.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import kv_cache as kv
from specdec_jax import protocol
# Configuration and Flax modules live in their own modules; re-exported here.
from specdec_jax.models.llamagen_config import (MODEL_TYPES, PRESETS, T2I_CAPTION_TOKENS,
                                                GPTConfig, find_multiple, gpt_config)
from specdec_jax.models.llamagen_modules import (CaptionCond, CaptionEmbedder, ClassEmbedder,
                                                 GPTModule, _as_caption, _CaptionMLP,
                                                 left_pad_captions, rope_2d)


@dataclasses.dataclass(frozen=True)
class LlamaGenGPT:
  """LlamaGen GPT as a `DecodeModel`.

  Params are the Flax tree of `GPTModule`: `tok_embeddings`, `cls_embedding`,
  `layers_{i}` (DecoderLayer; with `scan_layers`, one `layers` tree with a
  leading layer axis), `norm`, `output` (see `converters/llamagen.py` for the
  mapping from the original keys).
  """

  config: GPTConfig
  # prefill and forward take logits_at (`protocol.prefill_last`, drafters' catch-up).
  head_at_one_position = True

  @property
  def module(self) -> GPTModule:
    return GPTModule(self.config)

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def image_token_range(self) -> tuple[int, int]:
    """Every token is a VQ code; see `protocol.image_token_range`."""
    return 0, self.config.vocab_size

  @property
  def hidden_size(self) -> int:
    return self.config.dim

  @property
  def max_image_tokens(self) -> int:
    """N: the image grid's tokens (2D RoPE has no position past it)."""
    return self.config.block_size

  def check_cond(self, cond: Any) -> None:
    """Checks a concrete condition's values too (`specdec_jax.checks`)."""
    rows = jax.tree.leaves(cond)[0].shape[0] if jax.tree.leaves(cond) else 0
    self._check_cond(cond, rows, 'generate: cond')

  def check_cfg_cond(self, cond: Any) -> None:
    """Warns when guided c2i rows [cond; uncond] have no null class in their second
    half: most likely labels passed without `cfg_cond` (then half of them guide
    the other half as if unconditional)."""
    if self.config.model_type != 'c2i':
      return
    labels = np.asarray(cond)
    if labels.size and not np.any(labels[labels.shape[0] // 2:] == self.config.num_classes):
      warnings.warn(
          f'generate: CFG is on but no unconditional row of cond (its second half, '
          f'{labels[labels.shape[0] // 2:].tolist()[:8]}) holds the null class '
          f'{self.config.num_classes}; pass model.cfg_cond(params, labels) as cond.',
          RuntimeWarning, stacklevel=3)

  def check_unguided_cond(self, cond: Any) -> None:
    """Warns when unguided c2i labels look like `cfg_cond`'s rows: only the null
    class in the second half and none in the first (then half of the images are
    unconditional and the batch is twice the one meant)."""
    if self.config.model_type != 'c2i':
      return
    labels, null = np.asarray(cond), self.config.num_classes
    half = labels.shape[0] // 2
    if half and np.all(labels[half:] == null) and not np.any(labels[:half] == null):
      warnings.warn(
          f'generate: CFG is off (cfg_scale 1) but cond looks like cfg_cond rows: its '
          f'second half is all the null class {null}, so {labels.shape[0] - half} of the '
          f'{labels.shape[0]} images are unconditional. Pass the labels themselves as cond, '
          'or set Sampling(cfg_scale > 1) to guide.', RuntimeWarning, stacklevel=3)

  def prefix_length(self, cond: Any) -> int:
    del cond
    return self.config.cls_token_num

  def init_cache(self, batch_size: int, capacity: int) -> kv.KVCache:
    c = self.config
    return kv.init_cache(num_layers=c.n_layer, batch_size=batch_size,
                         capacity=capacity, num_kv_heads=c.n_kv_head,
                         head_dim=c.head_dim, dtype=c.compute_dtype,
                         stacked=c.scan_layers)

  def init_params(self, rng: jax.Array) -> Any:
    """Random parameters (tests, benchmarks, the bundled model's training)."""
    c = self.config
    cache = self.init_cache(1, c.cls_token_num + 1)
    tokens = jnp.zeros((1, 1), jnp.int32)
    if c.model_type == 'c2i':
      cond = jnp.zeros((1,), jnp.int32)
    else:
      cond = jnp.zeros((1, c.cls_token_num, c.caption_dim), jnp.float32)
    return _init_params(self, rng, tokens, cond, cache)

  def null_cond(self, params: Any, batch_size: int) -> Any:
    """The unconditional condition for CFG rows (null class / uncond caption)."""
    c = self.config
    if c.model_type == 'c2i':
      return jnp.full((batch_size,), c.num_classes, jnp.int32)
    null = self.module.apply({'params': params}, method=GPTModule.null_caption)
    return CaptionCond(features=jnp.broadcast_to(null, (batch_size,) + null.shape),
                       mask=None)

  def cfg_cond(self, params: Any, cond: Any) -> Any:
    """[cond; uncond] rows for CFG, as LlamaGen's generate() builds them: c2i class
    ids int32[B] -> int32[2B] (second half the null class `num_classes`); t2i a
    CaptionCond of B rows -> one of 2B rows (second half the null caption).

    t2i: the unconditional rows reuse the conditional rows' mask (as the
    original does with `emb_masks`).
    """
    if self.config.model_type == 'c2i':
      labels = jnp.asarray(cond)
      if labels.ndim != 1:
        raise ValueError(f'cfg_cond: c2i cond must be int class ids [B], got shape '
                         f'{tuple(labels.shape)}.')
      labels = self._check_cond(labels, labels.shape[0], 'cfg_cond')
      return jnp.concatenate([labels, self.null_cond(params, labels.shape[0])])
    caption = _as_caption(cond)
    null = self.null_cond(params, caption.features.shape[0]).features.astype(
        caption.features.dtype)
    mask = None if caption.mask is None else jnp.concatenate([caption.mask, caption.mask])
    return CaptionCond(features=jnp.concatenate([caption.features, null]), mask=mask)

  def _check_cond(self, cond: Any, batch_size: int, what: str) -> Any:
    c = self.config
    if c.model_type == 'c2i':
      labels = jnp.asarray(cond)
      if labels.shape != (batch_size,) or not jnp.issubdtype(labels.dtype, jnp.integer):
        raise ValueError(f'{what}: c2i cond must be int class ids of shape '
                         f'({batch_size},) (one per cache row), got {labels.dtype}'
                         f'{tuple(labels.shape)}.')
      if not isinstance(labels, jax.core.Tracer):
        ids = np.asarray(labels)
        if ids.size and (ids.min() < 0 or ids.max() > c.num_classes):
          raise ValueError(f'{what}: class ids must lie in [0, {c.num_classes}] '
                           f'({c.num_classes} = null class), got min {ids.min()}, '
                           f'max {ids.max()}.')
      return labels.astype(jnp.int32)
    caption = _as_caption(cond)
    want = (batch_size, c.cls_token_num, c.caption_dim)
    if tuple(caption.features.shape) != want:
      raise ValueError(f'{what}: t2i caption features must have shape {want} '
                       f'(rows, cls_token_num, caption_dim), got '
                       f'{tuple(caption.features.shape)}.')
    if caption.mask is not None:
      if tuple(caption.mask.shape) != want[:2]:
        raise ValueError(f'{what}: caption mask must have shape {want[:2]}, got '
                         f'{tuple(caption.mask.shape)}.')
      if not isinstance(caption.mask, jax.core.Tracer):
        m = np.asarray(caption.mask, bool)
        if (m[:, 1:] < m[:, :-1]).any() or not m[:, -1].all():
          raise ValueError(f'{what}: caption mask must be left padded (False '
                           'then True, last slot True); use left_pad_captions.')
    return caption

  def prefill(self, params: Any, cache: kv.KVCache, cond: Any,
              logits_at: jax.Array | None = None) -> protocol.ForwardOutput:
    """Runs the P condition tokens on a fresh cache, in one forward.

    Returns logits [B, P, V] (the last predicts image token 0; [B, 1, V] at
    logits_at int32[B] only, `protocol.prefill_last`). A t2i padding
    mask marks the padding slots invalid keys (`key_valid`); the cache's
    mask then lets a padding query see only itself and a real query the real
    slots before it and itself, the original's emb_masks + diagonal.
    """
    c = self.config
    kv.check_capacity(cache.capacity, c.cls_token_num, 'LlamaGenGPT.prefill')
    cond = self._check_cond(cond, cache.batch_size, 'LlamaGenGPT.prefill')
    features = cond if c.model_type == 'c2i' else cond.features
    embeds = self.module.apply({'params': params}, features, method=GPTModule.embed_cond)
    if c.model_type == 't2i' and cond.mask is not None:
      mask = jnp.asarray(cond.mask, bool)
      cache = cache.replace(key_valid=cache.key_valid.at[:, : c.cls_token_num].set(mask))
    return self._run(params, cache, embeds, logits_at=logits_at)

  def forward(self, params: Any, cache: kv.KVCache, tokens: jax.Array,
              window_mask: jax.Array | None = None,
              depths: jax.Array | None = None,
              logits_at: jax.Array | None = None) -> protocol.ForwardOutput:
    """Runs T image tokens int32[B, T] at each row's length (see protocol).

    logits_at int32[B] (optional): logits [B, 1, V] at that position only.
    """
    embeds = self.module.apply({'params': params}, tokens, method=GPTModule.embed_tokens)
    return self._run(params, cache, embeds, window_mask, depths, logits_at)

  def _run(self, params, cache, embeds, window_mask=None, depths=None, logits_at=None):
    protocol.check_logits_at(logits_at, embeds.shape[0], 'LlamaGenGPT')
    logits, hidden, cache = self.module.apply(
        {'params': params}, embeds, cache, window_mask, depths, logits_at)
    return protocol.ForwardOutput(logits=logits, hidden=hidden, cache=cache)


@functools.partial(jax.jit, static_argnums=(1,))
def forward_logits(params: Any, config: GPTConfig, cond: Any, tokens: jax.Array) -> jax.Array:
  """Teacher-forced logits, equal to the original `GPT.forward(idx, cond)[0]`.

  The input is [P condition tokens, image tokens idx[:, 0..M-1]]; the output
  keeps positions P-1.. (the original's `logits[:, cls_token_num - 1:]`), so
  entry i predicts image token i.

  Args:
    params: GPT params.
    config: the GPTConfig.
    cond: class ids int32[B] (c2i) or `CaptionCond` (t2i).
    tokens: int32[B, M] image tokens fed as input (M <= N - 1; for training,
      the first N - 1 of the N targets).
  Returns:
    float32[B, M + 1, V]. Jitted with `config` static.
  """
  model = LlamaGenGPT(config)
  batch, num_tokens = tokens.shape
  if num_tokens > config.block_size - 1:
    raise ValueError(f'forward_logits: at most block_size - 1 = '
                     f'{config.block_size - 1} input tokens, got {num_tokens}.')
  cache = model.init_cache(batch, config.cls_token_num + max(num_tokens, 1))
  prefix = model.prefill(params, cache, cond)
  if num_tokens == 0:
    return prefix.logits[:, -1:]
  rest = model.forward(params, prefix.cache, tokens)
  return jnp.concatenate([prefix.logits[:, -1:], rest.logits], axis=1)


@functools.partial(jax.jit, static_argnums=0)
def _init_params(model: LlamaGenGPT, rng, tokens, cond, cache) -> Any:
  """`LlamaGenGPT.init_params`, compiled once per model config (eager init is slow; a
  jit built per call would trace again on every call)."""
  return model.module.init(rng, tokens, cond, cache, method=GPTModule.init_all)['params']
