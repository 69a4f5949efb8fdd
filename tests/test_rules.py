"""Exact (closed-form) checks of every acceptance rule and its residual."""


from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import resampling
from specdec_jax import rules
from specdec_jax import verify
from tests.rules_support import ATOL
from tests.rules_support import dirichlet_pair
from tests.rules_support import line_neighbors
from tests.rules_support import relaxed_rules


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


def _all_rules(vocab):
  return dict(relaxed_rules(vocab), lossless=rules.Lossless(),
              csd_literal=rules.ContentAware(lam=0.3, tv_threshold=1.0,
                                             keep_target_support=False))


class NonFiniteTest(parameterized.TestCase):
  """NaN or inf probabilities never accept, whatever the rule (a NaN draft used to
  count as d = 0, hence f = 1: a NaN-parameter drafter got every draft accepted)."""

  @parameterized.product(name=sorted(_all_rules(8)), broken=['draft', 'target'],
                         value=[np.nan, np.inf])
  def test_never_accepts(self, name, broken, value):
    rule = _all_rules(8)[name]
    draft, target = dirichlet_pair(3, 8)
    bad = jnp.full((8,), value, jnp.float32)
    draft, target = (bad, target) if broken == 'draft' else (draft, bad)
    np.testing.assert_array_equal(np.asarray(rule.accept_prob(draft, target, 1)), 0.0)
    for token in (0, 5):
      self.assertEqual(float(rule.accept_prob_at(draft, target, 1, token)), 0.0)

  @parameterized.parameters(sorted(_all_rules(8)))
  def test_one_nan_entry_rejects_only_that_token(self, name):
    rule = _all_rules(8)[name]
    draft, target = dirichlet_pair(4, 8)
    reference = np.asarray(rule.accept_prob(draft, target, 1))
    accept = np.asarray(rule.accept_prob(draft.at[2].set(jnp.nan), target, 1))
    self.assertEqual(accept[2], 0.0)
    if name in ('lossless', 'uniform', 'coolsd'):  # token-wise rules: the others unchanged
      np.testing.assert_array_equal(np.delete(accept, 2), np.delete(reference, 2))

  @parameterized.parameters('lossless', 'uniform', 'coolsd')
  def test_chain_with_nan_drafts_keeps_the_target_law(self, name):
    """Every draft is rejected and the residual falls back to the target, so the
    emitted token is still a draw from t (the decode warns that drafts were broken).
    Lossless resamples from Norm([t - d]_+), the relaxed rules from G* =
    Norm([t - d f]_+): both masses are NaN here and must fall back to t, not d."""
    rule = _all_rules(8)[name]
    _, target = dirichlet_pair(5, 8)
    np.testing.assert_allclose(rule.residual(jnp.full((8,), jnp.nan), target, 1), target,
                               atol=1e-7)
    keys = jax.random.split(jax.random.key(0), 4096)
    run = jax.jit(jax.vmap(lambda key, draft_probs: verify.verify_chain(
        rule, key, jnp.array([1, 2]), draft_probs, jnp.stack([target] * 3)),
                           in_axes=(0, None)))  # traced: the probabilities are not checked
    num_accepted, tokens = run(keys, jnp.full((2, 8), jnp.nan))
    np.testing.assert_array_equal(np.asarray(num_accepted), 0)
    counts = np.bincount(np.asarray(tokens), minlength=8) / keys.shape[0]
    np.testing.assert_allclose(counts, np.asarray(target), atol=0.03)


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
      (lambda: rules.CoolSD(delta=2.0, mu=float('nan')), 'mu'),
      (lambda: rules.CoolSD(delta=np.array([1.0, 2.0])), 'delta must be one number'),
      (lambda: rules.ContentAware(lam='0.1'), 'lam must be one number'),
      (lambda: rules.UniformRelaxed([-2.0]), 'omega must be one number'),
      (lambda: rules.CoolSD(delta=(2.0,)), 'delta must be one number'),
      (lambda: rules.Grouped(dist_threshold=0.0), 'dist_threshold'),
      (lambda: rules.Grouped(below=-1), 'below/above must be >= 0'),
      (lambda: rules.Grouped(above=-1), 'below/above must be >= 0'),
      (lambda: rules.LanternPP(neighbors=line_neighbors(8, 4), k=0),
       r'k must be in \[1, K=4\]'),
  )
  def test_bad_hyperparameters_raise_naming_the_argument(self, make, name):
    with self.assertRaisesRegex(ValueError, name):
      make()

  def test_grouped_embeddings_need_one_row_per_token(self):
    draft, target = dirichlet_pair(0, 8)
    rule = rules.Grouped(embeddings=jnp.zeros((7, 3)))
    with self.assertRaisesRegex(ValueError, 'embeddings has 7 rows but the vocabulary has V=8'):
      rule.accept_prob(draft, target, 1)
    with self.assertRaisesRegex(ValueError, 'embeddings has 7 rows'):
      rule.check_vocab(8)
    rules.Grouped(embeddings=jnp.zeros((8, 3))).check_vocab(8)

  def test_grouped_group_must_fit_the_vocabulary(self):
    with self.assertRaisesRegex(ValueError, 'below=7 and above=6 .* must be below the '
                                'vocabulary size V=4'):
      rules.Grouped().check_vocab(4)
    rules.Grouped(below=3, above=3).check_vocab(4)
    for below, above in ((4, 0), (0, 4)):  # the boundary: `below` or `above` equal to V
      with self.assertRaisesRegex(ValueError, f'below={below} and above={above} .* must be '
                                  'below the vocabulary size V=4'):
        rules.Grouped(below=below, above=above).check_vocab(4)

  def test_numpy_tables_work_like_jax_arrays_in_chains_and_under_jit(self):
    """`neighbor_table` returns NumPy; indexing it by traced tokens used to fail."""
    table = np.asarray(line_neighbors(8, 4))
    embeddings = np.asarray(jax.random.normal(jax.random.key(1), (8, 3)))
    pairs = [dirichlet_pair(seed, 8) for seed in range(3)]
    draft = jnp.asarray(np.stack([d for d, _ in pairs]), jnp.float32)
    target = jnp.asarray(np.stack([t for _, t in pairs]), jnp.float32)
    tokens = jnp.argmax(draft[:2], axis=-1)
    for rule in (rules.Lantern(neighbors=table, k=2, delta=0.3),
                 rules.LanternPP(neighbors=table, k=2),
                 rules.Grouped(embeddings=embeddings, below=1, above=1, dist_threshold=4.0)):
      on_device = jax.tree.map(jnp.asarray, rule)
      with self.subTest(type(rule).__name__):
        np.testing.assert_array_equal(
            verify.verify_chain(rule, jax.random.key(0), tokens, draft[:2], target),
            verify.verify_chain(on_device, jax.random.key(0), tokens, draft[:2], target))
        np.testing.assert_array_equal(jax.jit(rule.accept_prob)(draft[0], target[0], 1),
                                      on_device.accept_prob(draft[0], target[0], 1))

  def test_coolsd_mean_normalised_needs_window(self):
    draft, target = dirichlet_pair(0, 8)
    with self.assertRaisesRegex(ValueError, 'window'):
      rules.CoolSD(delta=2.0).accept_prob(draft, target, 1)
    rule = rules.CoolSD(delta=2.0).for_window(4)
    self.assertEqual(rule.window, 4)
    self.assertEqual(rules.CoolSD(delta=2.0, window=4).for_window(4).window, 4)
    self.assertEqual(rules.CoolSD(delta=2.0, mu=0.1, window=6).for_window(4).window, 4)
    with self.assertRaisesRegex(ValueError, r'CoolSD\(window=6\) normalises its schedule over '
                                r'6 draft positions, but the decoder verifies 4 per step'):
      rules.CoolSD(delta=2.0, window=6).for_window(4)

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
