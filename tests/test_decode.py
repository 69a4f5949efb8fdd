"""Tests of the compiled decode loop (specdec_jax.decode).

Exactness: on a second-order Markov toy target that reads its context back
through the KV cache (specdec_jax/app/toy.py), the joint law of the generated tokens
under every lossless mode must equal the exact joint law. Chi-square test
over the V**n = 64 sequences (rare ones merged into groups of expected count >= 5), N = 2**14
images, p-value threshold 1e-4, fixed seeds. Power: with 63 degrees of
freedom, any law whose chi-square divergence sum (q - p)^2 / p from the exact
law is >= 0.0061 (e.g. any TV distance >= 0.04) is rejected with probability
>= 0.99 (noncentral chi-square, noncentrality 99.7 = N x 0.0061).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import sys
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from specdec_jax import decode
from specdec_jax import jacobi_drafts
from specdec_jax import logits
from specdec_jax import mode_base
from specdec_jax import modes
from specdec_jax import rules
from specdec_jax import testing
from specdec_jax import verify
from specdec_jax.app import toy
from tests import doc_snippets
from tests.decode_support import VOCAB
from tests.decode_support import CLASSES
from tests.decode_support import NUM_SAMPLES
from tests.decode_support import NUM_TOKENS
from tests.decode_support import P_THRESHOLD
from tests.decode_support import TREE
from tests.decode_support import FAST
from tests.decode_support import TARGET
from tests.decode_support import DRAFT
from tests.decode_support import EAGLE
from tests.decode_support import _params
from tests.decode_support import _cond
from tests.decode_support import _chi_square_pvalue
from tests.decode_support import assert_joint_law
from tests.decode_support import _run

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'bench'))
import scd_recording  # pylint: disable=g-import-not-at-top,wrong-import-position  (bench/)


# A mode defined outside the library, to show a new mode is one class: k drafts
# that repeat the last committed token (point masses, so lossless chain
# verification accepts draft x with probability t(x)). It is docs/engine.md's
# example, executed from there, so the joint-law test below keeps that example true.
_RepeatLeft = doc_snippets.class_from(
    'docs/engine.md', 'RepeatLeft',
    dict(dataclasses=dataclasses, modes=modes, mode_base=mode_base, rules=rules, jax=jax,
         jnp=jnp))


LOSSLESS_CASES = (
    ('vanilla', decode.Vanilla(), logits.Sampling()),
    ('chain_model', decode.ChainDraft(2, 'model'), logits.Sampling()),
    ('chain_eagle_cfg', decode.ChainDraft(2, 'eagle'),
     logits.Sampling(cfg_scale=2.0, cfg_interval=1)),
    ('tree_eagle', decode.TreeDraft(TREE, 'eagle'), logits.Sampling(temperature=0.8)),
    ('tree_model_topk', decode.TreeDraft(TREE, 'model'), logits.Sampling(top_k=3)),
    ('jacobi_random', decode.Jacobi(3, 'random'), logits.Sampling()),
    ('jacobi_spatial_cfg', decode.Jacobi(3, 'spatial'), logits.Sampling(cfg_scale=1.5)),
    ('jacobi_scd_random', decode.Jacobi(3, 'random', coupling='maximal'), logits.Sampling()),
    ('jacobi_scd_spatial_cfg', decode.Jacobi(3, 'spatial', coupling='maximal'),
     logits.Sampling(cfg_scale=1.5)),
    ('jacobi_scd_gumbel_random', decode.Jacobi(3, 'random', coupling='gumbel'), logits.Sampling()),
    ('jacobi_scd_gumbel_spatial_cfg', decode.Jacobi(3, 'spatial', coupling='gumbel'),
     logits.Sampling(cfg_scale=1.5)),
    ('plugged_in_mode', _RepeatLeft(2), logits.Sampling()),
)


class ExactnessTest(parameterized.TestCase):

  @parameterized.named_parameters(*LOSSLESS_CASES)
  def test_joint_law_matches_target(self, mode, sampling):
    assert_joint_law(self, _run(mode, sampling), mode, sampling)

  def test_joint_law_with_cpu_latency_options(self):
    """The plain-reduction compile (CompilerOptionsTest) keeps the decode exact."""
    if jax.default_backend() != 'cpu':
      self.skipTest('XLA:CPU options')
    mode, sampling = decode.ChainDraft(2, 'eagle'), logits.Sampling(cfg_scale=2.0)
    result = _run(mode, sampling, compiler_options={**FAST, **decode.CPU_LATENCY_OPTIONS})
    law = TARGET.joint_law(_params()[0], 0, NUM_TOKENS, sampling)
    self.assertGreater(_chi_square_pvalue(np.asarray(result.tokens), law), P_THRESHOLD)

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


  def test_scd_broken_coupling_fails(self):
    """Negative control for SCD: keeping every old draft (its law is not the t it
    is verified against) must break the joint law."""
    original = jacobi_drafts.maximal_coupling
    jacobi_drafts.maximal_coupling = lambda keep_u, draw_u, old, q, p, has_old=None: old
    decode.clear_compile_cache()
    try:
      sampling = logits.Sampling()
      tokens = np.asarray(_run(decode.Jacobi(3, 'random', coupling='maximal'), sampling).tokens)
    finally:
      jacobi_drafts.maximal_coupling = original
      decode.clear_compile_cache()
    law = TARGET.joint_law(_params()[0], 0, NUM_TOKENS, sampling)
    self.assertLess(_chi_square_pvalue(tokens, law), P_THRESHOLD)

  def test_scd_released_recording_fails(self):
    """Negative control for SCD's bookkeeping: recording a kept draft's old law q_old
    for its next verification (as the released SCD code does,
    bench/scd_recording.py) instead of the law t it was coupled to must break the
    joint law. 'spatial' init: on these 3 tokens the only coupled draft is a fresh
    one, and a 'random' fresh draft (uniform over V) averages the two recordings
    to one law (p = 0.55 here); the left neighbour does not (p = 0.0)."""
    sampling = logits.Sampling()
    mode = decode.Jacobi(3, 'spatial', coupling='maximal')
    with scd_recording.released_recording():
      tokens = np.asarray(_run(mode, sampling).tokens)
    law = TARGET.joint_law(_params()[0], 0, NUM_TOKENS, sampling)
    self.assertLess(_chi_square_pvalue(tokens, law), P_THRESHOLD)

  def test_scd_released_recording_closed_form(self):
    """bench/scd_recording.biased_law_example: the exact recording (q_old = p_t makes
    the two recordings one) gives p; the released one 0.15 where p says 0.3."""
    p = np.array([0.3, 0.3, 0.4])
    np.testing.assert_allclose(scd_recording.biased_law_example(p, p, p), p, atol=1e-12)
    np.testing.assert_allclose(
        scd_recording.biased_law_example([0.6, 0.3, 0.1], p, p), [0.15, 0.3, 0.55], atol=1e-12)


class ScdGumbelJointLawTest(parameterized.TestCase):
  """SCD over 5 tokens, its maximal and its Gumbel coupling (V**5 = 1024 sequences,
  N = 2**16 images, chi-square threshold 1e-4; at 2**14 a law at total variation
  0.04 spread over ~500 merged bins is rejected with probability 0.05-0.2 only, at
  2**16 with probability > 0.999): on 3 tokens at
  most one coupled draft of a drawn old draft is verified, and at most one Gumbel draft is ever
  verified per image, so mistakes in which token gets which Gumbel numbers
  only show on longer images. Negative controls that must fail (p < 1e-25 when
  written): one set of numbers for every token of an image, and numbers indexed
  by window slot instead of image token (the window moves, so a token's draft
  reuses the numbers an earlier, already verified token was drawn with).
  """

  NUM_TOKENS = 5

  def _pvalue(self, mode, sampling, num_images=NUM_SAMPLES):
    result = _run(mode, sampling, num_tokens=self.NUM_TOKENS, num_images=num_images)
    law = TARGET.joint_law(_params()[0], 0, self.NUM_TOKENS, sampling)
    counts = testing.histogram(testing.sequence_index(np.asarray(result.tokens), VOCAB), law.size)
    return testing.chi_square_pvalue(counts, law)[0], result

  @parameterized.named_parameters(
      ('random', decode.Jacobi(4, 'random', coupling='gumbel'), logits.Sampling()),
      ('spatial_cfg', decode.Jacobi(3, 'spatial', coupling='gumbel'),
       logits.Sampling(cfg_scale=1.5)))
  def test_scd_gumbel_joint_law_over_five_tokens(self, mode, sampling):
    p_value, result = self._pvalue(mode, sampling, num_images=2 ** 16)
    self.assertGreater(p_value, P_THRESHOLD)
    self.assertGreater(float(result.metrics.summary()['tokens_per_target_forward']), 1.05)

  @parameterized.named_parameters(
      ('random', decode.Jacobi(4, 'random', coupling='maximal'), logits.Sampling()),
      ('spatial_cfg', decode.Jacobi(4, 'spatial', coupling='maximal'),
       logits.Sampling(cfg_scale=1.5)))
  def test_scd_maximal_joint_law_over_five_tokens(self, mode, sampling):
    """The maximal coupling of drafts that were themselves drawn from a stale law (on
    3 tokens every coupled old draft is a fresh one), N = 2**16 images."""
    p_value, result = self._pvalue(mode, sampling, num_images=2 ** 16)
    self.assertGreater(p_value, P_THRESHOLD)
    self.assertGreater(float(result.metrics.summary()['tokens_per_target_forward']), 1.05)

  def test_scd_released_recording_fails_over_five_tokens(self):
    """Negative control: the released recording (q_old for a kept draft) with 'random'
    fresh drafts, which passes on 3 tokens (p = 0.55 there) and at 2**14 images here;
    at 2**16 p = 7e-20 when written."""
    with scd_recording.released_recording():
      p_value, _ = self._pvalue(decode.Jacobi(4, 'random', coupling='maximal'),
                                logits.Sampling(), num_images=2 ** 16)
    self.assertLess(p_value, P_THRESHOLD)

  @parameterized.named_parameters(
      ('shared_numbers', lambda index: jnp.zeros_like(index)),
      ('numbers_by_window_slot', lambda index: index - index[:, :1]))
  def test_scd_gumbel_wrong_numbers_fail(self, which_index):
    original = jacobi_drafts.gumbel_noise
    jacobi_drafts.gumbel_noise = lambda seeds, index, vocab: original(seeds, which_index(index),
                                                                      vocab)
    decode.clear_compile_cache()
    try:
      p_value, _ = self._pvalue(decode.Jacobi(4, 'random', coupling='gumbel'), logits.Sampling())
    finally:
      jacobi_drafts.gumbel_noise = original
      decode.clear_compile_cache()
    self.assertLess(p_value, P_THRESHOLD)


class CompilerOptionsTest(absltest.TestCase):

  def test_cpu_latency_options_compile_plain_reductions(self):
    """XLA:CPU's default compile rewrites a small softmax's reductions into
    reduce-window + reduce (the control); CPU_LATENCY_OPTIONS keeps them plain
    (so the pass name is one XLA knows) and the values stay the same."""
    if jax.default_backend() != 'cpu':
      self.skipTest('XLA:CPU options')
    scores = jax.random.normal(jax.random.key(0), (2, 2, 5, 201))
    softmax = jax.jit(lambda x: jax.nn.softmax(x, axis=-1)).lower(scores)
    default = softmax.compile()
    plain = softmax.compile(compiler_options=decode.CPU_LATENCY_OPTIONS)
    self.assertIn('reduce-window', default.as_text())
    self.assertNotIn('reduce-window', plain.as_text())
    np.testing.assert_allclose(plain(scores), default(scores), rtol=1e-6, atol=1e-7)


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

  def test_threads_asking_for_one_program_compile_it_once(self):
    """Two threads decoding the same shapes at once (different keys) trace the loop
    once (chex.assert_max_traces n=1 fails on a second trace, which two threads that
    both found the cache empty would make) and get their own tokens."""
    decode.clear_compile_cache()
    original = decode._decode
    decode._decode = chex.assert_max_traces(original, n=1)
    try:
      with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(
            lambda seed: _run(decode.ChainDraft(2, 'model'), logits.Sampling(), num_images=4,
                              seed=seed), (3, 4)))
    finally:
      decode._decode = original
      chex.clear_trace_counter()
      decode.clear_compile_cache()
    self.assertFalse(np.array_equal(np.asarray(results[0].tokens),
                                    np.asarray(results[1].tokens)))
    alone = _run(decode.ChainDraft(2, 'model'), logits.Sampling(), num_images=4, seed=4)
    np.testing.assert_array_equal(np.asarray(results[1].tokens), np.asarray(alone.tokens))

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


  def test_int_and_float_hyperparameters_and_numpy_cond_share_one_program(self):
    """delta=2 then delta=2.5 (an int then a float leaf), 0-d jnp arrays, and NumPy then
    device labels trace the loop once (chex.assert_max_traces n=1; each pair traced twice
    before), and only the first call validates (compile_seconds 0.0 after it)."""
    decode.clear_compile_cache()
    target_params, draft_params, _ = _params()
    original = decode._decode
    decode._decode = chex.assert_max_traces(original, n=1)
    try:
      seconds = [decode.generate(
          TARGET, target_params, cond, num_tokens=NUM_TOKENS, key=jax.random.key(0),
          mode=decode.ChainDraft(2, 'model'), rule=rule, draft=DRAFT, draft_params=draft_params,
          compiler_options=FAST).compile_seconds
                 for rule, cond in ((rules.CoolSD(delta=2), np.zeros((4,), np.int32)),
                                    (rules.CoolSD(delta=2.5), jnp.zeros((4,), jnp.int32)),
                                    (rules.CoolSD(delta=np.int64(3)), np.zeros((4,), np.int32)),
                                    (rules.CoolSD(delta=jnp.float32(2.5), nu=jnp.asarray(0.5)),
                                     jnp.zeros((4,), jnp.int32)))]
      self.assertGreater(seconds[0], 0.0)
      self.assertEqual(seconds[1:], [0.0, 0.0, 0.0])
    finally:
      decode._decode = original
      chex.clear_trace_counter()
      decode.clear_compile_cache()


  def test_numpy_parameters_warn_once_per_program(self):
    """Host parameters (what the converters' loaders give) are copied to the devices on
    every call: the first call of a program says so; device parameters do not warn."""
    decode.clear_compile_cache()
    target_params = _params()[0]
    call = lambda params: decode.generate(TARGET, params, jnp.zeros((2,), jnp.int32),
                                          num_tokens=NUM_TOKENS, key=jax.random.key(0),
                                          compiler_options=FAST)
    host = jax.tree.map(np.asarray, target_params)
    with self.assertWarnsRegex(UserWarning, r'NumPy arrays.*jax\.device_put\(params\)'):
      call(host)
    for params in (host, target_params):  # the program's second call; device parameters
      with warnings.catch_warnings():
        warnings.simplefilter('error')
        call(params)
    decode.clear_compile_cache()


class MetricsTest(parameterized.TestCase):
  """Tokens per forward credits only tokens inside the image (SPEC section 3)."""

  @parameterized.named_parameters(
      ('chain', decode.ChainDraft(4, 'model')), ('jacobi', decode.Jacobi(5, 'random')),
      ('tree', decode.TreeDraft(TREE, 'model')))
  def test_last_step_credits_only_the_tokens_the_image_needed(self, mode):
    """8 tokens, up to 5 per step: a finished image committed exactly 7 tokens in its
    verify steps (its first came from the prefill), whatever its last step accepted."""
    num_tokens = 8
    target_params, draft_params, _ = _params()
    extra = {} if isinstance(mode, decode.Jacobi) else dict(draft=DRAFT, draft_params=draft_params)
    result = decode.generate(
        TARGET, target_params, _cond(256, logits.Sampling()), num_tokens=num_tokens,
        key=jax.random.key(4), mode=mode, rule=rules.UniformRelaxed(3.0),
        compiler_options=FAST, **extra)
    host = jax.tree.map(np.asarray, result.metrics)
    np.testing.assert_array_equal(host.committed_tokens, num_tokens - 1)
    np.testing.assert_allclose(np.asarray(result.metrics.tokens_per_target_forward),
                               (num_tokens - 1) / host.verify_steps, rtol=1e-6)
    self.assertAlmostEqual(result.metrics.summary()['tokens_per_target_forward'],
                           float(np.mean((num_tokens - 1) / host.verify_steps)), places=5)
    # Accepted drafts inside the image: at most one fewer than committed per step.
    self.assertTrue(np.all(host.accepted_tokens <= host.committed_tokens))
    self.assertTrue(np.all(host.accepted_tokens >= host.committed_tokens - host.verify_steps))
    np.testing.assert_array_equal(host.accepted_per_position.sum(1), host.accepted_tokens)


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
      ('scd_bad_coupling', dict(mode=decode.Jacobi(3, coupling='sinkhorn')), 'Jacobi.coupling'),
      ('attention_phases', dict(attention_phases=0), 'attention_phases must be an int'),
  )
  def test_rejected_before_compilation(self, overrides, message):
    with self.assertRaisesRegex(ValueError, message):
      self._generate(**overrides)


if __name__ == '__main__':
  absltest.main()
