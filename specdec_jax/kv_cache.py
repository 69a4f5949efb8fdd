"""Static-shape key/value caches with a write position per row.

Legend: B batch rows, S cache capacity (slots), T new tokens in one forward,
N layers, K key/value heads, D head dim.

Every row b holds its tokens in slots [0, lengths[b]). A forward over T new
tokens writes their keys/values at slots lengths[b] .. lengths[b]+T-1 of its own
row; accepting n of them afterwards is `advance`/`set_lengths`: slots beyond the
new length are stale and hidden by the mask, and the next write overwrites them.
Rejection therefore never copies a cache.

`key_valid[B, S]` marks slots that hold padding (left-padded captions, an
unconditional prompt shorter than the conditional one) so attention skips them
(a padding slot still sees itself while it is written, so every query has a
key); `position_offset[B]` is subtracted from the slot index to give the
position id a rotary embedding sees (a left-padded row starts at 0).

Buffers are heads-major: values [B, K, S, D], keys [B, K, D, S] (each
head's keys stored transposed), so attention's two matmuls, scores = q
[G*T, D] x keys [D, S] and out = weights [G*T, S] x values [S, D], read the
cache as stored. With the slot axis outside the heads XLA:CPU transposed
every layer's keys and values on every forward; keys [B, K, S, D] made one
layer's write plus attention 1.27-1.29x as slow at five new tokens (a k = 4
verify forward) and 0.87-0.91x at one (`bench/attention_layout.py`, README
"The decoding engine"). `KEY_SLOT_AXIS`/`VALUE_SLOT_AXIS` name the slot axes.

Two arrangements of the layers: tuples over layers of per-layer arrays (the
default), or one stacked array each for keys ([N, B, K, D, S]) and values
([N, B, K, S, D]) (`stacked=True`), which a model scanning over its layers
(`lax.scan`) carries through the scan and indexes with the traced layer
number. Everything else (lengths, masks, `advance`, `set_lengths`) is the
same; code that transforms every layer's buffer goes through `map_buffers`,
which keeps the arrangement.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

# Slot axis of one layer's buffer: keys [B, K, D, S], values [B, K, S, D].
KEY_SLOT_AXIS = 3
VALUE_SLOT_AXIS = 2


@flax.struct.dataclass
class KVCache:
  """Per-layer key/value buffers plus per-row lengths.

  Attributes:
    keys: tuple over layers of [B, K, D, S] arrays (transposed, see the
      module docstring), or one [N, B, K, D, S] array (stacked layout).
    values: tuple over layers of [B, K, S, D] arrays, or one [N, B, K, S, D]
      array.
    lengths: int32[B], number of valid slots per row.
    key_valid: bool[B, S], False for padding slots inside [0, lengths).
    position_offset: int32[B], position id = slot index - position_offset.
    shared_length: static promise that every row has the same length (one
      image with its CFG rows: the decode engine sets it at batch 1); writes
      are then one dynamic_update_slice at lengths[0] instead of a per-row
      scatter (which accelerators run as a loop over rows).
  """

  keys: tuple
  values: tuple
  lengths: jax.Array
  key_valid: jax.Array
  position_offset: jax.Array
  shared_length: bool = flax.struct.field(pytree_node=False, default=False)

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

  stacked: one [N, B, K, D, S] array for keys and one [N, B, K, S, D] for
  values (for models that scan over layers) instead of tuples of N arrays.
  """
  for name, value in (('num_layers', num_layers), ('batch_size', batch_size),
                      ('capacity', capacity), ('num_kv_heads', num_kv_heads),
                      ('head_dim', head_dim)):
    if int(value) < 1:
      raise ValueError(f'init_cache: {name} must be >= 1, got {value}.')
  key_shape = (batch_size, num_kv_heads, head_dim, capacity)
  value_shape = (batch_size, num_kv_heads, capacity, head_dim)
  if stacked:
    keys = jnp.zeros((num_layers,) + key_shape, dtype)
    values = jnp.zeros((num_layers,) + value_shape, dtype)
  else:
    keys = tuple(jnp.zeros(key_shape, dtype) for _ in range(num_layers))
    values = tuple(jnp.zeros(value_shape, dtype) for _ in range(num_layers))
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


