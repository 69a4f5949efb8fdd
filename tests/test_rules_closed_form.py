"""Closed-form checks of the acceptance rules and their residuals.
"""

import math

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import resampling
from specdec_jax import rules
from specdec_jax import schedules
from specdec_jax import verify
from tests.rules_support import ATOL
from tests.rules_support import dirichlet_pair
from tests.rules_support import line_neighbors
from tests.rules_support import published_residual_law
from tests.rules_support import relaxed_rules


def _top_heavy_pair(vocab):
  """float64 (t, d) [V]: distinct target probabilities 1..V (normalised) on shuffled
  ids, and a draft d ~ t^1.5 that puts more mass than t on the top-ranked tokens."""
  t = np.random.default_rng(0).permutation(np.arange(1, vocab + 1)) / (vocab * (vocab + 1) / 2)
  return t, t ** 1.5 / np.sum(t ** 1.5)


def _grouped_definition(t, d, below, above):
  """GSD's f(x) [V] from its definition, every ranked neighbour kept (no probability
  or embedding filter): min(1, t(A)/d(A)) over the tokens ranked `below` under x to
  `above` over it (cut at the top), and min(1, t/d) when fewer than `below` are under x."""
  order = np.argsort(t, kind='stable')
  rank = np.argsort(order)
  f = np.empty(len(t))
  for x in range(len(t)):
    if rank[x] < below:
      f[x] = min(1, t[x] / d[x])
    else:
      group = order[rank[x] - below:rank[x] + above + 1]
      f[x] = min(1, t[group].sum() / d[group].sum())
  return f


