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
import math
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import kv_cache as kv
from specdec_jax import protocol
from specdec_jax.models import layers

MODEL_TYPES = ('c2i', 't2i')
T2I_CAPTION_TOKENS = 120

# name: (n_layer, n_head, dim), from `GPT_models` in the original gpt.py.
PRESETS = {
    'GPT-B': (12, 12, 768),
    'GPT-L': (24, 16, 1024),
    'GPT-XL': (36, 20, 1280),
    'GPT-XXL': (48, 24, 1536),
    'GPT-XXXL': (48, 40, 2560),
    'GPT-1B': (22, 32, 2048),
    'GPT-3B': (24, 32, 3200),
    'GPT-7B': (32, 32, 4096),
}


def find_multiple(n: int, k: int) -> int:
  """Smallest multiple of k that is >= n."""
  return n if n % k == 0 else n + k - (n % k)


@dataclasses.dataclass(frozen=True)
class GPTConfig:
  """LlamaGen GPT dimensions (defaults: GPT-B c2i at 256 px).

  Attributes:
    ffn_dim: SwiGLU width F; None computes find_multiple(int(2*4*dim/3),
      multiple_of) as the original does.
    block_size: number of image tokens N = G^2 ((image_size / 16)^2).
    cls_token_num: P, condition tokens in front of the image.
    dtype: compute and cache dtype name ('float32' or 'bfloat16').
  """

  n_layer: int = 12
  n_head: int = 12
  dim: int = 768
  n_kv_head: int | None = None
  ffn_dim: int | None = None
  multiple_of: int = 256
  vocab_size: int = 16384
  rope_base: float = 10000.0
  norm_eps: float = 1e-5
  model_type: str = 'c2i'
  num_classes: int = 1000
  caption_dim: int = 2048
  cls_token_num: int = 1
  block_size: int = 256
  dtype: str = 'float32'

  def __post_init__(self):
    if self.n_kv_head is None:
      object.__setattr__(self, 'n_kv_head', self.n_head)
    if self.ffn_dim is None:
      object.__setattr__(self, 'ffn_dim',
                         find_multiple(int(2 * 4 * self.dim / 3), self.multiple_of))
    if self.model_type not in MODEL_TYPES:
      raise ValueError(f'GPTConfig: model_type must be one of {MODEL_TYPES}, got '
                       f'{self.model_type!r}.')
    if self.dim % self.n_head:
      raise ValueError(f'GPTConfig: dim {self.dim} must be divisible by n_head '
                       f'{self.n_head}.')
    if self.n_head % self.n_kv_head:
      raise ValueError(f'GPTConfig: n_head {self.n_head} must be a multiple of '
                       f'n_kv_head {self.n_kv_head}.')
    if self.head_dim % 4:
      raise ValueError(f'GPTConfig: head_dim {self.head_dim} must be a multiple of '
                       '4 (2D RoPE splits the rotation pairs between rows and '
                       'columns).')
    if math.isqrt(self.block_size) ** 2 != self.block_size:
      raise ValueError(f'GPTConfig: block_size {self.block_size} must be a '
                       'square number (grid^2 = (image_size/16)^2).')
    if self.cls_token_num < 1:
      raise ValueError(f'GPTConfig: cls_token_num must be >= 1, got '
                       f'{self.cls_token_num}.')
    jnp.dtype(self.dtype)  # raises on an unknown dtype name

  @property
  def head_dim(self) -> int:
    return self.dim // self.n_head

  @property
  def grid_size(self) -> int:
    return math.isqrt(self.block_size)

  @property
  def compute_dtype(self) -> Any:
    return jnp.dtype(self.dtype)


