"""Exact (closed-form) checks of every acceptance rule and its residual."""

import itertools
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
from specdec_jax.models import neighbors as neighbors_lib

ATOL = 2e-6


def dirichlet_pair(seed, vocab, concentration=0.3, draft_support=None):
  """Random (draft, target) distributions, sharp and different from each other."""
  rng = np.random.default_rng(seed)
  draft = rng.dirichlet(np.full(vocab, concentration))
  target = rng.dirichlet(np.full(vocab, concentration))
  if draft_support is not None:  # zero mass outside a top-k support
    keep = np.argsort(-draft)[:draft_support]
    draft = np.where(np.isin(np.arange(vocab), keep), draft, 0.0)
    draft /= draft.sum()
  return jnp.asarray(draft, jnp.float32), jnp.asarray(target, jnp.float32)


def line_neighbors(vocab, columns):
  """Neighbours on a 1-D latent line: token x's nearest are x-1, x+1, x-2, ..."""
  distance = np.abs(np.arange(vocab)[:, None] - np.arange(vocab)[None, :]) * 2.0
  distance = distance + (np.arange(vocab)[None, :] > np.arange(vocab)[:, None]) * 0.1
  np.fill_diagonal(distance, np.inf)
  return jnp.asarray(np.argsort(distance, axis=1, kind='stable')[:, :columns], jnp.int32)


def relaxed_rules(vocab):
  neighbors = line_neighbors(vocab, min(vocab - 1, 6))
  rng = np.random.default_rng(7)
  return {
      'uniform': rules.UniformRelaxed(omega=2.5),
      'coolsd': rules.CoolSD(delta=2.0, window=5),
      'lantern': rules.Lantern(neighbors=neighbors, k=4, delta=0.2),
      'lanternpp': rules.LanternPP(neighbors=neighbors, k=4, lam=3.0),
      'csd': rules.ContentAware(lam=0.3, tv_threshold=1.0),
      'gsd': rules.Grouped(below=2, above=2, prob_threshold=0.3, residual_mode='optimal',
                           embeddings=jnp.asarray(rng.normal(size=(vocab, 3)), jnp.float32),
                           dist_threshold=4.0),
  }


class LosslessExactTest(parameterized.TestCase):

  @parameterized.product(vocab=[8, 16, 32, 16384], seed=[0, 1, 2])
  def test_lossless_output_law_is_target(self, vocab, seed):
    draft, target = dirichlet_pair(seed, vocab)
    law = verify.output_law(rules.Lossless(), draft, target)
    np.testing.assert_allclose(law, target, atol=ATOL)

  @parameterized.product(vocab=[8, 16, 32, 16384], position=[3, 4, 5])
  def test_coolsd_positions_with_weight_below_one_are_lossless(self, vocab, position):
    # Unfloored: w_3..w_5 = 0.70, 0.35, 0.17.
    rule = rules.CoolSD(delta=1.1, window=5, floor_at_one=False)
    self.assertLess(float(rule.weight(position)), 1.0)
    draft, target = dirichlet_pair(position, vocab)
    np.testing.assert_allclose(verify.output_law(rule, draft, target, position), target,
                               atol=ATOL)

  @parameterized.parameters(8, 32)
  def test_uniform_below_one_is_lossless_and_accepts_less(self, vocab):
    draft, target = dirichlet_pair(5, vocab)
    rule = rules.UniformRelaxed(omega=0.5)
    np.testing.assert_allclose(verify.output_law(rule, draft, target), target, atol=ATOL)
    self.assertLess(float(rule.acceptance_rate(draft, target, 1)),
                    float(rules.Lossless().acceptance_rate(draft, target, 1)))

  def test_identical_distributions_are_finite_and_exact(self):
    _, target = dirichlet_pair(3, 16)
    for rule in [rules.Lossless(), *relaxed_rules(16).values()]:
      law = verify.output_law(rule, target, target)
      self.assertTrue(np.all(np.isfinite(law)), type(rule).__name__)
      np.testing.assert_allclose(rule.acceptance_rate(target, target, 1), 1.0, atol=ATOL)
      residual = rule.residual(target, target, 1, 0)
      np.testing.assert_allclose(jnp.sum(residual), 1.0, atol=ATOL)

  @parameterized.parameters(8, 16384)
  def test_one_hot_drafts_sjd(self, vocab):
    """SJD's random init drafts with a one-hot draft distribution: f = t(x)."""
    _, target = dirichlet_pair(11, vocab)
    token = 3
    draft = jax.nn.one_hot(token, vocab)
    accept = rules.Lossless().accept_prob(draft, target)
    self.assertAlmostEqual(float(accept[token]), float(target[token]), places=6)
    np.testing.assert_allclose(verify.output_law(rules.Lossless(), draft, target), target,
                               atol=ATOL)
    residual = rules.Lossless().residual(draft, target)
    self.assertEqual(float(residual[token]), 0.0)

  def test_zero_mass_target_rows(self):
    """Target mass outside its top-k support stays exactly zero in the output."""
    draft, target = dirichlet_pair(4, 32)
    target = jnp.where(jnp.arange(32) < 8, target, 0.0)
    target = target / target.sum()
    law = verify.output_law(rules.Lossless(), draft, target)
    self.assertTrue(np.all(np.asarray(law)[8:] == 0))


