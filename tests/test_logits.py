"""Closed-form checks of the shared logits processing."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import logits


class ProcessLogitsTest(parameterized.TestCase):

  def test_temperature_is_softmax_of_scaled_logits(self):
    x = jnp.array([0.5, -1.0, 2.0, 0.0])
    np.testing.assert_allclose(logits.process_logits(x, temperature=0.5),
                               jax.nn.softmax(x / 0.5), rtol=1e-6)

  def test_top_k_keeps_ties_and_renormalises(self):
    x = jnp.array([1.0, 3.0, 2.0, 2.0, 0.0])
    probs = logits.process_logits(x, top_k=2)
    kept = np.array([0, 1, 1, 1, 0], bool)  # the k-th largest (2.0) is tied: both kept
    expected = np.where(kept, np.exp(np.asarray(x)), 0)
    np.testing.assert_allclose(probs, expected / expected.sum(), rtol=1e-6)

  def test_top_p_keeps_smallest_prefix_reaching_p(self):
    probs_in = np.array([0.5, 0.3, 0.15, 0.05])
    x = jnp.log(jnp.asarray(probs_in))
    for top_p, kept in ((0.45, 1), (0.6, 2), (0.79, 2), (0.81, 3), (0.99, 4)):
      out = np.asarray(logits.process_logits(x, top_p=top_p))
      expected = np.where(np.arange(4) < kept, probs_in, 0)
      np.testing.assert_allclose(out, expected / expected.sum(), rtol=1e-5, err_msg=str(top_p))

  def test_order_is_temperature_then_top_k_then_top_p(self):
    x = jnp.array([2.0, 1.0, 0.0, -1.0, -3.0])
    out = logits.process_logits(x, temperature=2.0, top_k=3, top_p=0.6)
    scaled = np.exp(np.asarray(x[:3]) / 2.0)
    scaled /= scaled.sum()  # after top-k: [0.51, 0.31, 0.19]
    kept = np.searchsorted(np.cumsum(scaled), 0.6) + 1
    expected = np.zeros(5)
    expected[:kept] = scaled[:kept] / scaled[:kept].sum()
    np.testing.assert_allclose(out, expected, rtol=1e-5)

  def test_greedy_is_one_hot(self):
    out = logits.process_logits(jnp.array([[0.1, 0.9, 0.3]]), temperature=0)
    np.testing.assert_array_equal(out, [[0, 1, 0]])

  def test_batched_leading_dims(self):
    x = jax.random.normal(jax.random.key(0), (2, 3, 50))
    out = logits.process_logits(x, top_k=5, top_p=0.9)
    self.assertEqual(out.shape, (2, 3, 50))
    np.testing.assert_allclose(out.sum(-1), 1.0, rtol=1e-5)
    self.assertTrue(np.all((np.asarray(out) > 0).sum(-1) <= 5))


class SamplingTest(parameterized.TestCase):

  def test_cfg_combine_formula(self):
    cond, uncond = jnp.array([1.0, 2.0]), jnp.array([0.5, 3.0])
    np.testing.assert_allclose(logits.cfg_combine(cond, uncond, 4.0),
                               uncond + 4.0 * (cond - uncond))

  def test_cfg_interval(self):
    sampling = logits.Sampling(cfg_scale=3.0, cfg_interval=1)
    cond = jnp.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    uncond = jnp.zeros((3, 2))
    out = sampling.probs(cond, uncond, token_index=jnp.array([0, 1, 2]))
    np.testing.assert_allclose(out[0], jax.nn.softmax(jnp.array([3.0, 0.0])), rtol=1e-6)
    np.testing.assert_allclose(out[1], out[0], rtol=1e-6)
    np.testing.assert_allclose(out[2], jax.nn.softmax(cond[2]), rtol=1e-6)

  def test_no_cfg_without_uncond_or_scale_one(self):
    cond = jnp.array([1.0, 0.0])
    for sampling, uncond in ((logits.Sampling(cfg_scale=3.0), None),
                             (logits.Sampling(cfg_scale=1.0), jnp.array([5.0, 0.0]))):
      np.testing.assert_allclose(sampling.probs(cond, uncond), jax.nn.softmax(cond), rtol=1e-6)

  @parameterized.parameters(
      (dict(temperature=-1.0), 'temperature'),
      (dict(top_p=0.0), 'top_p'),
      (dict(top_p=1.5), 'top_p'),
      (dict(top_k=-2), 'top_k'),
      (dict(cfg_interval=-3), 'cfg_interval'),
  )
  def test_bad_values_raise(self, kwargs, name):
    with self.assertRaisesRegex(ValueError, name):
      logits.Sampling(**kwargs)


if __name__ == '__main__':
  absltest.main()
