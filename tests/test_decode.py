"""Tests of the compiled decode loop (specdec_jax.decode).

Exactness: on a second-order Markov toy target that reads its context back
through the KV cache (specdec_jax/toy.py), the joint law of the generated tokens
under every lossless mode must equal the exact joint law. Chi-square test
over the V**n = 64 sequences (bins with expected count < 5 pooled), N = 2**14
images, p-value threshold 1e-4, fixed seeds. Power: with 63 degrees of
freedom, any law whose chi-square divergence sum (q - p)^2 / p from the exact
law is >= 0.0061 (e.g. any TV distance >= 0.04) is rejected with probability
>= 0.99 (noncentral chi-square, noncentrality 99.7 = N x 0.0061).
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from specdec_jax import decode
from specdec_jax import drafting
from specdec_jax import logits
from specdec_jax import mode_base
from specdec_jax import modes
from specdec_jax import rules
from specdec_jax import testing
from specdec_jax import toy
from specdec_jax import verify

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
  """Pearson chi-square (`specdec_jax.testing`) of sequences [N, n] against a law over
  V**n sequences; a zero-probability sequence gives p = 0."""
  counts = testing.histogram(testing.sequence_index(tokens, VOCAB), law.size)
  return testing.chi_square_pvalue(counts, law)[0]


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


@dataclasses.dataclass(frozen=True)
class _RepeatLeft(modes.Mode):
  """A mode defined outside the library, to show a new mode is one class: k drafts
  that repeat the last committed token (point masses, so lossless chain
  verification accepts draft x with probability t(x))."""

  k: int

  rule_mode = rules.CHAIN

  @property
  def width(self) -> int:
    return self.k + 1

  def _repeat(self, token, vocab):
    tokens = jnp.repeat(token[:, None], self.k, axis=1)
    return mode_base.Drafts(tokens=tokens, probs=jax.nn.one_hot(tokens, vocab))

  def start(self, plan, draft_params, draft_cond, prefill, first, first_index, keys):
    return self._repeat(first, plan.target.vocab_size), 0

  def advance(self, plan, draft_params, drafts, step, keys):
    last = jnp.take_along_axis(step.commit, step.verdict.num_accepted[:, None], axis=1)[:, 0]
    return self._repeat(last, plan.target.vocab_size), 0


LOSSLESS_CASES = (
    ('vanilla', decode.Vanilla(), logits.Sampling()),
    ('chain_model', decode.ChainDraft(2, 'model'), logits.Sampling()),
    ('chain_eagle_cfg', decode.ChainDraft(2, 'eagle'),
     logits.Sampling(cfg_scale=2.0, cfg_interval=1)),
    ('tree_eagle', decode.TreeDraft(TREE, 'eagle'), logits.Sampling(temperature=0.8)),
    ('tree_model_topk', decode.TreeDraft(TREE, 'model'), logits.Sampling(top_k=3)),
    ('jacobi_random', decode.Jacobi(3, 'random'), logits.Sampling()),
    ('jacobi_spatial_cfg', decode.Jacobi(3, 'spatial'), logits.Sampling(cfg_scale=1.5)),
    ('plugged_in_mode', _RepeatLeft(2), logits.Sampling()),
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
      p_value = testing.chi_square_pvalue(counts, out / out.sum())[0]
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


class GroupedThroughEngineTest(absltest.TestCase):

  def test_gsd_with_embeddings_compiles_and_runs(self):
    """GSD's embedding-distance filter passes its [V, C] table through jit (the rule's
    shape check must accept the placeholders jit rebuilds the rule with)."""
    embeddings = jnp.asarray(np.random.default_rng(0).normal(size=(VOCAB, 4)), jnp.float32)
    result = _run(decode.Jacobi(window=3), logits.Sampling(), num_images=4,
                  rule=rules.Grouped(embeddings=embeddings, dist_threshold=10.0, below=1,
                                     above=1))
    self.assertEqual(result.tokens.shape, (4, NUM_TOKENS))
    with self.assertRaisesRegex(ValueError, r'embeddings must be \[V, C\]'):
      rules.Grouped(embeddings=embeddings[:, 0])


class RepeatedCallTest(absltest.TestCase):

  def test_repeated_call_skips_validation_and_compilation(self):
    """A second generate() with the same shapes (new key, new parameter values, new
    rule hyperparameters) neither validates nor traces again; a new shape does."""
    decode.clear_compile_cache()
    sampling = logits.Sampling()
    first = _run(decode.ChainDraft(2, 'model'), sampling, num_images=4,
                 rule=rules.CoolSD(delta=2.0))
    self.assertGreater(first.compile_seconds, 0.0)
    original_validate, original_decode = decode.modes_lib.validate, decode._decode
    calls = []
    decode.modes_lib.validate = lambda *a, **k: calls.append(1) or original_validate(*a, **k)
    decode._decode = chex.assert_max_traces(original_decode, n=0)
    try:
      second = _run(decode.ChainDraft(2, 'model'), sampling, num_images=4, seed=11,
                    rule=rules.CoolSD(delta=3.0))
      self.assertEqual(calls, [])
      self.assertEqual(second.compile_seconds, 0.0)
      self.assertFalse(np.array_equal(np.asarray(first.tokens), np.asarray(second.tokens)))
    finally:
      decode._decode = original_decode
      chex.clear_trace_counter()
    try:
      _run(decode.ChainDraft(2, 'model'), sampling, num_images=2, rule=rules.CoolSD(delta=3.0))
      self.assertEqual(calls, [1])  # a new batch size is validated (and compiled)
    finally:
      decode.modes_lib.validate = original_validate


def _softmax64(logits_row) -> np.ndarray:
  x = np.asarray(logits_row, np.float64)
  e = np.exp(x - x.max())
  return e / e.sum()


def _relaxed_chain_law(weights, num_tokens=NUM_TOKENS) -> np.ndarray:
  """Exact law of the 3 tokens ChainDraft(2, 'model') emits on the toys under
  f_i = min(1, w_i t/d) with G*_i = Norm([t - d f_i]_+), written out here from the
  formulas (numpy, no project code), over V**3 sequences.

  Token 0 comes from the prefill (target law). The one verify step drafts
  x1 ~ d(.|a) and x2 ~ d(.|a, x1): if x1 is accepted (position 1), token 2 is
  the position-2 output; if rejected, token 1 is G*_1's sample and token 2 is
  the first draft of the next step, again at position 1.
  """
  assert num_tokens == 3
  target_params, draft_params, _ = _params()
  t_table = np.asarray(target_params['table'])
  d_table = np.asarray(draft_params['table'])
  bos, class_token = TARGET.bos, VOCAB  # class 0

  def parts(d, t, w):
    """(accepted mass d f, rejected mass (1 - beta) G*) over the vocabulary."""
    accepted = np.minimum(d, w * t)  # d min(1, w t/d)
    residual = np.maximum(t - accepted, 0.0)
    total = residual.sum()
    residual = residual / total if total > 0 else t
    return accepted, (1.0 - accepted.sum()) * residual

  w1, w2 = weights
  law = np.zeros((VOCAB,) * 3)
  first = _softmax64(t_table[bos, class_token])
  for a in range(VOCAB):
    accepted1, rejected1 = parts(_softmax64(d_table[class_token, a]),
                                 _softmax64(t_table[class_token, a]), w1)
    for b in range(VOCAB):
      d2, t2 = _softmax64(d_table[a, b]), _softmax64(t_table[a, b])
      after_accept = sum(parts(d2, t2, w2))  # x2 verified at position 2
      after_reject = sum(parts(d2, t2, w1))  # next step's first draft, position 1
      law[a, b] = first[a] * (accepted1[b] * after_accept + rejected1[b] * after_reject)
  return law.reshape(-1)


class RelaxedJointLawTest(parameterized.TestCase):
  """Relaxed rules through the engine at draft positions 1 *and* 2: the joint law of
  whole sequences against the closed form above. Same power as ExactnessTest (63
  degrees of freedom, N = 2**14, p threshold 1e-4: a chi-square divergence >= 0.0061
  is rejected with probability >= 0.99). Negative control: the law a decoder that
  used position 1's weight at position 2 would have; the test asserts that law is
  far enough (divergence >= 0.0061) and that the same samples reject it."""

  @parameterized.named_parameters(
      ('coolsd_floored', rules.CoolSD(delta=3.0)),
      ('coolsd_unfloored', rules.CoolSD(delta=1.1, floor_at_one=False)),
      ('uniform', rules.UniformRelaxed(omega=2.0)),
  )
  def test_joint_law_over_two_draft_positions(self, rule):
    mode = decode.ChainDraft(2, 'model')
    weights = [1.0, 1.0]
    if isinstance(rule, rules.CoolSD):
      windowed = rule.for_window(2)
      weights = [float(windowed.weight(1)), float(windowed.weight(2))]
    else:
      weights = [rule.omega, rule.omega]
    law = _relaxed_chain_law(weights)
    np.testing.assert_allclose(law.sum(), 1.0, atol=1e-9)
    tokens = np.asarray(_run(mode, logits.Sampling(), rule=rule, seed=11).tokens)
    p_value = _chi_square_pvalue(tokens, law)
    self.assertGreater(p_value, P_THRESHOLD, f'weights {weights}: p = {p_value:.3g}')
    if weights[0] != weights[1]:
      wrong = _relaxed_chain_law([weights[0], weights[0]])
      divergence = float(np.sum((wrong - law) ** 2 / np.where(law > 0, law, 1.0)))
      self.assertGreater(divergence, 0.0061)
      self.assertLess(_chi_square_pvalue(tokens, wrong), P_THRESHOLD)


class JacobiTokenRangeTest(absltest.TestCase):
  """Jacobi random drafts come from the target's declared image-token range."""

  def test_engine_passes_the_declared_range(self):
    ranged = _RangedToy(VOCAB, CLASSES, image_token_range=(1, 3))
    seen = []
    original = drafting.jacobi_fresh

    def recording(*args, **kwargs):
      seen.append(args[5] if len(args) > 5 else kwargs.get('token_range'))
      return original(*args, **kwargs)

    drafting.jacobi_fresh = recording
    decode.clear_compile_cache()
    try:
      target_params = _params()[0]
      decode.generate(ranged, target_params, _cond(4, logits.Sampling()), num_tokens=NUM_TOKENS,
                      key=jax.random.key(0), mode=decode.Jacobi(3), rule=rules.Lossless(),
                      compiler_options=FAST)
      self.assertNotEmpty(seen)
      self.assertEqual(set(seen), {(1, 3)})
      seen.clear()
      decode.generate(TARGET, target_params, _cond(4, logits.Sampling()), num_tokens=NUM_TOKENS,
                      key=jax.random.key(0), mode=decode.Jacobi(3), rule=rules.Lossless(),
                      compiler_options=FAST)
      self.assertEqual(set(seen), {(0, VOCAB)})  # no declaration: the whole vocabulary
    finally:
      drafting.jacobi_fresh = original
      decode.clear_compile_cache()

  def test_released_models_declare_their_image_tokens(self):
    from specdec_jax import protocol  # pylint: disable=g-import-not-at-top
    from specdec_jax.models import chameleon, janus, llamagen  # pylint: disable=g-import-not-at-top
    self.assertEqual(protocol.image_token_range(chameleon.ChameleonModel(chameleon.lumina_7b())),
                     (4, 8196))  # 8192 VQ codes of 65536 ids
    self.assertEqual(protocol.image_token_range(janus.JanusModel(janus.JanusConfig())),
                     (0, 16384))
    self.assertEqual(protocol.image_token_range(llamagen.LlamaGenGPT(llamagen.GPTConfig())),
                     (0, 16384))
    self.assertEqual(protocol.image_token_range(TARGET), (0, VOCAB))  # undeclared: all

  def test_bad_range_is_rejected_before_compilation(self):
    bad = _RangedToy(VOCAB, CLASSES, image_token_range=(2, VOCAB + 1))
    with self.assertRaisesRegex(ValueError, 'image_token_range must be a non-empty range'):
      decode.generate(bad, _params()[0], _cond(2, logits.Sampling()), num_tokens=NUM_TOKENS,
                      key=jax.random.key(0), mode=decode.Jacobi(3), rule=rules.Lossless(),
                      compiler_options=FAST)


@dataclasses.dataclass(frozen=True)
class _RangedToy(toy.MarkovToy):
  """A Markov toy that declares which token ids are image tokens."""

  image_token_range: tuple = (0, VOCAB)


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
