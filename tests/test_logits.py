"""Closed-form checks of the shared logits processing."""

import dataclasses

import chex
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import logits
from specdec_jax import topk
from tests import logits_reference


class ProcessLogitsTest(parameterized.TestCase):

  def test_temperature_is_softmax_of_scaled_logits(self):
    x = jnp.array([0.5, -1.0, 2.0, 0.0])
    np.testing.assert_allclose(logits.process_logits(x, temperature=0.5),
                               jax.nn.softmax(x / 0.5), rtol=1e-6)

  def test_default_top_p_filters_nothing(self):
    """top_p=1 (the default) is no nucleus at all, not one at p = 1: in float32 the
    sorted cumulative mass reaches 1 before the last token in 76 of these 256 rows,
    and a nucleus at p = 1 would drop the tokens after it (the negative control)."""
    x = jax.random.normal(jax.random.key(0), (256, 1024)) * 4.0
    np.testing.assert_array_equal(logits.process_logits(x), jax.nn.softmax(x))
    at_one = jax.nn.softmax(logits.filter_logits(x, top_k=0, top_p=1.0, nucleus=True))
    self.assertGreater(int(jnp.sum(jnp.any(at_one != jax.nn.softmax(x), axis=-1))), 0)

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

  def test_greedy_marks_broken_rows_as_the_softmax_does(self):
    inf = np.inf
    rows = jnp.array([[0.1, -inf, 0.3], [np.nan, 0.9, 0.3], [0.1, inf, 0.3], [-inf, -inf, -inf]])
    greedy = np.asarray(logits.process_logits(rows, temperature=0))
    soft = np.asarray(logits.process_logits(rows, temperature=1))
    np.testing.assert_array_equal(greedy[0], [0, 0, 1])  # masked tokens are fine
    np.testing.assert_array_equal(np.isnan(greedy).all(-1), [False, True, True, True])
    np.testing.assert_array_equal(np.isnan(greedy).any(-1), np.isnan(soft).any(-1))

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

  @parameterized.parameters(0.0, 0.5, 1.0, 2.0)
  def test_guide_below_one_guides_every_scale_but_one(self, cfg_scale):
    """Lumina-mGPT's and Janus's code guide with u + s (c - u) whenever s != 1;
    LlamaGen's convention (the default, the negative control below 1) only above 1."""
    cond = jax.random.normal(jax.random.key(0), (3, 6))
    uncond = jax.random.normal(jax.random.key(1), (3, 6))
    guided = logits.Sampling(cfg_scale=cfg_scale, guide_below_one=True)
    self.assertEqual(guided.uses_cfg, cfg_scale != 1.0)
    np.testing.assert_allclose(guided.probs(cond, uncond),
                               jax.nn.softmax(uncond + cfg_scale * (cond - uncond)), rtol=1e-5)
    llamagen = logits.Sampling(cfg_scale=cfg_scale)
    self.assertEqual(llamagen.uses_cfg, cfg_scale > 1.0)
    if cfg_scale < 1.0:
      np.testing.assert_allclose(llamagen.probs(cond, uncond), jax.nn.softmax(cond), rtol=1e-6)
    with self.assertRaisesRegex(ValueError, 'guide_below_one must be a bool'):
      logits.Sampling(cfg_scale=cfg_scale, guide_below_one=1)

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
    self.assertEqual({name for name in expected if logits.Sampling.preset(name).guide_below_one},
                     {'lumina_mgpt', 'lumina_mgpt_default', 'janus_pro'})
    with self.assertRaisesRegex(ValueError, "unknown preset 'llamagen'"):
      logits.Sampling.preset('llamagen')

  def test_preset_builds_subclasses(self):
    from specdec_jax.models import lumina_layout  # pylint: disable=g-import-not-at-top
    layout = lumina_layout.ImageLayout(2, 2)
    sampling = lumina_layout.LuminaSampling.preset('lumina_mgpt', layout=layout)
    self.assertIsInstance(sampling, lumina_layout.LuminaSampling)
    self.assertEqual((sampling.cfg_scale, sampling.top_k, sampling.layout), (4.0, 2000, layout))
    self.assertTrue(lumina_layout.LuminaSampling(layout=layout).guide_below_one)

  @parameterized.parameters(
      (dict(temperature=-1.0), 'temperature'),
      (dict(top_p=0.0), 'top_p'),
      (dict(top_p=1.5), 'top_p'),
      (dict(top_k=-2), 'top_k'),
      (dict(cfg_interval=-3), 'cfg_interval'),
      (dict(temperature=1e-39), 'temperature.*1 / temperature is not finite in float32'),
  )
  def test_bad_values_raise(self, kwargs, name):
    with self.assertRaisesRegex(ValueError, name):
      logits.Sampling(**kwargs)


