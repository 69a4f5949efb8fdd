"""The trainers' objectives against their closed forms (pinned by a mutation audit;
tests/test_train_models.py only checks that training improves them): EAGLE-1's
loss pairs the drafter's output at position i with the target's feature and law
at i + 1, its clip-by-value runs before AdamW, and the GPT's teacher-forced NLL
of token i reads tokens < i only, and its held-out metrics per token with the
null class for 'uncond'."""

import types

from absl.testing import absltest
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from specdec_jax.app.train import drafter as train_drafter
from specdec_jax.app.train import gpt as train_gpt
from specdec_jax.models import llamagen


class IdentityDrafter:
  """A stand-in EAGLE head: hidden = scale * input feature, logits = hidden @ w."""

  def init_cache(self, batch, length):
    del batch, length
    return None

  def forward(self, params, cache, tokens, features):
    del cache, tokens
    hidden = params['scale'] * features
    return types.SimpleNamespace(hidden=hidden, logits=hidden @ params['w'])


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


class EagleLossTest(absltest.TestCase):

  def test_loss_matches_eagle_1_closed_form(self):
    rng = np.random.default_rng(0)
    batch, num_tokens, width, vocab = 2, 5, 3, 6
    tokens = jnp.asarray(rng.integers(0, vocab, (batch, num_tokens)), jnp.int32)
    features = rng.standard_normal((batch, num_tokens, width)).astype(np.float32) * 2
    target_logits = rng.standard_normal((batch, num_tokens, vocab)).astype(np.float32) * 3
    params = {'scale': np.float32(0.7),
              'w': rng.standard_normal((width, vocab)).astype(np.float32)}
    loss, metrics = train_drafter.eagle_loss(
        IdentityDrafter(), params, tokens, jnp.asarray(features), jnp.asarray(target_logits),
        reg_weight=2.0, cls_weight=0.3)

    predicted = 0.7 * features[:, :-1]  # f^_{i+1} from (x_i, f_i)
    diff = predicted - features[:, 1:]
    smooth = np.where(np.abs(diff) < 1, 0.5 * diff ** 2, np.abs(diff) - 0.5)
    reg = smooth.mean()
    target = np.exp(_log_softmax(target_logits[:, 1:]))
    draft_log = _log_softmax(predicted @ params['w'])
    cls = (-(target * draft_log).sum(-1)).mean()
    np.testing.assert_allclose(float(metrics['reg']), reg, rtol=1e-5)
    np.testing.assert_allclose(float(metrics['cls']), cls, rtol=1e-5)
    np.testing.assert_allclose(float(loss), 2.0 * reg + 0.3 * cls, rtol=1e-5)
    np.testing.assert_allclose(
        float(metrics['top1']),
        np.mean(np.argmax(draft_log, -1) == np.argmax(target_logits[:, 1:], -1)))
    np.testing.assert_allclose(float(metrics['acceptance']),
                               np.minimum(target, np.exp(draft_log)).sum(-1).mean(), rtol=1e-5)

  def test_copying_the_input_feature_is_not_free(self):
    """The regression target is the next feature f_{i+1}: a head that copies its input
    f_i pays a loss when the features change along the sequence."""
    rng = np.random.default_rng(1)
    features = np.cumsum(rng.standard_normal((1, 4, 3)), axis=1).astype(np.float32)
    params = {'scale': np.float32(1.0), 'w': np.eye(3, dtype=np.float32)}
    _, metrics = train_drafter.eagle_loss(IdentityDrafter(), params,
                                          jnp.zeros((1, 4), jnp.int32), jnp.asarray(features),
                                          jnp.zeros((1, 4, 3)))
    self.assertGreater(float(metrics['reg']), 0.1)


def _tiny_gpt():
  """A 1-layer LlamaGen GPT (vocabulary 8, 4 tokens, 3 classes) initialised as the
  trainer does: (config, params)."""
  gpt = llamagen.GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=8, block_size=4,
                           num_classes=3, multiple_of=32)
  model = llamagen.LlamaGenGPT(gpt)
  return gpt, train_gpt.init_like_llamagen(
      jax.eval_shape(model.init_params, jax.random.key(0)), 0, zero_init=())