class RelaxedExactTest(parameterized.TestCase):

  @parameterized.product(vocab=[8, 16, 32], seed=[0, 1, 2],
                         name=['uniform', 'coolsd', 'lantern', 'lanternpp', 'csd', 'gsd'])
  def test_optimal_residual_tv_equals_excess_mass(self, vocab, seed, name):
    rule = relaxed_rules(vocab)[name]
    draft, target = dirichlet_pair(seed, vocab)
    for position in (1, 2, 5):
      law = verify.output_law(rule, draft, target, position)
      np.testing.assert_allclose(jnp.sum(law), 1.0, atol=ATOL)
      tv = verify.tv_distance(law, target)
      excess = verify.excess_acceptance(rule, draft, target, position)
      np.testing.assert_allclose(tv, excess, atol=5 * ATOL)

  @parameterized.product(vocab=[8, 32], seed=[0, 1, 2, 3],
                         name=['uniform', 'coolsd', 'lantern', 'csd', 'gsd'])
  def test_standard_residual_never_closer_than_optimal(self, vocab, seed, name):
    rule = relaxed_rules(vocab)[name]
    draft, target = dirichlet_pair(seed, vocab)
    accept = rule.accept_prob(draft, target, 1)
    accepted = draft * accept
    standard = accepted + (1 - accepted.sum()) * resampling.standard_residual(draft, target)
    optimal = verify.output_law(rule, draft, target, 1)
    self.assertGreaterEqual(float(verify.tv_distance(standard, target)) + 1e-6,
                            float(verify.tv_distance(optimal, target)))

  def test_standard_residual_strictly_worse_when_weight_below_one(self):
    """COOL-SD positions with w < 1: G* is exact, the plain residual is biased."""
    draft, target = dirichlet_pair(0, 16)
    rule = rules.CoolSD(delta=1.1, window=5, floor_at_one=False)
    accept = rule.accept_prob(draft, target, 5)
    accepted = draft * accept
    standard = accepted + (1 - accepted.sum()) * resampling.standard_residual(draft, target)
    self.assertGreater(float(verify.tv_distance(standard, target)), 1e-3)

  def test_acceptance_rate_monotone_in_relaxation(self):
    draft, target = dirichlet_pair(9, 32)
    rates = [float(rules.UniformRelaxed(omega=w).acceptance_rate(draft, target, 1))
             for w in (0.5, 1.0, 1.5, 3.0, 10.0)]
    self.assertEqual(rates, sorted(rates))
    # alpha = 1 - TV + e for omega >= 1 (e: the excess mass d f - t, README "Methods").
    for omega in (1.0, 1.5, 3.0):
      rule = rules.UniformRelaxed(omega=omega)
      np.testing.assert_allclose(
          rule.acceptance_rate(draft, target, 1),
          1 - verify.tv_distance(draft, target) + verify.excess_acceptance(rule, draft, target),
          atol=ATOL)


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
      mass, m_star = 0.0, 0
      for m in range(1, rule.k + 1):
        c_m = t[table[x, :m]].sum()
        if c_m <= bound:
          mass, m_star = c_m, m
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
      d, t = np.asarray(draft, np.float64), np.asarray(target, np.float64)
      if mode == 'published_llamagen':
        d = d.copy(); d[zero] = 0
      else:
        t = t.copy(); t[zero] = 0
      expected = np.maximum(t - d, 0) / np.maximum(t - d, 0).sum()
      np.testing.assert_allclose(rule.residual(draft, target, 1, rejected), expected, atol=1e-6)
      self.assertTrue(rule.residual_depends_on_token)
      law = verify.output_law(rule, draft, target)
      np.testing.assert_allclose(jnp.sum(law), 1.0, atol=1e-5)
      # LANTERN's published residual is biased relative to G*.
      self.assertGreater(float(verify.tv_distance(law, target)),
                         float(verify.excess_acceptance(rule, draft, target)) - 1e-6)

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


