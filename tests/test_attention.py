"""`attention.einsum_attention` equals a per-row, per-head NumPy softmax, and
`attention.attend` through jax.nn.dot_product_attention (and 'auto') equals it,
for every mask the engine produces: decode steps, chains, trees, per-row lengths,
padding, grouped-query heads, float32 and bfloat16. Keys are [B, K, D, S] and
values [B, K, S, D], as the cache stores them (the NumPy reference takes both
[B, K, S, D])."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import attention
from specdec_jax import kv_cache as kv

TREE = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], bool)


def engine_mask(num_new, window, capacity=12, seed=0):
  """bool[3, T, S] from kv.attention_mask: rows at lengths 0, 3, 6 with padding."""
  rng = np.random.default_rng(seed)
  cache = kv.init_cache(num_layers=1, batch_size=3, capacity=capacity, num_kv_heads=1,
                        head_dim=2)
  key_valid = rng.random((3, capacity)) > 0.3
  cache = cache.replace(lengths=jnp.array([0, 3, 6]), key_valid=jnp.asarray(key_valid))
  return kv.attention_mask(cache, num_new, None if window is None else jnp.asarray(window))


def numpy_attention(q, k, v, mask):
  """Direct float64 softmax attention: q [B, T, H, D], k/v [B, K, S, D], mask [B, T, S]."""
  q, k, v, mask = (np.asarray(x, np.float64) for x in (q, k, v, mask))
  batch, num_new, num_heads, head_dim = q.shape
  group = num_heads // k.shape[1]
  out = np.zeros(q.shape)
  for b in range(batch):
    for h in range(num_heads):
      scores = q[b, :, h] @ k[b, h // group].T / np.sqrt(head_dim)  # [T, S]
      scores = np.where(mask[b] > 0, scores, -np.inf)
      weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
      weights /= weights.sum(axis=-1, keepdims=True)
      out[b, :, h] = weights @ v[b, h // group]
  return out


class AttendTest(parameterized.TestCase):

  @parameterized.product(
      case=[('decode', 1, None), ('chain', 4, None), ('tree', 4, TREE)],
      heads=[(4, 4), (4, 2), (4, 1), (6, 2)])
  def test_einsum_matches_numpy(self, case, heads):
    _, num_new, window = case
    num_heads, num_kv_heads = heads
    mask = engine_mask(num_new, window)
    keys = jax.random.split(jax.random.key(4), 3)
    q = jax.random.normal(keys[0], (3, num_new, num_heads, 16))
    k = jax.random.normal(keys[1], (3, num_kv_heads, 12, 16))
    v = jax.random.normal(keys[2], (3, num_kv_heads, 12, 16))
    got = jax.jit(attention.einsum_attention)(q, jnp.swapaxes(k, 2, 3), v, mask)
    np.testing.assert_allclose(got, numpy_attention(q, k, v, mask), rtol=2e-5, atol=2e-5)
    # Negative control: the same check sees heads paired with the wrong group.
    swapped = numpy_attention(q, k[:, ::-1], v[:, ::-1], mask)
    if num_kv_heads > 1:
      self.assertGreater(np.abs(np.asarray(got) - swapped).max(), 1e-2)

  @parameterized.product(
      case=[('decode', 1, None), ('chain', 4, None), ('tree', 4, TREE)],
      heads=[(4, 4), (4, 2), (4, 1)],
      dtype=['float32', 'bfloat16'])
  def test_xla_matches_einsum(self, case, heads, dtype):
    _, num_new, window = case
    num_heads, num_kv_heads = heads
    mask = engine_mask(num_new, window)
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (3, num_new, num_heads, 16), dtype)
    k = jax.random.normal(keys[1], (3, num_kv_heads, 12, 16), dtype)
    v = jax.random.normal(keys[2], (3, num_kv_heads, 12, 16), dtype)
    k = jnp.swapaxes(k, 2, 3)  # [B, K, D, S]
    got = jax.jit(attention.attend, static_argnums=4)(q, k, v, mask, 'xla')
    want = jax.jit(attention.attend, static_argnums=4)(q, k, v, mask, 'einsum')
    self.assertEqual(got.dtype, jnp.dtype(dtype))
    tol = 1e-6 if dtype == 'float32' else 1e-2
    if dtype == 'float32':  # both read the [B, K, D, S] keys as the reference does
      np.testing.assert_allclose(got, numpy_attention(q, jnp.swapaxes(k, 2, 3), v, mask),
                                 rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=tol, atol=tol)

  def test_auto_is_einsum_on_cpu_and_the_library_call_elsewhere(self):
    """'auto' picks by the platform the program is lowered for (lax.platform_dependent)."""
    mask = engine_mask(4, TREE)
    q = jax.random.normal(jax.random.key(2), (3, 4, 4, 8))
    v = jax.random.normal(jax.random.key(3), (3, 2, 12, 8))
    k = jnp.swapaxes(v, 2, 3)
    auto = jax.jit(attention.attend, static_argnums=4)
    if jax.default_backend() == 'cpu':
      np.testing.assert_array_equal(auto(q, k, v, mask, 'auto'),
                                    jax.jit(attention.einsum_attention)(q, k, v, mask))
    # Both branches are in the traced program; lowering keeps the platform's one.
    jaxpr = str(jax.make_jaxpr(attention.attend, static_argnums=4)(q, k, v, mask, 'auto'))
    self.assertIn('platform_index', jaxpr)
    cpu_hlo = auto.lower(q, k, v, mask, 'auto').as_text()
    self.assertNotIn('platform_index', cpu_hlo)

  @parameterized.parameters('xla', 'einsum')
  def test_masked_keys_do_not_matter(self, implementation):
    # Guard against a vacuous mask: changing only masked keys/values leaves the output.
    mask = engine_mask(4, TREE)
    keys = jax.random.split(jax.random.key(1), 3)
    q = jax.random.normal(keys[0], (3, 4, 2, 8))
    k = jax.random.normal(keys[1], (3, 2, 8, 12))  # [B, K, D, S]
    v = jax.random.normal(keys[2], (3, 2, 12, 8))
    hidden = ~np.asarray(mask).any(axis=1)  # [B, S] slots no query sees
    noise = jnp.asarray(hidden)[:, None, :, None] * 100.0
    key_noise = jnp.swapaxes(noise, 2, 3)
    np.testing.assert_allclose(attention.attend(q, k + key_noise, v - noise, mask,
                                                implementation),
                               attention.attend(q, k, v, mask, implementation),
                               rtol=1e-5, atol=1e-6)

  def test_bad_implementation(self):
    q = jnp.zeros((1, 1, 1, 4))
    mask = jnp.ones((1, 1, 1), bool)
    with self.assertRaisesRegex(ValueError, "one of .*'xla'"):
      attention.attend(q, q, q, mask, 'flash')
    if jax.default_backend() != 'gpu':
      with self.assertRaisesRegex(ValueError, 'needs a GPU'):
        attention.attend(q, q, q, mask, 'cudnn')


if __name__ == '__main__':
  absltest.main()