class TokenNllTest(absltest.TestCase):

  def test_nll_of_token_i_reads_only_earlier_tokens(self):
    gpt, params = _tiny_gpt()
    labels = jnp.asarray([0, 2], jnp.int32)
    tokens = jnp.asarray([[1, 2, 3, 4], [7, 6, 5, 4]], jnp.int32)
    nll = np.asarray(train_gpt.token_nll(params, gpt, labels, tokens))
    self.assertEqual(nll.shape, (2, 4))
    for position in range(4):
      changed = tokens.at[:, position].set((tokens[:, position] + 3) % 8)
      other = np.asarray(train_gpt.token_nll(params, gpt, labels, changed))
      np.testing.assert_allclose(other[:, :position], nll[:, :position], rtol=1e-6, atol=1e-6)
      self.assertTrue(np.all(np.abs(other[:, position] - nll[:, position]) > 1e-7))
    # And the NLL is that of the model's own next-token law.
    logits = llamagen.forward_logits(params, gpt, labels, tokens[:, :-1])
    expected = -np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)),
                                   np.asarray(tokens)[..., None], -1)[..., 0]
    np.testing.assert_allclose(nll, expected, rtol=1e-5, atol=1e-6)


def _optimizer_config(grad_clip_value):
  return ml_collections.ConfigDict(dict(
      learning_rate=1e-2, num_steps=10, warmup_steps=0, weight_decay=0.0, b1=0.9, b2=0.95,
      clip_norm=0.0, grad_clip_value=grad_clip_value))


class OptimizerTest(absltest.TestCase):

  def test_gradients_are_clipped_by_value_before_adamw(self):
    params = {'w': jnp.zeros((3,))}
    raw = [jnp.asarray([10.0, -0.1, 0.2]), jnp.asarray([0.3, 0.3, -4.0])]
    clipped = [jnp.clip(g, -0.5, 0.5) for g in raw]

    def updates_after(config, grads):
      optimizer = train_drafter.optimizer_from(config)
      state = optimizer.init(params)
      for g in grads:  # varying gradients: Adam's normalisation alone hides no clipping
        updates, state = optimizer.update({'w': g}, state, params)
      return np.asarray(updates['w'])

    with_clip = updates_after(_optimizer_config(0.5), raw)
    without_clip = updates_after(_optimizer_config(0.0), raw)
    np.testing.assert_allclose(with_clip, updates_after(_optimizer_config(0.0), clipped),
                               rtol=1e-5)
    self.assertFalse(np.allclose(without_clip, with_clip, rtol=1e-3))



class EvaluateNllTest(absltest.TestCase):

  def test_matches_token_nll_per_token_with_the_null_class(self):
    """The GPT trainer's held-out metrics (`evaluate_nll`): mean NLL per token (not
    per image), conditional on each image's class, and 'uncond' with the null class
    (id num_classes, the row class dropout trains)."""
    gpt, params = _tiny_gpt()
    params = jax.tree_util.tree_map(lambda x: x * 25.0 if x.ndim == 2 else x, params)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 8, (5, 4)).astype(np.int32)
    labels = np.array([0, 1, 2, 0, 1], np.int32)
    # batch 2 over 5 images: a ragged last chunk, to check the per-token mean too
    metrics = train_gpt.evaluate_nll(params, gpt, tokens, labels, batch_size=2)

    def mean_nll(labels):
      return float(np.mean(train_gpt.token_nll(params, gpt, jnp.asarray(labels),
                                               jnp.asarray(tokens))))

    np.testing.assert_allclose(metrics['test_nll'], mean_nll(labels), rtol=1e-5)
    null = np.full_like(labels, gpt.num_classes)
    np.testing.assert_allclose(metrics['test_nll_uncond'], mean_nll(null), rtol=1e-5)
    # The null class is its own row: a real class (the last) gives another number.
    self.assertGreater(abs(mean_nll(null) - mean_nll(np.full_like(labels, 2))), 1e-3)
    np.testing.assert_allclose(metrics['test_bits_per_token'],
                               metrics['test_nll'] / np.log(2.0), rtol=1e-6)
    self.assertAlmostEqual(metrics['uniform_nll'], np.log(8), places=6)



if __name__ == '__main__':
  absltest.main()
