"""LlamaGen GPT Flax modules: 2D RoPE, class/caption embedders and the transformer.

Legend: B batch rows, P condition tokens, N image tokens (G x G grid), T new tokens,
S cache slots, V vocabulary, E width, H heads, D head dim, C caption feature width.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import kv_cache as kv
from specdec_jax import protocol
from specdec_jax.models import dense_dot
from specdec_jax.models import layers
from specdec_jax.models.llamagen_config import GPTConfig


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
  cos_table, sin_table = rope_2d_grid_table(head_dim, grid_size, base)  # [G^2, D/2]
  image_index = positions - cls_token_num  # [B, T]
  outside = ((image_index < 0) | (image_index >= grid_size * grid_size))[..., None]
  image_index = jnp.clip(image_index, 0, grid_size * grid_size - 1)
  return (jnp.where(outside, 0.0, cos_table[image_index]),
          jnp.where(outside, 0.0, sin_table[image_index]))


def rope_2d_grid_table(head_dim: int, grid_size: int,
                       base: float = 10000.0) -> tuple[jax.Array, jax.Array]:
  """cos and sin, float32[G^2, D/2], of the image grid's G^2 positions (row-major).

  Computed when the program is traced, by the backend's own cos and sin (the
  values a jitted cos and sin give), and embedded as constants: the decode
  loop then looks rows up instead of evaluating cos and sin, which XLA:CPU
  would otherwise repeat inside every layer's fusions that read them
  (docs/results.md "Forwards as fast inside the loop as alone").
  """
  half = head_dim // 2
  with jax.ensure_compile_time_eval():
    # omega_k = base^(-2k / (D/2)), k = 0..D/4-1 (precompute_freqs_cis_2d).
    freqs = 1.0 / (base ** (jnp.arange(0, half, 2, dtype=jnp.float32)[: half // 2] / half))
    index = jnp.arange(grid_size * grid_size, dtype=jnp.int32)
    rows = (index // grid_size).astype(jnp.float32)
    cols = (index % grid_size).astype(jnp.float32)
    angles = jnp.concatenate([rows[:, None] * freqs, cols[:, None] * freqs], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


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
                     param_dtype=self.dtype, name='embedding_table')
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
                                       (self.num_tokens, self.caption_dim), self.dtype)
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
    dense = lambda name: nn.Dense(self.dim, use_bias=False, dtype=self.dtype,
                                  param_dtype=self.dtype, name=name)
    h = nn.gelu(dense('fc1')(features), approximate=True)
    return dense('fc2')(h)


class GPTModule(nn.Module):
  """The LlamaGen transformer over precomputed input embeddings."""

  config: GPTConfig

  def setup(self):
    c = self.config
    dtype = c.compute_dtype
    self.tok_embeddings = nn.Embed(c.vocab_size, c.dim, dtype=dtype, param_dtype=dtype)
    if c.model_type == 'c2i':
      self.cls_embedding = ClassEmbedder(c.num_classes, c.dim, dtype)
    else:
      self.cls_embedding = CaptionEmbedder(c.caption_dim, c.dim, c.cls_token_num, dtype)
    make_layer = lambda: layers.DecoderLayer(
        num_heads=c.n_head, num_kv_heads=c.n_kv_head, head_dim=c.head_dim,
        ffn_dim=c.ffn_dim, norm_eps=c.norm_eps, rope='interleaved', dtype=dtype,
        param_dtype=dtype, merge_projections=not c.scan_layers,
        transpose_kernels=not c.scan_layers)
    # Scanned: one module `layers` with stacked params; else `layers_{i}`.
    self.layers = make_layer() if c.scan_layers else [make_layer() for _ in range(c.n_layer)]
    self.norm = layers.RMSNorm(c.norm_eps, dtype)
    self.output = nn.Dense(c.vocab_size, use_bias=False, dtype=dtype, param_dtype=dtype,
                           dot_general=dense_dot.weight_dot)

  def embed_tokens(self, tokens: jax.Array) -> jax.Array:
    """int32[B, T] -> [B, T, E]."""
    return self.tok_embeddings(tokens)

  def embed_cond(self, cond: Any) -> jax.Array:
    """class ids int32[B] or caption features [B, P, C] -> [B, P, E]."""
    return self.cls_embedding(cond)

  def null_caption(self) -> jax.Array:
    return self.cls_embedding.null_features()

  def __call__(self, embeds: jax.Array, cache: kv.KVCache, window_mask=None,
               depths=None, logits_at=None):
    """[B, T, E] at each row's length -> (logits f32[B, T, V], hidden, cache).

    logits_at int32[B] (optional): the head at that position only, [B, 1, V].
    """
    c = self.config
    positions = kv.window_positions(cache, embeds.shape[1], depths)  # [B, T]
    cos, sin = rope_2d(positions, c.head_dim, c.grid_size, c.cls_token_num, c.rope_base)
    x = embeds.astype(c.compute_dtype)
    if c.scan_layers:
      x, cache = layers.scan_layers(self.layers, c.n_layer, x, cos, sin, cache, window_mask)
    else:
      for index, layer in enumerate(self.layers):
        x, cache = layer(x, cos, sin, cache, index, window_mask)
    hidden = self.norm(x)
    logits = self.output(protocol.at_positions(hidden, logits_at)).astype(jnp.float32)
    return logits, hidden, kv.advance(cache, embeds.shape[1])

  def init_all(self, tokens, cond, cache):
    """Touches every parameter (used by `init`)."""
    if self.config.model_type == 't2i':
      self.null_caption()
    embeds = jnp.concatenate([self.embed_cond(cond), self.embed_tokens(tokens)], axis=1)
    return self(embeds, cache)


