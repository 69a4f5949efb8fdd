"""VQ image tokenizers: LlamaGen VQ-16 (also Janus-Pro's), Chameleon VQGAN, small VQs.

A `VQTokenizer` is a frozen description (its `VQConfig`); parameters are a
separate pytree:

  {'encoder': ..., 'quant_conv': ..., 'quantize': {'embedding': [V, Cq]},
   'post_quant_conv': ..., 'decoder': ...}

Images are NHWC. `encode` takes uint8 images in [0, 255] (mapped to [-1, 1] as
x / 127.5 - 1, LlamaGen's Normalize(0.5, 0.5)) or float images already in
[-1, 1]; `decode` returns float images in about [-1, 1]; `to_uint8` applies the
original repository's conversion. Tokens are raster-ordered codebook indices.

Quantisation is nearest codebook entry in squared L2 distance; with
`codebook_l2_norm` (LlamaGen) both the latents and the codebook rows are
L2-normalised first, at encode and at decode lookup alike. Chameleon looks up
raw rows.

Legend: B batch, H/W image size, C image channels, h/w latent grid
(H/f, W/f with f = 2^(len(ch_mult)-1)), N = h*w tokens, V codebook size,
Cq codebook dim.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.models import vq_blocks
# The configuration lives in vq_config; re-exported here.
from specdec_jax.models.vq_config import (UINT8_STYLES, VQConfig, chameleon_vqgan_config,
                                          small_vq_config, vq16_config)


def l2_normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
  """x / max(||x||, eps) over the last axis (torch.nn.functional.normalize)."""
  norm = jnp.sqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True))
  return x / jnp.maximum(norm, eps)


def nearest_codes(latents: jax.Array, codebook: jax.Array) -> jax.Array:
  """Index of the nearest codebook row (squared L2; ties -> lowest index).

  Args:
    latents: [..., Cq].
    codebook: [V, Cq].
  Returns:
    int32[...].
  """
  flat = latents.reshape(-1, latents.shape[-1]).astype(jnp.float32)
  book = codebook.astype(jnp.float32)
  # |z|^2 + |e|^2 - 2 z.e, at full precision: the argmin is sensitive to it.
  dots = jnp.einsum('nc,vc->nv', flat, book, precision=jax.lax.Precision.HIGHEST)
  dist = (jnp.sum(flat * flat, axis=1, keepdims=True) + jnp.sum(book * book, axis=1)[None]
          - 2.0 * dots)  # [N, V]
  return jnp.argmin(dist, axis=1).astype(jnp.int32).reshape(latents.shape[:-1])


class Codebook(nn.Module):
  """Holds the codebook `embedding` [V, Cq] (LlamaGen's uniform(-1/V, 1/V) init)."""

  codebook_size: int
  codebook_dim: int
  l2_norm: bool

  @nn.compact
  def __call__(self) -> jax.Array:
    def init(rng, shape, dtype=jnp.float32):
      table = jax.random.uniform(rng, shape, dtype, -1.0 / shape[0], 1.0 / shape[0])
      return l2_normalize(table) if self.l2_norm else table
    return self.param('embedding', init, (self.codebook_size, self.codebook_dim))


class VQAutoencoder(nn.Module):
  """encoder -> quant_conv -> (quantize) -> post_quant_conv -> decoder."""

  config: VQConfig

  def setup(self):
    cfg = self.config
    self.encoder = vq_blocks.Encoder(cfg)
    self.quant_conv = nn.Conv(cfg.codebook_dim, (1, 1), dtype=cfg.compute_dtype)
    self.quantize = Codebook(cfg.codebook_size, cfg.codebook_dim, cfg.codebook_l2_norm)
    self.post_quant_conv = nn.Conv(cfg.z_channels, (1, 1), dtype=cfg.compute_dtype)
    self.decoder = vq_blocks.Decoder(cfg)

  def encode_latents(self, images: jax.Array) -> jax.Array:
    """float images [B, H, W, C] in [-1, 1] -> pre-quant latents [B, h, w, Cq]."""
    return self.quant_conv(self.encoder(images))

  def lookup_table(self) -> jax.Array:
    """The [V, Cq] rows latents are compared with (normalised if configured)."""
    table = self.quantize()
    return l2_normalize(table) if self.config.codebook_l2_norm else table

  def decode_latents(self, quantized: jax.Array) -> jax.Array:
    """[B, h, w, Cq] -> float images [B, H, W, C]."""
    return self.decoder(self.post_quant_conv(quantized))

  def __call__(self, images: jax.Array) -> jax.Array:
    """Touches every parameter (used by `init`); straight reconstruction."""
    latents = self.encode_latents(images)
    table = self.lookup_table()
    if self.config.codebook_l2_norm:
      latents = l2_normalize(latents)
    return self.decode_latents(table[nearest_codes(latents, table)])


def _apply(config: VQConfig, params: Any, method: str, *args):
  module = VQAutoencoder(config)
  return module.apply({'params': params}, *args, method=getattr(VQAutoencoder, method))


@functools.partial(jax.jit, static_argnums=0)
def _encode(config: VQConfig, params: Any, images: jax.Array):
  latents = _apply(config, params, 'encode_latents', images)  # [B, h, w, Cq]
  table = _apply(config, params, 'lookup_table')
  normed = l2_normalize(latents) if config.codebook_l2_norm else latents
  return latents, nearest_codes(normed, table)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _decode(config: VQConfig, params: Any, tokens: jax.Array, grid: tuple[int, int]):
  table = _apply(config, params, 'lookup_table')  # [V, Cq]
  quantized = jnp.take(table, tokens, axis=0).reshape(tokens.shape[0], *grid, -1)
  return _apply(config, params, 'decode_latents', quantized)


def _is_concrete(x: Any) -> bool:
  return not isinstance(x, jax.core.Tracer)


def preprocess_images(images: jax.Array, channels: int, latent_grid) -> jax.Array:
  """Checks images [B, H, W, C] and scales them: uint8 -> x / 127.5 - 1, float kept.

  Shared by the tokenizers (`VQTokenizer`, `patch_tokenizer.PatchTokenizer`).

  Args:
    images: uint8 in [0, 255] or float in [-1, 1], [B, H, W, channels].
    channels: the tokenizer's input channels C.
    latent_grid: (H, W) -> (h, w), raising if the size does not fit the tokenizer.
  Returns:
    float32[B, H, W, C].
  """
  images = jnp.asarray(images)
  if images.ndim != 4 or images.shape[-1] != channels:
    raise ValueError(
        f'images must be [B, H, W, {channels}] (NHWC), got shape '
        f'{images.shape}; add a batch axis or move channels last.')
  latent_grid(images.shape[1], images.shape[2])
  if images.dtype == jnp.uint8:
    return images.astype(jnp.float32) / 127.5 - 1.0
  if not jnp.issubdtype(images.dtype, jnp.floating):
    raise ValueError(f'images must be uint8 in [0, 255] or float in [-1, 1], '
                     f'got dtype {images.dtype}.')
  return images.astype(jnp.float32)


def check_token_grid(tokens: jax.Array, grid: tuple[int, int], vocab_size: int) -> jax.Array:
  """Checks raster-ordered token ids int[B, h*w] for a (h, w) grid and a codebook of
  `vocab_size` (values only when concrete); returns them as int32[B, h*w]."""
  tokens = jnp.asarray(tokens)
  if tokens.ndim != 2 or tokens.shape[1] != grid[0] * grid[1]:
    raise ValueError(
        f'tokens must be [B, h*w] = [B, {grid[0] * grid[1]}] for grid={grid}, '
        f'got shape {tokens.shape}.')
  if not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f'tokens must be integers, got dtype {tokens.dtype}.')
  if _is_concrete(tokens) and tokens.size:
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= vocab_size:
      raise ValueError(
          f'token ids must lie in [0, {vocab_size}), got range [{low}, {high}]. '
          'Subtract the id offset of a multimodal vocabulary (e.g. 4 for '
          'Lumina-mGPT) before decoding.')
  return tokens.astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class VQTokenizer:
  """Images <-> token grids with a VQ autoencoder. Methods take `params` first.

  Attributes:
    config: the architecture.
  """

  config: VQConfig

  @property
  def vocab_size(self) -> int:
    return self.config.codebook_size

  def latent_grid(self, height: int, width: int) -> tuple[int, int]:
    """(h, w) token grid of an H x W image; raises if not divisible."""
    factor = self.config.downsample_factor
    if height % factor or width % factor:
      raise ValueError(
          f'Image size {height}x{width} is not divisible by the downsample factor '
          f'{factor} of this tokenizer; crop or resize to a multiple of {factor}.')
    return height // factor, width // factor

  def param_shapes(self, image_size: tuple[int, int] | None = None) -> Any:
    """The param tree as jax.ShapeDtypeStruct leaves (traced, nothing computed)."""
    size = tuple(int(n) for n in (image_size or (self.config.downsample_factor,) * 2))
    self.latent_grid(*size)
    dummy = jax.ShapeDtypeStruct((1, *size, self.config.in_channels), jnp.float32)
    return jax.eval_shape(
        lambda x: VQAutoencoder(self.config).init(jax.random.key(0), x)['params'], dummy)

  def init(self, rng: jax.Array | int, image_size: tuple[int, int] | None = None) -> Any:
    """Random parameters, drawn on the host.

    Conv kernels ~ N(0, 1/fan_in) (LeCun normal), biases 0, GroupNorm scales 1,
    codebook ~ U(-1/V, 1/V) (L2-normalised rows if configured), as LlamaGen.
    numpy draws them because XLA takes tens of seconds on CPU to compile Flax's
    random initialisers for these conv stacks.

    Args:
      rng: a JAX key or an int seed.
      image_size: (H, W) of the dummy input used to trace shapes; default f x f.
    Returns:
      The param tree (jax arrays, float32).
    """
    shapes = self.param_shapes(image_size)
    if isinstance(rng, (int, np.integer)):
      seed = [rng]
    else:
      seed = np.asarray(jax.random.key_data(rng)).ravel().tolist()
    generator = np.random.default_rng(seed)

    def draw(path, leaf):
      name = str(path[-1].key)
      if name == 'kernel':
        fan_in = int(np.prod(leaf.shape[:-1]))
        return generator.standard_normal(leaf.shape, np.float32) * np.float32(fan_in ** -0.5)
      if name == 'embedding':
        table = generator.uniform(-1.0 / leaf.shape[0], 1.0 / leaf.shape[0], leaf.shape)
        if self.config.codebook_l2_norm:
          table /= np.maximum(np.linalg.norm(table, axis=-1, keepdims=True), 1e-12)
        return table
      fill = np.ones if name == 'scale' else np.zeros
      return fill(leaf.shape, np.float32)

    params = jax.tree_util.tree_map_with_path(draw, shapes)
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), params)

  def codebook(self, params: Any) -> jax.Array:
    """The raw codebook float32[V, Cq] (`quantize.embedding`, before any L2
    normalisation: what LANTERN's neighbour tables use)."""
    return jnp.asarray(params['quantize']['embedding'], jnp.float32)

  def preprocess(self, images: jax.Array) -> jax.Array:
    """uint8 [B, H, W, C] -> x / 127.5 - 1; float images pass through (as float32)."""
    return preprocess_images(images, self.config.in_channels, self.latent_grid)

  def encode_latents(self, params: Any, images: jax.Array) -> jax.Array:
    """Pre-quantisation latents (after quant_conv, before any normalisation).

    Args:
      params: tokenizer params.
      images: uint8 or float [B, H, W, C].
    Returns:
      float32[B, h, w, Cq].
    """
    return _encode(self.config, params, self.preprocess(images))[0]

  def encode(self, params: Any, images: jax.Array) -> jax.Array:
    """Images -> raster-ordered token ids int32[B, h*w]."""
    tokens = _encode(self.config, params, self.preprocess(images))[1]  # [B, h, w]
    return tokens.reshape(tokens.shape[0], -1)

  def decode(self, params: Any, tokens: jax.Array, grid: tuple[int, int]) -> jax.Array:
    """Token ids [B, h*w] -> float images [B, h*f, w*f, C] in about [-1, 1].

    Args:
      params: tokenizer params.
      tokens: int[B, h*w], raster order (row-major), values in [0, V).
      grid: (h, w), static.
    """
    grid = (int(grid[0]), int(grid[1]))
    tokens = check_token_grid(tokens, grid, self.vocab_size)
    return _decode(self.config, params, tokens, grid)

  def to_uint8(self, images: jax.Array) -> jax.Array:
    """Decoded float images [..., H, W, C] -> uint8 of the same shape, as the original
    repository does it (`to_uint8`)."""
    return to_uint8(images, self.config.uint8_style)


