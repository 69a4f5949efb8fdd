"""Patch k-means tokenizer: images <-> token grids by nearest codebook patch.

The bundled Fashion-MNIST family's tokenizer. An image is cut into
non-overlapping p x p patches; each patch becomes the id of its nearest
codebook entry (Euclidean distance on pixels scaled to [-1, 1]); decoding
pastes the codebook patches back. The codebook is fitted by k-means
(`specdec_jax.app.train.kmeans_tokenizer`). It is a vector quantiser with the
identity as encoder and decoder, so it offers the same interface as
`models.vq.VQTokenizer` (`encode`, `decode`, `to_uint8`, `vocab_size`,
`latent_grid`) and keeps its codebook where LANTERN's neighbour tables read
one (`params['quantize']['embedding']`, raw, [V, p*p*C]).

Legend: B images, H x W x C image, p patch side, h = H/p, w = W/p,
L = h*w tokens, V codebook size, D = p*p*C patch dimension.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.models import vq as vq_lib


@dataclasses.dataclass(frozen=True)
class PatchTokenizerConfig:
  codebook_size: int = 256
  patch_size: int = 2
  in_channels: int = 1
  uint8_style: str = 'llamagen'

  def __post_init__(self):
    if self.codebook_size < 2 or self.patch_size < 1 or self.in_channels < 1:
      raise ValueError(f'PatchTokenizerConfig: need codebook_size >= 2, patch_size >= 1 and '
                       f'in_channels >= 1, got {self}.')
    if self.uint8_style not in vq_lib.UINT8_STYLES:
      raise ValueError(f'PatchTokenizerConfig: uint8_style must be one of '
                       f'{vq_lib.UINT8_STYLES}, got {self.uint8_style!r}.')

  @property
  def patch_dim(self) -> int:
    return self.patch_size * self.patch_size * self.in_channels

  @property
  def downsample_factor(self) -> int:
    return self.patch_size

  def to_dict(self) -> dict:
    return dict(dataclasses.asdict(self), kind='patch_kmeans')

  @classmethod
  def from_dict(cls, values: dict) -> 'PatchTokenizerConfig':
    values = dict(values)
    kind = values.pop('kind', 'patch_kmeans')
    if kind != 'patch_kmeans':
      raise ValueError(f'not a patch tokenizer config (kind {kind!r}).')
    unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
      raise ValueError(f'PatchTokenizerConfig: unknown fields {sorted(unknown)}.')
    return cls(**values)


def image_to_patches(images: jax.Array, patch: int) -> jax.Array:
  """float[B, H, W, C] -> float[B, h*w, p*p*C] (raster order of patches)."""
  batch, height, width, channels = images.shape
  x = images.reshape(batch, height // patch, patch, width // patch, patch, channels)
  x = x.transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(batch, (height // patch) * (width // patch), patch * patch * channels)


def patches_to_image(patches: jax.Array, grid: tuple[int, int], patch: int,
                     channels: int) -> jax.Array:
  """float[B, h*w, p*p*C] -> float[B, h*p, w*p, C]."""
  batch = patches.shape[0]
  height, width = grid
  x = patches.reshape(batch, height, width, patch, patch, channels)
  x = x.transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(batch, height * patch, width * patch, channels)


def nearest_patch(patches: jax.Array, codebook: jax.Array) -> jax.Array:
  """Ids of the nearest codebook rows: float[..., D], float[V, D] -> int32[...]."""
  distances = (jnp.sum(patches * patches, -1, keepdims=True)
               - 2.0 * patches @ codebook.T + jnp.sum(codebook * codebook, -1))
  return jnp.argmin(distances, axis=-1).astype(jnp.int32)


@jax.jit
def _encode(codebook: jax.Array, patches: jax.Array) -> jax.Array:
  return nearest_patch(patches, codebook)


@dataclasses.dataclass(frozen=True)
class PatchTokenizer:
  """Images <-> token grids through a patch codebook. Methods take `params` first
  (`{'quantize': {'embedding': float32[V, D]}}`, pixels in [-1, 1])."""

  config: PatchTokenizerConfig

  @property
  def vocab_size(self) -> int:
    return self.config.codebook_size

  def latent_grid(self, height: int, width: int) -> tuple[int, int]:
    """(h, w) token grid of an H x W image; raises if not divisible."""
    patch = self.config.patch_size
    if height % patch or width % patch:
      raise ValueError(f'Image size {height}x{width} is not divisible by the patch size '
                       f'{patch}; crop or pad to a multiple of {patch}.')
    return height // patch, width // patch

  def codebook(self, params: Any) -> jax.Array:
    """The raw codebook float32[V, D] (what LANTERN's neighbour tables use)."""
    book = jnp.asarray(params['quantize']['embedding'], jnp.float32)
    if book.shape != (self.vocab_size, self.config.patch_dim):
      raise ValueError(f'patch tokenizer params hold a codebook of shape {book.shape}; the '
                       f'config needs ({self.vocab_size}, {self.config.patch_dim}).')
    return book

  def preprocess(self, images: jax.Array) -> jax.Array:
    """uint8 [B, H, W, C] -> x / 127.5 - 1; float images pass through (as float32)."""
    return vq_lib.preprocess_images(images, self.config.in_channels, self.latent_grid)

  def encode(self, params: Any, images: jax.Array) -> jax.Array:
    """Images uint8/float[B, H, W, C] -> raster-ordered token ids int32[B, h*w]."""
    patches = image_to_patches(self.preprocess(images), self.config.patch_size)
    return _encode(self.codebook(params), patches)

  def decode(self, params: Any, tokens: jax.Array, grid: tuple[int, int]) -> jax.Array:
    """Token ids int[B, h*w] -> float images [B, h*p, w*p, C] in [-1, 1]."""
    grid = (int(grid[0]), int(grid[1]))
    tokens = vq_lib.check_token_grid(tokens, grid, self.vocab_size)
    patches = jnp.take(self.codebook(params), tokens, axis=0)
    return patches_to_image(patches, grid, self.config.patch_size, self.config.in_channels)

  def to_uint8(self, images: jax.Array) -> jax.Array:
    """Decoded float images [..., H, W, C] -> uint8 of the same shape (`vq.to_uint8`)."""
    return vq_lib.to_uint8(images, self.config.uint8_style)


def init_params(config: PatchTokenizerConfig, codebook: np.ndarray) -> dict:
  """Params from a fitted codebook float[V, D] (validated)."""
  book = np.asarray(codebook, np.float32)
  if book.shape != (config.codebook_size, config.patch_dim):
    raise ValueError(f'codebook shape {book.shape} != ({config.codebook_size}, '
                     f'{config.patch_dim}).')
  if not np.all(np.isfinite(book)):
    raise ValueError('codebook holds NaN or inf values.')
  return {'quantize': {'embedding': book}}
