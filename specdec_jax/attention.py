"""Cached multi-head attention shared by every model (LlamaGen, Chameleon, Janus, drafters).

Legend: B batch rows, T new tokens, S cache slots, H query heads, K key/value
heads (H % K == 0), D head dim.

On GPU and TPU the attention goes through `jax.nn.dot_product_attention`
with the engine's boolean mask [B, T, S] (per-row lengths, padding,
draft-tree ancestors), so XLA, or cuDNN on GPU when asked, picks the kernel.
On CPU the default is `einsum_attention`, the explicit grouped-query form the
tests compare the other paths with: on XLA:CPU it is the faster one (the
bundled family's batch-1 vanilla decode took 71 ms with it and 96 ms through
`dot_product_attention`, same run, before the heads-major cache; README "The
decoding engine").

The cache is heads-major, keys [B, K, D, S] and values [B, K, S, D]
(`kv_cache`). `einsum_attention` folds each key/value head's query group and
the T new tokens into the rows of one matmul per head, [G*T, D] x [D, S]
for the scores and [G*T, S] x [S, D] for the output, so both matmuls read
the cache as stored and a multi-token verify forward runs two plain batched
matmuls per layer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_jax import kv_cache as kv

# 'auto': 'einsum' when the program is lowered for CPU, 'xla' for GPU/TPU
# (chosen at lowering by `lax.platform_dependent`, so a TPU program compiled
# on a CPU host gets 'xla'); 'xla': jax.nn.dot_product_attention(
# implementation=None), XLA's choice on any backend; 'cudnn': its cuDNN kernel
# (GPU only); 'einsum': the reference.
IMPLEMENTATIONS = ('auto', 'xla', 'cudnn', 'einsum')


def cached_attention(
    queries: jax.Array,
    new_keys: jax.Array,
    new_values: jax.Array,
    cache: kv.KVCache,
    layer: int,
    window_mask: jax.Array | None = None,
    implementation: str = 'auto',
) -> tuple[jax.Array, kv.KVCache]:
  """Writes T new keys/values at each row's length, then attends over the cache.

  Args:
    queries: [B, T, H, D], already rotated.
    new_keys: [B, T, K, D], already rotated.
    new_values: [B, T, K, D].
    cache: cache before the write; `lengths` are not moved here.
    layer: index of this layer's buffers (a traced scalar for a stacked cache).
    window_mask: optional bool[T, T] visibility among the new tokens (default
      causal).
    implementation: one of IMPLEMENTATIONS.
  Returns:
    ([B, T, H, D] attention output in the queries' dtype, updated cache).
  """
  cache = kv.update_layer(cache, layer, new_keys, new_values)
  mask = kv.attention_mask(cache, queries.shape[1], window_mask)  # [B, T, S]
  keys, values = kv.layer_buffers(cache, layer)  # [B, K, D, S], [B, K, S, D]
  out = attend(queries, keys, values, mask, implementation)
  return out, cache


def attend(queries: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array,
           implementation: str = 'auto') -> jax.Array:
  """softmax(q k^T / sqrt(D) where mask, else -inf) v, scores and softmax in float32.

  Args:
    queries: [B, T, H, D].
    keys: [B, K, D, S] and values: [B, K, S, D], as the cache stores them
      (cast to the queries' dtype).
    mask: bool[B, T, S]; every query must see at least one key (its own slot).
    implementation: one of IMPLEMENTATIONS.
  Returns:
    [B, T, H, D] in the queries' dtype.
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f'attention implementation must be one of {IMPLEMENTATIONS}, '
                     f'got {implementation!r}.')
  keys, values = keys.astype(queries.dtype), values.astype(queries.dtype)
  if implementation == 'auto':
    return jax.lax.platform_dependent(queries, keys, values, mask, cpu=einsum_attention,
                                      default=_library_attention)
  if implementation == 'einsum':
    return einsum_attention(queries, keys, values, mask)
  if implementation == 'cudnn' and jax.default_backend() != 'gpu':
    raise ValueError(f"attention implementation 'cudnn' needs a GPU backend, this "
                     f"one is {jax.default_backend()!r}; use 'xla'.")
  return _library_attention(queries, keys, values, mask,
                            'cudnn' if implementation == 'cudnn' else None)


def _library_attention(queries, keys, values, mask, implementation=None):
  """jax.nn.dot_product_attention with the engine's mask; shapes as `attend`.

  The library takes [B, S, K, D]; on GPU/TPU XLA folds the transposes into
  the attention's dot dimension numbers.
  """
  keys, values = jnp.transpose(keys, (0, 3, 1, 2)), jnp.swapaxes(values, 1, 2)
  return jax.nn.dot_product_attention(queries, keys, values, mask=mask[:, None, :, :],
                                      implementation=implementation)


def einsum_attention(queries: jax.Array, keys: jax.Array, values: jax.Array,
                     mask: jax.Array) -> jax.Array:
  """The explicit grouped-query attention (reference for `attend`); shapes as there.

  Per batch row and key/value head, the G = H / K query heads of its group and
  the T new tokens are the G*T rows (m = g*T + t) of the scores matmul.
  """
  batch, num_new, num_heads, head_dim = queries.shape
  num_kv_heads = keys.shape[1]
  group = num_heads // num_kv_heads
  q = queries.reshape(batch, num_new, num_kv_heads, group, head_dim)
  q = q.transpose(0, 2, 3, 1, 4).reshape(batch, num_kv_heads, group * num_new, head_dim)
  scores = jnp.einsum('bkmd,bkds->bkms', q, keys.astype(q.dtype),
                      preferred_element_type=jnp.float32)
  scores = scores * (head_dim ** -0.5)
  row_mask = jnp.tile(mask, (1, group, 1))[:, None]  # [B, 1, G*T, S]: row m is token m % T
  scores = jnp.where(row_mask, scores, jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(scores, axis=-1).astype(values.dtype)
  out = jnp.einsum('bkms,bksd->bkmd', weights, values)  # [B, K, G*T, D]
  out = out.reshape(batch, num_kv_heads, group, num_new, head_dim).transpose(0, 3, 1, 2, 4)
  return out.reshape(batch, num_new, num_heads, head_dim).astype(queries.dtype)
