"""Decodes that meet NaN probabilities: drafts never accept, and generate says so.

A drafter with NaN parameters used to get every draft accepted (tokens per
forward k + 1, most tokens 0), and a NaN target gave all-zero tokens without a
word. Needs the loop to record `DecodeMetrics.record_nonfinite`.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from specdec_jax import decode
from specdec_jax import dynamic_tree
from specdec_jax import logits
from specdec_jax import metrics
from specdec_jax import rules
from specdec_jax.models import llamagen
from specdec_jax.models import tiny
from tests.decode_support import DRAFT
from tests.decode_support import EAGLE
from tests.decode_support import FAST
from tests.decode_support import NUM_TOKENS
from tests.decode_support import P_THRESHOLD
from tests.decode_support import TARGET
from tests.decode_support import TREE
from tests.decode_support import VOCAB
from tests.decode_support import _chi_square_pvalue
from tests.decode_support import _params


def _nan(params):
  return jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), params)


class NanDrafterTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('chain_model', decode.ChainDraft(2, 'model'), rules.Lossless()),
      ('chain_eagle_coolsd', decode.ChainDraft(2, 'eagle'), rules.CoolSD(delta=3.0)),
      ('tree_eagle', decode.TreeDraft(TREE, 'eagle'), rules.Lossless()))
  def test_no_draft_is_accepted_and_the_decode_warns(self, mode, rule):
    target_params, draft_params, eagle_params = _params()
    draft, params = (EAGLE, eagle_params) if mode.drafter == 'eagle' else (DRAFT, draft_params)
    with self.assertWarnsRegex(RuntimeWarning, 'draft probabilities held NaN or inf for 64 '
                                               'image'):
      result = decode.generate(
          TARGET, target_params, jnp.zeros((64,), jnp.int32), num_tokens=NUM_TOKENS,
          key=jax.random.key(0), mode=mode, rule=rule, draft=draft, draft_params=_nan(params),
          compiler_options=FAST)
    np.testing.assert_array_equal(result.metrics.accepted_tokens, 0)
    np.testing.assert_array_equal(result.metrics.tokens_per_target_forward, 1.0)
    np.testing.assert_array_equal(result.metrics.nonfinite_target_steps, 0)
    # Every verify step met broken drafts, and only those steps were counted
    # (drafts are checked where they are made, for the images that verify them).
    np.testing.assert_array_equal(result.metrics.nonfinite_draft_steps,
                                  result.metrics.verify_steps)

  def test_eagle2_reports_a_nan_drafter(self):
    """EAGLE-2's tree ranks candidates by log q: a NaN q stays NaN there
    (dynamic_tree.log_probs) and is reported for every verify step. Its candidates are
    point masses verified against the target alone, so they may still be accepted."""
    self.assertTrue(np.isnan(dynamic_tree.log_probs(jnp.array([jnp.nan, 0.5, 0.0]))[0]))
    target_params, _, eagle_params = _params()
    with self.assertWarnsRegex(RuntimeWarning, 'draft probabilities held NaN or inf for 64 '
                                               'image'):
      result = decode.generate(
          TARGET, target_params, jnp.zeros((64,), jnp.int32), num_tokens=NUM_TOKENS,
          key=jax.random.key(0), mode=decode.DynamicTreeDraft(5, 2, 2), rule=rules.Lossless(),
          draft=EAGLE, draft_params=_nan(eagle_params), compiler_options=FAST)
    np.testing.assert_array_equal(result.metrics.nonfinite_draft_steps,
                                  result.metrics.verify_steps)
    np.testing.assert_array_equal(result.metrics.nonfinite_target_steps, 0)

  def test_tokens_keep_the_target_law(self):
    """Every draft rejected, every residual the target: plain sampling's law."""
    sampling = logits.Sampling()
    target_params, draft_params, _ = _params()
    with self.assertWarns(RuntimeWarning):
      result = decode.generate(
          TARGET, target_params, jnp.zeros((2 ** 14,), jnp.int32), num_tokens=NUM_TOKENS,
          key=jax.random.key(3), mode=decode.ChainDraft(2, 'model'), rule=rules.Lossless(),
          draft=DRAFT, draft_params=_nan(draft_params), compiler_options=FAST)
    law = TARGET.joint_law(target_params, 0, NUM_TOKENS, sampling)
    self.assertGreater(_chi_square_pvalue(np.asarray(result.tokens), law), P_THRESHOLD)


  def test_a_transformer_target_keeps_its_law_too(self):
    """A NaN drafter row once became token V: a real target embeds that id as NaN
    (the toy target's table clamps it), and the decode raised, blaming the target."""
    target = llamagen.LlamaGenGPT(llamagen.GPTConfig(
        n_layer=2, n_head=4, dim=64, vocab_size=64, block_size=16, model_type='c2i',
        num_classes=10, cls_token_num=1))
    draft = tiny.TinyTransformer(tiny.TinyConfig(vocab_size=64, num_classes=10))
    with self.assertWarnsRegex(RuntimeWarning, 'draft probabilities held NaN'):
      result = decode.generate(
          target, target.init_params(jax.random.key(0)), jnp.array([1, 2], jnp.int32),
          num_tokens=8, key=jax.random.key(5), mode=decode.ChainDraft(2, 'model'),
          rule=rules.Lossless(), draft=draft,
          draft_params=_nan(draft.init_params(jax.random.key(1))), compiler_options=FAST)
    self.assertLess(int(np.max(result.tokens)), 64)
    np.testing.assert_array_equal(result.metrics.accepted_tokens, 0)
    np.testing.assert_array_equal(result.metrics.nonfinite_target_steps, 0)


class NanTargetTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('vanilla', decode.Vanilla()), ('chain', decode.ChainDraft(2, 'model')),
      ('jacobi', decode.Jacobi(3)))
  def test_raises_with_the_result(self, mode):
    target_params, draft_params, _ = _params()
    with self.assertRaisesRegex(metrics.NonFiniteProbabilitiesError,
                                r'target probabilities held NaN or inf for 4 image\(s\) '
                                r'\[0, 1, 2, 3\]') as raised:
      decode.generate(TARGET, _nan(target_params), jnp.zeros((4,), jnp.int32),
                      num_tokens=NUM_TOKENS, key=jax.random.key(0), mode=mode,
                      rule=rules.Lossless(), draft=DRAFT, draft_params=draft_params,
                      compiler_options=FAST)
    result = raised.exception.result
    self.assertEqual(result.tokens.shape, (4, NUM_TOKENS))
    self.assertTrue(np.all(np.asarray(result.metrics.nonfinite_target_steps) > 0))

  @parameterized.named_parameters(
      ('vanilla', decode.Vanilla(), 1.0), ('vanilla_cfg', decode.Vanilla(), 2.0),
      ('chain', decode.ChainDraft(2, 'model'), 1.0))
  def test_greedy_decoding_raises_too(self, mode, cfg_scale):
    """Greedy decoding takes the argmax, which NaN logits do not stop (token 0)."""
    target_params, draft_params, _ = _params()
    cond = jnp.zeros((4 if cfg_scale > 1 else 2,), jnp.int32)
    with self.assertRaisesRegex(metrics.NonFiniteProbabilitiesError,
                                r'target probabilities held NaN or inf for 2 image'):
      decode.generate(TARGET, _nan(target_params), cond, num_tokens=NUM_TOKENS,
                      key=jax.random.key(0), mode=mode, rule=rules.Lossless(), draft=DRAFT,
                      draft_params=draft_params,
                      sampling=logits.Sampling(temperature=0.0, cfg_scale=cfg_scale),
                      compiler_options=FAST)

  @parameterized.named_parameters(('vanilla', decode.Vanilla()),
                                  ('chain', decode.ChainDraft(2, 'model')))
  def test_one_nan_logit_raises_under_top_k_and_top_p(self, mode):
    """One NaN logit (token 1's, in every context) under top-k and top-p together:
    the filter dropped the NaN and the decode sampled on from the other tokens."""
    target_params, draft_params, _ = _params()
    table = target_params['table'].at[..., 1].set(jnp.nan)
    with self.assertRaisesRegex(metrics.NonFiniteProbabilitiesError,
                                r'target probabilities held NaN or inf for 4 image\(s\)'):
      decode.generate(TARGET, {'table': table}, jnp.zeros((4,), jnp.int32),
                      num_tokens=NUM_TOKENS, key=jax.random.key(0), mode=mode,
                      rule=rules.Lossless(), draft=DRAFT, draft_params=draft_params,
                      sampling=logits.Sampling(top_k=3, top_p=0.95), compiler_options=FAST)

  @parameterized.named_parameters(('jacobi', decode.Jacobi(3, init='random')),
                                  ('chain', decode.ChainDraft(2, 'model')),
                                  ('tree', decode.TreeDraft(TREE, 'model')),
                                  ('sjd_pac', decode.JacobiPAC(3, branches=2, depth=1,
                                                               init='random')),
                                  ('tree_top_k', decode.TreeDraft(TREE, 'model'), 3))
  def test_nan_laws_after_a_rejected_draft_decide_nothing(self, mode, top_k=0):
    """The target never emits token 3 and its law after a 3 is NaN: a 3 is only ever a
    draft (a random Jacobi draft; the draft model's, about a quarter of its drafts),
    always rejected, and the NaN law in the window entry after it decides no token.
    The decode raised NonFiniteProbabilitiesError on such steps (float16 overflow
    after a random Jacobi draft) with every token right; now the tokens keep the
    target's law. Jacobi re-drafts from those laws, which the draft count reports.
    With top-k a tree reads the raw logits at the nodes it visits (`ImageLogits`)."""
    target_params, draft_params, _ = _params()
    never = target_params['table'].at[:, :, 3].set(-jnp.inf)
    sampling = logits.Sampling(top_k=top_k)
    law = TARGET.joint_law({'table': never}, 0, NUM_TOKENS, sampling)
    self.assertEqual(law.reshape(VOCAB, -1)[3].sum(), 0.0)
    table = never.at[:, 3].set(jnp.nan).at[3].set(jnp.nan)  # after (., 3) or (3, .)
    jacobi = isinstance(mode, (decode.Jacobi, decode.JacobiPAC))
    with (self.assertWarnsRegex(RuntimeWarning, 'draft probabilities held NaN') if jacobi
          else contextlib.nullcontext()):
      result = decode.generate(
          TARGET, {'table': table}, jnp.zeros((2 ** 13,), jnp.int32), num_tokens=NUM_TOKENS,
          key=jax.random.key(4), mode=mode, rule=rules.Lossless(), draft=DRAFT,
          draft_params=draft_params, sampling=sampling, compiler_options=FAST)
    np.testing.assert_array_equal(result.metrics.nonfinite_target_steps, 0)
    self.assertGreater(_chi_square_pvalue(np.asarray(result.tokens), law), P_THRESHOLD)
    if jacobi:
      self.assertGreater(int(np.sum(result.metrics.nonfinite_draft_steps)), 0)

  @parameterized.named_parameters(('chain', decode.ChainDraft(2, 'model')),
                                  ('jacobi', decode.Jacobi(3, init='random')))
  def test_nan_laws_on_the_committed_path_are_named_wherever_they_are(self, mode):
    """The law after token 2 is NaN, and the target emits 2: every image with a 2 before
    its last token drew the next one from a NaN law, also where the 2 was an accepted
    draft inside the window (not its first entry), and exactly those are named."""
    target_params, draft_params, _ = _params()
    table = target_params['table'].at[:, 2].set(jnp.nan)  # after (., 2)
    with self.assertRaises(metrics.NonFiniteProbabilitiesError) as raised:
      decode.generate(TARGET, {'table': table}, jnp.zeros((512,), jnp.int32),
                      num_tokens=NUM_TOKENS, key=jax.random.key(6), mode=mode,
                      rule=rules.Lossless(), draft=DRAFT, draft_params=draft_params,
                      compiler_options=FAST)
    tokens = np.asarray(raised.exception.result.tokens)
    met_nan = np.flatnonzero(np.any(tokens[:, :-1] == 2, axis=1))
    self.assertGreater(len(met_nan), 50)
    np.testing.assert_array_equal(raised.exception.images, met_nan)

  def test_only_the_images_that_met_nan_are_named(self):
    """NaN logits after class 1's prefix only: class-0 images decode soundly."""
    target_params, _, _ = _params()
    table = target_params['table'].at[:, VOCAB + 1].set(jnp.nan)
    cond = jnp.array([0, 1, 0, 1], jnp.int32)
    with self.assertRaisesRegex(metrics.NonFiniteProbabilitiesError,
                                r'for 2 image\(s\) \[1, 3\]') as raised:
      decode.generate(TARGET, {'table': table}, cond, num_tokens=NUM_TOKENS,
                      key=jax.random.key(0), compiler_options=FAST)
    np.testing.assert_array_equal(raised.exception.images, [1, 3])
    steps = np.asarray(raised.exception.result.metrics.nonfinite_target_steps)
    np.testing.assert_array_equal(steps > 0, [False, True, False, True])


if __name__ == '__main__':
  absltest.main()
