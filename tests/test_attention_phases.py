"""Attention phases (`decode.generate(attention_phases=P)`): the decode runs P loops on a
target cache that grows between them, so attention reads only the slots a phase can reach.

The phases change which cache slots attention reads, never what it sees: the
tokens must follow the target's law (whole-loop chi-square on the toy models,
with a negative control whose grown slots are hidden), and through a real
model (LlamaGen, the EAGLE-1 head) every mode must give the tokens and counters
of the one-loop decode for the same keys.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from specdec_jax import decode
from specdec_jax import kv_cache as kv
from specdec_jax import phases
from specdec_jax import logits
from specdec_jax import rules
from specdec_jax import verify
from tests.decode_support import FAST
from tests.decode_support import NUM_TOKENS
from tests.decode_support import TARGET
from tests.decode_support import TREE
from tests.decode_support import _chi_square_pvalue
from tests.decode_support import _params
from tests.decode_support import _run
from tests.decode_support import P_THRESHOLD

TOY_CASES = (
    ('vanilla', decode.Vanilla(), logits.Sampling()),
    ('chain_eagle_cfg', decode.ChainDraft(2, 'eagle'), logits.Sampling(cfg_scale=2.0)),
    ('tree_model', decode.TreeDraft(TREE, 'model'), logits.Sampling(temperature=0.8)),
    ('jacobi_scd', decode.Jacobi(3, 'random', coupling='maximal'), logits.Sampling()),
)


def _tight_spans(prefix_length, num_tokens, width, capacity, num_phases):
  """One phase whose cache holds the prefix and one window: the first verify step runs
  in it, every later one after the growth."""
  del num_tokens, num_phases
  span = prefix_length + width
  return (span,) if span < capacity else ()


class ToyLawTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self._spans = phases.spans
    phases.spans = _tight_spans
    decode.clear_compile_cache()

  def tearDown(self):
    phases.spans = self._spans
    decode.clear_compile_cache()
    super().tearDown()

  def _law_pvalue(self, mode, sampling):
    result = _run(mode, sampling, attention_phases=2)
    law = TARGET.joint_law(_params()[0], 0, NUM_TOKENS, sampling)
    return _chi_square_pvalue(np.asarray(result.tokens), law)

  @parameterized.named_parameters(*TOY_CASES)
  def test_joint_law_with_a_phase_change(self, mode, sampling):
    self.assertGreater(self._law_pvalue(mode, sampling), P_THRESHOLD)
    plans = [plan for plan, _ in decode._PREPARED.values()]  # pylint: disable=protected-access
    self.assertTrue(plans and all(plan.attention_spans for plan in plans),
                    'the decode ran without a phase change')

  def test_phase_overrunning_its_cache_fails(self):
    """Negative control: a phase that runs one step past its cache (its window's write
    is clamped onto the committed tokens) must break the law."""
    original = phases.window_fits
    phases.window_fits = lambda lengths, width, span: jnp.max(lengths) + width <= span + 1
    try:
      p_value = self._law_pvalue(decode.Vanilla(), logits.Sampling())
    finally:
      phases.window_fits = original
    self.assertLess(p_value, P_THRESHOLD)


class RealModelTest(parameterized.TestCase):
  """LlamaGen (one layer, 2D RoPE) with the EAGLE-1 head, CFG, temperature 1, 3 images
  with their own keys, 36 tokens: three phases give the one loop's tokens and counters."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    from specdec_jax.models import eagle, llamagen  # pylint: disable=g-import-not-at-top
    config = llamagen.GPTConfig(n_layer=1, n_head=4, dim=32, vocab_size=64, num_classes=4,
                                block_size=36)
    cls.target = llamagen.LlamaGenGPT(config)
    cls.target_params = cls.target.init_params(jax.random.key(0))
    cls.head = eagle.EagleDrafter(eagle.llamagen_drafter_config(config))
    cls.head_params = eagle.attach_head(cls.head.init_params(jax.random.key(1)),
                                        cls.target_params['output']['kernel'])

  def _run(self, mode, phases):
    sampling = logits.Sampling(cfg_scale=2.0)
    cond = self.target.cfg_cond(self.target_params, jnp.array([0, 1, 3]))
    drafter = {} if isinstance(mode, (decode.Vanilla, decode.Jacobi)) else dict(
        draft=self.head, draft_params=self.head_params)
    return decode.generate(
        self.target, self.target_params, cond, num_tokens=36,
        key=jax.random.split(jax.random.key(5), 3), mode=mode, sampling=sampling,
        rule=None if isinstance(mode, decode.Vanilla) else rules.Lossless(),
        compiler_options=FAST, attention_phases=phases, **drafter)

  @parameterized.named_parameters(
      ('vanilla', decode.Vanilla()),
      ('chain', decode.ChainDraft(3, 'eagle')),
      ('tree', decode.TreeDraft(verify.StaticTree.from_paths(((0,), (1,), (0, 0))), 'eagle')),
      ('jacobi', decode.Jacobi(4)),
      ('eagle2', decode.DynamicTreeDraft(total_tokens=6, depth=2, top_k=2, drafts='sampled')),
  )
  def test_phases_give_the_one_loop_tokens(self, mode):
    width = decode.window_width(mode)
    spans = phases.spans(1, 36, width, 1 + 36 - 1 + width, 3)
    self.assertLen(spans, 2)
    one_loop, phased = self._run(mode, 1), self._run(mode, 3)
    np.testing.assert_array_equal(np.asarray(phased.tokens), np.asarray(one_loop.tokens))
    for name in ('verify_steps', 'accepted_tokens', 'committed_tokens', 'accepted_per_position'):
      np.testing.assert_array_equal(np.asarray(getattr(phased.metrics, name)),
                                    np.asarray(getattr(one_loop.metrics, name)), err_msg=name)


