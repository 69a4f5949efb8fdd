"""Engine-path tests for models/llamagen.py (prefill/forward with caches,
chains and trees); run without torch. See tests/test_llamagen.py.
"""

import warnings

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decode
from specdec_jax import drafting
from specdec_jax import logits
from specdec_jax import rules
from specdec_jax.models import eagle
from specdec_jax.models import llamagen
from tests.llamagen_support import RTOL
from tests.llamagen_support import tiny_config
from tests.llamagen_support import rel_err
from tests.llamagen_support import image_tokens
from tests.llamagen_support import fixture
from tests.llamagen_support import example_cond
from tests.llamagen_support import jit_prefill
from tests.llamagen_support import jit_forward
from tests.llamagen_support import capacity


class EnginePathTest(parameterized.TestCase):

  def _setup(self, model_type):
    config, _, params = fixture(model_type)
    params = jax.device_put(params)  # the converter's NumPy arrays, placed once
    model = llamagen.LlamaGenGPT(config)
    tokens = image_tokens(config)  # same tokens as ParityTest
    return config, params, model, jnp.asarray(tokens, jnp.int32), example_cond(config)[2]

  @parameterized.parameters('c2i', 't2i')
  def test_one_by_one_and_chunked_match_teacher_forced(self, model_type):
    config, params, model, tokens, cond = self._setup(model_type)
    expected = llamagen.forward_logits(params, config, cond, tokens)  # [2, N, V]
    prefix = jit_prefill(model, params, model.init_cache(2, capacity(config)), cond)
    chex.assert_shape(prefix.logits, (2, config.cls_token_num, config.vocab_size))
    np.testing.assert_array_equal(prefix.cache.lengths, config.cls_token_num)

    cache, one_by_one = prefix.cache, [prefix.logits[:, -1]]
    for t in range(tokens.shape[1]):
      out = jit_forward(model, params, cache, tokens[:, t: t + 1])
      cache = out.cache
      one_by_one.append(out.logits[:, 0])
    one_by_one = jnp.stack(one_by_one, axis=1)
    self.assertLess(rel_err(one_by_one, expected), RTOL)
    np.testing.assert_array_equal(cache.lengths, config.cls_token_num + tokens.shape[1])

    if model_type == 't2i':
      return  # windows are model-type independent; spare a compile
    cache, chunked = prefix.cache, [prefix.logits[:, -1:]]
    for start in range(0, tokens.shape[1], 3):  # 15 tokens = 5 windows of 3
      out = jit_forward(model, params, cache, tokens[:, start: start + 3])
      cache = out.cache
      chunked.append(out.logits)
    self.assertLess(rel_err(jnp.concatenate(chunked, axis=1), one_by_one), RTOL)

  def test_rollback_and_tree_window(self):
    config, params, model, tokens, cond = self._setup('c2i')
    cache = jit_prefill(model, params, model.init_cache(2, capacity(config)), cond).cache
    chain = lambda *columns: jnp.concatenate([tokens[:, c: c + 1] for c in columns], 1)
    fresh = jit_forward(model, params, cache, chain(0, 5, 6))
    # Rollback: after writing tokens (0, 1, 2), move the length back to P + 1
    # and write token 5: same logits as a fresh (0, 5) chain.
    written = jit_forward(model, params, cache, chain(0, 1, 2)).cache
    redo = jit_forward(model, params, written.replace(lengths=written.lengths - 2),
                       chain(5))
    self.assertLess(rel_err(redo.logits[:, 0], fresh.logits[:, 1]), RTOL)
    # Tree: token 0, then two siblings at depth 1 that do not see each other.
    window_mask = jnp.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]], bool)
    depths = jnp.array([0, 1, 1], jnp.int32)
    tree = jit_forward(model, params, cache, chain(0, 3, 4), window_mask, depths)
    chain_a = jit_forward(model, params, cache, chain(0, 3, 7))
    chain_b = jit_forward(model, params, cache, chain(0, 4, 7))
    self.assertLess(rel_err(tree.logits[:, 1], chain_a.logits[:, 1]), RTOL)
    self.assertLess(rel_err(tree.logits[:, 2], chain_b.logits[:, 1]), RTOL)
    self.assertGreater(rel_err(tree.logits[:, 1], tree.logits[:, 2]), 1e-3)

  def test_t2i_eagle_chain_prefills_the_drafter_with_the_condition(self):
    """A t2i target (8 condition positions) with an EAGLE drafter (7): the
    drafter's prefill holds the 7 condition pairs (`EagleDrafter.prefix_pairs`),
    the decode runs, and greedy chain decoding gives vanilla's greedy tokens."""
    config, params, model, _, cond = self._setup('t2i')
    drafter = eagle.EagleDrafter(eagle.llamagen_drafter_config(config))
    draft_params = eagle.attach_head(drafter.init_params(jax.random.key(3)),
                                     params['output']['kernel'])
    prefix = jit_prefill(model, params, model.init_cache(2, capacity(config)), cond)
    drafted = jax.jit(drafting.Drafter(drafter, drafting.EAGLE).prefill)(  # not op by op
        draft_params, drafter.init_cache(2, 16), cond, prefix.hidden)
    np.testing.assert_array_equal(drafted.lengths, config.cls_token_num - 1)
    greedy = logits.Sampling(temperature=0.0)
    run = lambda mode, **kw: decode.generate(
        model, params, cond, num_tokens=config.block_size, key=jax.random.key(0), mode=mode,
        sampling=greedy, compiler_options=decode.FAST_COMPILE, **kw)
    vanilla = run(decode.Vanilla())
    chain = run(decode.ChainDraft(3, 'eagle'), rule=rules.Lossless(), draft=drafter,
                draft_params=draft_params)
    np.testing.assert_array_equal(np.asarray(chain.tokens), np.asarray(vanilla.tokens))

  def test_cond_errors(self):
    config, params, model, _, _ = self._setup('c2i')
    cache = model.init_cache(2, 8)
    with self.assertRaisesRegex(ValueError, r'class ids of shape \(2,\)'):
      model.prefill(params, cache, jnp.array([1, 2, 3], jnp.int32))
    with self.assertRaisesRegex(ValueError, r'class ids must lie in \[0, 10\]'):
      model.prefill(params, cache, jnp.array([1, 11], jnp.int32))
    with self.assertRaisesRegex(ValueError, r'cfg_cond: c2i cond must be int class ids of '
                                r'shape \(2,\).*got float32'):
      model.cfg_cond(params, jnp.array([1.7, 2.9]))  # truncated to [1, 2] before
    with self.assertRaisesRegex(ValueError, r'cfg_cond: c2i cond must be int class ids \[B\]'):
      model.cfg_cond(params, jnp.array([[1], [2]], jnp.int32))
    guided = lambda cond: decode.generate(
        model, params, cond, num_tokens=2, key=jax.random.key(0),
        sampling=logits.Sampling(cfg_scale=2.0), compiler_options=decode.FAST_COMPILE)
    with self.assertWarnsRegex(RuntimeWarning, r'no unconditional row of cond .* holds the null '
                               r'class 10; pass model.cfg_cond'):
      guided(jnp.array([1, 2], jnp.int32))  # labels without cfg_cond: class 2 guides class 1
    with warnings.catch_warnings():
      warnings.simplefilter('error')
      guided(model.cfg_cond(params, jnp.array([1], jnp.int32)))
    # The mirror mistake: cfg_cond rows with guidance off (Sampling()'s default)
    # decode the null-class rows as images of their own.
    unguided = lambda cond: decode.generate(
        model, params, cond, num_tokens=2, key=jax.random.key(0),
        compiler_options=decode.FAST_COMPILE)
    with self.assertWarnsRegex(RuntimeWarning, r'CFG is off \(cfg_scale 1\) but cond looks like '
                               r'cfg_cond rows: .* so 2 of the 4 images are unconditional'):
      unguided(model.cfg_cond(params, jnp.array([1, 2], jnp.int32)))
    with warnings.catch_warnings():
      warnings.simplefilter('error')
      unguided(jnp.array([1, 2], jnp.int32))
      unguided(jnp.array([10, 10], jnp.int32))  # unconditional images on purpose
    t2i = llamagen.LlamaGenGPT(tiny_config('t2i'))
    bad_mask = llamagen.CaptionCond(jnp.zeros((2, 8, 24)), jnp.array([[1] * 7 + [0]] * 2, bool))
    with self.assertRaisesRegex(ValueError, 'left padded'):
      t2i.prefill(None, t2i.init_cache(2, 9), bad_mask)

  def test_a_draft_model_for_another_grid_or_kind_is_refused(self):
    """A 36-token (grid 6) draft for a 16-token (grid 4) target ran at lower acceptance,
    its 2D RoPE placing tokens at another (row, column); a t2i draft for a c2i target
    failed inside JAX with a concatenate TypeError."""
    config, params, model, _, _ = self._setup('c2i')
    cond = jnp.array([1, 2], jnp.int32)  # two images, unguided
    run = lambda draft_config: decode.generate(
        model, params, cond, num_tokens=config.block_size, key=jax.random.key(0),
        mode=decode.ChainDraft(2, 'model'), rule=rules.Lossless(),
        draft=llamagen.LlamaGenGPT(draft_config),
        draft_params=llamagen.LlamaGenGPT(draft_config).init_params(jax.random.key(1)),
        compiler_options=decode.FAST_COMPILE)
    with self.assertRaisesRegex(ValueError, r"draft model's grid_size 6 differs from the "
                                r"target's 4; its 2D RoPE"):
      run(tiny_config('c2i', dim=32, block_size=36))
    with self.assertRaisesRegex(ValueError, r"draft model's model_type 't2i' differs from the "
                                r"target's 'c2i'"):
      run(tiny_config('t2i', dim=32))
    self.assertEqual(run(tiny_config('c2i', dim=32)).tokens.shape, (2, config.block_size))

  def test_left_pad_captions(self):
    """3 and 1 of 5 tokens valid (neither 0 nor half the row: a rotation the wrong way
    gives the same rows for 2 of 4)."""
    features = jnp.arange(3 * 5 * 1, dtype=jnp.float32).reshape(3, 5, 1) + 1
    mask = jnp.array([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    cond = llamagen.left_pad_captions(features, mask)
    np.testing.assert_array_equal(cond.features[..., 0], [[0, 0, 1, 2, 3], [0, 0, 0, 0, 6],
                                                          [11, 12, 13, 14, 15]])
    np.testing.assert_array_equal(cond.mask, [[0, 0, 1, 1, 1], [0, 0, 0, 0, 1], [1] * 5])

  def test_t2i_cfg_rows_share_the_caption_mask(self):
    """LlamaGen's generate masks the unconditional rows with the captions' own mask
    (`emb_masks` twice), not with an all-valid one."""
    model = llamagen.LlamaGenGPT(tiny_config('t2i'))
    params = model.init_params(jax.random.key(0))
    mask = jnp.array([[0, 0, 0, 1, 1, 1, 1, 1], [0] * 7 + [1]], bool)
    rows = model.cfg_cond(params, llamagen.CaptionCond(jnp.ones((2, 8, 24)), mask))
    np.testing.assert_array_equal(rows.mask, jnp.concatenate([mask, mask]))
    self.assertEqual(rows.features.shape, (4, 8, 24))


if __name__ == '__main__':
  absltest.main()