def to_uint8(images: jax.Array, style: str = 'llamagen') -> jax.Array:
  """float images in about [-1, 1] -> uint8 (truncating, like a torch/numpy cast).

  Args:
    images: float [...].
    style: 'llamagen': clip(127.5 x + 128, 0, 255) (LlamaGen app.py);
      'chameleon': clip(x, -1, 1) then (x + 1) / 2 * 255 (Lumina-mGPT; Janus's
      clip((x + 1) / 2 * 255, 0, 255) gives the same values).
  """
  images = jnp.asarray(images, jnp.float32)
  if style == 'llamagen':
    scaled = jnp.clip(127.5 * images + 128.0, 0.0, 255.0)
  elif style == 'chameleon':
    scaled = (jnp.clip(images, -1.0, 1.0) + 1.0) / 2.0 * 255.0
  else:
    raise ValueError(f'to_uint8: style must be one of {UINT8_STYLES}, got {style!r}.')
  return jnp.floor(scaled).astype(jnp.uint8)


def vq_losses(tokenizer: VQTokenizer, params: Any, images: jax.Array):
  """Training losses with the straight-through estimator (VQ-VAE / LlamaGen).

  reconstruction = mean((decode(z + sg(z_q - z)) - x)^2),
  codebook = mean((z_q - sg(z))^2), commitment = beta * mean((sg(z_q) - z)^2),
  where z are the (L2-normalised if configured) pre-quant latents and z_q their
  nearest rows. Perceptual and adversarial terms are left to the trainer.

  Args:
    tokenizer: the VQTokenizer.
    params: its params (differentiated).
    images: uint8 or float [B, H, W, C].
  Returns:
    (total loss, {'reconstruction', 'codebook', 'commitment', 'tokens' int32[B, h*w],
    'reconstructions' [B, H, W, C]}), for jax.value_and_grad(..., has_aux=True).
  """
  config = tokenizer.config
  images = tokenizer.preprocess(images)
  latents = _apply(config, params, 'encode_latents', images)  # [B, h, w, Cq]
  table = _apply(config, params, 'lookup_table')  # [V, Cq]
  if config.codebook_l2_norm:
    latents = l2_normalize(latents)
  tokens = nearest_codes(jax.lax.stop_gradient(latents), jax.lax.stop_gradient(table))
  quantized = jnp.take(table, tokens, axis=0)  # [B, h, w, Cq]
  sg = jax.lax.stop_gradient
  codebook_loss = jnp.mean(jnp.square(quantized - sg(latents)))
  commitment_loss = config.commitment_beta * jnp.mean(jnp.square(sg(quantized) - latents))
  straight_through = latents + sg(quantized - latents)
  reconstructions = _apply(config, params, 'decode_latents', straight_through)
  reconstruction_loss = jnp.mean(jnp.square(reconstructions.astype(jnp.float32) - images))
  total = reconstruction_loss + codebook_loss + commitment_loss
  aux = dict(reconstruction=reconstruction_loss, codebook=codebook_loss,
             commitment=commitment_loss, tokens=tokens.reshape(tokens.shape[0], -1),
             reconstructions=reconstructions)
  return total, aux


def param_count(params: Any) -> int:
  return int(sum(np.size(x) for x in jax.tree_util.tree_leaves(params)))
