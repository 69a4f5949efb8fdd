"""app.files (pinned by a mutation audit): where an atomic write's temporary file
lives, and json_lines' key order; the permissions of what it writes."""

import json
import os
import pathlib
import tempfile
from unittest import mock

from absl.testing import absltest

from specdec_jax.app import files


class FilesAtomicTest(absltest.TestCase):

  def test_the_temporary_file_is_a_hidden_tmp_file_beside_the_target(self):
    """os.replace is atomic only within one file system, and remove_temporaries
    finds a killed writer's leftovers only in the set's folders: the temporary
    must be `.<name>.<random>.tmp` in the target's own folder."""
    renames = []
    real_replace = os.replace

    def replace(src, dst):
      renames.append((pathlib.Path(src), pathlib.Path(dst)))
      real_replace(src, dst)

    with tempfile.TemporaryDirectory() as tmp, mock.patch('os.replace', replace):
      target = pathlib.Path(tmp, 'sub', 'out.bin')
      files.write_atomic(target, b'data')
      self.assertEqual(target.read_bytes(), b'data')
    (src, dst), = renames
    self.assertEqual(dst, target)
    self.assertEqual(src.parent, target.parent)
    self.assertTrue(src.name.startswith('.out.bin.'), src.name)
    self.assertTrue(src.name.endswith(files.TEMP_SUFFIX), src.name)

  def test_written_files_get_the_umask_permissions_like_open(self):
    """tempfile.mkstemp makes 0600 files and os.replace keeps the mode, so a sample
    set in a shared folder was unreadable to every other user. Both the atomic
    writes and the folder lock get what open() would give: 0666 less the umask."""
    with tempfile.TemporaryDirectory() as tmp:
      reference = pathlib.Path(tmp, 'plain')
      reference.write_bytes(b'')
      written = pathlib.Path(tmp, 'written')
      files.write_atomic(written, b'data')
      lock = files.FolderLock(tmp)
      lock.acquire()
      for path in (written, lock.path):
        self.assertEqual(oct(path.stat().st_mode & 0o777),
                         oct(reference.stat().st_mode & 0o777), str(path))
      self.assertEqual(written.stat().st_mode & 0o777, files.NEW_FILE_MODE)

  def test_folder_problem_names_a_folder_that_refuses_new_entries(self):
    """A read-only output folder (or one above a new one) is named before a
    command starts, not found by a PermissionError traceback at its first write."""
    denied = OSError(13, 'Permission denied')
    with tempfile.TemporaryDirectory() as tmp:
      self.assertIsNone(files.folder_problem(tmp))
      self.assertIsNone(files.folder_problem(os.path.join(tmp, 'new', 'deeper')))
      self.assertEqual(os.listdir(tmp), [])  # the probe leaves nothing
      with mock.patch('tempfile.mkdtemp', side_effect=denied):
        self.assertEqual(files.folder_problem(tmp), f'{tmp} cannot be written (Permission denied)')
        self.assertEqual(files.folder_problem(os.path.join(tmp, 'new', 'deeper')),
                         f'no folder can be made in {tmp} (Permission denied)')

  def test_json_lines_sorts_each_records_keys(self):
    """One record per line with sorted keys: the same metrics give the same bytes (and
    SHA-256 in a chunk's manifest) whatever order the code built the dict in."""
    lines = files.json_lines([{'b': 1, 'a': 2, 'c': {'z': 0, 'y': 1}}, {'x': None}])
    self.assertEqual(lines, b'{"a": 2, "b": 1, "c": {"y": 1, "z": 0}}\n{"x": null}\n')
    self.assertEqual(files.json_lines([{'a': 2, 'b': 1}]), files.json_lines([{'b': 1, 'a': 2}]))
    self.assertEqual(json.loads(lines.splitlines()[0]), {'a': 2, 'b': 1, 'c': {'y': 1, 'z': 0}})


if __name__ == '__main__':
  absltest.main()
