"""LlamaGen GPT configuration: model types, size presets and `GPTConfig`."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp

from specdec_jax import precision


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
    dtype: compute, parameter and cache dtype name ('float32',
      'bfloat16'); None or 'auto' picks float32 on CPU and bfloat16 on
      accelerators (`specdec_jax.precision`), resolved when the config is
      built, so the field always holds a concrete name.
    scan_layers: run the N blocks as one `nn.scan` (one compiled block: much
      faster compiles for deep models); params then hold one `layers` tree
      with a leading N axis (`models.layers.stack_layer_params` converts) and
      `init_cache` makes a stacked cache.
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
  dtype: str | None = None
  scan_layers: bool = False

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
    if self.block_size < 1 or math.isqrt(self.block_size) ** 2 != self.block_size:
      raise ValueError(f'GPTConfig: block_size {self.block_size} must be a square '
                       'number >= 1 (grid^2 = (image_size/16)^2).')
    if self.cls_token_num < 1:
      raise ValueError(f'GPTConfig: cls_token_num must be >= 1, got '
                       f'{self.cls_token_num}.')
    object.__setattr__(self, 'dtype', precision.resolve_dtype(self.dtype).name)

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
    if image_size < downsample or image_size % downsample:
      raise ValueError(f'image_size {image_size} must be a positive multiple of the VQ '
                       f'downsampling {downsample}.')
    fields['block_size'] = (image_size // downsample) ** 2
  fields.update(overrides)
  return GPTConfig(**fields)
