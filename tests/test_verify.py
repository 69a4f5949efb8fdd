"""Monte Carlo checks of verify_chain / verify_tree against exact laws.

Power: n = 2^16 samples, 6 sigma per bin (+5 counts slack): a bin of mass 0.1
detects a deviation of 1.0 percentage point with probability 0.99 (it fails
beyond 0.7); every zero-mass bin must be
exactly empty. Each test has a negative control (a broken verifier) that must
fail the same criterion.
"""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import categorical
from specdec_jax import rules
from specdec_jax import testing
from specdec_jax import verify
from tests.rules_support import dirichlet_pair, relaxed_rules
from tests.verify_support import NUM_SAMPLES
from tests.verify_support import AcceptEverything


@flax.struct.dataclass
class TargetAsResidual(rules.Lossless):
  """Negative control: resample from t instead of Norm([t - d]_+)."""

  def residual(self, draft_probs, target_probs, position=1, rejected_token=None):
    return target_probs


def next_token_reports(rule, draft_probs, target_probs, num_accepted, next_token) -> list:
  """`testing.bins_match` of the token after each stop n = 0..k against its law under
  `rule`: position n+1's residual mixture after a rejection there, the bonus law at k."""
  k, vocab = draft_probs.shape
  reports = []
  for stop in range(k + 1):
    if stop == k:
      law = target_probs[k]
    else:  # rejected at position stop+1: law of the residual mixture
      d, t = draft_probs[stop], target_probs[stop]
      accept = rule.accept_prob(d, t, stop + 1)
      law = (verify.output_law(rule, d, t, stop + 1) - d * accept) / (1 - jnp.sum(d * accept))
    reports.append(testing.bins_match(testing.histogram(next_token[num_accepted == stop], vocab),
                                      law))
  return reports


def sample_chain(rule, draft_probs, target_probs, seed=0, num_samples=NUM_SAMPLES):
  """Runs verify_chain on num_samples independent drafts; returns
  (draft_tokens [n, k], num_accepted [n], next_token [n])."""
  k = draft_probs.shape[0]
  key_draft, key_verify = jax.random.split(jax.random.key(seed))
  drafts = jax.random.categorical(key_draft, jnp.log(draft_probs), shape=(num_samples, k))
  keys = jax.random.split(key_verify, num_samples)
  run = jax.jit(jax.vmap(functools.partial(verify.verify_chain, rule),
                         in_axes=(0, 0, None, None)))
  num_accepted, next_token = run(keys, drafts.astype(jnp.int32), draft_probs, target_probs)
  return np.asarray(drafts), np.asarray(num_accepted), np.asarray(next_token)


def first_tokens(drafts, num_accepted, next_token):
  return np.where(num_accepted > 0, drafts[:, 0], next_token)


