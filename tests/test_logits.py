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

  @parameterized.product(cfg_scale=[0.5, 1.0, 1.5, 4.0], cfg_interval=[-1, 0, 1, 3])
  def test_cfg_matches_llamagen_decode_loop(self, cfg_scale, cfg_interval):
    """Which tokens are guided, against LlamaGen's `generate` (autoregressive/models/
    generate.py) re-implemented here: the prefill token is guided when cfg_scale > 1;
    decode step i (token i + 1) is guided until i > cfg_interval turns cfg_flag off."""
    num_tokens = 7
    guided_in_llamagen = [cfg_scale > 1.0]  # prefill
    cfg_flag = True
    for i in range(num_tokens - 1):  # decode_n_tokens
      if cfg_interval > -1 and i > cfg_interval:
        cfg_flag = False
      guided_in_llamagen.append(cfg_scale > 1.0 and cfg_flag)

    sampling = logits.Sampling(cfg_scale=cfg_scale, cfg_interval=cfg_interval)
    self.assertEqual(sampling.uses_cfg, cfg_scale > 1.0)
    cond = jax.random.normal(jax.random.key(0), (num_tokens, 6))
    uncond = jax.random.normal(jax.random.key(1), (num_tokens, 6))
    out = np.asarray(sampling.probs(cond, uncond, token_index=jnp.arange(num_tokens)))
    for index, guided in enumerate(guided_in_llamagen):
      combined = uncond[index] + (cond[index] - uncond[index]) * cfg_scale
      expected = jax.nn.softmax(combined if guided else cond[index])
      np.testing.assert_allclose(out[index], expected, rtol=1e-5, err_msg=f'token {index}')

  def test_no_cfg_without_uncond_or_scale_one(self):
    cond = jnp.array([1.0, 0.0])
    for sampling, uncond in ((logits.Sampling(cfg_scale=3.0), None),
                             (logits.Sampling(cfg_scale=1.0), jnp.array([5.0, 0.0]))):
      np.testing.assert_allclose(sampling.probs(cond, uncond), jax.nn.softmax(cond), rtol=1e-6)

  def test_presets_are_the_released_settings(self):
    """Values read from the released code (cited in logits.SAMPLING_PRESETS)."""
    expected = {
        'llamagen_c2i': (4.0, 2000, 1.0, 1.0),
        'llamagen_c2i_fid': (1.5, 0, 1.0, 1.0),
        'llamagen_t2i': (7.5, 1000, 1.0, 1.0),
        'lumina_mgpt': (4.0, 2000, 1.0, 1.0),
        'lumina_mgpt_default': (3.0, 2000, 1.0, 1.0),
        'janus_pro': (5.0, 0, 1.0, 1.0),
    }
    self.assertEqual(set(logits.SAMPLING_PRESETS), set(expected))
    for name, (cfg_scale, top_k, top_p, temperature) in expected.items():
      sampling = logits.Sampling.preset(name)
      self.assertEqual((sampling.cfg_scale, sampling.top_k, sampling.top_p,
                        sampling.temperature, sampling.cfg_interval),
                       (cfg_scale, top_k, top_p, temperature, -1), name)
    self.assertEqual(logits.Sampling.preset('janus_pro', temperature=0.5).temperature, 0.5)
    with self.assertRaisesRegex(ValueError, "unknown preset 'llamagen'"):
      logits.Sampling.preset('llamagen')

  def test_preset_builds_subclasses(self):
    from specdec_jax.models import lumina_layout  # pylint: disable=g-import-not-at-top
    layout = lumina_layout.ImageLayout(2, 2)
    sampling = lumina_layout.LuminaSampling.preset('lumina_mgpt', layout=layout)
    self.assertIsInstance(sampling, lumina_layout.LuminaSampling)
    self.assertEqual((sampling.cfg_scale, sampling.top_k, sampling.layout), (4.0, 2000, layout))

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
