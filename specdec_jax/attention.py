"""Cached multi-head attention shared by every model (LlamaGen, Chameleon, Janus, drafters).

Legend: B batch rows, T new tokens, S cache slots, H query heads, K key/value
heads (H % K == 0), D head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_jax import kv_cache as kv


def cached_attention(
    queries: jax.Array,
    new_keys: jax.Array,
    new_values: jax.Array,
    cache: kv.KVCache,
    layer: int,
    window_mask: jax.Array | None = None,
) -> tuple[jax.Array, kv.KVCache]:
  """Writes T new keys/values at each row's length, then attends over the cache.

  Args:
    queries: [B, T, H, D], already rotated.
    new_keys: [B, T, K, D], already rotated.
    new_values: [B, T, K, D].
    cache: cache before the write; `lengths` are not moved here.
    layer: index of this layer's buffers.
    window_mask: optional bool[T, T] visibility among the new tokens (default
      causal).
  Returns:
    ([B, T, H, D] attention output in the queries' dtype, updated cache).
  """
  num_new = queries.shape[1]
  cache = kv.update_layer(cache, layer, new_keys, new_values)
  keys = cache.keys[layer]  # [B, S, K, D]
  values = cache.values[layer]
  num_heads, num_kv_heads = queries.shape[2], keys.shape[2]
  group = num_heads // num_kv_heads
  batch = keys.shape[0]
  head_dim = queries.shape[-1]
  q = queries.reshape(batch, num_new, num_kv_heads, group, head_dim)
  scores = jnp.einsum('btkgd,bskd->bkgts', q, keys.astype(q.dtype),
                      preferred_element_type=jnp.float32)
  scores = scores * (head_dim ** -0.5)
  mask = kv.attention_mask(cache, num_new, window_mask)  # [B, T, S]
  scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(scores, axis=-1).astype(values.dtype)
  out = jnp.einsum('bkgts,bskd->btkgd', weights, values)
  return out.reshape(batch, num_new, num_heads, head_dim).astype(queries.dtype), cache
