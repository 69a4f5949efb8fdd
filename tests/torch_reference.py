"""PyTorch reference forwards of the original architectures, for parity tests.

Each forward is written from the original papers and repositories, not from
the Flax ports: LlamaGen's GPT and VQ (FoundationVision/LlamaGen
`autoregressive/models/gpt.py`, `tokenizer/tokenizer_image/vq_model.py`),
Hugging Face Chameleon as Lumina-mGPT runs it (Alpha-VLLM/Lumina-mGPT), the
taming VQGAN Chameleon uses, the Janus-Pro generation path
(deepseek-ai/Janus `janus/models/modeling_vlm.py`) and the LANTERN / EAGLE-1
drafters (jadohu/LANTERN).

torch is optional. Without it this module still imports, `HAVE_TORCH` is
False, and test classes or methods decorated with `requires_torch` are
skipped, so every test module collects and its torch-free tests run. State
dicts passed in may hold numpy arrays or torch tensors (`as_torch`).

This module holds the guarded torch import and the pieces several families
share; the per-family forwards live in `torch_reference_chameleon_janus.py`,
`torch_reference_llamagen.py`, `torch_reference_eagle.py` and
`torch_reference_vq.py`.
"""

from __future__ import annotations

import unittest
from collections.abc import Mapping
from typing import Any

import numpy as np

try:
  import torch  # pylint: disable=g-import-not-at-top
  from torch import nn  # pylint: disable=g-import-not-at-top
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top
except ImportError:  # the torch extra is not installed
  torch = nn = F = None

HAVE_TORCH = torch is not None
requires_torch = unittest.skipUnless(
    HAVE_TORCH, 'needs torch for the PyTorch reference or torch files '
    '(pip install "specdec-jax[torch]")')


def as_torch(value: Any):
  """numpy array -> torch tensor (shares memory, bf16 included); torch tensors pass through."""
  if isinstance(value, np.ndarray):
    value = np.ascontiguousarray(value)
    if value.dtype.name == 'bfloat16':  # ml_dtypes bf16: reinterpret the bits
      return torch.from_numpy(value.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(value)
  return value


def as_torch_state(state: Mapping[str, Any]) -> dict[str, Any]:
  return {k: as_torch(v) for k, v in state.items()}


def as_long(ids: Any):
  """Token ids (list, numpy or torch) -> int64 torch tensor."""
  if isinstance(ids, torch.Tensor):
    return ids.long()
  return torch.from_numpy(np.asarray(ids, np.int64))


# ------------------------------------------------------- shared pieces ---


def rms(x, weight, eps):
  """RMSNorm computed in float32: weight * x / sqrt(mean(x^2) + eps)."""
  normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
  return normed.type_as(x) * weight


def rotate_half(x):
  """HF Llama's rotate_half over the last axis: [x1, x2] -> [-x2, x1]."""
  half = x.shape[-1] // 2
  return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def rope_1d(positions, head_dim, theta):
  """HF Llama RoPE tables (cos, sin) [L, D] for integer positions [L]."""
  inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
  freqs = positions.float()[:, None] * inv_freq[None, :]
  emb = torch.cat([freqs, freqs], dim=-1)
  return emb.cos(), emb.sin()


def apply_rope_half(x, cos, sin):
  """x [B, H, L, D] with cos/sin [L, D]: x cos + rotate_half(x) sin."""
  return x * cos + rotate_half(x) * sin


def causal_bias(length):
  """[L, L] additive mask: 0 on and below the diagonal, -inf above."""
  return torch.full((length, length), float('-inf')).triu(1)


def swiglu(x, gate_w, up_w, down_w):
  return (F.silu(x @ gate_w.T) * (x @ up_w.T)) @ down_w.T


# ------------------------------------------ 2D RoPE (LlamaGen, LANTERN) ---


def rope_2d_table(grid, head_dim, base, cls_token_num, trailing_zeros=0):
  """LlamaGen's 2D RoPE angles as (cos, sin) [P + G*G + Z, D/2].

  Zero rows (no rotation) for the P condition tokens and, as in LANTERN's
  drafter table, Z rows after the grid.
  """
  half = head_dim // 2
  freqs = 1.0 / (base ** (torch.arange(0, half, 2)[: half // 2].float() / half))
  per_axis = torch.outer(torch.arange(grid, dtype=torch.float32), freqs)  # [G, D/4]
  angles = torch.cat([per_axis[:, None, :].expand(grid, grid, -1),     # row
                      per_axis[None, :, :].expand(grid, grid, -1)],    # column
                     dim=-1).reshape(grid * grid, half)
  front, back = torch.zeros(cls_token_num, half), torch.zeros(trailing_zeros, half)
  return (torch.cat([front, angles.cos(), back]), torch.cat([front, angles.sin(), back]))


def rotate_pairs(x, cos, sin):
  """Interleaved-pair rotation; x [B, L, H, D], cos/sin [L, D/2]."""
  pairs = x.float().reshape(*x.shape[:-1], -1, 2)
  x0, x1 = pairs[..., 0], pairs[..., 1]
  c, s = cos[None, :, None, :], sin[None, :, None, :]
  return torch.stack([x0 * c - x1 * s, x1 * c + x0 * s], -1).flatten(3).type_as(x)
