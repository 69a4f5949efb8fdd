"""Models built with scan_layers=True (one nn.scan over the blocks, stacked params and
caches) give the unscanned models' logits, hidden states and caches, for prefill
(padded), decode steps, chains and trees, and through the decode engine."""

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decode
from specdec_jax import kv_cache as kv
from specdec_jax import logits
from specdec_jax import rules
from specdec_jax import verify
from specdec_jax.models import chameleon
from specdec_jax.models import janus
from specdec_jax.models import layers
from specdec_jax.models import llamagen

FAST = decode.FAST_COMPILE
TOL = dict(rtol=2e-5, atol=2e-5)
TREE = jnp.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], bool)
PADDING = (0, 2, 5)


def _mask(length):
  mask = np.ones((len(PADDING), length), bool)
  for row, pad in enumerate(PADDING):
    mask[row, :pad] = False
  return jnp.asarray(mask)


def build(kind, scan):
  """(model, cond) of a 3-layer tiny model, padded prefix of 6."""
  if kind == 'llamagen':
    model = llamagen.LlamaGenGPT(llamagen.GPTConfig(
        n_layer=3, n_head=4, dim=32, vocab_size=48, block_size=16, model_type='t2i',
        caption_dim=20, cls_token_num=6, scan_layers=scan))
    mask = _mask(6)
    features = jax.random.normal(jax.random.key(1), (3, 6, 20)) * mask[:, :, None]
    return model, llamagen.CaptionCond(features, mask)
  tokens = jax.random.randint(jax.random.key(2), (3, 6), 4, 40)
  if kind == 'chameleon':
    return chameleon.ChameleonModel(chameleon.ChameleonConfig(
        vocab_size=48, hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2,
        head_dim=8, intermediate_size=48, scan_layers=scan)), chameleon.ChameleonPrompt(
            tokens, _mask(6))
  return janus.JanusModel(janus.JanusConfig(
      text_vocab_size=48, hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=4,
      head_dim=8, intermediate_size=48, image_vocab_size=40, gen_head_dim=24,
      scan_layers=scan)), janus.JanusPrompt(tokens, _mask(6))