class SamplingPytreeTest(absltest.TestCase):
  """cfg_scale, temperature and top_p are traced; top_k, cfg_interval and the flags static."""

  def test_children_are_the_float_fields_and_aux_holds_the_flags(self):
    sampling = logits.Sampling(cfg_scale=4.0, temperature=0.5, top_p=0.9, top_k=7,
                               cfg_interval=2)
    leaves, treedef = jax.tree.flatten(sampling)
    self.assertEqual(leaves, [4.0, 0.5, 0.9])
    self.assertEqual(sampling.flags, logits.SamplingFlags(cfg=True, greedy=False, nucleus=True))
    self.assertEqual(jax.tree.unflatten(treedef, leaves), sampling)
    # Same structure for other values on the same side of the flags; not across them.
    same = jax.tree.structure(logits.Sampling(cfg_scale=2.0, temperature=1.5, top_p=0.5,
                                              top_k=7, cfg_interval=2))
    self.assertEqual(same, treedef)
    for other in (dict(cfg_scale=1.0), dict(temperature=0.0), dict(top_p=1.0), dict(top_k=8)):
      changed = dataclasses.replace(sampling, **other)
      self.assertNotEqual(jax.tree.structure(changed), treedef, other)

  def test_int_values_are_stored_as_floats(self):
    """An int scale must not give the compiled decode a second signature."""
    sampling = logits.Sampling(cfg_scale=4, temperature=1, top_p=1)
    self.assertEqual([type(x) for x in jax.tree.leaves(sampling)], [float] * 3)

  def test_jit_traces_once_over_a_sweep(self):
    cond = jax.random.normal(jax.random.key(0), (3, 40))
    uncond = jax.random.normal(jax.random.key(1), (3, 40))

    @jax.jit
    @chex.assert_max_traces(n=1)
    def probs(sampling, cond, uncond):
      return sampling.probs(cond, uncond)

    chex.clear_trace_counter()
    for cfg_scale, temperature, top_p in ((2.0, 1.0, 0.9), (4.0, 0.5, 0.7), (1.5, 2.0, 0.99)):
      sampling = logits.Sampling(cfg_scale=cfg_scale, temperature=temperature, top_p=top_p,
                                 top_k=10)
      np.testing.assert_allclose(probs(sampling, cond, uncond), sampling.probs(cond, uncond),
                                 rtol=1e-5, atol=1e-7)
    chex.clear_trace_counter()

  def test_tree_map_on_concrete_values_checks_them(self):
    with self.assertRaisesRegex(ValueError, 'top_p'):
      jax.tree.map(lambda x: x * 2, logits.Sampling(top_p=0.9))

  def test_subclasses_are_registered_with_their_fields_static(self):
    from specdec_jax.models import lumina_layout  # pylint: disable=g-import-not-at-top
    layout = lumina_layout.ImageLayout(2, 2)
    sampling = lumina_layout.LuminaSampling(layout=layout, cfg_scale=3.0, top_k=50)
    leaves, treedef = jax.tree.flatten(sampling)
    self.assertEqual(leaves, [3.0, 1.0, 1.0])
    rebuilt = jax.tree.unflatten(treedef, leaves)
    self.assertIsInstance(rebuilt, lumina_layout.LuminaSampling)
    self.assertEqual(rebuilt.layout, layout)


def _test_logits(seed, shape=(4, 3, 257)):
  """Random logits, half of the rows rounded so that many values tie (also at the
  k-th value and at the nucleus boundary), a few -inf entries."""
  x = np.asarray(jax.random.normal(jax.random.key(seed), shape)) * 2
  x[::2] = np.round(x[::2] * 2) / 2
  x[1, 0, :5] = -np.inf
  return jnp.asarray(x, jnp.float32)