class ChainMonteCarloTest(parameterized.TestCase):

  @parameterized.product(
      name=['lossless', 'uniform', 'coolsd', 'lantern', 'lanternpp', 'csd', 'gsd',
            'lantern_published'],
      vocab=[8, 32])
  def test_first_token_follows_output_law(self, name, vocab):
    if name == 'lossless':
      rule = rules.Lossless()
    elif name == 'lantern_published':
      rule = relaxed_rules(vocab)['lanternpp'].replace(residual_mode='published_llamagen')
    else:
      rule = relaxed_rules(vocab)[name]
    draft, target = dirichlet_pair(1, vocab)
    target = jnp.where(jnp.arange(vocab) == 0, 0.0, target)  # one zero-mass bin
    target = target / target.sum()
    out = sample_chain(rule, draft[None], jnp.stack([target, target]))
    law = verify.output_law(rule, draft, target, 1)
    report = testing.bins_match(testing.histogram(first_tokens(*out), vocab), law)
    self.assertTrue(report.ok, report.message)

  @parameterized.parameters(('accept_all', AcceptEverything()),
                            ('target_residual', TargetAsResidual()))
  def test_negative_controls_fail(self, name, broken):
    vocab = 16
    draft, target = dirichlet_pair(1, vocab)
    out = sample_chain(broken, draft[None], jnp.stack([target, target]))
    report = testing.bins_match(testing.histogram(first_tokens(*out), vocab), target)
    self.assertFalse(report.ok, f'{name} should have been detected: {report.message}')

  @parameterized.parameters(('lossless',), ('coolsd',), ('csd',))
  def test_accepted_length_and_conditional_next_token(self, name):
    """P(N = n) = prod_{j<=n} a_j (1 - a_{n+1}) for independent positions, and
    the token after a stop at n follows that position's residual (or the bonus)."""
    vocab, k = 16, 4
    rule = (rules.Lossless() if name == 'lossless' else relaxed_rules(vocab)[name])
    rule = rules.CoolSD(delta=2.0, window=k) if name == 'coolsd' else rule.for_window(k)
    pairs = [dirichlet_pair(20 + i, vocab, concentration=1.0) for i in range(k + 1)]
    draft_probs = jnp.stack([d for d, _ in pairs[:k]])
    target_probs = jnp.stack([t for _, t in pairs])
    drafts, num_accepted, next_token = sample_chain(rule, draft_probs, target_probs, seed=3)

    rates = [float(rule.acceptance_rate(draft_probs[i], target_probs[i], i + 1))
             for i in range(k)]
    survive = np.cumprod([1.0] + rates)  # P(N >= n)
    length_law = np.append(survive[:-1] * (1 - np.array(rates)), survive[-1])
    report = testing.bins_match(testing.histogram(num_accepted, k + 1), length_law)
    self.assertTrue(report.ok, report.message)

    for stop, report in enumerate(next_token_reports(rule, draft_probs, target_probs,
                                                     num_accepted, next_token)):
      self.assertTrue(report.ok, f'stop {stop}: {report.message}')

  def test_conditional_next_token_negative_control(self):
    """Resampling from the target instead of the residual keeps the accepted-length law
    (the same acceptance) but moves the token after a rejection: some stop must fail."""
    vocab, k = 16, 4
    pairs = [dirichlet_pair(20 + i, vocab, concentration=1.0) for i in range(k + 1)]
    draft_probs = jnp.stack([d for d, _ in pairs[:k]])
    target_probs = jnp.stack([t for _, t in pairs])
    _, num_accepted, next_token = sample_chain(TargetAsResidual(), draft_probs, target_probs,
                                               seed=3)
    reports = next_token_reports(rules.Lossless(), draft_probs, target_probs, num_accepted,
                                 next_token)
    self.assertFalse(all(report.ok for report in reports), [r.message for r in reports])

  def test_accepted_length_negative_control(self):
    vocab, k = 16, 3
    pairs = [dirichlet_pair(30 + i, vocab, concentration=1.0) for i in range(k + 1)]
    draft_probs = jnp.stack([d for d, _ in pairs[:k]])
    target_probs = jnp.stack([t for _, t in pairs])
    _, num_accepted, _ = sample_chain(AcceptEverything(), draft_probs, target_probs)
    rates = [float(rules.Lossless().acceptance_rate(draft_probs[i], target_probs[i]))
             for i in range(k)]
    survive = np.cumprod([1.0] + rates)
    length_law = np.append(survive[:-1] * (1 - np.array(rates)), survive[-1])
    self.assertFalse(testing.bins_match(testing.histogram(num_accepted, k + 1), length_law).ok)


class JitVmapTest(parameterized.TestCase):

  def test_no_retrace_and_batched_rows_match_single_rows(self):
    vocab, k, batch = 16, 3, 6
    pairs = [dirichlet_pair(i, vocab) for i in range(batch * (k + 1))]
    draft_probs = jnp.stack([d for d, _ in pairs]).reshape(batch, k + 1, vocab)[:, :k]
    target_probs = jnp.stack([t for _, t in pairs]).reshape(batch, k + 1, vocab)
    drafts = jax.random.categorical(jax.random.key(0), jnp.log(draft_probs)).astype(jnp.int32)
    keys = jax.random.split(jax.random.key(1), batch)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def batched(keys, drafts, draft_probs, target_probs):
      return jax.vmap(functools.partial(verify.verify_chain, rules.CoolSD(delta=2.0, window=k)))(
          keys, drafts, draft_probs, target_probs)

    num_accepted, next_token = batched(keys, drafts, draft_probs, target_probs)
    batched(keys, drafts, draft_probs * 1.0, target_probs)  # same shapes: no retrace
    single = jax.jit(functools.partial(verify.verify_chain, rules.CoolSD(delta=2.0, window=k)))
    for row in range(batch):
      n, token = single(keys[row], drafts[row], draft_probs[row], target_probs[row])
      self.assertEqual(int(n), int(num_accepted[row]))
      self.assertEqual(int(token), int(next_token[row]))


