"""Padded prefixes prefill in one forward, equal to running them one slot per forward.

A left-padded caption (LlamaGen t2i) or prompt (Chameleon, Janus-Pro) runs in a
single forward: `kv.attention_mask` lets a padding query see only itself and a
real query the real slots before it and itself. The reference here feeds the
same prefix one slot per forward, where every earlier slot is in the masked
prefix; logits, hidden states and every cache buffer must agree.
"""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import kv_cache as kv
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


if __name__ == '__main__':
  absltest.main()
