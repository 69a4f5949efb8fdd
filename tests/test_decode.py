"""Tests of the compiled decode loop (specdec_jax.decode).

Exactness: on a second-order Markov toy target that reads its context back
through the KV cache (models/toy.py), the joint law of the generated tokens
under every lossless mode must equal the exact joint law. Chi-square test
over the V**n = 64 sequences (bins with expected count < 5 pooled), N = 2**14
images, p-value threshold 1e-4, fixed seeds. Power: with 63 degrees of
freedom, any law whose chi-square divergence sum (q - p)^2 / p from the exact
law is >= 0.0061 (e.g. any TV distance >= 0.04) is rejected with probability
>= 0.99 (noncentral chi-square, noncentrality 99.7 = N x 0.0061).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from scipy import stats

from specdec_jax import decode
from specdec_jax import logits
from specdec_jax import rules
from specdec_jax import verify
from specdec_jax.models import toy

VOCAB, CLASSES, NUM_TOKENS = 4, 2, 3
NUM_SAMPLES = 2 ** 14
P_THRESHOLD = 1e-4
TREE = verify.StaticTree.from_paths(((0,), (1,), (0, 0), (0, 1), (1, 0)))
FAST = decode.FAST_COMPILE

TARGET = toy.MarkovToy(VOCAB, CLASSES)
DRAFT = toy.MarkovToy(VOCAB, CLASSES)
EAGLE = toy.ToyEagle(VOCAB, CLASSES)


def _params():
  return (TARGET.init_params(jax.random.key(0)), DRAFT.init_params(jax.random.key(1)),
          EAGLE.init_params(jax.random.key(2)))


def _cond(num_images: int, sampling: logits.Sampling, class_id: int = 0):
  ids = jnp.full((num_images,), class_id, jnp.int32)
  return toy.cfg_class_rows(ids, CLASSES) if sampling.uses_cfg else ids


def _chi_square_pvalue(tokens: np.ndarray, law: np.ndarray) -> float:
  """Pearson chi-square of sequences [N, n] against a law over V**n sequences."""
  index = np.ravel_multi_index(tokens.T, (VOCAB,) * tokens.shape[1])
  counts = np.bincount(index, minlength=law.size).astype(np.float64)
  expected = law * tokens.shape[0]
  small = expected < 5
  if small.any():
    counts = np.append(counts[~small], counts[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
  keep = expected > 0
  assert np.all(counts[~keep] == 0), 'a zero-probability sequence was generated'
  statistic = np.sum((counts[keep] - expected[keep]) ** 2 / expected[keep])
  return float(stats.chi2.sf(statistic, keep.sum() - 1))


def _run(mode, sampling, *, num_images=NUM_SAMPLES, seed=7, rule=rules.Lossless(), **kwargs):
  target_params, draft_params, eagle_params = _params()
  draft, params = None, None
  if isinstance(mode, (decode.ChainDraft, decode.TreeDraft)):
    draft, params = ((EAGLE, eagle_params) if mode.drafter == 'eagle'
                     else (DRAFT, draft_params))
  return decode.generate(
      TARGET, target_params, _cond(num_images, sampling), num_tokens=NUM_TOKENS,
      key=jax.random.key(seed), mode=mode, sampling=sampling, rule=rule, draft=draft,
      draft_params=params, compiler_options=FAST, **kwargs)


LOSSLESS_CASES = (
    ('vanilla', decode.Vanilla(), logits.Sampling()),
    ('chain_model', decode.ChainDraft(2, 'model'), logits.Sampling()),
    ('chain_eagle_cfg', decode.ChainDraft(2, 'eagle'),
     logits.Sampling(cfg_scale=2.0, cfg_interval=1)),
    ('tree_eagle', decode.TreeDraft(TREE, 'eagle'), logits.Sampling(temperature=0.8)),
    ('tree_model_topk', decode.TreeDraft(TREE, 'model'), logits.Sampling(top_k=3)),
    ('jacobi_random', decode.Jacobi(3, 'random'), logits.Sampling()),
    ('jacobi_spatial_cfg', decode.Jacobi(3, 'spatial'), logits.Sampling(cfg_scale=1.5)),
)


class ExactnessTest(parameterized.TestCase):

  @parameterized.named_parameters(*LOSSLESS_CASES)
  def test_joint_law_matches_target(self, mode, sampling):
    result = _run(mode, sampling)
    tokens = np.asarray(result.tokens)
    chex.assert_shape(tokens, (NUM_SAMPLES, NUM_TOKENS))
    law = TARGET.joint_law(_params()[0], 0, NUM_TOKENS, sampling)
    p_value = _chi_square_pvalue(tokens, law)
    self.assertGreater(p_value, P_THRESHOLD, f'{mode}: p = {p_value:.3g}')
    if not isinstance(mode, decode.Vanilla):
      # Speculation actually happened: some steps accepted drafts.
      self.assertGreater(float(result.metrics.summary()['tokens_per_target_forward']), 1.05)

  def test_broken_rollback_fails(self):
    """Negative control: advancing lengths by the whole window always."""
    original = decode._committed_length
    decode._committed_length = lambda old, num_accepted, window: old + window
    decode.clear_compile_cache()
    try:
      sampling = logits.Sampling()
      tokens = np.asarray(_run(decode.ChainDraft(2, 'model'), sampling).tokens)
    finally:
      decode._committed_length = original
      decode.clear_compile_cache()
    law = TARGET.joint_law(_params()[0], 0, NUM_TOKENS, sampling)
    self.assertLess(_chi_square_pvalue(tokens, law), P_THRESHOLD)


class RelaxedRuleTest(absltest.TestCase):

  def _check_second_token(self, tokens, rule):
    """Token 2 given token 1 follows the rule's exact one-step law at draft position 1,
    out = d f + (1 - beta) G*, and its TV to the target is within sum [d f - t]_+
    (+ Monte Carlo slack)."""
    target_params, draft_params, _ = _params()
    class_token = VOCAB  # class 0
    for first in range(VOCAB):
      rows = tokens[tokens[:, 0] == first]
      target_probs = jax.nn.softmax(target_params['table'][class_token, first])
      draft_probs = jax.nn.softmax(draft_params['table'][class_token, first])
      out = np.asarray(verify.output_law(rule, draft_probs, target_probs, 1), np.float64)
      counts = np.bincount(rows[:, 1], minlength=VOCAB)
      p_value = stats.chisquare(counts, out / out.sum() * len(rows)).pvalue
      self.assertGreater(p_value, P_THRESHOLD)
      bound = float(verify.excess_acceptance(rule, draft_probs, target_probs, 1))
      empirical_tv = 0.5 * np.abs(counts / len(rows) - np.asarray(target_probs)).sum()
      self.assertLessEqual(empirical_tv, bound + 3 * 0.5 * np.sqrt(VOCAB / len(rows)))

  def test_coolsd_one_step_law_tv_bound_and_no_retrace(self):
    """COOL-SD chain drafts at two deltas. The second call reuses the compiled program:
    rule hyperparameters are pytree leaves, so no retrace (chex.assert_max_traces) and
    no compile."""
    decode.clear_compile_cache()
    original = decode._decode
    decode._decode = chex.assert_max_traces(original, n=1)
    results = {}
    try:
      for delta in (2.0, 3.0):
        rule = rules.CoolSD(delta=delta)
        results[delta] = _run(decode.ChainDraft(2, 'model'), logits.Sampling(), rule=rule,
                              seed=int(delta))
    finally:
      decode._decode = original
      chex.clear_trace_counter()
    self.assertGreater(results[2.0].compile_seconds, 0.0)
    self.assertEqual(results[3.0].compile_seconds, 0.0)
    for delta, result in results.items():
      self._check_second_token(np.asarray(result.tokens), rules.CoolSD(delta=delta).for_window(2))


class BatchTest(absltest.TestCase):

  def test_rows_match_batch_of_one(self):
    """Per-image keys: each image's tokens equal its batch-of-one run, while rows
    accept different numbers of drafts (so rows really are out of step)."""
    sampling = logits.Sampling(cfg_scale=1.5)
    mode = decode.ChainDraft(3, 'eagle')
    keys = jax.random.split(jax.random.key(3), 6)
    target_params, _, eagle_params = _params()
    run = lambda row_keys: decode.generate(
        TARGET, target_params, _cond(row_keys.shape[0], sampling), num_tokens=6,
        key=row_keys, mode=mode, sampling=sampling, rule=rules.Lossless(), draft=EAGLE,
        draft_params=eagle_params, compiler_options=FAST)
    batch = run(keys)
    self.assertGreater(len(set(np.asarray(batch.metrics.accepted_tokens).tolist())), 1)
    for row in range(6):
      single = run(keys[row:row + 1])
      np.testing.assert_array_equal(np.asarray(single.tokens)[0], np.asarray(batch.tokens)[row])
      np.testing.assert_array_equal(np.asarray(single.metrics.accepted_tokens)[0],
                                    np.asarray(batch.metrics.accepted_tokens)[row])


class GreedyRealModelTest(absltest.TestCase):
  """Through real models (LlamaGen 2D RoPE, the EAGLE-1 head): with temperature 0 every
  lossless mode must emit exactly vanilla greedy decoding's tokens (positions, tree masks,
  path compaction and drafter catch-up all have to be right for that; replacing the path
  compaction by a no-op makes this test fail)."""

  def test_all_modes_equal_vanilla_greedy(self):
    from specdec_jax.models import eagle, llamagen  # pylint: disable=g-import-not-at-top
    config = llamagen.GPTConfig(n_layer=1, n_head=4, dim=32, vocab_size=64, num_classes=4,
                                block_size=16)
    target = llamagen.LlamaGenGPT(config)
    target_params = target.init_params(jax.random.key(0))
    head = eagle.EagleDrafter(eagle.llamagen_drafter_config(config))
    head_params = eagle.attach_head(head.init_params(jax.random.key(1)),
                                    target_params['output']['kernel'])
    sampling = logits.Sampling(cfg_scale=2.0, temperature=0.0)
    cond = target.cfg_cond(target_params, jnp.array([0, 1, 3]))
    run = lambda mode, **kwargs: decode.generate(
        target, target_params, cond, num_tokens=16, key=jax.random.key(4), mode=mode,
        sampling=sampling, rule=rules.Lossless(), compiler_options=FAST, **kwargs)
    expected = np.asarray(run(decode.Vanilla()).tokens)
    tree = verify.StaticTree.from_paths(((0,), (1,), (0, 0), (1, 0), (0, 0, 0)))
    # The target drafting for itself: every greedy draft is accepted, so whole
    # depth-3 paths are compacted into the cache and bonus tokens follow.
    self_draft = run(decode.TreeDraft(tree, 'model'), draft=target, draft_params=target_params)
    np.testing.assert_array_equal(np.asarray(self_draft.tokens), expected)
    self.assertGreater(self_draft.metrics.summary()['tokens_per_target_forward'], 3.0)
    # A random EAGLE-1 head (models/eagle.py): mostly rejections, resampled from the target.
    eagle_run = run(decode.ChainDraft(3, 'eagle'), draft=head, draft_params=head_params)
    np.testing.assert_array_equal(np.asarray(eagle_run.tokens), expected)


class BadInputTest(parameterized.TestCase):
  """Every error is raised before anything is traced or compiled."""

  def setUp(self):
    super().setUp()
    self._original = decode._decode

    def must_not_run(*args, **kwargs):
      raise AssertionError('the decode was traced despite invalid input')

    decode._decode = must_not_run
    decode.clear_compile_cache()

  def tearDown(self):
    decode._decode = self._original
    super().tearDown()

  def _generate(self, **overrides):
    target_params, draft_params, _ = _params()
    kwargs = dict(num_tokens=NUM_TOKENS, key=jax.random.key(0), mode=decode.ChainDraft(2, 'model'),
                  rule=rules.Lossless(), draft=DRAFT, draft_params=draft_params,
                  compiler_options=FAST)
    kwargs.update(overrides)
    cond = kwargs.pop('cond', jnp.zeros((2,), jnp.int32))
    return decode.generate(TARGET, target_params, cond, **kwargs)

  @parameterized.named_parameters(
      ('capacity', dict(capacity=5), 'capacity 5 is too small'),
      ('k_too_large', dict(mode=decode.ChainDraft(3, 'model')), 'ChainDraft.k'),
      ('window_too_large', dict(mode=decode.Jacobi(4)), 'Jacobi.window'),
      ('window_too_small', dict(mode=decode.Jacobi(1)), 'Jacobi.window'),
      ('vocab_mismatch', dict(draft=toy.MarkovToy(5, CLASSES)), 'vocab_size 5'),
      ('rule_mode', dict(mode=decode.TreeDraft(TREE, 'model'),
                         rule=rules.Grouped()), "'tree'"),
      ('no_rule', dict(rule=None), 'needs an acceptance rule'),
      ('cond_shape', dict(cond=jnp.zeros((2, 3), jnp.int32)), r'shape \[B\]'),
      ('cfg_odd_rows', dict(cond=jnp.zeros((3,), jnp.int32),
                            sampling=logits.Sampling(cfg_scale=2.0)), 'must be even'),
      ('no_draft', dict(draft=None), 'needs draft='),
      ('bad_init', dict(mode=decode.Jacobi(3, 'diagonal')), 'Jacobi.init'),
  )
  def test_rejected_before_compilation(self, overrides, message):
    with self.assertRaisesRegex(ValueError, message):
      self._generate(**overrides)


if __name__ == '__main__':
  absltest.main()
