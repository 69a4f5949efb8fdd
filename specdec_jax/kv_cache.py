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

Buffers are heads-major, [B, K, S, D]: each head's slots are one contiguous
[S, D] matrix, so attention's two matmuls read the cache as stored. With the
slot axis outside the heads ([B, S, K, D]) XLA:CPU transposed every layer's
keys and values on every forward: one layer's write plus attention took
3.6x as long at one new token, 2.9x at five (`bench/attention_layout.py`,
README "The decoding engine").

Two arrangements of the layers: a tuple over layers of [B, K, S, D] arrays
(the default), or one stacked [N, B, K, S, D] array each for keys and values
(`stacked=True`), which a model scanning over its layers (`lax.scan`) carries
through the scan and indexes with the traced layer number. Everything else
(lengths, masks, `advance`, `set_lengths`) is the same; code that transforms
every layer's buffer goes through `map_buffers`, which keeps the arrangement.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class KVCache:
  """Per-layer key/value buffers plus per-row lengths.

  Attributes:
    keys: tuple over layers of [B, K, S, D] arrays, or one [N, B, K, S, D]
      array (stacked layout).
    values: as keys.
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

  @property
  def stacked(self) -> bool:
    return not isinstance(self.keys, tuple)


def init_cache(
    *,
    num_layers: int,
    batch_size: int,
    capacity: int,
    num_kv_heads: int,
    head_dim: int,
    dtype=jnp.float32,
    stacked: bool = False,
) -> KVCache:
  """Returns an empty cache: zero buffers, zero lengths, every slot valid.

  stacked: one [N, B, K, S, D] array for keys and one for values (for models
  that scan over layers) instead of a tuple of N arrays.
  """
  for name, value in (('num_layers', num_layers), ('batch_size', batch_size),
                      ('capacity', capacity), ('num_kv_heads', num_kv_heads),
                      ('head_dim', head_dim)):
    if int(value) < 1:
      raise ValueError(f'init_cache: {name} must be >= 1, got {value}.')
  shape = (batch_size, num_kv_heads, capacity, head_dim)
  if stacked:
    keys, values = (jnp.zeros((num_layers,) + shape, dtype) for _ in range(2))
  else:
    keys, values = (tuple(jnp.zeros(shape, dtype) for _ in range(num_layers))
                    for _ in range(2))
  return KVCache(
      keys=keys,
      values=values,
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


def write_slots(buffer: jax.Array, new: jax.Array, starts: jax.Array) -> jax.Array:
  """Writes one layer's new keys (or values) at each row's slots.

  Args:
    buffer: [B, K, S, D], heads-major.
    new: [B, T, K, D], token-major as attention computes them.
    starts: int32[B], the first slot of each row (callers guarantee
      starts + T <= S, see `check_capacity`).
  Returns:
    The updated [B, K, S, D] buffer: buffer[b, :, starts[b] + t] = new[b, t].
  """
  batch, heads, _, head_dim = buffer.shape
  if new.ndim != 4 or new.shape[0] != batch or new.shape[2:] != (heads, head_dim):
    raise ValueError(f'write_slots: new {new.shape} must be [B={batch}, T, K={heads}, '
                     f'D={head_dim}] for a [B, K, S, D] buffer {buffer.shape}.')

  def one_row(row, update, start):  # [K, S, D], [T, K, D]
    update = jnp.swapaxes(update, 0, 1).astype(row.dtype)
    return jax.lax.dynamic_update_slice(row, update, (0, start, 0))

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


def update_layer(cache: KVCache, layer: int | jax.Array, new_keys: jax.Array,
                 new_values: jax.Array) -> KVCache:
  """Writes one layer's [B, T, K, D] keys/values at each row's length (`write_slots`).

  `layer` is a Python int, or (stacked layout only) a traced int32 scalar.
  Does not move `lengths`; call `advance` once after all layers are written.
  """
  if cache.stacked:
    return cache.replace(keys=_write_stacked(cache.keys, layer, new_keys, cache.lengths),
                         values=_write_stacked(cache.values, layer, new_values, cache.lengths))
  keys = list(cache.keys)
  values = list(cache.values)
  keys[layer] = write_slots(keys[layer], new_keys, cache.lengths)
  values[layer] = write_slots(values[layer], new_values, cache.lengths)
  return cache.replace(keys=tuple(keys), values=tuple(values))


def _write_stacked(buffer, layer, new, starts):
  """buffer [N, B, K, S, D]: writes new[b] [T, K, D] at [layer, b, :, starts[b]:+T] (one scatter).

  A scatter rather than a vmapped dynamic_update_slice, whose batching over
  axis 1 would move the whole stacked buffer each layer.
  """
  rows = jnp.arange(new.shape[0])[:, None]  # [B, 1]
  slots = starts[:, None] + jnp.arange(new.shape[1])[None, :]  # [B, T]
  # The index arrays are split by the head slice, so NumPy rules put their
  # [B, T] axes first: the indexed shape is [B, T, K, D], as `new`.
  return buffer.at[layer, rows, :, slots].set(new.astype(buffer.dtype),
                                              mode='promise_in_bounds')


def layer_buffers(cache: KVCache, layer: int | jax.Array) -> tuple[jax.Array, jax.Array]:
  """(keys, values) [B, K, S, D] of one layer, in either layout."""
  return cache.keys[layer], cache.values[layer]


def map_buffers(fn, cache: KVCache) -> KVCache:
  """Applies fn ([B, K, S, D] -> [B, K, S, D]) to every layer's keys and values.

  Keeps the layout: a stacked cache maps with `jax.vmap` over the layer axis,
  so callers (tree compaction, resharding) need not know which one they hold.
  """
  if cache.stacked:
    return cache.replace(keys=jax.vmap(fn)(cache.keys), values=jax.vmap(fn)(cache.values))
  return cache.replace(keys=tuple(fn(x) for x in cache.keys),
                       values=tuple(fn(x) for x in cache.values))


def stack_layers(cache: KVCache) -> KVCache:
  """The same cache in the stacked layout (a copy of the buffers)."""
  if cache.stacked:
    return cache
  return cache.replace(keys=jnp.stack(cache.keys), values=jnp.stack(cache.values))


def unstack_layers(cache: KVCache) -> KVCache:
  """The same cache in the tuple layout (a copy of the buffers)."""
  if not cache.stacked:
    return cache
  return cache.replace(keys=tuple(cache.keys), values=tuple(cache.values))


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
