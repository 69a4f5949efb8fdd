"""app.files: atomic writes and file hashes."""

import hashlib
import os
import pathlib
import tempfile

from absl.testing import absltest

from specdec_jax.app import files


class FilesTest(absltest.TestCase):

  def test_sha256_of_a_file_spanning_several_blocks(self):
    data = os.urandom((5 << 19) + 7)  # 2.5 MiB + 7 bytes: three 1 MiB blocks, the last partial
    with tempfile.TemporaryDirectory() as tmp:
      path = pathlib.Path(tmp, 'blob')
      path.write_bytes(data)
      self.assertEqual(files.sha256(path), hashlib.sha256(data).hexdigest())
      path.write_bytes(b'')
      self.assertEqual(files.sha256(path), hashlib.sha256(b'').hexdigest())

  def test_atomic_file_replaces_whole_or_keeps_the_old_file(self):
    with tempfile.TemporaryDirectory() as tmp:
      path = pathlib.Path(tmp, 'sub', 'out.bin')  # the folder is created
      files.write_atomic(path, b'first')
      with self.assertRaises(RuntimeError):
        with files.atomic_file(path) as f:
          f.write(b'half')
          raise RuntimeError('killed mid-write')
      self.assertEqual(path.read_bytes(), b'first')
      self.assertEqual(os.listdir(path.parent), ['out.bin'])  # no temporary file left


if __name__ == '__main__':
  absltest.main()