def write_window(buffer: jax.Array, new: jax.Array, starts: jax.Array) -> jax.Array:
  """Writes new[b] into buffer[b, starts[b]:starts[b]+T], as one elementwise select.

  For small buffers (token buffers [B, L]): every entry reads its source in
  `new` by index, so there is no per-row scatter or loop (what `write_rows`
  becomes when its vmapped dynamic_update_slice is lowered). Entries past
  the buffer's end are dropped.

  Args:
    buffer: [B, L, ...]; new: [B, T, ...] (same trailing dims); starts: int32[B].
  """
  slots = jnp.arange(buffer.shape[1], dtype=jnp.int32)[None, :]  # [1, L]
  offset = slots - starts[:, None]  # [B, L]: index into new
  inside = (offset >= 0) & (offset < new.shape[1])
  source = jnp.take_along_axis(new, jnp.clip(offset, 0, new.shape[1] - 1).reshape(
      offset.shape + (1,) * (new.ndim - 2)), axis=1)
  inside = inside.reshape(inside.shape + (1,) * (buffer.ndim - 2))
  return jnp.where(inside, source.astype(buffer.dtype), buffer)


def write_slots(buffer: jax.Array, new: jax.Array, starts: jax.Array,
                slot_axis: int = VALUE_SLOT_AXIS, shared_start: bool = False) -> jax.Array:
  """Writes one layer's new keys (or values) at each row's slots.

  Args:
    buffer: [B, K, S, D] (slot_axis 2, values) or [B, K, D, S] (slot_axis 3,
      keys).
    new: [B, T, K, D], token-major as attention computes them.
    starts: int32[B], the first slot of each row (callers guarantee
      starts + T <= S, see `check_capacity`).
    slot_axis: VALUE_SLOT_AXIS or KEY_SLOT_AXIS.
    shared_start: every row starts at starts[0] (`KVCache.shared_length`):
      one dynamic_update_slice of all rows.
  Returns:
    The updated buffer: new[b, t] lands at slot starts[b] + t of row b.
  """
  if slot_axis not in (VALUE_SLOT_AXIS, KEY_SLOT_AXIS):
    raise ValueError(f'write_slots: slot_axis must be {VALUE_SLOT_AXIS} (values, '
                     f'[B, K, S, D]) or {KEY_SLOT_AXIS} (keys, [B, K, D, S]), got {slot_axis}.')
  batch, heads = buffer.shape[:2]
  head_dim = buffer.shape[3] if slot_axis == VALUE_SLOT_AXIS else buffer.shape[2]
  if new.ndim != 4 or new.shape[0] != batch or new.shape[2:] != (heads, head_dim):
    layout = '[B, K, S, D]' if slot_axis == VALUE_SLOT_AXIS else '[B, K, D, S]'
    raise ValueError(f'write_slots: new {new.shape} must be [B={batch}, T, K={heads}, '
                     f'D={head_dim}] for a {layout} buffer {buffer.shape}.')
  # [B, T, K, D] -> [B, K, T, D] (values) or [B, K, D, T] (keys).
  order = (0, 2, 1, 3) if slot_axis == VALUE_SLOT_AXIS else (0, 2, 3, 1)
  new = jnp.transpose(new, order).astype(buffer.dtype)
  if shared_start:
    index = [0, 0, 0, 0]
    index[slot_axis] = starts[0]
    return jax.lax.dynamic_update_slice(buffer, new, tuple(index))

  def one_row(row, update, start):  # [K, S, D] or [K, D, S]; update likewise with T
    index = [0, 0, 0]
    index[slot_axis - 1] = start
    return jax.lax.dynamic_update_slice(row, update, tuple(index))

  return jax.vmap(one_row)(buffer, new, starts)


def read_slots(buffer: jax.Array, slots: jax.Array, slot_axis: int = VALUE_SLOT_AXIS) -> jax.Array:
  """Gathers each row's slots from one layer's keys or values (inverse of `write_slots`).

  Args:
    buffer: [B, K, S, D] (slot_axis 2, values) or [B, K, D, S] (slot_axis 3,
      keys).
    slots: int32[B, T], slot indices per row (in range).
    slot_axis: VALUE_SLOT_AXIS or KEY_SLOT_AXIS.
  Returns:
    [B, T, K, D], token-major as `write_slots` takes it.
  """
  if slot_axis == VALUE_SLOT_AXIS:
    picked = jnp.take_along_axis(buffer, slots[:, None, :, None], axis=2)  # [B, K, T, D]
    return jnp.transpose(picked, (0, 2, 1, 3))
  if slot_axis == KEY_SLOT_AXIS:
    picked = jnp.take_along_axis(buffer, slots[:, None, None, :], axis=3)  # [B, K, D, T]
    return jnp.transpose(picked, (0, 3, 1, 2))
  raise ValueError(f'read_slots: slot_axis must be {VALUE_SLOT_AXIS} (values, [B, K, S, D]) '
                   f'or {KEY_SLOT_AXIS} (keys, [B, K, D, S]), got {slot_axis}.')


