"""Convolutional encoder and decoder of VQ image tokenizers (taming-style).

One code path builds LlamaGen's VQ-16 (and Janus-Pro's copy of it), the
Chameleon/Lumina-mGPT VQGAN and the project's small tokenizers; they differ
only in the `VQConfig` fields (channel multipliers, where attention sits).

Everything runs NHWC. Parameter names mirror the LlamaGen state dict with the
list index joined to its name (`conv_blocks.0.res.1.conv1.weight` ->
`conv_blocks_0/res_1/conv1/kernel`), so a converter is a rename plus an
OIHW -> HWIO transpose; Chameleon's `down/up.{i}.block.{j}` names map onto the
same tree (see `converters/vq.py`).

Legend: B batch, H/W spatial size at the current level, C channels.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


def swish(x: jax.Array) -> jax.Array:
  """x * sigmoid(x), the nonlinearity of every block."""
  return x * jax.nn.sigmoid(x)


def _group_norm(groups: int, eps: float, dtype: Any, name: str) -> nn.GroupNorm:
  # Exact two-pass variance: the fast E[x^2]-E[x]^2 form loses precision and
  # would cost parity with torch.nn.GroupNorm.
  return nn.GroupNorm(num_groups=groups, epsilon=eps, dtype=dtype,
                      use_fast_variance=False, name=name)


def _conv(features: int, kernel: int, dtype: Any, name: str) -> nn.Conv:
  """Stride-1 'same' convolution (torch padding = kernel // 2)."""
  pad = kernel // 2
  return nn.Conv(features, (kernel, kernel), padding=((pad, pad), (pad, pad)),
                 dtype=dtype, name=name)


class ResnetBlock(nn.Module):
  """norm1 -> swish -> conv1 -> norm2 -> swish -> conv2, plus the shortcut.

  The shortcut is a 1x1 conv (`nin_shortcut`) when the channel count changes.
  """

  out_channels: int
  norm_groups: int = 32
  norm_eps: float = 1e-6
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """x [B, H, W, C_in] -> [B, H, W, C_out]."""
    h = swish(_group_norm(self.norm_groups, self.norm_eps, self.dtype, 'norm1')(x))
    h = _conv(self.out_channels, 3, self.dtype, 'conv1')(h)
    h = swish(_group_norm(self.norm_groups, self.norm_eps, self.dtype, 'norm2')(h))
    h = _conv(self.out_channels, 3, self.dtype, 'conv2')(h)
    if x.shape[-1] != self.out_channels:
      x = _conv(self.out_channels, 1, self.dtype, 'nin_shortcut')(x)
    return x + h


class AttnBlock(nn.Module):
  """Single-head self-attention over all H*W positions, with a residual.

  q, k, v and proj_out are 1x1 convs; scores are scaled by C^-0.5 and the
  softmax runs in float32.
  """

  norm_groups: int = 32
  norm_eps: float = 1e-6
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """x [B, H, W, C] -> [B, H, W, C]."""
    batch, height, width, channels = x.shape
    h = _group_norm(self.norm_groups, self.norm_eps, self.dtype, 'norm')(x)
    flat = lambda name: _conv(channels, 1, self.dtype, name)(h).reshape(
        batch, height * width, channels)
    q, k, v = flat('q'), flat('k'), flat('v')  # [B, HW, C] each
    scores = jnp.einsum('bqc,bkc->bqk', q, k) * channels ** -0.5  # [B, HW, HW]
    weights = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(v.dtype)
    out = jnp.einsum('bqk,bkc->bqc', weights, v).reshape(x.shape)
    return x + _conv(channels, 1, self.dtype, 'proj_out')(out)


class Downsample(nn.Module):
  """Zero-pad one row/column at the bottom/right, then a 3x3 stride-2 conv."""

  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """x [B, H, W, C] -> [B, H/2, W/2, C] (H, W even)."""
    x = jnp.pad(x, ((0, 0), (0, 1), (0, 1), (0, 0)))
    return nn.Conv(x.shape[-1], (3, 3), strides=(2, 2), padding='VALID',
                   dtype=self.dtype, name='conv')(x)


class Upsample(nn.Module):
  """Nearest-neighbour x2 upsampling, then a 3x3 conv."""

  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """x [B, H, W, C] -> [B, 2H, 2W, C]."""
    x = jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)
    return _conv(x.shape[-1], 3, self.dtype, 'conv')(x)