def offset_vocabulary_table(k=4):
  """A Lumina-like vocabulary of 20 ids: 0..3 text, 4..15 image tokens (12 codes,
  token = code + 4), 16..19 layout ids; the codebook and its neighbour table."""
  codebook = np.random.default_rng(5).normal(size=(12, 3))
  return codebook, neighbors_lib.neighbor_table(codebook, k, token_offset=4, vocab_size=20)


class NeighborRowsTest(parameterized.TestCase):
  """LANTERN tables have one row per token id; offset vocabularies (Lumina-mGPT) pool
  each token's own neighbours and leave non-image tokens lossless."""

  @parameterized.parameters('lantern', 'lanternpp')
  def test_offset_vocabulary_pools_the_tokens_own_neighbours(self, name):
    codebook, table = offset_vocabulary_table()
    draft, target = dirichlet_pair(4, 20, concentration=1.0)
    t, d = np.asarray(target, np.float64), np.asarray(draft, np.float64)
    k = 3
    if name == 'lantern':
      rule = rules.Lantern(neighbors=jnp.asarray(table), k=k, delta=0.15)
    else:
      rule = rules.LanternPP(neighbors=jnp.asarray(table), k=k, lam=2.5)
    expected = []
    for x in range(20):
      mass = 0.0
      if 4 <= x < 16:  # an image token: code x - 4, neighbours by brute-force distance
        distance = np.linalg.norm(codebook - codebook[x - 4], axis=1)
        distance[x - 4] = np.inf
        near = np.argsort(distance, kind='stable')[:k] + 4
        bound = 0.15 if name == 'lantern' else 1.5 * t[x]
        for m in range(1, k + 1):
          if t[near[:m]].sum() <= bound:
            mass = t[near[:m]].sum()
      expected.append(min(1.0, (t[x] + mass) / d[x]))
    expected = np.array(expected)
    self.assertTrue(np.any(expected[4:16] > np.minimum(1, t / d)[4:16] + 1e-3))  # it relaxes
    np.testing.assert_allclose(rule.accept_prob(draft, target), expected, rtol=1e-5)
    for token in range(20):
      self.assertAlmostEqual(float(rule.accept_prob_at(draft, target, 1, token)),
                             expected[token], places=5)

  def test_published_residual_leaves_tokens_without_neighbours_alone(self):
    """A rejected layout/text token zeroes nothing (no wrap-around of the -1 padding)."""
    _, table = offset_vocabulary_table()
    draft, target = dirichlet_pair(8, 20, concentration=1.0)
    for mode in ('published_llamagen', 'published_lumina'):
      rule = rules.LanternPP(neighbors=jnp.asarray(table), k=3, lam=50.0, residual_mode=mode)
      for rejected in (0, 3, 16, 19):
        np.testing.assert_allclose(rule.residual(draft, target, 1, rejected),
                                   resampling.standard_residual(draft, target), atol=1e-7)
      # An image token's k + 1 = 4 neighbours are zeroed (ids in 4..15 only).
      zero = np.asarray(table[9, :4])
      d, t = np.asarray(draft, np.float64), np.asarray(target, np.float64)
      if mode == 'published_llamagen':
        d = d.copy(); d[zero] = 0
      else:
        t = t.copy(); t[zero] = 0
      expected = np.maximum(t - d, 0) / np.maximum(t - d, 0).sum()
      np.testing.assert_allclose(rule.residual(draft, target, 1, 9), expected, atol=1e-6)

  @parameterized.parameters('lantern', 'lanternpp')
  def test_table_rows_must_match_the_vocabulary(self, name):
    codebook, _ = offset_vocabulary_table()
    code_rows = neighbors_lib.code_neighbor_table(codebook, 4)  # 12 rows, indexed by code
    make = rules.Lantern if name == 'lantern' else rules.LanternPP
    rule = make(neighbors=jnp.asarray(code_rows), k=2)
    draft, target = dirichlet_pair(0, 20)
    for call in (lambda: rule.accept_prob(draft, target),
                 lambda: rule.accept_prob_at(draft, target, 1, 5),
                 lambda: jax.jit(rule.accept_prob)(draft, target)):
      with self.assertRaisesRegex(ValueError, r'12 rows but the vocabulary has V=20'):
        call()