def row_depths(depths: jax.Array | None, batch_size: int, num_new: int) -> jax.Array:
  """int32[B, T] offsets of T new tokens from each row's length.

  depths: None (a causal chain: arange(T)), int32[T] (one tree for every row)
  or int32[B, T] (a tree per row, e.g. EAGLE-2's dynamic trees).
  """
  if depths is None:
    depths = jnp.arange(num_new, dtype=jnp.int32)
  depths = jnp.asarray(depths, jnp.int32)
  if depths.ndim == 1:
    depths = jnp.broadcast_to(depths[None, :], (batch_size, num_new))
  if depths.shape != (batch_size, num_new):
    raise ValueError(f'depths must be [T] = [{num_new}] or [B, T] = [{batch_size}, {num_new}], '
                     f'got {depths.shape}.')
  return depths


def window_positions(cache: KVCache, num_new: int, depths: jax.Array | None = None) -> jax.Array:
  """Position ids of T new tokens written at each row's length.

  Args:
    cache: the cache before the write.
    num_new: T.
    depths: optional int32[T] or int32[B, T] (`row_depths`), offset of each
      new token from the row length (tree drafts give siblings the same
      depth); default arange(T).
  Returns:
    int32[B, T] position ids (slot index minus the row's position offset).
  """
  depths = row_depths(depths, cache.batch_size, num_new)
  return (cache.lengths - cache.position_offset)[:, None] + depths


def attention_mask(cache: KVCache, num_new: int, window_mask: jax.Array | None = None) -> jax.Array:
  """Which cache slots each of T new queries may attend to, after the write.

  Args:
    cache: the cache *before* the write (lengths point at the first new slot).
    num_new: T.
    window_mask: optional bool[T, W] (every row) or bool[B, T, W] (one per
      row), W >= T: the window is the W - T slots before the row length
      (already written: a draft tree's earlier levels) and the T new ones;
      entry [t, u] says new token t sees window slot u. Default
      lower-triangular [T, T] (causal chain). Trees pass their ancestor mask.
  Returns:
    bool[B, T, S].
  """
  causal = window_mask is None  # lower-triangular [T, T], read without a lookup below
  width = num_new if causal else window_mask.shape[-1]
  if not causal and (window_mask.shape[-2] != num_new or width < num_new or (
      window_mask.ndim == 3 and window_mask.shape[0] != cache.batch_size)):
    raise ValueError(f'window_mask must be [T, W] or [B, T, W] with T = {num_new} new tokens, '
                     f'B = {cache.batch_size} and W >= T, got {window_mask.shape}.')
  slots = jnp.arange(cache.capacity, dtype=jnp.int32)  # [S]
  start = (cache.lengths - (width - num_new))[:, None]  # [B, 1]: the window's first slot
  in_prefix = (slots[None, :] < start) & cache.key_valid  # [B, S]
  offset = slots[None, :] - start  # [B, S]: index into the window
  in_window = (offset >= 0) & (offset < width)
  window_index = jnp.clip(offset, 0, width - 1)
  if causal:  # [B, T, S]: window_mask[t, u] = u <= t
    sees_window = window_index[:, None, :] <= jnp.arange(num_new, dtype=jnp.int32)[None, :, None]
  else:  # [B, T, S]: window_mask[(b,) t, offset[b, s]], as a one-hot matmul (exact for 0/1)
    one_hot = (window_index[..., None] == jnp.arange(width)).astype(jnp.float32)  # [B, S, W]
    spec = 'bsw,tw->bts' if window_mask.ndim == 2 else 'bsw,btw->bts'
    sees_window = jnp.einsum(spec, one_hot, window_mask.astype(jnp.float32)) > 0.5
  # A padding slot written now (key_valid False) is seen only by its own query, so a
  # left-padded prefix prefills in one forward (LlamaGen's t2i mask: diagonal kept).
  own = jnp.arange(width - num_new, width, dtype=jnp.int32)  # [T]: each query's own slot
  is_own = offset[:, None, :] == own[None, :, None]
  window_visible = sees_window & (cache.key_valid[:, None, :] | is_own)
  return in_prefix[:, None, :] | (in_window[:, None, :] & window_visible)


