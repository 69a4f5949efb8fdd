"""VQ tokenizer configuration: `VQConfig` and the VQ-16, Chameleon VQGAN and small presets."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

UINT8_STYLES = ('llamagen', 'chameleon')


@dataclasses.dataclass(frozen=True)
class VQConfig:
  """Architecture of a VQ tokenizer (hashable: usable as a static jit argument).

  Attributes:
    codebook_size: V.
    codebook_dim: Cq.
    codebook_l2_norm: L2-normalise latents and codebook rows before lookup.
    commitment_beta: weight of the commitment loss.
    ch: base channel count.
    ch_mult: channel multiplier per level (encoder order, highest resolution
      first); len(ch_mult) - 1 stride-2 steps.
    num_res_blocks: ResnetBlocks per encoder level (decoder levels have one more).
    z_channels: width between encoder/decoder and the 1x1 quant convs.
    in_channels: image channels read by the encoder.
    out_channels: image channels written by the decoder.
    attn_levels: ch_mult indices whose ResnetBlocks are each followed by an
      AttnBlock (the middle always has one). LlamaGen's VQs use the last
      level only (VQ-16: (4,); VQ-8, ch_mult (1, 2, 2, 4): (3,)); the
      Chameleon VQGAN none.
    norm_groups: GroupNorm groups (every width must divide by it).
    norm_eps: GroupNorm epsilon.
    uint8_style: 'llamagen' (clip(127.5 x + 128)) or 'chameleon'
      (clip(x, -1, 1) -> (x + 1) / 2 * 255), both truncated to uint8.
    dtype: compute dtype name ('float32', 'bfloat16'); parameters stay float32.
  """

  codebook_size: int = 16384
  codebook_dim: int = 8
  codebook_l2_norm: bool = True
  commitment_beta: float = 0.25
  ch: int = 128
  ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
  num_res_blocks: int = 2
  z_channels: int = 256
  in_channels: int = 3
  out_channels: int = 3
  attn_levels: tuple[int, ...] = (4,)
  norm_groups: int = 32
  norm_eps: float = 1e-6
  uint8_style: str = 'llamagen'
  dtype: str = 'float32'

  def __post_init__(self):
    object.__setattr__(self, 'ch_mult', tuple(int(m) for m in self.ch_mult))
    object.__setattr__(self, 'attn_levels', tuple(int(i) for i in self.attn_levels))
    for name in ('codebook_size', 'codebook_dim', 'ch', 'num_res_blocks',
                 'z_channels', 'in_channels', 'out_channels', 'norm_groups'):
      if int(getattr(self, name)) < 1:
        raise ValueError(f'VQConfig.{name} must be >= 1, got {getattr(self, name)}.')
    if not self.ch_mult or min(self.ch_mult) < 1:
      raise ValueError(f'VQConfig.ch_mult must be non-empty positive ints, got {self.ch_mult}.')
    bad = [i for i in self.attn_levels if not 0 <= i < len(self.ch_mult)]
    if bad:
      last = len(self.ch_mult) - 1
      raise ValueError(
          f'VQConfig.attn_levels {self.attn_levels} has indices {bad} outside '
          f'ch_mult (levels 0..{last}). LlamaGen puts attention at the last '
          f'level: with ch_mult {list(self.ch_mult)} pass attn_levels=({last},) '
          f'(e.g. VQ-8: ch_mult [1, 2, 2, 4], attn_levels [3]).')
    widths = sorted({self.ch * m for m in self.ch_mult})
    odd = [w for w in widths if w % self.norm_groups]
    if odd:
      raise ValueError(
          f'VQConfig: channel widths {odd} (ch={self.ch} x ch_mult) are not '
          f'divisible by norm_groups={self.norm_groups}; pick ch as a multiple '
          f'of {self.norm_groups}.')
    if self.uint8_style not in UINT8_STYLES:
      raise ValueError(f'VQConfig.uint8_style must be one of {UINT8_STYLES}, '
                       f'got {self.uint8_style!r}.')
    jnp.dtype(self.dtype)  # raises TypeError on an unknown name

  @property
  def compute_dtype(self) -> Any:
    return jnp.dtype(self.dtype)

  @property
  def downsample_factor(self) -> int:
    return 2 ** (len(self.ch_mult) - 1)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> 'VQConfig':
    """Inverse of `to_dict` (JSON lists become tuples); unknown keys raise."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
      raise ValueError(f'VQConfig.from_dict: unknown fields {unknown}; known: {sorted(names)}.')
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def vq16_config(**overrides: Any) -> VQConfig:
  """LlamaGen VQ-16 (= Janus-Pro's gen_vision_model): 16384 x 8, L2-normalised, f=16."""
  return VQConfig(**overrides)


def chameleon_vqgan_config(**overrides: Any) -> VQConfig:
  """Chameleon / Lumina-mGPT VQGAN: 8192 x 256 raw codebook, attention only in the middle."""
  values = dict(codebook_size=8192, codebook_dim=256, codebook_l2_norm=False,
                attn_levels=(), uint8_style='chameleon')
  values.update(overrides)
  return VQConfig(**values)


def small_vq_config(**overrides: Any) -> VQConfig:
  """A small VQ for 32x32 single-channel images (Fashion-MNIST): a 16x16 token grid.

  ch 32, ch_mult (1, 2) (one stride-2 step), 1024 x 8 L2-normalised codebook,
  attention at the lowest-resolution level and in the middle.
  """
  values = dict(codebook_size=1024, codebook_dim=8, ch=32, ch_mult=(1, 2),
                num_res_blocks=1, z_channels=64, in_channels=1, out_channels=1,
                attn_levels=(1,))
  values.update(overrides)
  return VQConfig(**values)