class FilterLogitsTest(parameterized.TestCase):
  """The single-sort exact path against the previous implementation, ties included."""

  @parameterized.product(top_k=[0, 1, 7, 50, 256, 257], top_p=[0.05, 0.5, 0.9, 0.999, 1.0],
                         seed=[0, 1])
  def test_exact_path_equals_the_previous_masks(self, top_k, top_p, seed):
    x = _test_logits(seed)
    expected = logits_reference.top_k_mask(x, top_k)
    if top_p < 1:
      expected = logits_reference.top_p_mask(expected, top_p)
    got = logits.filter_logits(x, top_k=top_k, top_p=top_p, nucleus=top_p < 1)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))

  def test_ties_at_the_nucleus_boundary_are_kept_in_index_order(self):
    """Four equal logits: top_p 0.3 keeps the first two (0.25 <= 0.3 < 0.5), by index."""
    x = jnp.array([0.0, 1.0, 1.0, 1.0, 1.0, -9.0]) * 1.0
    got = np.isfinite(np.asarray(logits.top_p_mask(x, 0.3)))
    np.testing.assert_array_equal(got, [False, True, True, False, False, False])

  @parameterized.product(top_k=[1, 7, 50], top_p=[0.5, 0.9, 1.0], seed=[0, 1])
  def test_approx_equals_exact_on_cpu(self, top_k, top_p, seed):
    """On CPU `lax.approx_max_k` is exact, so the approximate path must give the exact
    masks (its nucleus is normalised differently, so only a cumulative mass within an
    ulp of top_p could differ; the fixed seeds have none). Continuous logits: where the
    nucleus reaches past the k-th value, the approx path keeps all its ties."""
    x = jax.random.normal(jax.random.key(seed), (4, 3, 257)) * 2
    exact = logits.filter_logits(x, top_k=top_k, top_p=top_p, nucleus=top_p < 1)
    approx = logits.filter_logits(x, top_k=top_k, top_p=top_p, nucleus=top_p < 1,
                                  topk_method='approx', topk_recall=0.9)
    np.testing.assert_array_equal(np.isfinite(approx), np.isfinite(exact))
    np.testing.assert_array_equal(np.asarray(approx), np.asarray(exact))

  def test_sampling_approx_probs_equal_exact_on_cpu(self):
    x = jax.random.normal(jax.random.key(3), (2, 5, 300))
    exact = logits.Sampling(top_k=20, top_p=0.8).probs(x)
    approx = logits.Sampling(top_k=20, top_p=0.8, topk_method='approx').probs(x)
    np.testing.assert_allclose(approx, exact, rtol=1e-6, atol=1e-8)
    with self.assertRaisesRegex(ValueError, 'topk_method'):
      logits.Sampling(topk_method='fast')


def _tied_logits(seed: int, vocab: int = 256) -> jax.Array:
  """[3, 4, V] logits drawn from six values (heavy ties), a few -inf."""
  rng = np.random.default_rng(seed)
  x = rng.integers(0, 6, size=(3, 4, vocab)).astype(np.float32) * 0.7
  x[0, 1, ::3] = -np.inf
  return jnp.asarray(x)


def _stable_sort_law(row, top_k: int, top_p: float):
  """LlamaGen's `top_k_top_p_filtering` with a stable sort, in float64, on one row [V].

  Returns (the filtered row, whether a cumulative mass lies within 1e-6 of top_p,
  where float32 rounding decides).
  """
  row = np.asarray(row, np.float64)
  if 0 < top_k < row.size:
    row = np.where(row < np.sort(row)[::-1][top_k - 1], -np.inf, row)
  order = np.argsort(-row, kind='stable')
  cumulative = np.cumsum(np.exp(row[order] - row[order[0]]))
  cumulative /= cumulative[-1]
  removed = np.concatenate([[False], cumulative[:-1] > top_p])
  filtered = row.copy()
  filtered[order[removed]] = -np.inf
  return filtered, bool(np.any(np.abs(cumulative[:-1] - top_p) < 1e-6))