class ClosedFormTest(parameterized.TestCase):

  def test_coolsd_schedule_matches_reference_values(self):
    # Reference note 1.5: L = 5, nu = 0.7, mean-normalised: mu = -1.654 and
    # delta = 1.1 gives (2.86, 1.42, 0.70, 0.35, 0.17).
    self.assertAlmostEqual(float(schedules.mean_normalised_mu(0.7, 5)), -1.654, places=3)
    np.testing.assert_allclose(schedules.coolsd_weights(5, delta=1.1, floor_at_one=False),
                               [2.855, 1.418, 0.704, 0.350, 0.174], atol=2e-3)
    # The default floors at 1; mu still normalises the unfloored mean to delta.
    np.testing.assert_allclose(schedules.coolsd_weights(5, delta=1.1),
                               [2.855, 1.418, 1.0, 1.0, 1.0], atol=2e-3)
    np.testing.assert_allclose(
        jnp.mean(schedules.coolsd_weights(7, delta=2.0, floor_at_one=False)), 2.0, rtol=1e-6)
    rule = rules.CoolSD(delta=2.0, nu=0.5, mu=0.1)
    self.assertAlmostEqual(float(rule.weight(3)), 1.0, places=6)  # 0.40 floored
    self.assertAlmostEqual(float(rule.replace(floor_at_one=False).weight(3)),
                           2.0 * math.exp(-1.5 - 0.1), places=5)
    self.assertAlmostEqual(float(rules.CoolSD(delta=9.0, nu=0.5, mu=0.1).weight(2)),
                           9.0 * math.exp(-1.0 - 0.1), places=5)

  def test_coolsd_schedule_with_a_steep_decay_stays_finite(self):
    """exp(-nu i) underflows float32 for nu above about 87; mu is a logsumexp, so the
    window mean of the unfloored weights is still delta: w_1 = L delta, the rest 1."""
    for nu in (90.0, 200.0):
      with self.subTest(nu=nu):
        np.testing.assert_allclose(rules.CoolSD(delta=2.0, nu=nu, window=4).weight(
            jnp.arange(1, 5)), [8.0, 1.0, 1.0, 1.0], rtol=1e-5)
    law = verify.output_law(rules.CoolSD(delta=2.0, nu=90.0, window=4),
                            jnp.array([.7, .1, .1, .1]), jnp.array([.1, .3, .3, .3]), position=3)
    np.testing.assert_allclose(law, [.1, .3, .3, .3], atol=1e-6)  # w_3 = 1: lossless

  def test_coolsd_schedule_functions_refuse_values_the_rule_refuses(self):
    for call, message in (
        (lambda: schedules.coolsd_weights(0, delta=2.0), 'window must be an int >= 1'),
        (lambda: schedules.coolsd_weights(2.5, delta=2.0), 'window must be an int >= 1'),
        (lambda: schedules.coolsd_weights(0, delta=2.0, mu=0.0), 'window must be an int >= 1'),
        (lambda: schedules.coolsd_weights(4, delta=-2.0), 'delta must be > 0'),
        (lambda: schedules.coolsd_weights(4, delta=float('nan')), 'delta must be > 0'),
        (lambda: schedules.coolsd_weights(4, delta=2.0, nu=-1.0), 'nu must be >= 0'),
        (lambda: schedules.mean_normalised_mu(-0.5, 4), 'nu must be >= 0'),
        (lambda: schedules.coolsd_weight(-5, delta=2.0, nu=0.7, mu=0.0), '1-based'),
        (lambda: schedules.coolsd_weight(0, delta=2.0, nu=0.7, mu=0.0), '1-based'),  # boundary
        (lambda: schedules.coolsd_weight(1, delta=2.0, nu=0.7, mu=float('inf')), 'mu must be')):
      with self.subTest(message), self.assertRaisesRegex(ValueError, message):
        call()
    traced = jax.jit(lambda nu, i: schedules.coolsd_weight(i, delta=2.0, nu=nu, mu=0.0))
    self.assertAlmostEqual(float(traced(0.5, 1)), 2.0 * math.exp(-0.5), places=5)

  @parameterized.parameters(True, False)
  def test_coolsd_accept_prob_closed_form(self, floor_at_one):
    draft, target = dirichlet_pair(1, 16)
    delta, nu, window = 1.5, 0.7, 4
    rule = rules.CoolSD(delta=delta, window=window, floor_at_one=floor_at_one)
    mu = math.log(np.mean([math.exp(-nu * j) for j in range(1, window + 1)]))
    for position in range(1, window + 1):
      w = delta * math.exp(-nu * position - mu)
      w = max(1.0, w) if floor_at_one else w
      expected = np.minimum(1, w * np.asarray(target, np.float64) / np.asarray(draft))
      np.testing.assert_allclose(rule.accept_prob(draft, target, position), expected, rtol=1e-5)

  def test_coolsd_default_accepts_identical_distributions_everywhere(self):
    """Identical target and draft: the default (floored) COOL-SD accepts every draft at
    every position, so a chain of k drafts always yields k + 1 tokens per forward."""
    k = 5
    rule = rules.CoolSD(delta=1.1, window=k)  # unfloored w_3..w_5 < 1
    _, target = dirichlet_pair(3, 16)
    for position in range(1, k + 1):
      np.testing.assert_array_equal(np.asarray(rule.accept_prob(target, target, position)), 1.0)
    probs = jnp.stack([target] * (k + 1))
    keys = jax.random.split(jax.random.key(0), 512)
    drafts = jax.random.categorical(jax.random.key(1), jnp.log(target), shape=(512, k))
    num_accepted, _ = jax.jit(jax.vmap(
        lambda key, x: verify.verify_chain(rule, key, x.astype(jnp.int32), probs[:k], probs)))(
            keys, drafts)
    np.testing.assert_array_equal(np.asarray(num_accepted), k)  # tokens per forward = k + 1

  @parameterized.product(seed=[0, 1, 2, 3], delta=[0.5, 1.1, 2.0], vocab=[8, 64])
  def test_coolsd_default_never_accepts_less_than_lossless(self, seed, delta, vocab):
    """Per position and per token f_CoolSD >= f_Lossless, hence its acceptance rate too."""
    draft, target = dirichlet_pair(seed, vocab)
    rule = rules.CoolSD(delta=delta, window=5)
    lossless = np.minimum(1.0, np.asarray(target, np.float64) / np.asarray(draft, np.float64))
    for position in range(1, 6):
      accept = np.asarray(rule.accept_prob(draft, target, position), np.float64)
      self.assertTrue(np.all(accept >= lossless - 1e-6), (position, accept - lossless))
      self.assertGreaterEqual(float(rule.acceptance_rate(draft, target, position)),
                              float(rules.Lossless().acceptance_rate(draft, target)) - 1e-6)

  @parameterized.parameters(('lantern',), ('lanternpp',))
  def test_lantern_neighbor_mass_brute_force(self, name):
    vocab = 16
    rule = relaxed_rules(vocab)[name]
    draft, target = dirichlet_pair(2, vocab)
    t = np.asarray(target, np.float64)
    table = np.asarray(rule.neighbors)
    expected = []
    for x in range(vocab):
      bound = rule.delta if name == 'lantern' else (rule.lam - 1) * t[x]
      mass = 0.0
      for m in range(1, rule.k + 1):
        c_m = t[table[x, :m]].sum()
        if c_m <= bound:
          mass = c_m
      if name == 'lantern':
        self.assertLessEqual(mass, rule.delta + 1e-12)  # the TV budget
      expected.append(min(1.0, (t[x] + mass) / float(draft[x])))
    np.testing.assert_allclose(rule.accept_prob(draft, target), expected, rtol=1e-5)
    for token in range(vocab):
      self.assertAlmostEqual(float(rule.accept_prob_at(draft, target, 1, token)),
                             expected[token], places=5)

  def test_lantern_published_residuals(self):
    vocab = 16
    neighbors = line_neighbors(vocab, 6)
    draft, target = dirichlet_pair(3, vocab)
    target = (target + 0.02) / (1 + 0.02 * vocab)  # every neighbour has some mass
    for mode in ('published_llamagen', 'published_lumina'):
      rule = rules.LanternPP(neighbors=neighbors, k=4, lam=50.0, residual_mode=mode)
      rejected = 5
      zero = np.asarray(neighbors[rejected, :5])
      expected = published_residual_law(draft, target, zero, mode)
      np.testing.assert_allclose(rule.residual(draft, target, 1, rejected), expected, atol=1e-6)
      self.assertTrue(rule.residual_depends_on_token)
      law = verify.output_law(rule, draft, target)
      np.testing.assert_allclose(jnp.sum(law), 1.0, atol=1e-5)
      # LANTERN's published residual is biased relative to G*.
      self.assertGreater(float(verify.tv_distance(law, target)),
                         float(verify.excess_acceptance(rule, draft, target)) - 1e-6)

  def test_lantern_published_residuals_when_only_the_nearest_neighbour_fits(self):
    """m*(x) > 0 means the nearest neighbour fits the bound, not all k: with a uniform
    target and lam=2.5 (bound 1.5 t(x)), c_1 = t(x) fits and c_2 = 2 t(x) does not, so
    m* = 1 < k and the published residuals still zero x's k + 1 nearest neighbours.
    Rejected x = 1 on the line: its neighbours 0, 2, 3, 4 include token id 0, where
    0 < d < t, so zeroing it changes both residuals."""
    vocab = 8
    neighbors = line_neighbors(vocab, 4)
    target = jnp.full((vocab,), 1 / vocab, jnp.float32)
    draft = jnp.array([.05, .3, .05, .2, .05, .15, .1, .1], jnp.float32)
    rejected = 1
    zero = np.asarray(neighbors[rejected, :4])
    self.assertEqual(sorted(zero.tolist()), [0, 2, 3, 4])
    for mode in ('published_llamagen', 'published_lumina'):
      rule = rules.LanternPP(neighbors=neighbors, k=3, lam=2.5, residual_mode=mode)
      expected = published_residual_law(draft, target, zero, mode)
      self.assertGreater(np.max(np.abs(expected - resampling.standard_residual(draft, target))),
                         0.01)  # the zeroing matters in this example
      without_0 = published_residual_law(draft, target, zero[zero != 0], mode)
      self.assertGreater(np.max(np.abs(expected - without_0)), 0.01)  # token 0's too
      np.testing.assert_allclose(rule.residual(draft, target, 1, rejected), expected, atol=1e-6)

  def test_lantern_published_residual_without_mass_is_the_target(self):
    """The target's support inside the rejected token and its k + 1 neighbours:
    after the Lumina path zeroes them, [t' - d]_+ is empty; the residual is then
    the target itself (a law: the output law sums to 1, and no token outside the
    target's support is drawn), never the zeroed t'. Published modes need k + 1
    neighbour columns."""
    vocab = 8
    neighbors = line_neighbors(vocab, 4)
    target = jnp.array([0.1, 0.3, 0.3, 0.2, 0.1, 0.0, 0.0, 0.0])
    draft = jnp.array([0.6, 0.1, 0.1, 0.1, 0.1, 0.0, 0.0, 0.0])
    rule = rules.LanternPP(neighbors=neighbors, k=3, lam=50.0, residual_mode='published_lumina')
    rejected = 0
    self.assertTrue(set(np.asarray(neighbors[rejected, :4]).tolist()) >= {1, 2, 3, 4})
    np.testing.assert_allclose(rule.residual(draft, target, 1, rejected), target, atol=1e-7)
    law = verify.output_law(rule, draft, target)
    np.testing.assert_allclose(jnp.sum(law), 1.0, atol=1e-6)
    self.assertEqual(float(jnp.sum(jnp.where(target == 0, law, 0.0))), 0.0)
    # LANTERN (delta) relaxes a draft the target excludes: t' is all zero there.
    excluded = jnp.array([0.0, 0.3, 0.3, 0.2, 0.2, 0.0, 0.0, 0.0])
    lantern = rules.Lantern(neighbors=neighbors, k=3, delta=0.35,
                            residual_mode='published_lumina')
    one_hot = jnp.zeros(vocab).at[0].set(1.0)
    np.testing.assert_allclose(lantern.residual(one_hot, excluded, 1, 0), excluded, atol=1e-7)
    with self.assertRaisesRegex(ValueError, r'k \+ 1 = 4 nearest neighbours.*3 columns'):
      rules.LanternPP(neighbors=neighbors[:, :3], k=3, residual_mode='published_llamagen')
    rules.LanternPP(neighbors=neighbors[:, :3], k=3)  # the optimal residual zeroes none
    self.assertEqual([rules.neighbor_columns(3, mode) for mode in
                      ('optimal', 'published_llamagen', 'published_lumina')], [3, 4, 4])

  def test_content_aware_closed_form_and_filter(self):
    vocab = 16
    draft, target = dirichlet_pair(6, vocab)
    t, d = np.asarray(target, np.float64), np.asarray(draft, np.float64)
    tv = 0.5 * np.abs(t - d).sum()
    nz = t[t > 0]
    h_nats = -(nz * np.log(nz)).sum()
    for transform, h in (('identity', h_nats), ('normalized', h_nats / np.log(len(nz))),
                         ('one_minus_normalized', 1 - h_nats / np.log(len(nz)))):
      for sign in (1, -1):
        rule = rules.ContentAware(lam=0.2, tv_threshold=1.0, transform=transform, sign=sign)
        expected = np.clip(t / d + sign * 0.2 * h, 0, 1)
        np.testing.assert_allclose(rule.accept_prob(draft, target), expected, rtol=1e-5,
                                   atol=1e-6)
    # Above the TV threshold the rule is exactly lossless.
    strict = rules.ContentAware(lam=0.2, tv_threshold=tv * 0.99)
    np.testing.assert_allclose(strict.accept_prob(draft, target),
                               rules.Lossless().accept_prob(draft, target), atol=1e-7)
    np.testing.assert_allclose(verify.output_law(strict, draft, target), target, atol=ATOL)

  @parameterized.product(seed=[6, 7], lam=[0.0, 0.05, 0.3])
  def test_content_aware_default_is_the_paper_formula(self, seed, lam):
    """CSD's acceptance min(1, t/d + lam H(t)), H the target entropy in nats, residual
    Norm([t - d]_+), written out here from the formula."""
    vocab = 16
    draft, target = dirichlet_pair(seed, vocab)
    t, d = np.asarray(target, np.float64), np.asarray(draft, np.float64)
    self.assertTrue(np.all(t > 0))
    entropy_nats = -np.sum(t * np.log(t))
    rule = rules.ContentAware(lam=lam, tv_threshold=1.0)
    np.testing.assert_allclose(rule.accept_prob(draft, target),
                               np.minimum(1.0, t / d + lam * entropy_nats), rtol=1e-5, atol=1e-6)
    residual = np.maximum(t - d, 0.0)
    np.testing.assert_allclose(rule.residual(draft, target), residual / residual.sum(),
                               atol=1e-6)

  def test_content_aware_verifies_point_masses_losslessly(self):
    """A point-mass draft (a Jacobi fresh draft) that the TV filter passes is
    accepted with t(x), not t(x) + lam H(t), unless relax_point_masses; a draft
    with a law is relaxed as before. Negative control: with relax_point_masses
    the point mass's acceptance and output law move off the lossless ones."""
    vocab = 8
    target = jnp.asarray([0.7, 0.1, 0.05, 0.05, 0.04, 0.03, 0.02, 0.01], jnp.float32)
    point = jax.nn.one_hot(0, vocab)  # TV(point, target) = 0.3 < 0.5: the filter passes
    t = np.asarray(target, np.float64)
    entropy_nats = -np.sum(t * np.log(t))
    rule = rules.ContentAware(lam=0.2)
    self.assertAlmostEqual(float(rule.accept_prob(point, target)[0]), 0.7, places=6)
    np.testing.assert_allclose(verify.output_law(rule, point, target), target, atol=ATOL)
    literal = rules.ContentAware(lam=0.2, relax_point_masses=True)
    self.assertAlmostEqual(float(literal.accept_prob(point, target)[0]),
                           min(1.0, 0.7 + 0.2 * entropy_nats), places=5)
    self.assertGreater(float(verify.tv_distance(verify.output_law(literal, point, target),
                                                target)), 0.05)
    draft, target = dirichlet_pair(6, 16)  # a draft with a law: relaxed either way
    for relax in (False, True):
      np.testing.assert_allclose(
          rules.ContentAware(lam=0.2, tv_threshold=1.0, relax_point_masses=relax).accept_prob(
              draft, target),
          rules.ContentAware(lam=0.2, tv_threshold=1.0).accept_prob(draft, target), atol=1e-7)
    self.assertGreater(float(verify.excess_acceptance(
        rules.ContentAware(lam=0.2, tv_threshold=1.0), draft, target)), 0.0)

  def test_lossless_on_point_masses_of_rules_that_accept_less_than_lossless(self):
    """Below lossless acceptance the wrapped rule's residual differs from the lossless
    one at the point mass's own token: the wrapper must use Norm([t - d]_+) there."""
    target, point = jnp.asarray([0.4, 0.6], jnp.float32), jax.nn.one_hot(0, 2)
    for rule in (rules.UniformRelaxed(omega=0.5), rules.CoolSD(delta=0.5, floor_at_one=False)):
      guarded = rules.jacobi_rule(rule.for_window(3), relax_fresh_drafts=False)
      np.testing.assert_allclose(guarded.residual(point, target, 1), [0.0, 1.0], atol=1e-7)
      np.testing.assert_allclose(verify.output_law(guarded, point, target, 1), target, atol=ATOL)
      # Its own residual, for its own acceptance (below 0.4), keeps mass on token 0.
      self.assertGreater(float(rule.for_window(3).residual(point, target, 1)[0]), 0.05)

  def test_content_aware_normalises_the_entropy_by_the_support(self):
    """'normalized' divides H by log K_eff, K_eff the tokens with nonzero mass (a
    top-k target has zeros); Dirichlet targets, whose K_eff is V, could not tell."""
    target = jnp.asarray([0.5, 0.5, 0.0, 0.0], jnp.float32)
    draft = jnp.asarray([0.4, 0.6, 0.0, 0.0], jnp.float32)
    for transform, expected in (('normalized', 0.2), ('one_minus_normalized', 0.0)):
      rule = rules.ContentAware(lam=0.2, transform=transform)
      self.assertAlmostEqual(float(rule.relaxation(draft, target)), expected, places=6)
    accept = rules.ContentAware(lam=0.2, transform='normalized').accept_prob(draft, target)
    np.testing.assert_allclose(accept[:2], [1.0, 1.0], atol=1e-7)  # 0.5/0.6 + 0.2 >= 1

  @parameterized.parameters('uniform', 'coolsd', 'lantern', 'lanternpp')
  def test_lossless_on_point_masses(self, name):
    """The Jacobi modes' wrapper (`rules.jacobi_rule`): a point-mass draft (a fresh
    Jacobi draft) is accepted with t(x) and the output law is the target's; a
    draft with a law gets the wrapped rule's acceptance and residual exactly.
    Negative control: the chain rule itself on the point mass accepts more than
    t(x) and moves the output law (TV > 0.05)."""
    vocab = 8
    rule = relaxed_rules(vocab)[name]
    guarded = rules.jacobi_rule(rule, relax_fresh_drafts=False)
    self.assertIsInstance(guarded, rules.LosslessOnPointMasses)
    self.assertIs(rules.jacobi_rule(rule, relax_fresh_drafts=True), rule)
    target = jnp.asarray([0.3, 0.25, 0.15, 0.1, 0.08, 0.06, 0.04, 0.02], jnp.float32)
    for x in (0, 3):
      point = jax.nn.one_hot(x, vocab)
      self.assertAlmostEqual(float(guarded.accept_prob(point, target, 1)[x]), float(target[x]),
                             places=6)
      self.assertAlmostEqual(float(guarded.accept_prob_at(point, target, 1, x)),
                             float(target[x]), places=6)
      np.testing.assert_allclose(verify.output_law(guarded, point, target, 1), target,
                                 atol=ATOL)
    point = jax.nn.one_hot(3, vocab)  # every one of the four rules relaxes this token
    self.assertGreater(float(rule.accept_prob(point, target, 1)[3]), 0.1 + 0.1)
    self.assertGreater(float(verify.tv_distance(verify.output_law(rule, point, target, 1),
                                                target)), 0.05)
    draft, target = dirichlet_pair(3, vocab)
    for position in (1, 3):
      np.testing.assert_allclose(guarded.accept_prob(draft, target, position),
                                 rule.accept_prob(draft, target, position), atol=1e-7)
      np.testing.assert_allclose(guarded.residual(draft, target, position, 2),
                                 rule.residual(draft, target, position, 2), atol=1e-7)
      np.testing.assert_allclose(verify.output_law(guarded, draft, target, position),
                                 verify.output_law(rule, draft, target, position), atol=1e-6)

  def test_jacobi_rule_keeps_rules_that_decide_point_masses(self):
    """Lossless (nothing to relax), CSD (its own relax_point_masses) and GSD (its
    group test is defined on SJD's drafts, fresh ones included) are not wrapped."""
    for rule in (relaxed_rules(8)['csd'], relaxed_rules(8)['gsd'], rules.Lossless()):
      self.assertIs(rules.jacobi_rule(rule, relax_fresh_drafts=False), rule)

  def test_content_aware_keeps_target_support(self):
    draft, target = dirichlet_pair(8, 16)
    target = jnp.where(jnp.arange(16) < 4, target + 0.1, 0.0)
    target = target / target.sum()
    rule = rules.ContentAware(lam=1.0, tv_threshold=1.0)
    self.assertTrue(np.all(np.asarray(verify.output_law(rule, draft, target))[4:] == 0))
    literal = rules.ContentAware(lam=1.0, tv_threshold=1.0, keep_target_support=False)
    self.assertGreater(float(jnp.sum(verify.output_law(literal, draft, target)[4:])), 0)

  def test_grouped_brute_force(self):
    vocab = 24
    draft, target = dirichlet_pair(12, vocab, concentration=1.0)
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(vocab, 2))
    rule = rules.Grouped(below=3, above=2, prob_threshold=0.05, dist_threshold=2.0,
                         embeddings=jnp.asarray(embeddings, jnp.float32))
    t, d = np.asarray(target, np.float64), np.asarray(draft, np.float64)
    order = np.argsort(np.asarray(target), kind='stable')
    rank = np.argsort(order)
    expected = []
    for x in range(vocab):
      if rank[x] < 3:
        expected.append(min(1, t[x] / d[x]))
        continue
      group = [order[r] for r in range(rank[x] - 3, min(rank[x] + 3, vocab))]
      group = [y for y in group if abs(t[y] - t[x]) < 0.05
               and ((embeddings[y] - embeddings[x]) ** 2).sum() < 2.0]
      self.assertIn(x, group)
      expected.append(min(1, t[group].sum() / d[group].sum()))
    np.testing.assert_allclose(rule.accept_prob(draft, target), expected, rtol=1e-5)

  @parameterized.parameters((0,), (1,))
  def test_grouped_single_token_path_matches_full_vocab_path_with_ties(self, seed):
    """accept_prob_at (no sort) and accept_prob (argsort) agree, including the
    many zero-probability ties outside a top-k support."""
    vocab = 40
    draft, target = dirichlet_pair(seed, vocab, concentration=1.0)
    target = jnp.where(jnp.arange(vocab) % 3 == 0, 0.0, target)
    target = (target / target.sum()).at[5].set(target[7] / target.sum())  # a nonzero tie
    target = target / target.sum()
    rule = rules.Grouped(below=4, above=3, prob_threshold=0.2)
    full = rule.accept_prob(draft, target)
    single = jax.vmap(lambda x: rule.accept_prob_at(draft, target, 1, x))(jnp.arange(vocab))
    np.testing.assert_allclose(single, full, rtol=1e-6)
    for keep in (True, False):  # both paths, with and without the support guard
      literal = rules.Grouped(below=4, above=3, prob_threshold=0.2, keep_target_support=keep)
      single = jax.vmap(lambda x: literal.accept_prob_at(draft, target, 1, x))(jnp.arange(vocab))
      np.testing.assert_allclose(single, literal.accept_prob(draft, target), rtol=1e-6)

  def test_grouped_paths_match_the_definition_at_the_top_ranks(self):
    """accept_prob (argsort) and accept_prob_at (lax.top_k) against the definition on
    every token, with every ranked neighbour kept (prob_threshold=1.0, no embeddings)
    and above=3: the top-ranked tokens have fewer than `above` tokens over them, so
    their groups stop at the top (no rank past V - 1 and no top_k padding entry is a
    member, and the members over x stay paired with their validity). The draft
    over-weights the top (d ~ t^1.5), so the top groups have f < 1 and a wrong member
    changes f."""
    t, d = _top_heavy_pair(10)
    target, draft = jnp.asarray(t, jnp.float32), jnp.asarray(d, jnp.float32)
    expected = _grouped_definition(t, d, below=2, above=3)
    top = np.argsort(t)[-4:]
    self.assertTrue(np.all(expected[top] < 0.95))  # the example exercises the top groups
    rule = rules.Grouped(below=2, above=3, prob_threshold=1.0)
    np.testing.assert_allclose(rule.accept_prob(draft, target), expected, rtol=1e-5)
    single = jax.vmap(lambda x: rule.accept_prob_at(draft, target, 1, x))(jnp.arange(10))
    np.testing.assert_allclose(single, expected, rtol=1e-5)

  def test_grouped_residual_is_the_plain_one_unless_optimal(self):
    """As in the released GSD code, Grouped() resamples from Norm([t - d]_+);
    residual_mode='optimal' selects G* = Norm([t - d f]_+) with its own f (from the
    definition). The example relaxes where t > d f with f < 1, so the two differ."""
    t, d = _top_heavy_pair(10)
    target, draft = jnp.asarray(t, jnp.float32), jnp.asarray(d, jnp.float32)
    f = _grouped_definition(t, d, below=2, above=3)
    plain = np.maximum(t - d, 0) / np.maximum(t - d, 0).sum()
    optimal = np.maximum(t - d * f, 0) / np.maximum(t - d * f, 0).sum()
    self.assertGreater(np.max(np.abs(plain - optimal)), 0.05)
    self.assertEqual(rules.Grouped().residual_mode, 'standard')
    for mode, expected in ((None, plain), ('standard', plain), ('optimal', optimal)):
      kwargs = {} if mode is None else dict(residual_mode=mode)
      rule = rules.Grouped(below=2, above=3, prob_threshold=1.0, **kwargs)
      for rejected in (None, 3):
        np.testing.assert_allclose(rule.residual(draft, target, 1, rejected), expected,
                                   atol=1e-6, err_msg=f'residual_mode={mode}')

  def test_grouped_keeps_the_target_support(self):
    """A token the target excludes (top-k) is never accepted, though its group holds
    target mass. Negative control: the group test alone accepts some of them."""
    vocab = 40
    draft, target = dirichlet_pair(3, vocab, concentration=1.0)
    target = jnp.where(jnp.arange(vocab) % 3 == 0, 0.0, target)
    target = target / target.sum()
    outside = np.asarray(target) == 0
    guarded = np.asarray(rules.Grouped(below=4, above=3, prob_threshold=0.2).accept_prob(
        draft, target))
    literal = np.asarray(rules.Grouped(below=4, above=3, prob_threshold=0.2,
                                       keep_target_support=False).accept_prob(draft, target))
    np.testing.assert_array_equal(guarded[outside], 0.0)
    np.testing.assert_array_equal(guarded[~outside], literal[~outside])
    self.assertGreater(np.max(literal[outside]), 0.01)
    with self.assertRaisesRegex(ValueError, 'keep_target_support must be True or False'):
      rules.Grouped(keep_target_support='no')


