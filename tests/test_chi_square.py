"""The chi-square helper of the Monte Carlo law tests (`testing.chi_square_pvalue`):
calibrated under the null, and blind neither to draws in rare bins nor to mass moved
between them (both were invisible when every rare bin was pooled into one, dropped
when that pool's expected count stayed below 5)."""

from __future__ import annotations

from absl.testing import absltest
import numpy as np

from specdec_jax import testing

N = 2**14
# 3 common bins and 300 rare ones (expected counts 0.6..4.5 each at N; 3.5% of the mass).
RARE = np.geomspace(1, 8, 300)
LAW = np.concatenate([[0.35, 0.35, 0.265], 0.035 * RARE / RARE.sum()])


def draw(law, seed: int, n: int = N) -> np.ndarray:
  return np.random.default_rng(seed).multinomial(n, law / law.sum())


class ChiSquareTest(absltest.TestCase):

  def test_exact_counts_and_a_zero_probability_bin(self):
    self.assertEqual(testing.chi_square_pvalue([25, 25, 50], [0.25, 0.25, 0.5]), (1.0, 2))
    self.assertEqual(testing.chi_square_pvalue([25, 24, 50, 1], [0.25, 0.25, 0.5, 0.0])[0], 0.0)

  def test_calibrated_under_the_null(self):
    """200 samples of the law itself: the fraction of p below 0.05 is 0.05 (binomial
    s.e. 0.015: 0.005..0.11 holds it with probability > 0.999)."""
    p_values = np.array([testing.chi_square_pvalue(draw(LAW, seed), LAW)[0]
                         for seed in range(200)])
    self.assertBetween(float(np.mean(p_values < 0.05)), 0.005, 0.11)
    self.assertGreater(p_values.min(), 1e-4)

  def test_draws_in_rare_bins_whose_pool_is_below_five(self):
    """Three bins of mass 2e-5 (expected 1.3 together at 2**16 draws) holding 30% of
    the draws: p was 0.99995, those bins dropped and the others rescaled."""
    law = np.array([0.3, 0.3, 0.4 - 6e-5, 2e-5, 2e-5, 2e-5])
    counts = np.round(np.array([0.21, 0.21, 0.28, 0.1, 0.1, 0.1]) * 2**16)
    self.assertLess(testing.chi_square_pvalue(counts, law)[0], 1e-6)

  def test_mass_moved_between_rare_bins_is_seen(self):
    """The rare masses reversed (each rare bin gets the mass of its mirror; the common
    bins and the rare total unchanged): one pool of all rare bins passed it (its count
    is the same), the groups by probability reject it."""
    reversed_law = np.concatenate([LAW[:3], LAW[3:][::-1]])
    for seed in range(5):
      self.assertLess(testing.chi_square_pvalue(draw(reversed_law, seed), LAW)[0], 1e-4)
    rare = LAW < 5 / N
    pooled = lambda counts: np.append(counts[~rare], counts[rare].sum())
    self.assertGreater(testing.chi_square_pvalue(  # the old single pool: blind to it
        pooled(draw(reversed_law, 0)), pooled(LAW))[0], 1e-4)


if __name__ == '__main__':
  absltest.main()
