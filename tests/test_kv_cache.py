"""Per-row cache writes, masks and rollback, checked against explicit loops."""

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import attention
from specdec_jax import kv_cache as kv


def reference_mask(lengths, key_valid, num_new, window_mask, capacity):
  batch = len(lengths)
  mask = np.zeros((batch, num_new, capacity), bool)
  for b in range(batch):
    for t in range(num_new):
      for s in range(capacity):
        if s < lengths[b]:
          mask[b, t, s] = key_valid[b, s]
        elif s < lengths[b] + num_new:
          u = s - lengths[b]
          mask[b, t, s] = window_mask[t, u] and (key_valid[b, s] or u == t)
  return mask


class KVCacheTest(absltest.TestCase):

  def test_write_rows_at_per_row_lengths(self):
    cache = kv.init_cache(num_layers=2, batch_size=3, capacity=8, num_kv_heads=1, head_dim=2)
    cache = kv.set_lengths(cache, jnp.array([0, 2, 5]))
    new = jnp.arange(3 * 2 * 1 * 2, dtype=jnp.float32).reshape(3, 2, 1, 2) + 1
    cache = kv.update_layer(cache, 1, new, -new)
    keys, values = np.asarray(cache.keys[1]), np.asarray(cache.values[1])
    self.assertEqual(keys.shape, (3, 1, 2, 8))  # [B, K, D, S]
    self.assertEqual(values.shape, (3, 1, 8, 2))  # [B, K, S, D]
    for b, start in enumerate([0, 2, 5]):
      np.testing.assert_array_equal(keys[b, :, :, start:start + 2],
                                    np.transpose(new[b], (1, 2, 0)))
      np.testing.assert_array_equal(values[b, :, start:start + 2], -np.swapaxes(new[b], 0, 1))
      self.assertEqual(float(np.abs(keys[b]).sum()), float(np.abs(new[b]).sum()))
    self.assertEqual(float(np.abs(cache.keys[0]).sum()), 0.0)  # other layer untouched
    np.testing.assert_array_equal(cache.lengths, [0, 2, 5])  # writes do not move lengths
    np.testing.assert_array_equal(kv.advance(cache, jnp.array([2, 1, 0])).lengths, [2, 3, 5])

  def test_write_slots_rejects_mismatched_heads_or_rows(self):
    buffer = jnp.zeros((2, 4, 8, 3))
    with self.assertRaisesRegex(ValueError, r'must be \[B=2, T, K=4, D=3\]'):
      kv.write_slots(buffer, jnp.ones((2, 1, 2, 3)), jnp.zeros((2,), jnp.int32))  # 2 heads
    with self.assertRaisesRegex(ValueError, 'write_slots'):
      kv.write_slots(buffer, jnp.ones((1, 1, 4, 3)), jnp.zeros((2,), jnp.int32))  # 1 row
    written = kv.write_slots(buffer, jnp.ones((2, 2, 4, 3)), jnp.array([0, 5]))
    self.assertEqual(float(written.sum()), 2 * 2 * 4 * 3)
    np.testing.assert_array_equal(written[1, :, 5:7], 1.0)
    # Keys: [B, K, D, S], slots on the last axis.
    new = jnp.arange(2 * 2 * 4 * 3, dtype=jnp.float32).reshape(2, 2, 4, 3)
    written = kv.write_slots(jnp.zeros((2, 4, 3, 8)), new, jnp.array([0, 5]), kv.KEY_SLOT_AXIS)
    np.testing.assert_array_equal(written[1, :, :, 5:7], np.transpose(new[1], (1, 2, 0)))
    self.assertEqual(float(written[1, :, :, :5].sum() + written[1, :, :, 7:].sum()), 0.0)
    with self.assertRaisesRegex(ValueError, r'must be \[B=2, T, K=4, D=3\] for a \[B, K, D, S\]'):
      kv.write_slots(jnp.zeros((2, 4, 3, 8)), jnp.ones((2, 1, 4, 8)), jnp.zeros((2,), jnp.int32),
                     kv.KEY_SLOT_AXIS)  # head dim 8 is the slot count
    with self.assertRaisesRegex(ValueError, 'slot_axis must be'):
      kv.write_slots(buffer, new, jnp.zeros((2,), jnp.int32), 1)

  def test_shared_start_write_equals_per_row_writes(self):
    """One dynamic_update_slice (rows sharing a length) writes what per-row writes do,
    in the tuple and the stacked layout; a shared write at unequal lengths does not
    (negative control: the flag is a promise about the lengths)."""
    new = jnp.arange(2 * 3 * 2 * 4, dtype=jnp.float32).reshape(2, 3, 2, 4) + 1  # [B, T, K, D]
    for stacked in (False, True):
      cache = kv.init_cache(num_layers=2, batch_size=2, capacity=9, num_kv_heads=2, head_dim=4,
                            stacked=stacked)
      cache = kv.set_lengths(cache, jnp.array([4, 4]))
      per_row = kv.update_layer(cache, 1, new, -new)
      shared = kv.update_layer(cache.replace(shared_length=True), 1, new, -new)
      self.assertTrue(shared.shared_length)
      for got, want in ((shared.keys, per_row.keys), (shared.values, per_row.values)):
        np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
      uneven = kv.set_lengths(cache, jnp.array([4, 1]))
      self.assertFalse(np.array_equal(
          np.asarray(kv.update_layer(uneven.replace(shared_length=True), 1, new, -new).keys[1]),
          np.asarray(kv.update_layer(uneven, 1, new, -new).keys[1])))

  def test_write_window_equals_write_rows(self):
    buffer = jnp.arange(3 * 10, dtype=jnp.int32).reshape(3, 10)
    new = -jnp.arange(3 * 4, dtype=jnp.int32).reshape(3, 4) - 1
    starts = jnp.array([0, 3, 6])
    np.testing.assert_array_equal(kv.write_window(buffer, new, starts),
                                  kv.write_rows(buffer, new, starts))
    # Past the end: the entries beyond the buffer are dropped.
    tail = kv.write_window(buffer, new, jnp.array([8, 8, 9]))
    np.testing.assert_array_equal(tail[:, :8], buffer[:, :8])
    np.testing.assert_array_equal(tail[:, 8:], [[-1, -2], [-5, -6], [28, -9]])

  def test_read_slots_inverts_write_slots_in_both_layouts(self):
    new = jnp.arange(2 * 3 * 4 * 5, dtype=jnp.float32).reshape(2, 3, 4, 5)  # [B, T, K, D]
    starts = jnp.array([1, 6])
    slots = starts[:, None] + jnp.arange(3)[None, :]
    layouts = ((kv.VALUE_SLOT_AXIS, (2, 4, 10, 5)), (kv.KEY_SLOT_AXIS, (2, 4, 5, 10)))
    for slot_axis, shape in layouts:
      written = kv.write_slots(jnp.zeros(shape), new, starts, slot_axis)
      np.testing.assert_array_equal(kv.read_slots(written, slots, slot_axis), new)
      np.testing.assert_array_equal(kv.read_slots(written, slots[:, ::-1], slot_axis),
                                    new[:, ::-1])  # order follows the slots asked for
    # Negative control: the values' axis on a keys buffer does not give the tokens back.
    keys = kv.write_slots(jnp.zeros((2, 4, 5, 10)), new, starts, kv.KEY_SLOT_AXIS)
    self.assertFalse(np.array_equal(
        kv.read_slots(keys, jnp.clip(slots, 0, 4), kv.VALUE_SLOT_AXIS)[..., :5], new))
    with self.assertRaisesRegex(ValueError, 'read_slots: slot_axis must be'):
      kv.read_slots(keys, slots, 1)

  def test_mask_matches_reference_for_chains_trees_and_padding(self):
    rng = np.random.default_rng(0)
    capacity, num_new = 10, 4
    tree = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], bool)
    causal = np.tril(np.ones((num_new, num_new), bool))
    # None: the default causal window, computed without a lookup into a [T, T] mask.
    for window_mask, want_window in ((None, causal), (causal, causal), (tree, tree)):
      lengths = np.array([0, 3, 6])
      key_valid = rng.random((3, capacity)) > 0.3
      cache = kv.init_cache(num_layers=1, batch_size=3, capacity=capacity, num_kv_heads=1,
                            head_dim=2)
      cache = cache.replace(lengths=jnp.asarray(lengths), key_valid=jnp.asarray(key_valid))
      got = kv.attention_mask(cache, num_new,
                              None if window_mask is None else jnp.asarray(window_mask))
      np.testing.assert_array_equal(got, reference_mask(lengths, key_valid, num_new,
                                                        want_window, capacity))
    # Negative control: the default mask is not that of a window where all tokens see
    # each other.
    everyone = reference_mask(lengths, key_valid, num_new, np.ones_like(causal), capacity)
    self.assertFalse(np.array_equal(kv.attention_mask(cache, num_new), everyone))

  def test_window_reaching_back_equals_the_last_rows_of_a_wider_window(self):
    """A [B, T, W] mask (W > T: the window starts W - T slots before the length, a
    draft tree's earlier levels) gives the last T rows of the [B, W, W] mask of a
    forward that wrote all W slots, padding slots and per-row lengths included."""
    rng = np.random.default_rng(2)
    capacity, num_new, width = 12, 3, 7
    lengths = np.array([4, 5, 8])
    key_valid = rng.random((3, capacity)) > 0.3
    wide = rng.random((3, width, width)) > 0.5
    wide |= np.eye(width, dtype=bool)[None]
    cache = kv.init_cache(num_layers=1, batch_size=3, capacity=capacity, num_kv_heads=1,
                          head_dim=2).replace(key_valid=jnp.asarray(key_valid))
    got = kv.attention_mask(cache.replace(lengths=jnp.asarray(lengths)), num_new,
                            jnp.asarray(wide[:, width - num_new:]))
    want = kv.attention_mask(cache.replace(lengths=jnp.asarray(lengths - (width - num_new))),
                             width, jnp.asarray(wide))[:, width - num_new:]
    np.testing.assert_array_equal(got, want)
    # Negative control: the same rows read as a window of T slots differ.
    short = kv.attention_mask(cache.replace(lengths=jnp.asarray(lengths)), num_new,
                              jnp.asarray(wide[:, width - num_new:, width - num_new:]))
    self.assertFalse(np.array_equal(short, want))
    with self.assertRaisesRegex(ValueError, r'W >= T'):
      kv.attention_mask(cache, num_new, jnp.ones((num_new, num_new - 1), bool))

  def test_per_row_tree_masks_and_depths_match_each_row_alone(self):
    """bool[B, T, T] masks and int32[B, T] depths (EAGLE-2's per-image trees): row b
    sees what its own [T, T] mask and [T] depths give it alone."""
    rng = np.random.default_rng(1)
    capacity, num_new = 10, 4
    chain = np.tril(np.ones((num_new, num_new), bool))
    tree = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], bool)
    masks = np.stack([chain, tree, tree])
    depths = np.array([[0, 1, 2, 3], [0, 1, 1, 2], [0, 1, 1, 2]], np.int32)
    lengths = np.array([0, 3, 6])
    key_valid = rng.random((3, capacity)) > 0.3
    cache = kv.init_cache(num_layers=1, batch_size=3, capacity=capacity, num_kv_heads=1,
                          head_dim=2)
    cache = cache.replace(lengths=jnp.asarray(lengths), key_valid=jnp.asarray(key_valid))
    got = kv.attention_mask(cache, num_new, jnp.asarray(masks))
    positions = kv.window_positions(cache, num_new, jnp.asarray(depths))
    for row in range(3):
      np.testing.assert_array_equal(got[row], reference_mask(
          lengths, key_valid, num_new, masks[row], capacity)[row])
      np.testing.assert_array_equal(positions[row], lengths[row] + depths[row])
    with self.assertRaisesRegex(ValueError, r'window_mask must be \[T, W\] or \[B, T, W\]'):
      kv.attention_mask(cache, num_new, jnp.asarray(masks[:2]))
    with self.assertRaisesRegex(ValueError, r'depths must be \[T\] = \[4\] or \[B, T\]'):
      kv.row_depths(jnp.asarray(depths[:2]), 3, num_new)

  def test_rollback_hides_stale_slots(self):
    """After writing 3 tokens and keeping 1, attention equals never having written 2."""
    heads, dim = 2, 4
    key = jax.random.key(0)
    q, k, v = (jax.random.normal(kk, (1, 3, heads, dim)) for kk in jax.random.split(key, 3))
    fresh = kv.init_cache(num_layers=1, batch_size=1, capacity=6, num_kv_heads=heads,
                          head_dim=dim)
    _, written = attention.cached_attention(q, k, v, fresh, 0)
    rolled_back = kv.set_lengths(written, jnp.array([1]))
    q2 = jax.random.normal(jax.random.key(1), (1, 1, heads, dim))
    k2, v2 = q2 * 2, q2 * 3
    out_rolled, _ = attention.cached_attention(q2, k2, v2, rolled_back, 0)
    _, only_first = attention.cached_attention(q[:, :1], k[:, :1], v[:, :1], fresh, 0)
    out_clean, _ = attention.cached_attention(q2, k2, v2, kv.set_lengths(only_first, jnp.array([1])), 0)
    np.testing.assert_allclose(out_rolled, out_clean, rtol=1e-6)

  def test_attention_matches_dense_softmax(self):
    heads, kv_heads, dim = 4, 2, 8
    keys = jax.random.split(jax.random.key(2), 3)
    q = jax.random.normal(keys[0], (1, 3, heads, dim))
    k = jax.random.normal(keys[1], (1, 3, kv_heads, dim))
    v = jax.random.normal(keys[2], (1, 3, kv_heads, dim))
    cache = kv.init_cache(num_layers=1, batch_size=1, capacity=5, num_kv_heads=kv_heads,
                          head_dim=dim)
    out, _ = attention.cached_attention(q, k, v, cache, 0)
    k_rep, v_rep = np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2)  # GQA: head h uses h // 2
    scores = np.einsum('bthd,bshd->bhts', q, k_rep) / np.sqrt(dim)
    scores = np.where(np.tril(np.ones((3, 3), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    np.testing.assert_allclose(out, np.einsum('bhts,bshd->bthd', weights, v_rep), rtol=1e-5,
                               atol=1e-6)

  def test_capacity_error_and_bad_sizes(self):
    with self.assertRaisesRegex(ValueError, 'capacity 10 is too small.*>= 12'):
      kv.check_capacity(10, 12)
    with self.assertRaisesRegex(ValueError, 'head_dim'):
      kv.init_cache(num_layers=1, batch_size=1, capacity=4, num_kv_heads=1, head_dim=0)


class PositionOffsetTest(absltest.TestCase):
  """Rotary positions of left-padded rows count from their first real token."""

  def test_window_positions_subtract_the_position_offset(self):
    cache = kv.init_cache(num_layers=1, batch_size=2, capacity=8, num_kv_heads=1, head_dim=2)
    cache = cache.replace(lengths=jnp.array([3, 5]), position_offset=jnp.array([0, 2]))
    np.testing.assert_array_equal(kv.window_positions(cache, 2), [[3, 4], [3, 4]])
    np.testing.assert_array_equal(kv.window_positions(cache, 2, jnp.array([0, 0])),
                                  [[3, 3], [3, 3]])


if __name__ == '__main__':
  absltest.main()
