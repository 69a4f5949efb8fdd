"""A tiny class-conditional Llama-shaped transformer, for the sharding test and the CPU benchmark.

Built from `models/layers.py` like the real models, at a size that compiles in
seconds. Legend: B batch rows, T new tokens, E model width.

Class id `num_classes` is the null class of CFG rows (`cfg_class_rows`), here
and in the Markov toys of `specdec_jax.app.toy`, which share `check_class_ids`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import kv_cache as kv
from specdec_jax import protocol
from specdec_jax.models import layers


def check_class_ids(cond, num_classes: int, what: str, allow_null: bool) -> None:
  """Raises a clear error for conditioning that is not int class ids [B]."""
  shape = jnp.shape(cond)
  if len(shape) != 1 or not jnp.issubdtype(jnp.result_type(cond), jnp.integer):
    raise ValueError(
        f'{what}: cond must be integer class ids of shape [B] (one per cache row; with '
        f'CFG [cond; uncond] rows), got shape {shape} dtype {jnp.result_type(cond)}.')
  if not isinstance(cond, jax.core.Tracer):
    values = np.asarray(cond)
    high = num_classes + (1 if allow_null else 0)
    if values.size and (values.min() < 0 or values.max() >= high):
      raise ValueError(f'{what}: class ids must be in [0, {high}), got {values.tolist()}.')


def cfg_class_rows(class_ids, num_classes: int) -> jax.Array:
  """[cond; uncond] class-id rows for CFG, int[B] -> int32[2B]: the null class is
  `num_classes`."""
  class_ids = jnp.asarray(class_ids, jnp.int32)
  return jnp.concatenate([class_ids, jnp.full_like(class_ids, num_classes)])


@dataclasses.dataclass(frozen=True)
class TinyConfig:
  vocab_size: int = 32
  num_classes: int = 4
  width: int = 32
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  ffn_dim: int = 64
  dtype: Any = jnp.float32

  @property
  def head_dim(self) -> int:
    return self.width // self.num_heads


class _TinyLM(nn.Module):
  """Embedding (tokens or a class prefix) -> decoder layers -> RMSNorm -> head."""

  config: TinyConfig

  @nn.compact
  def __call__(self, tokens, cache, window_mask=None, depths=None, class_ids=None):
    c = self.config
    embed_tokens = nn.Embed(c.vocab_size, c.width, dtype=c.dtype, name='embed_tokens')
    embed_classes = nn.Embed(c.num_classes + 1, c.width, dtype=c.dtype, name='embed_classes')
    if class_ids is not None:
      x = embed_classes(class_ids)[:, None, :]  # [B, 1, E]
      # Touch the other table so `init` creates both (one init call).
      x = x + 0.0 * embed_tokens(jnp.zeros_like(class_ids))[:, None, :]
    else:
      x = embed_tokens(tokens)  # [B, T, E]
      x = x + 0.0 * embed_classes(jnp.zeros_like(tokens[:, :1]))
    num_new = x.shape[1]
    positions = kv.window_positions(cache, num_new, depths)  # [B, T]
    angles = layers.rope_1d_angles(positions, c.head_dim)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    for index in range(c.num_layers):
      x, cache = layers.DecoderLayer(
          c.num_heads, c.num_kv_heads, c.head_dim, c.ffn_dim, dtype=c.dtype,
          name=f'layers_{index}')(x, cos, sin, cache, index, window_mask)
    hidden = layers.RMSNorm(name='norm')(x)
    logits = nn.Dense(c.vocab_size, use_bias=False, dtype=c.dtype, name='lm_head')(hidden)
    return logits.astype(jnp.float32), hidden, kv.advance(cache, num_new)


@dataclasses.dataclass(frozen=True)
class TinyTransformer:
  """Class-conditional Llama-shaped model (prefix: one class embedding, P = 1).

  Class id `num_classes` is the null class for CFG rows.
  """

  config: TinyConfig = TinyConfig()

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def hidden_size(self) -> int:
    return self.config.width

  def init_params(self, key) -> Any:
    """Random parameters (one jitted init: eager Flax init compiles op by op)."""
    return _init_params(self, key)

  def prefix_length(self, cond) -> int:
    del cond
    return 1

  def check_cond(self, cond) -> None:
    """Checks concrete class ids too (`specdec_jax.checks`)."""
    check_class_ids(cond, self.config.num_classes, 'generate: cond', allow_null=True)

  def init_cache(self, batch_size: int, capacity: int) -> kv.KVCache:
    """An empty cache of `batch_size` rows and `capacity` slots (`kv.init_cache`)."""
    c = self.config
    return kv.init_cache(num_layers=c.num_layers, batch_size=batch_size, capacity=capacity,
                         num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, dtype=c.dtype)

  def prefill(self, params, cache, cond) -> protocol.ForwardOutput:
    """Class ids int[B] (null class `num_classes` for CFG rows) -> ForwardOutput:
    logits f32[B, 1, V] for the first image token, hidden [B, 1, E], cache advanced
    by the prefix (`protocol.DecodeModel.prefill`)."""
    check_class_ids(cond, self.config.num_classes, 'TinyTransformer.prefill',
                     allow_null=True)
    logits, hidden, cache = _TinyLM(self.config).apply(
        {'params': params}, None, cache, class_ids=cond.astype(jnp.int32))
    return protocol.ForwardOutput(logits=logits, hidden=hidden, cache=cache)

  def forward(self, params, cache, tokens, window_mask=None, depths=None):
    """Tokens int[B, T] at each row's length -> logits f32[B, T, V], hidden
    [B, T, E], cache advanced by T; window_mask and depths take the forms of
    `protocol.DecodeModel.forward` (default a causal chain)."""
    logits, hidden, cache = _TinyLM(self.config).apply(
        {'params': params}, tokens.astype(jnp.int32), cache, window_mask, depths)
    return protocol.ForwardOutput(logits=logits, hidden=hidden, cache=cache)


@functools.partial(jax.jit, static_argnums=0)
def _init_params(model: TinyTransformer, key) -> Any:
  """`TinyTransformer.init_params`, compiled once per model config."""
  cache = model.init_cache(1, 2)
  return _TinyLM(model.config).init(key, jnp.zeros((1, 1), jnp.int32), cache)['params']
