"""`sample_processes` in one process: `agreed` returns the step's result or raises
its own error, and the folder lock refuses a second holder. (Two processes, where a
step fails on one of them only: tests/test_sample.py.)"""

import os
import tempfile

from absl.testing import absltest

from specdec_jax.app import files
from specdec_jax.app import sample_processes


class AgreedTest(absltest.TestCase):

  def test_returns_the_steps_result(self):
    self.assertEqual(sample_processes.agreed('add', lambda: 1 + 1), 2)
    self.assertEqual(sample_processes.agreed('add', lambda: 3, process_0_only=True), 3)

  def test_the_failing_process_raises_its_own_error(self):
    def fail():
      raise OSError('disk full')
    with self.assertRaisesRegex(OSError, 'disk full'):
      sample_processes.agreed('merge the chunks', fail, process_0_only=True)


class LockFolderTest(absltest.TestCase):

  def test_a_held_folder_is_refused(self):
    folder = tempfile.mkdtemp()
    lock = sample_processes.lock_folder(folder, break_lock=False)
    try:
      with self.assertRaisesRegex(files.FolderLockedError, 'in use'):
        sample_processes.lock_folder(folder, break_lock=False)
    finally:
      lock.release()
    sample_processes.lock_folder(folder, break_lock=False).release()  # free again

  def test_a_folder_that_cannot_be_locked_raises_the_error(self):
    path = os.path.join(tempfile.mkdtemp(), 'a_file')
    with open(path, 'w') as f:
      f.write('not a folder')
    with self.assertRaises(OSError):
      sample_processes.lock_folder(path, break_lock=False)


if __name__ == '__main__':
  absltest.main()
