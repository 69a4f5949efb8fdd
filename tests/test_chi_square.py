"""The chi-square helper of the Monte Carlo law tests (`testing.chi_square_pvalue`):
calibrated under the null, and blind neither to draws in rare bins nor to mass moved
between them (both were invisible when every rare bin was pooled into one, dropped
when that pool's expected count stayed below 5)."""

from __future__ import annotations

from absl.testing import absltest
import jax
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


class ChecksTest(absltest.TestCase):

  def test_probs_must_be_a_law(self):
    """[1, 1, 1, 1] was renormalised silently (p = 1.0)."""
    for probs, message in (([1.0, 1.0, 1.0, 1.0], 'must sum to 1 .* sum of 4'),
                           ([0.5, 0.5, 0.1, -0.1], r'probs must be finite and >= 0, got -0.1'),
                           ([0.5, 0.5, np.nan, 0.0], 'probs must be finite'),
                           ([0.5, 0.5, 0.0], r'counts \(4 bins\) and probs \(3 bins\)')):
      with self.assertRaisesRegex(ValueError, message):
        testing.chi_square_pvalue([2500] * 4, probs)
    with self.assertRaisesRegex(ValueError, 'counts must be finite and >= 0'):
      testing.chi_square_pvalue([-1, 2], [0.5, 0.5])

  def test_probs_within_the_tolerance_pass(self):
    law = np.array([0.25, 0.25, 0.5]) * (1 + 0.5 * testing.PROBS_SUM_TOLERANCE)
    self.assertEqual(testing.chi_square_pvalue([25, 25, 50], law), (1.0, 2))
    law32 = np.asarray(np.random.default_rng(0).dirichlet(np.ones(1000)), np.float32)
    testing.chi_square_pvalue(np.ones(1000), law32)


class SequenceIndexTest(absltest.TestCase):

  def test_one_to_one_in_range(self):
    tokens = np.array(list(np.ndindex(3, 3, 3)))
    np.testing.assert_array_equal(testing.sequence_index(tokens, 3), np.arange(27))

  def test_int64_overflow_raises(self):
    """65536^5 > 2^63: [0, 0, 0, 0, 1] and [1, 0, 0, 0, 1] both mapped to 1."""
    with self.assertRaisesRegex(ValueError, r'65536\^5 sequences do not fit in int64'):
      testing.sequence_index([[0, 0, 0, 0, 1], [1, 0, 0, 0, 1]], 65536)
    self.assertLen(set(testing.sequence_index([[0, 0, 1], [1, 0, 1]], 65536)), 2)

  def test_tokens_outside_the_vocabulary_raise(self):
    for tokens in ([[0, 4]], [[0, -1]]):  # [0, 4] and [1, 0] had the same index
      with self.assertRaisesRegex(ValueError, r'tokens must be in \[0, 4\)'):
        testing.sequence_index(tokens, 4)
    with self.assertRaisesRegex(ValueError, 'sequences must hold ints'):
      testing.sequence_index([[0.5, 1.0]], 4)


class JaxprTracesTest(absltest.TestCase):

  def test_records_a_trace_per_new_shape_and_none_for_a_repeat(self):
    f = jax.jit(lambda x: x * 2 + 1)
    three, other_three, four, five = (np.ones(n, np.float32) for n in (3, 3, 4, 5))
    with testing.jaxpr_traces() as traces:
      f(three)
    self.assertLen(traces, 1)
    with testing.jaxpr_traces() as traces:
      f(other_three)  # same shape: compiled once
    self.assertEmpty(traces)
    with testing.jaxpr_traces() as traces:
      f(four)  # a new shape traces again
    self.assertLen(traces, 1)
    f(five)  # outside a block: nothing is recorded (the listener is gone)
    self.assertLen(traces, 1)


if __name__ == '__main__':
  absltest.main()
