"""Padded prefixes prefill in one forward, equal to running them one slot per forward.

A left-padded caption (LlamaGen t2i) or prompt (Chameleon, Janus-Pro) runs in a
single forward: `kv.attention_mask` lets a padding query see only itself and a
real query the real slots before it and itself. The reference here feeds the
same prefix one slot per forward, where every earlier slot is in the masked
prefix; logits, hidden states and every cache buffer must agree.

The engine's prefill (`protocol.prefill_last`) runs the LM head at the last
prefix position only on models with `head_at_one_position`: the same logits
there, hidden states and cache, and no [B, P, V] tensor in the program.
"""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decode
from specdec_jax import logits as logits_lib
from specdec_jax import protocol
from specdec_jax import rules
from specdec_jax.app import toy
from specdec_jax.models import chameleon
from specdec_jax.models import janus
from specdec_jax.models import llamagen

PREFIX = 12
PADDING = (0, 3, 7, 11)  # a different padding count per row, one real token at least
TOL = dict(rtol=1e-5, atol=1e-5)


def _mask():
  mask = np.ones((len(PADDING), PREFIX), bool)
  for row, pad in enumerate(PADDING):
    mask[row, :pad] = False
  return jnp.asarray(mask)


def slot_by_slot(step_fn, cache, inputs):
  """(logits, hidden, cache) of `inputs` [B, P, ...] fed one slot per forward."""
  logits, hidden = [], []
  for slot in range(inputs.shape[1]):
    out = step_fn(cache, inputs[:, slot:slot + 1])
    logits.append(out.logits)
    hidden.append(out.hidden)
    cache = out.cache
  return jnp.concatenate(logits, axis=1), jnp.concatenate(hidden, axis=1), cache


def _llamagen():
  config = llamagen.GPTConfig(n_layer=2, n_head=4, dim=32, vocab_size=48, block_size=16,
                              model_type='t2i', caption_dim=20, cls_token_num=PREFIX)
  model = llamagen.LlamaGenGPT(config)
  params = model.init_params(jax.random.PRNGKey(0))
  mask = _mask()
  features = jax.random.normal(jax.random.PRNGKey(1), (len(PADDING), PREFIX, 20))
  features = features * mask[:, :, None]
  cond = llamagen.CaptionCond(features, mask)

  def reference(cache):
    embeds = model.module.apply({'params': params}, features,
                                method=llamagen.GPTModule.embed_cond)
    cache = cache.replace(key_valid=cache.key_valid.at[:, :PREFIX].set(mask))
    return slot_by_slot(lambda c, e: model._run(params, c, e), cache, embeds)  # pylint: disable=protected-access

  return model, params, cond, reference


def _chameleon_like(kind):
  mask = _mask()
  tokens = jax.random.randint(jax.random.PRNGKey(2), mask.shape, 4, 90)
  if kind == 'chameleon':
    model = chameleon.ChameleonModel(chameleon.ChameleonConfig(
        vocab_size=96, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
        head_dim=8, intermediate_size=48))
    cond = chameleon.ChameleonPrompt(tokens, mask)
    step = lambda params: lambda c, t: model.forward(params, c, t)
  else:
    model = janus.JanusModel(janus.JanusConfig(
        text_vocab_size=96, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=4,
        head_dim=8, intermediate_size=48, image_vocab_size=40, gen_head_dim=24))
    cond = janus.JanusPrompt(tokens, mask)
    step = lambda params: lambda c, t: model._run(params, c, t, text=True)  # pylint: disable=protected-access
  params = model.init_params(jax.random.PRNGKey(0))

  def reference(cache):
    cache = chameleon.mark_prefix_padding(cache, mask)
    return slot_by_slot(step(params), cache, tokens)

  return model, params, cond, reference


class OneForwardPrefillTest(parameterized.TestCase):

  @parameterized.parameters('llamagen', 'chameleon', 'janus')
  def test_matches_slot_by_slot(self, kind):
    model, params, cond, reference = (_llamagen() if kind == 'llamagen'
                                      else _chameleon_like(kind))
    cache = model.init_cache(len(PADDING), PREFIX + 4)
    out = jax.jit(model.prefill)(params, cache, cond)
    logits, hidden, ref_cache = jax.jit(reference)(cache)
    np.testing.assert_allclose(out.logits, logits, **TOL)
    np.testing.assert_allclose(out.hidden, hidden, **TOL)
    for name in ('lengths', 'key_valid', 'position_offset'):
      np.testing.assert_array_equal(getattr(out.cache, name), getattr(ref_cache, name))
    for got, want in zip(out.cache.keys + out.cache.values, ref_cache.keys + ref_cache.values):
      np.testing.assert_allclose(got, want, **TOL)
    # The next decode step sees the same prefix either way.
    tokens = jnp.ones((len(PADDING), 1), jnp.int32)
    np.testing.assert_allclose(model.forward(params, out.cache, tokens).logits,
                               model.forward(params, ref_cache, tokens).logits, **TOL)

  def test_padding_is_masked(self):
    # Guard against a vacuous comparison: a different padding value in the
    # masked slots leaves the real rows' logits unchanged.
    model, params, cond, _ = _llamagen()
    cache = model.init_cache(len(PADDING), PREFIX + 4)
    noisy = cond.features + 5.0 * (~cond.mask)[:, :, None]
    a = model.prefill(params, cache, cond)
    b = model.prefill(params, cache, llamagen.CaptionCond(noisy, cond.mask))
    real = np.asarray(cond.mask)
    np.testing.assert_allclose(np.asarray(a.logits)[real], np.asarray(b.logits)[real], **TOL)
    self.assertGreater(float(jnp.abs(a.logits - b.logits).max()), 1e-3)


