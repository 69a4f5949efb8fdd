"""bench/timing.py's round order: `rotated` shifts the calls by one each round, so over
len(items) rounds every call runs first exactly once and keeps its neighbours."""

import os
import sys

from absl.testing import absltest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'bench'))
import timing  # pylint: disable=g-import-not-at-top,wrong-import-position  (bench/)


class RotatedTest(absltest.TestCase):

  def test_each_round_starts_one_later(self):
    items = ('a', 'b', 'c')
    rounds = [timing.rotated(items, index) for index in range(4)]
    self.assertEqual(rounds, [['a', 'b', 'c'], ['b', 'c', 'a'], ['c', 'a', 'b'],
                              ['a', 'b', 'c']])
    self.assertEqual(sorted(r[0] for r in rounds[:3]), list(items))  # each first once

  def test_dict_keys_and_empty(self):
    self.assertEqual(timing.rotated({'x': 1, 'y': 2}, 1), ['y', 'x'])
    self.assertEqual(timing.rotated([], 5), [])


if __name__ == '__main__':
  absltest.main()
