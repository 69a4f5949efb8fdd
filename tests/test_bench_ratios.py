"""`bench/ratios.py`: the Jacobi benches' ratio to SJD and its standard error.

The methods of a bench decode the same images, so their per-image tokens per
forward are paired. The paired delta-method error must match the ratio's
spread over repeated experiments, where the independent-samples formula (the
negative control) overstates it for positively correlated pairs.
"""

import os
import sys

from absl.testing import absltest
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'bench'))
import ratios  # pylint: disable=g-import-not-at-top,wrong-import-position  (bench/)


def _row(values):
  values = np.asarray(values, np.float64)
  return dict(tokens_per_forward=float(values.mean()),
              stderr=float(values.std(ddof=1) / np.sqrt(values.size)), per_image=values.tolist())


def _pairs(rng, n, correlation):
  """n pairs (method, reference) of tokens per forward, correlated, method ~ 1.2x."""
  shared = rng.normal(size=n)
  own = rng.normal(size=(2, n))
  mix = np.sqrt(1 - correlation)
  reference = 2.2 + 0.5 * (np.sqrt(correlation) * shared + mix * own[0])
  method = 1.2 * 2.2 + 0.5 * (np.sqrt(correlation) * shared + mix * own[1])
  return method, reference


class RatioStderrTest(absltest.TestCase):

  def test_closed_forms(self):
    reference = _row([1.0, 2.0, 3.0, 4.0])
    exact = ratios.with_ratio(_row([2.0, 4.0, 6.0, 8.0]), reference)
    self.assertEqual(exact['ratio_to_sjd'], 2.0)
    self.assertEqual(exact['ratio_stderr'], 0.0)  # x = 2y image by image: no spread
    self.assertTrue(exact['ratio_stderr_paired'])
    self.assertEqual(ratios.with_ratio(reference, reference)['ratio_stderr'], 0.0)
    # std(x - y) / sqrt(n): differences 1, 1, 1, 5 -> std 2.
    self.assertAlmostEqual(ratios.paired_difference_stderr([2, 3, 4, 9], [1, 2, 3, 4]), 1.0)
    # Without per-image values (older JSON): the independent formula.
    old = {k: v for k, v in _row([2.0, 4.0, 6.0, 8.0]).items() if k != 'per_image'}
    unpaired = ratios.with_ratio(old, reference)
    self.assertFalse(unpaired['ratio_stderr_paired'])
    self.assertAlmostEqual(unpaired['ratio_stderr'], 2.0 * np.sqrt(2) * reference['stderr']
                           / reference['tokens_per_forward'])

  def test_paired_error_matches_the_spread_of_repeated_experiments(self):
    """2,000 experiments of 50 pairs at correlation 0.8: the ratio's spread over them
    against the mean reported error. The sd of 2,000 draws is known to 1.6% (its
    relative s.e. 1/sqrt(2 * 2000)), so 10% is over 6 sigma; the independent formula
    is off by far more (about 2.1x here) and must fail the same bound."""
    rng = np.random.default_rng(0)
    ratio_values, paired, independent = [], [], []
    for _ in range(2000):
      method, reference = _pairs(rng, 50, 0.8)
      row = ratios.with_ratio(_row(method), _row(reference))
      ratio_values.append(row['ratio_to_sjd'])
      paired.append(row['ratio_stderr'])
      unpaired_method = {k: v for k, v in _row(method).items() if k != 'per_image'}
      independent.append(ratios.with_ratio(unpaired_method, _row(reference))['ratio_stderr'])
    spread = np.std(ratio_values, ddof=1)
    self.assertBetween(np.mean(paired) / spread, 0.9, 1.1)
    self.assertGreater(np.mean(independent) / spread, 1.1)  # the negative control


if __name__ == '__main__':
  absltest.main()
