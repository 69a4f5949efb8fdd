"""bench/resume.py: the JSON a resumable bench writes after every row is replaced whole,
so a run killed while writing resumes from its last complete file."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from unittest import mock

from absl.testing import absltest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'bench'))
import resume  # pylint: disable=g-import-not-at-top,wrong-import-position  (bench/)


class WriteJsonTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    folder = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, folder)
    self.path = os.path.join(folder, 'rows.json')

  def saved(self):
    return resume.saved_rows(self.path, lambda saved: saved['seed'] == 0, lambda r: r['w'])

  def test_rows_written_are_the_rows_a_rerun_keeps(self):
    resume.write_json(self.path, {'seed': 0, 'rows': [{'w': 4, 'x': 1.5}, {'w': 8, 'x': 2.0}]})
    self.assertEqual(self.saved(), {4: {'w': 4, 'x': 1.5}, 8: {'w': 8, 'x': 2.0}})
    resume.write_json(self.path, {'seed': 1, 'rows': [{'w': 4, 'x': 1.5}]})
    self.assertEqual(self.saved(), {})  # other settings: every row is decoded again

  def test_a_write_killed_part_way_leaves_the_previous_file(self):
    resume.write_json(self.path, {'seed': 0, 'rows': [{'w': 4, 'x': 1.5}]})

    def killed(fd, data):  # half of the new text reaches the disk, then the run dies
      os.write(fd, data[:len(data) // 2])
      raise KeyboardInterrupt

    with mock.patch('os.fdopen', side_effect=lambda fd, mode: _Killed(fd, killed)):
      with self.assertRaises(KeyboardInterrupt):
        resume.write_json(self.path, {'seed': 0, 'rows': [{'w': 4}, {'w': 8}]})
    self.assertEqual(self.saved(), {4: {'w': 4, 'x': 1.5}})
    self.assertEqual(os.listdir(os.path.dirname(self.path)), ['rows.json'])  # no temporary

  def test_a_non_finite_number_is_written_as_strict_json(self):
    resume.write_json(self.path, {'seed': 0, 'rows': [{'w': 4, 'x': float('nan')}]})
    with open(self.path) as f:
      text = f.read()
    self.assertNotIn('NaN', text)
    self.assertIsNone(json.loads(text)['rows'][0]['x'])


class _Killed:
  """A file object whose write hands its bytes to `write(fd, data)`."""

  def __init__(self, fd, write):
    self.fd, self._write = fd, write

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    os.close(self.fd)

  def write(self, data):
    self._write(self.fd, data)


if __name__ == '__main__':
  absltest.main()