class ScanLayersTest(parameterized.TestCase):

  @parameterized.parameters('llamagen', 'chameleon', 'janus')
  def test_scanned_model_matches_unscanned(self, kind):
    plain, cond = build(kind, False)
    scanned, _ = build(kind, True)
    params = plain.init_params(jax.random.key(0))
    stacked = layers.stack_layer_params(params)
    # The scanned model's own init has exactly the stacked tree's structure and shapes.
    chex.assert_trees_all_equal_shapes_and_dtypes(
        scanned.init_params(jax.random.key(0)), stacked)
    chex.assert_trees_all_equal(layers.unstack_layer_params(stacked), params)

    def run(model, model_params):
      cache = model.init_cache(3, 16)
      outs = [model.prefill(model_params, cache, cond)]
      steps = [(jnp.full((3, 1), 5), None), (jnp.arange(12).reshape(3, 4) % 40, None),
               (jnp.arange(12).reshape(3, 4) % 40, TREE)]
      for tokens, window in steps:
        outs.append(model.forward(model_params, outs[-1].cache, tokens, window))
      return outs

    want = jax.jit(lambda p: run(plain, p))(params)
    got = jax.jit(lambda p: run(scanned, p))(stacked)
    for a, b in zip(got, want):
      np.testing.assert_allclose(a.logits, b.logits, **TOL)
      np.testing.assert_allclose(a.hidden, b.hidden, **TOL)
      self.assertTrue(a.cache.stacked)
      np.testing.assert_array_equal(a.cache.lengths, b.cache.lengths)
      np.testing.assert_allclose(a.cache.keys, jnp.stack(b.cache.keys), **TOL)
      np.testing.assert_allclose(a.cache.values, jnp.stack(b.cache.values), **TOL)

  def test_llamagen_hidden_is_the_final_norm_output_and_cfg_rows_share_the_mask(self):
    """EAGLE drafters read `hidden`: the features the head reads, after the final norm
    (logits = hidden @ output kernel; the pre-norm features kept lossless decodes exact
    and only lowered acceptance). t2i CFG's unconditional rows keep the caption's
    padding mask, as LlamaGen's generate() does with emb_masks."""
    model, cond = build('llamagen', False)
    params = model.init_params(jax.random.key(0))
    head = params['output']['kernel']
    out = model.prefill(params, model.init_cache(3, 8), cond)
    step = model.forward(params, out.cache, jnp.ones((3, 2), jnp.int32))
    for result in (out, step):
      np.testing.assert_allclose(result.logits, result.hidden @ head, **TOL)
    rows = model.cfg_cond(params, cond)
    np.testing.assert_array_equal(rows.mask, jnp.concatenate([cond.mask, cond.mask]))

  def test_stacking_keeps_the_numeric_layer_order_past_ten_layers(self):
    """Stacked index i is layers_i for 12 layers (names sorted as text would put
    layers_10 third: every real checkpoint has more than ten layers)."""
    tree = {'model': {f'layers_{i}': {'self_attn': {'w': np.full(2, i, np.float32)}}
                      for i in range(12)}, 'norm': np.ones(2, np.float32)}
    stacked = layers.stack_layer_params(tree)
    np.testing.assert_array_equal(stacked['model'][layers.SCANNED]['self_attn']['w'][:, 0],
                                  np.arange(12))
    chex.assert_trees_all_equal(layers.unstack_layer_params(stacked), tree)

  def test_tuple_cache_into_scanned_model_keeps_its_layout(self):
    plain, cond = build('chameleon', False)
    scanned, _ = build('chameleon', True)
    params = plain.init_params(jax.random.key(0))
    out = scanned.prefill(layers.stack_layer_params(params), plain.init_cache(3, 8), cond)
    self.assertFalse(out.cache.stacked)
    np.testing.assert_allclose(out.logits, plain.prefill(params, plain.init_cache(3, 8),
                                                         cond).logits, **TOL)

  def test_engine_greedy_tokens_equal(self):
    config = dict(n_layer=2, n_head=4, dim=32, vocab_size=64, num_classes=4, block_size=16)
    plain = llamagen.LlamaGenGPT(llamagen.GPTConfig(**config))
    scanned = llamagen.LlamaGenGPT(llamagen.GPTConfig(**config, scan_layers=True))
    params = plain.init_params(jax.random.key(0))
    cond = plain.cfg_cond(params, jnp.array([0, 1, 3]))
    run = lambda model, p, mode, **extra: decode.generate(
        model, p, cond, num_tokens=12, key=jax.random.key(4), mode=mode,
        sampling=logits.Sampling(cfg_scale=2.0, temperature=0.0), rule=rules.Lossless(),
        compiler_options=FAST, **extra).tokens
    want = run(plain, params, decode.Vanilla())
    stacked = layers.stack_layer_params(params)
    # TreeDraft self-drafting (the target as its own draft model): greedy, so
    # every node agrees with the target; the accepted path is compacted in the
    # stacked cache (`mode_tree.compact_path`).
    tree = decode.TreeDraft(verify.StaticTree.from_paths([(0,), (1,), (0, 0)]), 'model')
    for mode in (decode.Vanilla(), decode.Jacobi(3), tree):
      extra = dict(draft=scanned, draft_params=stacked) if mode is tree else {}
      np.testing.assert_array_equal(run(scanned, stacked, mode, **extra), want)


class StackedCacheTest(absltest.TestCase):

  def test_update_and_map_buffers_in_both_layouts(self):
    plain = kv.set_lengths(kv.init_cache(num_layers=3, batch_size=2, capacity=6,
                                         num_kv_heads=1, head_dim=2), jnp.array([1, 3]))
    stacked = kv.stack_layers(plain)
    self.assertEqual((stacked.stacked, stacked.num_layers), (True, 3))
    new = jnp.ones((2, 2, 1, 2))
    a = kv.update_layer(plain, 1, new, -new)
    b = kv.update_layer(stacked, jnp.int32(1), new, -new)  # traced-style layer index
    np.testing.assert_array_equal(b.keys, jnp.stack(a.keys))
    np.testing.assert_array_equal(b.values, jnp.stack(a.values))
    double = lambda x, slot_axis: 2 * x + slot_axis  # keys get 3, values 2
    np.testing.assert_array_equal(kv.map_buffers(double, b).keys,
                                  jnp.stack(kv.map_buffers(double, a).keys))
    np.testing.assert_array_equal(kv.map_buffers(double, b).keys, 2 * b.keys + kv.KEY_SLOT_AXIS)
    np.testing.assert_array_equal(kv.map_buffers(double, a).values[1],
                                  2 * a.values[1] + kv.VALUE_SLOT_AXIS)
    self.assertFalse(kv.unstack_layers(b).stacked)


if __name__ == '__main__':
  absltest.main()