class ValidationTest(parameterized.TestCase):

  def test_bad_inputs_name_the_argument(self):
    draft, target = dirichlet_pair(0, 8)
    tokens = jnp.array([1, 2], jnp.int32)
    d2, t3 = jnp.stack([draft, draft]), jnp.stack([target] * 3)
    cases = [
        ((tokens, d2, jnp.stack([target] * 2)), 'k\\+1'),
        ((tokens, jnp.stack([draft[:7] / draft[:7].sum()] * 2), t3), 'vocabulary'),
        ((tokens[None], d2, t3), 'draft_tokens'),
        ((tokens, d2 * 2, t3), 'draft_probs rows must sum to 1'),
        ((tokens, d2.at[0, 0].set(jnp.nan), t3), 'NaN'),
        ((tokens, d2, t3 - 0.5), 'negative'),
        ((jnp.array([1, 9], jnp.int32), d2, t3), 'draft_tokens must be in'),
        ((jnp.array([1, 8], jnp.int32), d2, t3), r'draft_tokens must be in \[0, 8\)'),  # id V
    ]
    for args, message in cases:
      with self.assertRaisesRegex(ValueError, message):
        verify.verify_chain(rules.Lossless(), jax.random.key(0), *args)
    with self.assertRaisesRegex(ValueError, 'vocabulary'):
      verify.output_law(rules.Lossless(), draft, target[:4] / target[:4].sum())
    with self.assertRaisesRegex(ValueError, r'needs at least one draft \(k >= 1\)'):
      verify.verify_chain(rules.Lossless(), jax.random.key(0), tokens[:0], d2[:0], t3[:1])
    with self.assertRaisesRegex(ValueError, 'verify_chain: rule must be an acceptance rule'):
      verify.verify_chain(None, jax.random.key(0), tokens, d2, t3)
    with self.assertRaisesRegex(ValueError, 'output_law: position is the 1-based'):
      verify.output_law(rules.CoolSD(delta=2.0, window=4), draft, target, position=0)


  def test_tokens_of_the_wrong_kind_or_without_draft_mass_are_refused(self):
    draft, target = dirichlet_pair(0, 8)
    d2, t3 = jnp.stack([draft, draft]), jnp.stack([target] * 3)
    verify_chain = functools.partial(verify.verify_chain, rules.Lossless(), jax.random.key(0))
    for tokens, message in ((jnp.array([1., 2.]), 'draft_tokens must be an int array.*float32'),
                            (jnp.array([True, False]), 'draft_tokens must be an int array.*bool')):
      with self.subTest(message), self.assertRaisesRegex(ValueError, message):
        verify_chain(tokens, d2, t3)
    self.assertEqual(verify_chain([1, 2], d2, t3), verify_chain(jnp.array([1, 2]), d2, t3))
    point = jnp.zeros(8).at[1].set(1.0)
    with self.assertRaisesRegex(ValueError, r'draft_tokens\[1\]=0 has probability 0 under '
                                r'draft_probs\[1\]'):
      verify_chain(jnp.array([1, 0]), jnp.stack([draft, point]), t3)

  def test_laws_of_another_rank_or_shape_are_refused(self):
    draft, target = dirichlet_pair(0, 8)
    with self.assertRaisesRegex(ValueError, r'target_probs must be a distribution \[V\]'):
      verify.output_law(rules.Lossless(), draft, jnp.stack([target, target]))
    with self.assertRaisesRegex(ValueError, 'tv_distance: p and q must have one shape'):
      verify.tv_distance(draft, jnp.array([1.0]))
    with self.assertRaisesRegex(ValueError, 'target_probs rows must sum to 1'):
      verify.excess_acceptance(rules.Lossless(), draft, target * 4)
    with self.assertRaisesRegex(ValueError, 'excess_acceptance: draft_probs .* one shape'):
      verify.excess_acceptance(rules.Lossless(), draft, jnp.stack([target, target]))