class SpansAndGrowthTest(absltest.TestCase):

  def test_spans(self):
    width = decode.window_width(decode.ChainDraft(4, 'eagle'))  # 5
    capacity = 1 + 196 - 1 + width
    self.assertEqual(phases.spans(1, 196, width, capacity, 1), ())
    spans = phases.spans(1, 196, width, capacity, 4)
    # prefix + ceil(196 p / 4) + window, rounded up to SPAN_ALIGNMENT slots.
    self.assertEqual(spans, (56, 104, 160))
    self.assertTrue(all(s % phases.SPAN_ALIGNMENT == 0 for s in spans))
    # More phases than slots to split: spans never repeat or reach the capacity.
    many = phases.spans(1, 8, width, 1 + 8 - 1 + width, 8)
    self.assertEqual(list(many), sorted(set(many)))
    self.assertTrue(all(s < 13 for s in many))

  def test_bad_phases_are_rejected(self):
    for bad in (0, -1, 1.5, True, '2'):
      with self.assertRaisesRegex(ValueError, 'attention_phases must be an int >= 1'):
        phases.spans(1, 8, 1, 9, bad)

  def test_grow_keeps_the_slots_and_adds_valid_ones(self):
    for stacked in (False, True):
      cache = kv.init_cache(num_layers=2, batch_size=2, capacity=5, num_kv_heads=1, head_dim=3,
                            stacked=stacked)
      keys = jax.random.normal(jax.random.key(0), (2, 2, 1, 3))  # [B, T, K, D]
      cache = kv.advance(kv.update_layer(cache, 1, keys, keys + 1), 2)
      cache = cache.replace(key_valid=cache.key_valid.at[0, 0].set(False))
      grown = phases.grow(cache, 9)
      self.assertEqual(grown.capacity, 9)
      np.testing.assert_array_equal(grown.lengths, cache.lengths)
      old_keys, old_values = kv.layer_buffers(cache, 1)
      new_keys, new_values = kv.layer_buffers(grown, 1)
      self.assertEqual(new_keys.shape, (2, 1, 3, 9))
      self.assertEqual(new_values.shape, (2, 1, 9, 3))
      np.testing.assert_array_equal(new_keys[..., :5], old_keys)
      np.testing.assert_array_equal(new_values[:, :, :5], old_values)
      np.testing.assert_array_equal(new_keys[..., 5:], 0.0)
      np.testing.assert_array_equal(grown.key_valid[:, :5], cache.key_valid)
      self.assertTrue(bool(grown.key_valid[:, 5:].all()))
      with self.assertRaisesRegex(ValueError, 'only grows'):
        phases.grow(cache, 4)


if __name__ == '__main__':
  absltest.main()