def update_layer(cache: KVCache, layer: int | jax.Array, new_keys: jax.Array,
                 new_values: jax.Array) -> KVCache:
  """Writes one layer's [B, T, K, D] keys/values at each row's length (`write_slots`).

  `layer` is a Python int, or (stacked layout only) a traced int32 scalar.
  Does not move `lengths`; call `advance` once after all layers are written.
  """
  shared = cache.shared_length
  if cache.stacked:
    return cache.replace(
        keys=_write_stacked(cache.keys, layer, new_keys, cache.lengths, KEY_SLOT_AXIS, shared),
        values=_write_stacked(cache.values, layer, new_values, cache.lengths, VALUE_SLOT_AXIS,
                              shared))
  keys = list(cache.keys)
  values = list(cache.values)
  keys[layer] = write_slots(keys[layer], new_keys, cache.lengths, KEY_SLOT_AXIS, shared)
  values[layer] = write_slots(values[layer], new_values, cache.lengths, VALUE_SLOT_AXIS, shared)
  return cache.replace(keys=tuple(keys), values=tuple(values))


def _write_stacked(buffer, layer, new, starts, slot_axis, shared_start: bool = False):
  """buffer [N, B, K, S, D] (or [N, B, K, D, S] for keys): writes new[b] [T, K, D]
  at layer `layer`, row b, slots starts[b]:+T (one scatter; one
  dynamic_update_slice when every row starts at starts[0]).

  A scatter rather than a vmapped dynamic_update_slice, whose batching over
  axis 1 would move the whole stacked buffer each layer.
  """
  if shared_start:
    order = (0, 2, 1, 3) if slot_axis == VALUE_SLOT_AXIS else (0, 2, 3, 1)
    update = jnp.transpose(new, order).astype(buffer.dtype)[None]  # [1, B, K, T, D] / [.., D, T]
    index = [layer, 0, 0, 0, 0]
    index[slot_axis + 1] = starts[0]
    return jax.lax.dynamic_update_slice(buffer, update, tuple(index))
  rows = jnp.arange(new.shape[0])[:, None]  # [B, 1]
  slots = starts[:, None] + jnp.arange(new.shape[1])[None, :]  # [B, T]
  # The index arrays are split by the head slice, so NumPy rules put their
  # [B, T] axes first: the indexed shape is [B, T, K, D], as `new`.
  if slot_axis == VALUE_SLOT_AXIS:
    target = buffer.at[layer, rows, :, slots]
  else:
    target = buffer.at[layer, rows, :, :, slots]
  return target.set(new.astype(buffer.dtype), mode='promise_in_bounds')


def layer_buffers(cache: KVCache, layer: int | jax.Array) -> tuple[jax.Array, jax.Array]:
  """(keys [B, K, D, S], values [B, K, S, D]) of one layer, in either arrangement."""
  return cache.keys[layer], cache.values[layer]


def map_buffers(fn, cache: KVCache) -> KVCache:
  """Applies fn(buffer, slot_axis) -> buffer to every layer's keys and values.

  fn gets keys [B, K, D, S] with slot_axis KEY_SLOT_AXIS and values
  [B, K, S, D] with VALUE_SLOT_AXIS, and returns the same shape (`phases.grow`:
  more slots; `key_valid` is then the caller's to match). Keeps the
  arrangement: a stacked cache maps with `jax.vmap` over the layer axis, so
  callers (tree compaction, resharding) need not know which one they hold.
  """
  key_fn = lambda x: fn(x, KEY_SLOT_AXIS)
  value_fn = lambda x: fn(x, VALUE_SLOT_AXIS)
  if cache.stacked:
    return cache.replace(keys=jax.vmap(key_fn)(cache.keys),
                         values=jax.vmap(value_fn)(cache.values))
  return cache.replace(keys=tuple(key_fn(x) for x in cache.keys),
                       values=tuple(value_fn(x) for x in cache.values))


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