class ValidationTest(parameterized.TestCase):

  @parameterized.parameters(
      (lambda: rules.CoolSD(delta=0.0), 'delta'),
      (lambda: rules.CoolSD(delta=-1.0), 'delta'),
      (lambda: rules.CoolSD(delta=1.0, nu=-0.1), 'nu'),
      (lambda: rules.UniformRelaxed(omega=0.0), 'omega'),
      (lambda: rules.UniformRelaxed(omega=float('nan')), 'omega'),
      (lambda: rules.Lantern(neighbors=line_neighbors(8, 4), k=5, delta=0.1), 'k must be'),
      (lambda: rules.Lantern(neighbors=line_neighbors(8, 4), k=2, delta=1.5), 'delta'),
      (lambda: rules.Lantern(neighbors=None, k=2), 'neighbors'),
      (lambda: rules.Lantern(neighbors=jnp.full((8, 4), 8), k=2), 'token ids in'),
      (lambda: rules.LanternPP(neighbors=jnp.full((8, 4), -2), k=2), 'token ids in'),
      (lambda: rules.LanternPP(neighbors=jnp.zeros((8, 4)), k=2), 'integer'),
      (lambda: rules.CoolSD(delta=1.0, floor_at_one='yes'), 'floor_at_one'),
      (lambda: rules.LanternPP(neighbors=line_neighbors(8, 4), k=2, lam=0.5), 'lam'),
      (lambda: rules.LanternPP(neighbors=line_neighbors(8, 4), k=2, residual_mode='x'),
       'residual_mode'),
      (lambda: rules.ContentAware(lam=-1.0), 'lam'),
      (lambda: rules.ContentAware(tv_threshold=2.0), 'tv_threshold'),
      (lambda: rules.ContentAware(transform='log'), 'transform'),
      (lambda: rules.Grouped(prob_threshold=0.0), 'prob_threshold'),
  )
  def test_bad_hyperparameters_raise_naming_the_argument(self, make, name):
    with self.assertRaisesRegex(ValueError, name):
      make()

  def test_coolsd_mean_normalised_needs_window(self):
    draft, target = dirichlet_pair(0, 8)
    with self.assertRaisesRegex(ValueError, 'window'):
      rules.CoolSD(delta=2.0).accept_prob(draft, target, 1)
    rule = rules.CoolSD(delta=2.0).for_window(4)
    self.assertEqual(rule.window, 4)

  def test_rules_are_pytrees_so_sweeps_do_not_recompile(self):
    draft, target = dirichlet_pair(0, 8)
    traces = []

    @jax.jit
    def rate(rule):
      traces.append(1)
      return rule.acceptance_rate(draft, target, 1)

    values = [float(rate(rules.CoolSD(delta=delta, window=4))) for delta in (1.0, 2.0, 3.0)]
    self.assertEqual(len(traces), 1)
    self.assertEqual(values, sorted(values))


if __name__ == '__main__':
  absltest.main()
