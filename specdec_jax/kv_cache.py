"""Static-shape key/value caches with a write position per row.

Legend: B batch rows, S cache capacity (slots), T new tokens in one forward,
N layers, K key/value heads, D head dim.

Every row b holds its tokens in slots [0, lengths[b]). A forward over T new
tokens writes their keys/values at slots lengths[b] .. lengths[b]+T-1 of its own
row; accepting n of them afterwards is `advance`/`set_lengths`: slots beyond the
new length are stale and hidden by the mask, and the next write overwrites them.
Rejection therefore never copies a cache.

`key_valid[B, S]` marks slots that hold padding (left-padded captions, an
unconditional prompt shorter than the conditional one) so attention skips
them (a padding slot still sees itself while it is written, so every query
has at least one key); `position_offset[B]` is subtracted from the slot index to give the
position id a model's rotary embedding sees (so a left-padded row still starts
at position 0 on its first real token).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class KVCache:
  """Per-layer key/value buffers plus per-row lengths.

  Attributes:
    keys: tuple over layers of [B, S, K, D] arrays.
    values: tuple over layers of [B, S, K, D] arrays.
    lengths: int32[B], number of valid slots per row.
    key_valid: bool[B, S], False for padding slots inside [0, lengths).
    position_offset: int32[B], position id = slot index - position_offset.
  """

  keys: tuple
  values: tuple
  lengths: jax.Array
  key_valid: jax.Array
  position_offset: jax.Array

  @property
  def batch_size(self) -> int:
    return self.lengths.shape[0]

  @property
  def capacity(self) -> int:
    return self.key_valid.shape[1]

  @property
  def num_layers(self) -> int:
    return len(self.keys)


def init_cache(
    *,
    num_layers: int,
    batch_size: int,
    capacity: int,
    num_kv_heads: int,
    head_dim: int,
    dtype=jnp.float32,
) -> KVCache:
  """Returns an empty cache: zero buffers, zero lengths, every slot valid."""
  for name, value in (('num_layers', num_layers), ('batch_size', batch_size),
                      ('capacity', capacity), ('num_kv_heads', num_kv_heads),
                      ('head_dim', head_dim)):
    if int(value) < 1:
      raise ValueError(f'init_cache: {name} must be >= 1, got {value}.')
  shape = (batch_size, capacity, num_kv_heads, head_dim)
  zeros = tuple(jnp.zeros(shape, dtype) for _ in range(num_layers))
  return KVCache(
      keys=zeros,
      values=tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
      lengths=jnp.zeros((batch_size,), jnp.int32),
      key_valid=jnp.ones((batch_size, capacity), bool),
      position_offset=jnp.zeros((batch_size,), jnp.int32),
  )


def write_rows(buffer: jax.Array, new: jax.Array, starts: jax.Array) -> jax.Array:
  """Writes new[b] into buffer[b, starts[b]:starts[b]+T].

  Args:
    buffer: [B, S, ...].
    new: [B, T, ...] with the same trailing dims.
    starts: int32[B].
  Returns:
    The updated [B, S, ...] buffer. Callers guarantee starts + T <= S (see
    `check_capacity`); lax.dynamic_update_slice would otherwise clamp silently.
  """

  def one_row(row, update, start):
    index = (start,) + (0,) * (row.ndim - 1)
    return jax.lax.dynamic_update_slice(row, update.astype(row.dtype), index)

  return jax.vmap(one_row)(buffer, new, starts)


def window_positions(cache: KVCache, num_new: int, depths: jax.Array | None = None) -> jax.Array:
  """Position ids of T new tokens written at each row's length.

  Args:
    cache: the cache before the write.
    num_new: T.
    depths: optional int32[T], offset of each new token from the row length
      (tree drafts give siblings the same depth); default arange(T).
  Returns:
    int32[B, T] position ids (slot index minus the row's position offset).
  """
  if depths is None:
    depths = jnp.arange(num_new, dtype=jnp.int32)
  return (cache.lengths - cache.position_offset)[:, None] + depths[None, :]


def attention_mask(cache: KVCache, num_new: int, window_mask: jax.Array | None = None) -> jax.Array:
  """Which cache slots each of T new queries may attend to, after the write.

  Args:
    cache: the cache *before* the write (lengths point at the first new slot).
    num_new: T.
    window_mask: optional bool[T, T]; entry [t, u] says new token t sees new
      token u. Default lower-triangular (causal chain). Static trees pass their
      ancestor mask.
  Returns:
    bool[B, T, S].
  """
  if window_mask is None:
    window_mask = jnp.tril(jnp.ones((num_new, num_new), bool))
  slots = jnp.arange(cache.capacity, dtype=jnp.int32)  # [S]
  lengths = cache.lengths[:, None]  # [B, 1]
  in_prefix = (slots[None, :] < lengths) & cache.key_valid  # [B, S]
  offset = slots[None, :] - lengths  # [B, S]: index into the window
  in_window = (offset >= 0) & (offset < num_new)
  window_index = jnp.clip(offset, 0, num_new - 1)
  # [B, T, S]: window_mask[t, offset[b, s]]
  sees_window = jnp.moveaxis(jnp.take(window_mask, window_index, axis=1), 0, 1)
  # A padding slot written in this window (key_valid False) is seen only by
  # its own query, so a left-padded prefix can be prefilled in one forward
  # (LlamaGen's t2i mask: padded columns off, diagonal kept).
  is_own = offset[:, None, :] == jnp.arange(num_new, dtype=jnp.int32)[None, :, None]
  window_visible = sees_window & (cache.key_valid[:, None, :] | is_own)
  return in_prefix[:, None, :] | (in_window[:, None, :] & window_visible)


def update_layer(cache: KVCache, layer: int, new_keys: jax.Array, new_values: jax.Array) -> KVCache:
  """Writes one layer's [B, T, K, D] keys/values at each row's length.

  Does not move `lengths`; call `advance` once after all layers are written.
  """
  keys = list(cache.keys)
  values = list(cache.values)
  keys[layer] = write_rows(keys[layer], new_keys, cache.lengths)
  values[layer] = write_rows(values[layer], new_values, cache.lengths)
  return cache.replace(keys=tuple(keys), values=tuple(values))


def advance(cache: KVCache, num_tokens: jax.Array | int) -> KVCache:
  """Moves every row's length forward by num_tokens (scalar or int32[B])."""
  return cache.replace(lengths=cache.lengths + jnp.asarray(num_tokens, jnp.int32))


def set_lengths(cache: KVCache, lengths: jax.Array) -> KVCache:
  """Rollback/commit: sets int32[B] lengths; slots beyond become stale."""
  return cache.replace(lengths=jnp.asarray(lengths, jnp.int32))


def check_capacity(capacity: int, required: int, what: str = 'cache') -> None:
  """Raises before compilation if a decode would write past the cache end."""
  if required > capacity:
    raise ValueError(
        f'{what}: capacity {capacity} is too small, the decode needs up to '
        f'{required} slots (prefix + tokens + verify window). Create the cache '
        f'with capacity >= {required}.')