def _setup(kind):
  return _llamagen() if kind == 'llamagen' else _chameleon_like(kind)


def _assert_same_cache(test, got, want):
  for name in ('lengths', 'key_valid', 'position_offset'):
    np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
  for a, b in zip(got.keys + got.values, want.keys + want.values):
    np.testing.assert_allclose(a, b, **TOL)
  test.assertEqual(len(got.keys), len(want.keys))


class HeadAtOnePositionTest(parameterized.TestCase):
  """`logits_at` on the released models' prefill and forward, and the engine's use of it."""

  @parameterized.parameters('llamagen', 'chameleon', 'janus')
  def test_prefill_last_is_the_full_prefills_last_row(self, kind):
    model, params, cond, _ = _setup(kind)
    self.assertTrue(model.head_at_one_position)
    cache = model.init_cache(len(PADDING), PREFIX + 4)
    full = jax.jit(model.prefill)(params, cache, cond)
    last_fn = jax.jit(lambda p, c, x: protocol.prefill_last(model, p, c, x))
    last = last_fn(params, cache, cond)
    self.assertEqual(last.logits.shape, (len(PADDING), 1, model.vocab_size))
    np.testing.assert_allclose(last.logits, full.logits[:, -1:], **TOL)
    np.testing.assert_allclose(last.hidden, full.hidden, **TOL)
    _assert_same_cache(self, last.cache, full.cache)
    # The head ran at one position: at least an [E] x [E, V] product less per
    # skipped position in XLA's cost analysis (slicing the full prefill's logits
    # saves about 3,000 flops here, under a tenth of it: the negative control).
    flops = lambda fn: fn.lower(params, cache, cond).compile().cost_analysis()['flops']
    saved = flops(jax.jit(model.prefill)) - flops(last_fn)
    head = 2 * model.hidden_size * model.vocab_size
    self.assertGreaterEqual(saved, head * len(PADDING) * (PREFIX - 1))
    sliced = jax.jit(lambda p, c, x: model.prefill(p, c, x).logits[:, -1:])
    self.assertLess(flops(jax.jit(model.prefill)) - flops(sliced), head * len(PADDING))

  @parameterized.parameters('llamagen', 'chameleon', 'janus')
  def test_forward_logits_at_each_rows_position(self, kind):
    model, params, cond, _ = _setup(kind)
    prefix = model.prefill(params, model.init_cache(len(PADDING), PREFIX + 4), cond)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 40, (len(PADDING), 4)), jnp.int32)
    at = jnp.array([3, 0, 2, 1], jnp.int32)
    full = model.forward(params, prefix.cache, tokens)
    one = model.forward(params, prefix.cache, tokens, logits_at=at)
    self.assertEqual(one.logits.shape, (len(PADDING), 1, model.vocab_size))
    np.testing.assert_allclose(one.logits[:, 0], full.logits[jnp.arange(len(PADDING)), at], **TOL)
    np.testing.assert_allclose(one.hidden, full.hidden, **TOL)
    _assert_same_cache(self, one.cache, full.cache)
    with self.assertRaisesRegex(ValueError, r'logits_at must be int32\[B\] = \[4\], one '
                                r'position per row; got shape \(4, 1\)'):
      model.forward(params, prefix.cache, tokens, logits_at=at[:, None])

  def test_models_without_it_are_sliced(self):
    target = toy.MarkovToy(6, 3)
    self.assertFalse(getattr(target, 'head_at_one_position', False))
    params = target.init_params(jax.random.key(0))
    cache, cond = target.init_cache(2, 4), jnp.array([0, 2], jnp.int32)
    full = target.prefill(params, cache, cond)
    last = protocol.prefill_last(target, params, cache, cond)
    np.testing.assert_array_equal(last.logits, full.logits[:, -1:])

  def test_engine_tokens_equal_with_and_without_it(self):
    # The decode through `prefill_last` and a `kind='model'` drafter's
    # catch-up at one position emits the tokens of the same models sliced.
    config = llamagen.GPTConfig(n_layer=1, n_head=4, dim=32, vocab_size=64, num_classes=4,
                                block_size=16)
    target = llamagen.LlamaGenGPT(config)
    params = target.init_params(jax.random.key(0))
    draft_params = target.init_params(jax.random.key(1))
    sliced = _SlicedGPT(config)
    cond = target.cfg_cond(params, jnp.array([0, 1, 3]))
    sampling = logits_lib.Sampling(cfg_scale=2.0)

    def tokens(model, mode, **kwargs):
      return np.asarray(decode.generate(
          model, params, cond, num_tokens=16, key=jax.random.key(4), mode=mode,
          sampling=sampling, rule=rules.Lossless(), compiler_options=decode.FAST_COMPILE,
          **kwargs).tokens)

    np.testing.assert_array_equal(tokens(target, decode.Vanilla()),
                                  tokens(sliced, decode.Vanilla()))
    chain = decode.ChainDraft(3, 'model')
    np.testing.assert_array_equal(
        tokens(target, chain, draft=target, draft_params=draft_params),
        tokens(sliced, chain, draft=sliced, draft_params=draft_params))


@dataclasses.dataclass(frozen=True)
class _SlicedGPT(llamagen.LlamaGenGPT):
  """LlamaGen whose head runs everywhere: the engine slices (a user model's path)."""

  head_at_one_position = False


if __name__ == '__main__':
  absltest.main()