def gpt_config(name: str, *, image_size: int | None = None, downsample: int = 16,
               **overrides) -> GPTConfig:
  """A preset ('GPT-B' ... 'GPT-7B', or 'B', 'XL', ...) with overrides.

  Args:
    name: preset name.
    image_size: sets block_size = (image_size / downsample)^2.
    downsample: VQ downsampling factor (16 for VQ-16).
    **overrides: any GPTConfig field. model_type='t2i' implies
      cls_token_num=120 unless given.
  """
  key = name.upper().replace('_', '-')
  key = key if key.startswith('GPT-') else f'GPT-{key}'
  if key not in PRESETS:
    raise ValueError(f'Unknown LlamaGen config {name!r}; choose one of '
                     f'{sorted(PRESETS)}.')
  n_layer, n_head, dim = PRESETS[key]
  fields = dict(n_layer=n_layer, n_head=n_head, dim=dim)
  if overrides.get('model_type') == 't2i':
    fields['cls_token_num'] = T2I_CAPTION_TOKENS
  if image_size is not None:
    if image_size % downsample:
      raise ValueError(f'image_size {image_size} must be a multiple of the VQ '
                       f'downsampling {downsample}.')
    fields['block_size'] = (image_size // downsample) ** 2
  fields.update(overrides)
  return GPTConfig(**fields)


# ------------------------------------------------------------------ RoPE ---


def rope_2d(positions: jax.Array, head_dim: int, grid_size: int,
            cls_token_num: int, base: float = 10000.0) -> tuple[jax.Array, jax.Array]:
  """LlamaGen's 2D rotary table, looked up at position ids.

  Args:
    positions: int32[B, T] position ids (slot index in the sequence).
    head_dim: D (multiple of 4).
    grid_size: G.
    cls_token_num: P; positions below it get cos = sin = 0.
    base: rotary base.
  Positions at or past P + G^2 also get cos = sin = 0 (the original table
  ends there; LANTERN's drafter pads it with zero rows). Only draft windows
  running past the last image token reach them.
  Returns:
    (cos, sin), float32[B, T, D/2], for `layers.apply_rope_interleaved`.
  """
  half = head_dim // 2
  # omega_k = base^(-2k / (D/2)), k = 0..D/4-1 (precompute_freqs_cis_2d).
  freqs = 1.0 / (base ** (jnp.arange(0, half, 2, dtype=jnp.float32)[: half // 2] / half))
  image_index = positions - cls_token_num  # [B, T]
  is_cond = (image_index < 0) | (image_index >= grid_size * grid_size)
  image_index = jnp.maximum(image_index, 0)
  rows = (image_index // grid_size).astype(jnp.float32)
  cols = (image_index % grid_size).astype(jnp.float32)
  angles = jnp.concatenate([rows[..., None] * freqs, cols[..., None] * freqs], axis=-1)
  zero = is_cond[..., None]
  return (jnp.where(zero, 0.0, jnp.cos(angles)), jnp.where(zero, 0.0, jnp.sin(angles)))


# ---------------------------------------------------------- conditioning ---


@flax.struct.dataclass
class CaptionCond:
  """Text condition of the t2i model.

  Attributes:
    features: [B, P, C] FLAN-T5 features, left padded, zero on padding.
    mask: bool[B, P], True on real tokens (a suffix of each row), or None
      when every slot is real.
  """

  features: jax.Array
  mask: jax.Array | None = None


def left_pad_captions(features: jax.Array, mask: jax.Array) -> CaptionCond:
  """Turns right-padded T5 outputs into the left-padded condition LlamaGen uses.

  Rotates each row so its valid tokens end the row, flips the mask and zeroes
  the padding features (sample_t2i.py's left-padding step).

  Args:
    features: [B, P, C], valid tokens first.
    mask: [B, P], 1 on valid tokens (a prefix of each row).
  """
  mask = jnp.asarray(mask).astype(bool)
  num_valid = jnp.sum(mask, axis=1)  # [B]
  length = features.shape[1]
  source = (jnp.arange(length)[None, :] + num_valid[:, None]) % length  # [B, P]
  rotated = jnp.take_along_axis(features, source[:, :, None], axis=1)
  new_mask = jnp.flip(mask, axis=1)
  return CaptionCond(features=rotated * new_mask[:, :, None].astype(rotated.dtype),
                     mask=new_mask)


def _as_caption(cond: Any) -> CaptionCond:
  if isinstance(cond, CaptionCond):
    return cond
  if isinstance(cond, dict):
    return CaptionCond(features=cond['features'], mask=cond.get('mask'))
  return CaptionCond(features=cond)


class ClassEmbedder(nn.Module):
  """c2i: one embedding per class, plus the null class (row num_classes)."""

  num_classes: int
  dim: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, labels: jax.Array) -> jax.Array:
    """labels int32[B] -> [B, 1, E]."""
    table = nn.Embed(self.num_classes + 1, self.dim, dtype=self.dtype,
                     name='embedding_table')
    return table(labels)[:, None, :]


class CaptionEmbedder(nn.Module):
  """t2i `cls_embedding`: `cap_proj` (fc1 -> GELU(tanh) -> fc2) and `uncond_embedding`."""

  caption_dim: int
  dim: int
  num_tokens: int
  dtype: Any = jnp.float32

  def setup(self):
    init = nn.initializers.normal(stddev=self.caption_dim ** -0.5)
    self.uncond_embedding = self.param('uncond_embedding', init,
                                       (self.num_tokens, self.caption_dim))
    self.cap_proj = _CaptionMLP(self.dim, self.dtype)

  def __call__(self, features: jax.Array) -> jax.Array:
    """[B, P, C] -> [B, P, E]."""
    return self.cap_proj(features)

  def null_features(self) -> jax.Array:
    """[P, C], the unconditional caption (a buffer in the original)."""
    return self.uncond_embedding


class _CaptionMLP(nn.Module):
  """`cap_proj`: two bias-free Linear layers with a tanh-GELU between."""

  dim: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, features: jax.Array) -> jax.Array:
    """[B, P, C] -> fc1 -> GELU(tanh) -> fc2 -> [B, P, E]."""
    h = nn.Dense(self.dim, use_bias=False, dtype=self.dtype, name='fc1')(features)
    h = nn.gelu(h, approximate=True)
    return nn.Dense(self.dim, use_bias=False, dtype=self.dtype, name='fc2')(h)


class GPTModule(nn.Module):
  """The LlamaGen transformer over precomputed input embeddings."""

  config: GPTConfig

  def setup(self):
    c = self.config
    dtype = c.compute_dtype
    self.tok_embeddings = nn.Embed(c.vocab_size, c.dim, dtype=dtype)
    if c.model_type == 'c2i':
      self.cls_embedding = ClassEmbedder(c.num_classes, c.dim, dtype)
    else:
      self.cls_embedding = CaptionEmbedder(c.caption_dim, c.dim, c.cls_token_num, dtype)
    self.layers = [
        layers.DecoderLayer(
            num_heads=c.n_head, num_kv_heads=c.n_kv_head, head_dim=c.head_dim,
            ffn_dim=c.ffn_dim, norm_eps=c.norm_eps, rope='interleaved', dtype=dtype)
        for _ in range(c.n_layer)
    ]
    self.norm = layers.RMSNorm(c.norm_eps)
    self.output = nn.Dense(c.vocab_size, use_bias=False, dtype=dtype)

  def embed_tokens(self, tokens: jax.Array) -> jax.Array:
    """int32[B, T] -> [B, T, E]."""
    return self.tok_embeddings(tokens)

  def embed_cond(self, cond: Any) -> jax.Array:
    """class ids int32[B] or caption features [B, P, C] -> [B, P, E]."""
    return self.cls_embedding(cond)

  def null_caption(self) -> jax.Array:
    return self.cls_embedding.null_features()

  def __call__(self, embeds: jax.Array, cache: kv.KVCache, window_mask=None,
               depths=None):
    """[B, T, E] at each row's length -> (logits f32[B, T, V], hidden, cache)."""
    c = self.config
    positions = kv.window_positions(cache, embeds.shape[1], depths)  # [B, T]
    cos, sin = rope_2d(positions, c.head_dim, c.grid_size, c.cls_token_num, c.rope_base)
    x = embeds.astype(c.compute_dtype)
    for index, layer in enumerate(self.layers):
      x, cache = layer(x, cos, sin, cache, index, window_mask)
    hidden = self.norm(x)
    logits = self.output(hidden).astype(jnp.float32)
    return logits, hidden, kv.advance(cache, embeds.shape[1])

  def init_all(self, tokens, cond, cache):
    """Touches every parameter (used by `init`)."""
    if self.config.model_type == 't2i':
      self.null_caption()
    embeds = jnp.concatenate([self.embed_cond(cond), self.embed_tokens(tokens)], axis=1)
    return self(embeds, cache)


# ------------------------------------------------------------ the model ---


@dataclasses.dataclass(frozen=True)
class LlamaGenGPT:
  """LlamaGen GPT as a `DecodeModel`.

  Params are the Flax tree of `GPTModule`: `tok_embeddings`, `cls_embedding`,
  `layers_{i}` (DecoderLayer), `norm`, `output` (see
  `converters/llamagen.py` for the mapping from the original keys).
  """

  config: GPTConfig

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

  def prefix_length(self, cond: Any) -> int:
    del cond
    return self.config.cls_token_num

  def init_cache(self, batch_size: int, capacity: int) -> kv.KVCache:
    c = self.config
    return kv.init_cache(num_layers=c.n_layer, batch_size=batch_size,
                         capacity=capacity, num_kv_heads=c.n_kv_head,
                         head_dim=c.head_dim, dtype=c.compute_dtype)

  def init_params(self, rng: jax.Array) -> Any:
    """Random parameters (tests, benchmarks, the bundled model's training)."""
    c = self.config
    cache = self.init_cache(1, c.cls_token_num + 1)
    tokens = jnp.zeros((1, 1), jnp.int32)
    if c.model_type == 'c2i':
      cond = jnp.zeros((1,), jnp.int32)
    else:
      cond = jnp.zeros((1, c.cls_token_num, c.caption_dim), jnp.float32)
    init = functools.partial(self.module.init, method=GPTModule.init_all)
    return jax.jit(init)(rng, tokens, cond, cache)['params']  # jit: eager init is slow

  def null_cond(self, params: Any, batch_size: int) -> Any:
    """The unconditional condition for CFG rows (null class / uncond caption)."""
    c = self.config
    if c.model_type == 'c2i':
      return jnp.full((batch_size,), c.num_classes, jnp.int32)
    null = self.module.apply({'params': params}, method=GPTModule.null_caption)
    return CaptionCond(features=jnp.broadcast_to(null, (batch_size,) + null.shape),
                       mask=None)

  def cfg_cond(self, params: Any, cond: Any) -> Any:
    """[cond; uncond] rows for CFG, as LlamaGen's generate() builds them.

    t2i: the unconditional rows reuse the conditional rows' mask (as the
    original does with `emb_masks`).
    """
    if self.config.model_type == 'c2i':
      labels = jnp.asarray(cond, jnp.int32)
      return jnp.concatenate([labels, self.null_cond(params, labels.shape[0]).astype(labels.dtype)])
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

  def prefill(self, params: Any, cache: kv.KVCache, cond: Any) -> protocol.ForwardOutput:
    """Runs the P condition tokens on a fresh cache.

    Returns logits [B, P, V] (the last predicts image token 0). With a t2i
    padding mask the condition runs one token per forward (see below).
    """
    c = self.config
    kv.check_capacity(cache.capacity, c.cls_token_num, 'LlamaGenGPT.prefill')
    cond = self._check_cond(cond, cache.batch_size, 'LlamaGenGPT.prefill')
    features = cond if c.model_type == 'c2i' else cond.features
    embeds = self.module.apply({'params': params}, features, method=GPTModule.embed_cond)
    if c.model_type == 'c2i' or cond.mask is None:
      return self._run(params, cache, embeds)
    # Padding differs per row, but a window mask is shared by all rows, and
    # `key_valid` only masks slots before a row's length. One slot per forward
    # keeps every padding slot in the masked prefix: a padding query then sees
    # only itself (its own slot is in the window), a real query sees the real
    # slots before it and itself, exactly the original's emb_masks + diagonal.
    mask = jnp.asarray(cond.mask, bool)
    cache = cache.replace(key_valid=cache.key_valid.at[:, : c.cls_token_num].set(mask))

    def step(carry, column):
      out = self._run(params, carry, column[:, None, :])
      return out.cache, (out.logits[:, 0], out.hidden[:, 0])

    cache, (logits, hidden) = jax.lax.scan(step, cache, jnp.swapaxes(embeds, 0, 1))
    return protocol.ForwardOutput(logits=jnp.swapaxes(logits, 0, 1),
                                  hidden=jnp.swapaxes(hidden, 0, 1), cache=cache)

  def forward(self, params: Any, cache: kv.KVCache, tokens: jax.Array,
              window_mask: jax.Array | None = None,
              depths: jax.Array | None = None) -> protocol.ForwardOutput:
    """Runs T image tokens int32[B, T] at each row's length (see protocol)."""
    embeds = self.module.apply({'params': params}, tokens, method=GPTModule.embed_tokens)
    return self._run(params, cache, embeds, window_mask, depths)

  def _run(self, params, cache, embeds, window_mask=None, depths=None):
    logits, hidden, cache = self.module.apply(
        {'params': params}, embeds, cache, window_mask, depths)
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