class KthLargestTest(parameterized.TestCase):
  """`topk.kth_largest` (bisection, no sort) equals the k-th entry of a descending sort."""

  @parameterized.parameters(2, 7, 256, 16384)
  def test_equals_the_sorted_kth_value(self, vocab):
    rng = np.random.default_rng(vocab)
    rows = rng.normal(size=(6, vocab)).astype(np.float32) * 4
    rows[1] = np.round(rows[1])  # heavy ties
    rows[2, : vocab // 2] = -np.inf  # masked tokens
    rows[3] = 0.0
    rows[3, ::2] = -0.0  # both zeros
    rows[4] = rows[4] * 1e-38  # subnormals
    for k in sorted({1, 2, vocab // 3 + 1, vocab - 1, vocab}):
      want = -np.sort(-rows, axis=-1)[:, k - 1:k]
      np.testing.assert_array_equal(np.asarray(topk.kth_largest(jnp.asarray(rows), k)), want)
    # The mask top_k_mask builds with it keeps exactly the sort's survivors.
    k = max(1, vocab // 4)
    kth = -np.sort(-rows, axis=-1)[:, k - 1:k]
    np.testing.assert_array_equal(np.isfinite(np.asarray(topk.top_k_mask(jnp.asarray(rows), k))),
                                  (rows >= kth) & np.isfinite(rows))

  def test_negative_control(self):
    """The (k+1)-th value is a different answer on distinct values: the test can fail."""
    rows = jnp.asarray(np.random.default_rng(0).permutation(64).astype(np.float32)[None])
    self.assertEqual(float(topk.kth_largest(rows, 5)[0, 0]), 59.0)
    self.assertNotEqual(float(topk.kth_largest(rows, 6)[0, 0]), 59.0)


class BlockedTopKTest(parameterized.TestCase):
  """topk_blocks = n: the same k-th value from n vocabulary blocks, ties included."""

  @parameterized.product(blocks=[1, 2, 4, 8], top_k=[1, 7, 50, 32, 64, 128, 250, 255],
                         seed=[0, 1])
  def test_top_k_masks_equal_the_single_sort(self, blocks, top_k, seed):
    x = _tied_logits(seed)  # V = 256: V / n = 256..32, so k >= V / n occurs
    single = logits.filter_logits(x, top_k=top_k, nucleus=False)
    blocked = logits.filter_logits(x, top_k=top_k, nucleus=False, topk_blocks=blocks)
    np.testing.assert_array_equal(np.asarray(blocked), np.asarray(single))
    np.testing.assert_array_equal(
        np.asarray(logits.top_k_mask(x, top_k, blocks=blocks)), np.asarray(single))

  @parameterized.product(blocks=[2, 4, 8], top_k=[1, 7, 50, 128, 250],
                         top_p=[0.07, 0.37, 0.83, 0.999], seed=[0, 1])
  def test_top_p_equals_the_single_sort(self, blocks, top_k, top_p, seed):
    """Also where the nucleus reaches the k-th value and runs on into its ties."""
    x = _tied_logits(seed)
    single = np.asarray(logits.filter_logits(x, top_k=top_k, top_p=top_p))
    blocked = np.asarray(logits.filter_logits(x, top_k=top_k, top_p=top_p, topk_blocks=blocks))
    np.testing.assert_array_equal(blocked, single)

  def test_every_path_equals_the_single_sort_on_integer_logits(self):
    """Many small rows of integer logits (ties everywhere, masses often exactly equal
    to top_p): blocks and approx_max_k (exact on CPU) give the single sort's masks bit
    for bit, and the single sort follows the law away from exact boundary masses."""
    rng = np.random.default_rng(7)
    checked = 0
    for vocab in (8, 16, 48):
      x = rng.integers(-3, 3, size=(40, vocab)).astype(np.float32)
      x[::5, ::4] = -np.inf
      for top_k in (1, 2, 3, 5, vocab // 2, vocab - 1):
        for top_p in (0.1, 0.3, 0.5, 0.7, 0.9, 0.99):
          single = np.asarray(logits.filter_logits(jnp.asarray(x), top_k=top_k, top_p=top_p))
          for kwargs in [dict(topk_blocks=b) for b in (2, 4, 8)] + [dict(topk_method='approx')]:
            other = logits.filter_logits(jnp.asarray(x), top_k=top_k, top_p=top_p, **kwargs)
            np.testing.assert_array_equal(np.asarray(other), single,
                                          err_msg=f'{kwargs} k={top_k} p={top_p}')
          for row, got in zip(x, single):
            expected, on_boundary = _stable_sort_law(row, top_k, top_p)
            if not on_boundary:
              checked += 1
              np.testing.assert_array_equal(got, expected, err_msg=f'k={top_k} p={top_p}')
    self.assertGreater(checked, 3000)

  def test_documented_tie_case(self):
    """Logits [4, 3, 2, 2, 2, 0, -1, -2], k = 3, top_p = 0.8: top-k keeps the three
    tied 2s; the nucleus stops at the first of them (index order), on every path."""
    x = jnp.array([4.0, 3, 2, 2, 2, 0, -1, -2])
    expected = jax.nn.softmax(jnp.array([4.0, 3, 2]))
    for kwargs in (dict(), dict(topk_blocks=2), dict(topk_blocks=4),
                   dict(topk_method='approx')):
      probs = logits.process_logits(x, top_k=3, top_p=0.8, **kwargs)
      np.testing.assert_allclose(probs[:3], expected, rtol=1e-6, err_msg=str(kwargs))
      np.testing.assert_array_equal(probs[3:], 0.0)

  def test_sampling_probs_and_errors(self):
    x = jax.random.normal(jax.random.key(4), (2, 3, 240))
    np.testing.assert_allclose(logits.Sampling(top_k=20, topk_blocks=4).probs(x),
                               logits.Sampling(top_k=20).probs(x), rtol=1e-6, atol=1e-8)
    # Without top-k (or with 'approx') the blocks are unused: any n is accepted.
    logits.Sampling(topk_blocks=7).probs(x)
    with self.assertRaisesRegex(ValueError, 'topk_blocks=7 .* divide the vocabulary size 240'):
      logits.Sampling(top_k=20, topk_blocks=7).probs(x)
    for bad in (0, -2, 2.0):
      with self.assertRaisesRegex(ValueError, 'topk_blocks'):
        logits.Sampling(topk_blocks=bad)


class TieEdgeTest(absltest.TestCase):
  """Exact ties the law tests never reach: top-p at a cumulative mass equal to
  top_p, greedy decoding between equal maxima."""

  def test_top_p_at_exact_cumulative_equality_keeps_the_next_token(self):
    # 4 equal logits: masses 0.25 exactly; cumulative 0.5 == top_p is not "> top_p",
    # so LlamaGen/HF keep the third token too. Both the sort path and the top-k path.
    x = jnp.zeros((8,))
    want = [True, True, True, False, False, False, False, False]
    got = np.isfinite(np.asarray(logits.filter_logits(x[:4], top_p=0.5)))
    np.testing.assert_array_equal(got, want[:4])
    np.testing.assert_array_equal(got, np.isfinite(logits_reference.top_p_mask(x[:4], 0.5)))
    got_k = np.isfinite(np.asarray(logits.filter_logits(x.at[4:].set(-1.0), top_k=4, top_p=0.5)))
    np.testing.assert_array_equal(got_k, want)

  def test_greedy_ties_take_the_first_argmax(self):
    out = logits.process_logits(jnp.array([1.0, 3.0, 3.0, 0.0]), temperature=0)
    np.testing.assert_array_equal(out, [0, 1, 0, 0])  # jnp/torch argmax: first maximum


class NonFiniteLogitsTest(parameterized.TestCase):
  """A NaN or +inf logit makes its row's probabilities all NaN under every filter,
  which is how the decode detects broken target rows (NonFiniteProbabilitiesError);
  top-k and top-p together used to drop a NaN and return a clean law."""

  @parameterized.named_parameters(
      ('top_k', dict(top_k=3)), ('top_p', dict(top_p=0.95)),
      ('top_k_top_p', dict(top_k=3, top_p=0.95)),
      ('blocks', dict(top_k=3, topk_blocks=2)),
      ('blocks_top_p', dict(top_k=3, top_p=0.95, topk_blocks=2)),
      ('approx', dict(top_k=3, topk_method='approx')),
      ('approx_top_p', dict(top_k=3, top_p=0.95, topk_method='approx')),
      ('temperature_top_k_top_p', dict(temperature=0.5, top_k=2, top_p=0.5)),
      ('greedy', dict(temperature=0.0, top_k=3, top_p=0.95)))
  def test_nan_and_inf_rows_are_nan(self, kwargs):
    nan, inf = np.nan, np.inf
    rows = jnp.array([[1.0, nan, 3.0, 4.0], [nan, 1.0, 3.0, 4.0], [1.0, 2.0, 3.0, nan],
                      [1.0, inf, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]])
    sampling = logits.Sampling(**kwargs)
    for probs in (sampling.probs(rows), jax.jit(lambda s: s.probs(rows))(sampling)):
      probs = np.asarray(probs)
      np.testing.assert_array_equal(np.isnan(probs[:4]), True, err_msg=str(probs))
      self.assertTrue(np.all(np.isfinite(probs[4])), probs[4])
      np.testing.assert_allclose(probs[4].sum(), 1.0, rtol=1e-6)


class ProcessLogitsChecksTest(parameterized.TestCase):
  """process_logits, filter_logits and top_k_mask refuse what Sampling refuses."""

  @parameterized.parameters(
      (dict(temperature=-1.0), 'process_logits: temperature'),
      (dict(temperature=np.nan), 'process_logits: temperature'),
      (dict(temperature=1e-39), 'temperature.*1 / temperature is not finite in float32'),
      (dict(top_k=2.5), 'process_logits: top_k must be an int'),
      (dict(top_k=-2), 'process_logits: top_k'),
      (dict(top_p=0.0), 'process_logits: top_p'),
      (dict(top_p=-0.5), 'process_logits: top_p'),
      (dict(top_p=1.5), 'process_logits: top_p'),
      (dict(top_p=np.nan), 'process_logits: top_p'),
      (dict(topk_method='aprox'), "process_logits: topk_method .* got 'aprox'"),
      (dict(top_k=2, topk_blocks=0), 'process_logits: topk_blocks'),
      (dict(top_k=2, topk_blocks=-1), 'process_logits: topk_blocks'),
      (dict(top_k=2, topk_method='approx', topk_recall=0.0), 'process_logits: topk_recall'),
      (dict(temperature=0.0, top_k=-1), 'process_logits: top_k'),  # greedy checks them too
  )
  def test_bad_values_raise(self, kwargs, message):
    x = jnp.array([[1.0, 2.0, 3.0, 4.0]])
    with self.assertRaisesRegex(ValueError, message):
      logits.process_logits(x, **kwargs)

  def test_filter_logits_and_top_k_mask_check_their_settings(self):
    x = jnp.array([1.0, 2.0, 3.0, 4.0])
    for kwargs, message in ((dict(top_k=2, topk_method='aprox'), 'filter_logits: topk_method'),
                            (dict(top_k=2.5), 'filter_logits: top_k'),
                            (dict(top_k=2, topk_blocks=0), 'filter_logits: topk_blocks'),
                            (dict(top_p=0.0), 'filter_logits: top_p')):
      with self.assertRaisesRegex(ValueError, message):
        logits.filter_logits(x, **kwargs)
    with self.assertRaisesRegex(ValueError, "top_k_mask: topk_method .* got 'aprox'"):
      logits.top_k_mask(x, 2, method='aprox')
    with self.assertRaisesRegex(ValueError, 'top_k_mask: topk_recall'):
      logits.top_k_mask(x, 2, method='approx', recall=0.0)

  def test_traced_temperature_and_top_p_are_accepted(self):
    x = jax.random.normal(jax.random.key(5), (3, 40))
    traced = jax.jit(lambda t, p: logits.process_logits(x, temperature=t, top_k=9, top_p=p,
                                                        greedy=False, nucleus=True))
    np.testing.assert_allclose(traced(0.7, 0.9),
                               logits.process_logits(x, temperature=0.7, top_k=9, top_p=0.9),
                               rtol=1e-6)

  def test_smallest_temperature_has_a_finite_reciprocal(self):
    """MIN_TEMPERATURE's reciprocal is finite in float32, also traced (where XLA
    flushes a subnormal temperature, 3e-39 gave NaN). Only logits below about
    3.4e38 * MIN_TEMPERATURE = 2 in magnitude stay finite once scaled by it."""
    x = jnp.array([1.0, 2.0])
    sampling = logits.Sampling(temperature=logits.MIN_TEMPERATURE)
    for probs in (sampling.probs(x), jax.jit(lambda s: s.probs(x))(sampling),
                  logits.process_logits(x, temperature=logits.MIN_TEMPERATURE)):
      np.testing.assert_array_equal(probs, [0.0, 1.0])


class CfgShapeTest(parameterized.TestCase):
  """Conditional and unconditional logits must have one shape: broadcasting a
  [B, 1] or [1, V] uncond silently guided with the wrong rows."""

  @parameterized.named_parameters(('one_logit', (2, 1)), ('one_row', (1, 4)),
                                  ('vocab', (2, 3)), ('rank', (4,)))
  def test_shape_mismatch_raises(self, uncond_shape):
    cond, uncond = jnp.zeros((2, 4)), jnp.ones(uncond_shape)
    message = r'uncond_logits must have the shape of cond_logits \(2, 4\)'
    with self.assertRaisesRegex(ValueError, message):
      logits.cfg_combine(cond, uncond, 2.0)
    with self.assertRaisesRegex(ValueError, message):
      logits.Sampling(cfg_scale=2.0).probs(cond, uncond)
    with self.assertRaisesRegex(ValueError, message):
      jax.jit(lambda s, c, u: s.probs(c, u))(logits.Sampling(cfg_scale=2.0), cond, uncond)


if __name__ == '__main__':
  absltest.main()