class BFloat16Test(absltest.TestCase):
  """bfloat16 probabilities (what a bf16 model's softmax gives) pass the value checks
  outside jit as they do inside, and output_law is float32 for every rule."""

  def test_bf16_rows_pass_the_checks_and_the_law_is_float32(self):
    logits = jax.random.normal(jax.random.key(0), (5, 64)).astype(jnp.bfloat16) * 2
    target = jax.nn.softmax(logits)  # computed in bf16: rows sum to 1 +- a few 1e-3
    draft = jax.nn.softmax(logits[:4] * 0.5)
    sums = np.asarray(target, np.float64).sum(-1)
    self.assertGreater(np.abs(sums - 1).max(), 1e-3)  # what the f32 tolerance refused
    tokens = jnp.argmax(draft, -1).astype(jnp.int32)
    eager = verify.verify_chain(rules.Lossless(), jax.random.key(1), tokens, draft, target)
    jitted = jax.jit(verify.verify_chain, static_argnums=0)(
        rules.Lossless(), jax.random.key(1), tokens, draft, target)
    self.assertEqual([int(x) for x in eager], [int(x) for x in jitted])
    for rule in (rules.Lossless(), rules.UniformRelaxed(2.0), rules.CoolSD(2.0, window=4)):
      law = verify.output_law(rule, draft[0], target[0])
      self.assertEqual(law.dtype, jnp.float32, type(rule).__name__)
      np.testing.assert_allclose(float(law.sum()), 1.0, atol=1e-2)
    # Rows off by more than rounding are still refused, in bf16 as in f32.
    with self.assertRaisesRegex(ValueError, 'target_probs rows must sum to 1'):
      verify.output_law(rules.Lossless(), draft[0], target[0] * 1.05)
    draft32, target32 = jax.nn.softmax(logits[:2].astype(jnp.float32))
    verify.output_law(rules.Lossless(), draft32, target32)
    with self.assertRaisesRegex(ValueError, 'target_probs rows must sum to 1'):
      verify.output_law(rules.Lossless(), draft32, target32 * 1.005)

  def test_verification_of_bf16_rows_decides_in_float32(self):
    """verify_chain and verify_tree test min(1, t/d) in float32 as output_law does: a
    uniform between the bf16 and the float32 acceptance of a token decides as in
    float32 (in bf16 the tokens' f is off by up to about 2e-3, and the sampled law is
    not output_law's)."""
    logits = jax.random.normal(jax.random.key(0), (2, 64)).astype(jnp.bfloat16) * 2
    target, draft = jax.nn.softmax(logits), jax.nn.softmax(logits * 0.8)
    f32 = np.asarray(rules.Lossless().accept_prob(draft[0].astype(jnp.float32),
                                                  target[0].astype(jnp.float32)))
    f16 = np.asarray(rules.Lossless().accept_prob(draft[0], target[0]), np.float32)
    token = int(np.argmax(np.abs(f32 - f16)))
    self.assertGreater(abs(f32[token] - f16[token]), 1e-3)  # bf16 would decide otherwise
    between = (f32[token] + f16[token]) / 2
    uniforms = jnp.array([between, 0.5], jnp.float32)
    tokens = jnp.array([token], jnp.int32)
    accepted, _ = verify.verify_chain_with_uniforms(rules.Lossless(), uniforms, tokens,
                                                    draft[:1], target)
    self.assertEqual(int(accepted), int(between < f32[token]))
    tree = verify.StaticTree.from_paths(((0,),))
    path, accepted, _ = verify.verify_tree_with_uniforms(
        rules.Lossless(), uniforms, tree, jnp.array([0, token], jnp.int32),
        jnp.stack([draft[0], draft[0]]), target)
    self.assertEqual(int(accepted), int(between < f32[token]))


class ChainEdgeTest(absltest.TestCase):
  """A uniform of exactly 0 (jax.random.uniform gives one with probability
  2^-23 per draw) and the residual's position, which floored rules hide."""

  def test_chain_never_accepts_a_zero_probability_token_at_u_zero(self):
    # jax.random.uniform returns exactly 0.0 with probability 2^-23 per draw.
    d = jnp.array([[.5, .5, 0, 0]], jnp.float32)
    t = jnp.array([[0, .5, .5, 0], [.25] * 4], jnp.float32)
    n, _ = verify.verify_chain_with_uniforms(rules.Lossless(), jnp.zeros(2), jnp.array([0]), d, t)
    self.assertEqual(int(n), 0)  # f(0) = t(0)/d(0) = 0: u = 0 is not < 0

  def test_chain_resamples_from_the_rejected_positions_residual(self):
    # Unfloored COOL-SD over window 2: w_1 = 1.34, w_2 = 0.66, so G*_1 != G*_2.
    rule = rules.CoolSD(delta=1.0, window=2, floor_at_one=False)
    rng = np.random.default_rng(1)
    d = jnp.asarray(rng.dirichlet(np.full(6, 2.0), size=2), jnp.float32)
    t = jnp.asarray(rng.dirichlet(np.full(6, 2.0), size=3), jnp.float32)
    x = jnp.array([0, int(jnp.argmin(rule.accept_prob(d[1], t[1], 2)))])
    self.assertLess(float(rule.accept_prob_at(d[1], t[1], 2, x[1])), 0.999)
    g2 = rule.residual(d[1], t[1], 2)
    self.assertGreater(float(verify.tv_distance(g2, rule.residual(d[1], t[1], 1))), 0.05)
    grid = (jnp.arange(1024, dtype=jnp.float32) + 0.5) / 1024  # the next-token uniform, exact law
    run = jax.vmap(lambda u: verify.verify_chain_with_uniforms(
        rule, jnp.array([0.0, 0.9999, u]), x, d, t))
    n, token = run(grid)
    np.testing.assert_array_equal(n, 1)
    np.testing.assert_array_equal(token, categorical.sample(grid, jnp.broadcast_to(g2, (1024, 6))))


if __name__ == '__main__':
  absltest.main()
