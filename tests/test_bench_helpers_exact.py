"""bench/ratios.py, bench/timing.py and bench/resume.py against exact values: the
paired ratio's standard error in closed form (ddof 1, sqrt(n)), the unpaired fallback
for unequal or single-image rows, the best-of-repeats timing after an untimed
compile call with a fake clock, the interleaved rounds' rotation, and a first run
without a results file. Each test fails on a one-token change of the code it covers."""

import os
import shutil
import sys
import tempfile
import types
from unittest import mock

from absl.testing import absltest
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'bench'))
import ratios  # pylint: disable=g-import-not-at-top,wrong-import-position  (bench/)
import resume  # pylint: disable=g-import-not-at-top,wrong-import-position  (bench/)
import timing  # pylint: disable=g-import-not-at-top,wrong-import-position  (bench/)


class RatioClosedFormsTest(absltest.TestCase):

  def test_paired_ratio_stderr_value(self):
    """x = (2, 4, 6, 9), y = (1, 2, 3, 4): R = 2.1, residuals x - R y = (-0.1, -0.2, -0.3,
    0.6), sum of squares 0.5, sample variance (ddof 1) 1/6; s.e. sqrt(1/6) / (sqrt(4) 2.5)."""
    self.assertAlmostEqual(ratios.paired_ratio_stderr([2, 4, 6, 9], [1, 2, 3, 4]),
                           np.sqrt(1 / 6) / 5, places=12)

  def test_pairing_needs_equal_lengths_of_at_least_two(self):
    three = dict(tokens_per_forward=2.0, stderr=0.2, per_image=[1.0, 2.0, 3.0])
    two = dict(tokens_per_forward=1.5, stderr=0.5, per_image=[1.0, 2.0])
    self.assertFalse(ratios.is_paired(three, two))
    row = ratios.with_ratio(three, two)  # other images: the independent formula
    self.assertFalse(row['ratio_stderr_paired'])
    self.assertAlmostEqual(row['ratio_stderr'], (4 / 3) * np.hypot(0.1, 1 / 3))
    one = dict(tokens_per_forward=2.0, stderr=0.2, per_image=[2.0])
    one_ref = dict(tokens_per_forward=1.0, stderr=0.1, per_image=[1.0])
    self.assertFalse(ratios.is_paired(one, one_ref))
    self.assertAlmostEqual(ratios.with_ratio(one, one_ref)['ratio_stderr'],
                           2.0 * np.hypot(0.1, 0.1))

  def test_an_unpaired_reference_has_no_error_against_itself(self):
    old = dict(tokens_per_forward=2.5, stderr=0.3)  # JSON from before per_image was kept
    self.assertEqual(ratios.with_ratio(old, old)['ratio_stderr'], 0.0)


class BestMsTest(absltest.TestCase):

  def test_best_of_repeats_after_one_untimed_call(self):
    clock = iter([0.0, 0.003, 1.0, 1.001, 2.0, 2.002])  # timed calls: 3 ms, 1 ms, 2 ms
    calls = []
    with mock.patch.object(timing, 'time', types.SimpleNamespace(perf_counter=lambda: next(clock))):
      ms = timing.best_ms(lambda: calls.append(1), 3)
    self.assertLen(calls, 4)  # the compile call, then 3 timed ones
    self.assertAlmostEqual(ms, 1.0, places=6)

  def test_interleaved_rounds_rotate_and_keep_each_best(self):
    order, now = [], [0.0]
    durations = {'a': [5.0, 1.0, 3.0], 'b': [2.0, 4.0, 6.0]}  # ms of each timed call, by round

    def fn(name):
      def call():
        order.append(name)
        timed = order.count(name) - 2  # the first call of each is the untimed compile
        if timed >= 0:
          now[0] += durations[name][timed] / 1e3
      return call

    with mock.patch.object(timing, 'time', types.SimpleNamespace(perf_counter=lambda: now[0])):
      best = timing.best_ms_interleaved({'a': fn('a'), 'b': fn('b')}, 3)
    self.assertEqual(order, ['a', 'b', 'a', 'b', 'b', 'a', 'a', 'b'])
    self.assertEqual(set(best), {'a', 'b'})
    self.assertAlmostEqual(best['a'], 1.0, places=6)
    self.assertAlmostEqual(best['b'], 2.0, places=6)


class SavedRowsTest(absltest.TestCase):

  def test_no_file_yet_means_no_rows(self):
    folder = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, folder)
    self.assertEqual(resume.saved_rows(os.path.join(folder, 'absent.json'),
                                       lambda saved: True, lambda row: row['w']), {})


if __name__ == '__main__':
  absltest.main()
