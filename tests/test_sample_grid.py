"""bench/sample_grid.py: which image lands where, and the PNG it writes."""

import os
import sys
import tempfile

from absl.testing import absltest
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'bench'))

import sample_grid  # pylint: disable=g-import-not-at-top,wrong-import-position


def _set(num: int) -> np.ndarray:
  """uint8[num, 4, 5, 3]: image i filled with the value i (3 equal channels)."""
  return np.broadcast_to(np.arange(num, dtype=np.uint8)[:, None, None, None],
                         (num, 4, 5, 3)).copy()


class SampleGridTest(absltest.TestCase):

  def test_class_rows_put_image_c_plus_classes_r_at_r_c(self):
    rows = sample_grid.class_rows(_set(30), classes=10, per_class=3)
    self.assertEqual(rows.shape, (3, 10, 4, 5))
    for r in range(3):
      for c in range(10):
        np.testing.assert_array_equal(rows[r, c], np.full((4, 5), c + 10 * r))
    with self.assertRaisesRegex(ValueError, r'a set has 29 images, 30 are needed \(3 per '
                                r'class of 10\)'):
      sample_grid.class_rows(_set(29), classes=10, per_class=3)

  def test_writes_one_png_for_labelled_folders(self):
    with tempfile.TemporaryDirectory() as folder:
      sets = []
      for name in ('a', 'b'):
        os.makedirs(os.path.join(folder, name))
        np.savez(os.path.join(folder, name, 'samples.npz'), _set(20))
        sets.append(os.path.join(folder, name))
      out = os.path.join(folder, 'grid.png')
      sample_grid.main(['--out', out, '--classes', '10', '--per_class', '2',
                        '--labels', 'first,second', *sets])
      with open(out, 'rb') as f:
        self.assertEqual(f.read(8), b'\x89PNG\r\n\x1a\n')
      with self.assertRaises(SystemExit):
        sample_grid.main(['--out', out, '--labels', 'only_one', *sets])


if __name__ == '__main__':
  absltest.main()