class BoundaryTest(absltest.TestCase):
  """Strict and non-strict comparisons at exact ties (dyadic inputs, exact in
  float32), and the rarely reached branches: each test fails on a one-character
  change of the rule it names (checked by mutating the rule)."""

  def test_csd_tv_filter_is_strict(self):
    # TV(d, t) = 0.25 exactly: tv_threshold=0.25 must NOT relax (TV < threshold).
    d, t = jnp.array([.5, .25, .25, 0], jnp.float32), jnp.array([.25] * 4, jnp.float32)
    rule = rules.ContentAware(lam=0.1, tv_threshold=0.25)
    np.testing.assert_allclose(rule.accept_prob(d, t), [.5, 1, 1, 1], atol=1e-7)
    relaxed = rules.ContentAware(lam=0.1, tv_threshold=0.2500001)  # just above: relaxes
    self.assertAlmostEqual(float(relaxed.accept_prob(d, t)[0]), .5 + .1 * np.log(4), places=6)

  def test_lantern_neighbour_mass_equal_to_the_bound_is_pooled(self):
    # LANTERN++ lam=2: bound (lam-1) t(x) = 0.25 = t(nearest): c_1 <= bound, so m* = 1.
    t, d = jnp.full((4,), .25, jnp.float32), jnp.array([.5, .25, .125, .125], jnp.float32)
    nb = line_neighbors(4, 3)
    pp = rules.LanternPP(neighbors=nb, k=1, lam=2.0)
    np.testing.assert_allclose(pp.accept_prob(d, t), [1, 1, 1, 1], atol=1e-7)
    la = rules.Lantern(neighbors=nb, k=1, delta=0.25)  # same tie for LANTERN's delta
    np.testing.assert_allclose(la.accept_prob(d, t), [1, 1, 1, 1], atol=1e-7)
    self.assertAlmostEqual(float(pp.accept_prob_at(d, t, 1, 0)), 1.0, places=7)

  def test_grouped_probability_filter_is_strict(self):
    # |t(y) - t(x)| = 0.25 exactly must leave y out of x's group (< prob_threshold).
    t, d = jnp.array([.125, .125, .25, .5], jnp.float32), jnp.array([.0625, .0625, .375, .5], jnp.float32)
    rule = rules.Grouped(below=1, above=1, prob_threshold=0.25)
    # x=2 (rank 2): below = token 1 (|.125-.25| < .25 kept), above = token 3 (|.5-.25| = .25
    # dropped): f = min(1, (.125+.25)/(.0625+.375)) = 6/7.
    self.assertAlmostEqual(float(rule.accept_prob(d, t)[2]), 6 / 7, places=6)
    self.assertAlmostEqual(float(rule.accept_prob_at(d, t, 1, 2)), 6 / 7, places=6)

  def test_published_residual_zeroes_nothing_when_no_neighbour_fits(self):
    # Lantern delta=0.01: every token's nearest neighbour has mass > 0.01, so m* = 0
    # for every token and the published residuals are the plain Norm([t - d]_+).
    rng = np.random.default_rng(0)
    d = jnp.asarray(rng.dirichlet(np.ones(8)), jnp.float32)
    t = jnp.asarray(0.5 * rng.dirichlet(np.ones(8)) + 0.5 / 8, jnp.float32)  # every t(y) >= 1/16
    for mode in ('published_llamagen', 'published_lumina'):
      rule = rules.Lantern(neighbors=line_neighbors(8, 3), k=2, delta=0.01, residual_mode=mode)
      np.testing.assert_allclose(rule.accept_prob(d, t), np.minimum(1, t / d), rtol=1e-6)
      for x in range(8):
        np.testing.assert_allclose(rule.residual(d, t, 1, x),
                                   resampling.standard_residual(d, t), atol=1e-7)

  def test_grouped_single_token_path_at_rank_equal_to_below(self):
    # Dense target (no ties, no zeros): the token ranked exactly `below` must use the group.
    rng = np.random.default_rng(3)
    d, t = (jnp.asarray(rng.dirichlet(np.ones(10)), jnp.float32) for _ in range(2))
    rule = rules.Grouped(below=2, above=1, prob_threshold=1.0)
    full = np.asarray(rule.accept_prob(d, t))
    single = [float(rule.accept_prob_at(d, t, 1, x)) for x in range(10)]
    np.testing.assert_allclose(single, full, rtol=1e-6)


if __name__ == '__main__':
  absltest.main()