class ConvLevel(nn.Module):
  """One resolution level: `num_blocks` x (ResnetBlock [+ AttnBlock]), then resample.

  resample: 'down', 'up' or 'none'.
  """

  out_channels: int
  num_blocks: int
  with_attention: bool
  resample: str
  norm_groups: int = 32
  norm_eps: float = 1e-6
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """x [B, H, W, C_in] -> [B, H', W', C_out]."""
    norm = dict(norm_groups=self.norm_groups, norm_eps=self.norm_eps, dtype=self.dtype)
    for j in range(self.num_blocks):
      x = ResnetBlock(self.out_channels, **norm, name=f'res_{j}')(x)
      if self.with_attention:
        x = AttnBlock(**norm, name=f'attn_{j}')(x)
    if self.resample == 'down':
      x = Downsample(self.dtype, name='downsample')(x)
    elif self.resample == 'up':
      x = Upsample(self.dtype, name='upsample')(x)
    return x


def _middle(x: jax.Array, config: Any) -> jax.Array:
  """mid_0 (ResnetBlock), mid_1 (AttnBlock), mid_2 (ResnetBlock); call inside compact."""
  norm = dict(norm_groups=config.norm_groups, norm_eps=config.norm_eps, dtype=config.compute_dtype)
  channels = x.shape[-1]
  x = ResnetBlock(channels, **norm, name='mid_0')(x)
  x = AttnBlock(**norm, name='mid_1')(x)
  return ResnetBlock(channels, **norm, name='mid_2')(x)


class Encoder(nn.Module):
  """Images [B, H, W, in_channels] -> latents [B, H/f, W/f, z_channels].

  f = 2^(len(ch_mult) - 1). Level i has ch * ch_mult[i] channels and
  `num_res_blocks` blocks; every level but the last ends with a Downsample.
  `config` is a `models.vq.VQConfig`.
  """

  config: Any

  @nn.compact
  def __call__(self, images: jax.Array) -> jax.Array:
    cfg = self.config
    norm = dict(norm_groups=cfg.norm_groups, norm_eps=cfg.norm_eps, dtype=cfg.compute_dtype)
    h = _conv(cfg.ch, 3, cfg.compute_dtype, 'conv_in')(images)
    last = len(cfg.ch_mult) - 1
    for level, mult in enumerate(cfg.ch_mult):
      h = ConvLevel(cfg.ch * mult, cfg.num_res_blocks, level in cfg.attn_levels,
                    'down' if level != last else 'none', **norm,
                    name=f'conv_blocks_{level}')(h)
    h = _middle(h, cfg)
    h = swish(_group_norm(cfg.norm_groups, cfg.norm_eps, cfg.compute_dtype, 'norm_out')(h))
    return _conv(cfg.z_channels, 3, cfg.compute_dtype, 'conv_out')(h)


class Decoder(nn.Module):
  """Latents [B, h, w, z_channels] -> images [B, h*f, w*f, out_channels].

  Levels run from the lowest resolution up: `conv_blocks_k` is ch_mult index
  len(ch_mult) - 1 - k, has `num_res_blocks + 1` blocks and (except the last)
  ends with an Upsample. `config` is a `models.vq.VQConfig`.
  """

  config: Any

  @nn.compact
  def __call__(self, latents: jax.Array) -> jax.Array:
    cfg = self.config
    norm = dict(norm_groups=cfg.norm_groups, norm_eps=cfg.norm_eps, dtype=cfg.compute_dtype)
    h = _conv(cfg.ch * cfg.ch_mult[-1], 3, cfg.compute_dtype, 'conv_in')(latents)
    h = _middle(h, cfg)
    num_levels = len(cfg.ch_mult)
    for k in range(num_levels):
      level = num_levels - 1 - k
      h = ConvLevel(cfg.ch * cfg.ch_mult[level], cfg.num_res_blocks + 1,
                    level in cfg.attn_levels, 'up' if level != 0 else 'none',
                    **norm, name=f'conv_blocks_{k}')(h)
    h = swish(_group_norm(cfg.norm_groups, cfg.norm_eps, cfg.compute_dtype, 'norm_out')(h))
    return _conv(cfg.out_channels, 3, cfg.compute_dtype, 'conv_out')(h)
