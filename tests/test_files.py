"""app.files: atomic writes and file hashes."""

import hashlib
import json
import os
import pathlib
import socket
import stat
import subprocess
import sys
import tempfile
from unittest import mock

from absl.testing import absltest
import jax.numpy as jnp
import numpy as np

from specdec_jax.app import files


def strict_loads(text: str):
  """json.loads that refuses the non-standard NaN/Infinity/-Infinity tokens."""
  def refuse(token):
    raise ValueError(f'non-standard JSON token {token}')
  return json.loads(text, parse_constant=refuse)


class FilesTest(absltest.TestCase):

  def test_json_text_is_strict_json_with_null_for_non_finite_floats(self):
    value = {'nll': float('inf'), 'se': float('nan'), 'low': -np.inf,
             'rows': (np.float32(0.5), np.int64(3), np.bool_(True)),
             'array': np.array([[1.0, np.nan]]), 'device': jnp.asarray([2.0, jnp.inf]),
             np.int64(7): 'numpy key', 'text': 'kept', 'none': None}
    loaded = strict_loads(files.json_text(value))
    self.assertEqual(loaded, {
        'nll': None, 'se': None, 'low': None, 'rows': [0.5, 3, True],
        'array': [[1.0, None]], 'device': [2.0, None], '7': 'numpy key',
        'text': 'kept', 'none': None})
    lines = files.json_lines([{'a': np.nan}, {'b': 1.5}]).decode().splitlines()
    self.assertEqual([strict_loads(line) for line in lines], [{'a': None}, {'b': 1.5}])
    # Negative control: the standard library's default writes what strict readers refuse.
    with self.assertRaisesRegex(ValueError, 'Infinity'):
      strict_loads(json.dumps({'nll': float('inf')}))

  def test_write_json_writes_the_strict_text_into_a_new_folder_and_leaves_no_temporary(self):
    with tempfile.TemporaryDirectory() as tmp:
      path = pathlib.Path(tmp, 'new', 'result.json')
      files.write_json(path, {'x': np.float32(np.nan), 'rows': [1.5]})
      self.assertEqual(path.read_text(), files.json_text({'x': None, 'rows': [1.5]}))
      self.assertEqual(strict_loads(path.read_text()), {'x': None, 'rows': [1.5]})
      self.assertEqual(os.listdir(path.parent), ['result.json'])

  def test_sha256_of_a_file_spanning_several_blocks(self):
    data = os.urandom((5 << 19) + 7)  # 2.5 MiB + 7 bytes: three 1 MiB blocks, the last partial
    with tempfile.TemporaryDirectory() as tmp:
      path = pathlib.Path(tmp, 'blob')
      path.write_bytes(data)
      self.assertEqual(files.sha256(path), hashlib.sha256(data).hexdigest())
      path.write_bytes(b'')
      self.assertEqual(files.sha256(path), hashlib.sha256(b'').hexdigest())

  def test_tree_sha256_follows_values_dtypes_shapes_and_paths(self):
    tree = {'a': np.arange(6, dtype=np.float32).reshape(2, 3), 'b': jnp.ones(2, jnp.bfloat16)}
    digest = files.tree_sha256(tree)
    self.assertEqual(files.tree_sha256(dict(tree, a=np.array(tree['a']))), digest)
    for name, other in (('value', dict(tree, b=jnp.zeros(2, jnp.bfloat16))),
                        ('dtype', dict(tree, a=tree['a'].astype(np.float64))),
                        ('shape', dict(tree, a=tree['a'].reshape(3, 2))),
                        ('path', {'c': tree['a'], 'b': tree['b']})):
      with self.subTest(name):
        self.assertNotEqual(files.tree_sha256(other), digest)

  def test_dotted_fields_of_nested_mappings(self):
    self.assertEqual(files.dotted_fields({'a': {'b': 1, 'c': {'d': [2]}}, 'e': None}, 'x:'),
                     {'x:a.b': 1, 'x:a.c.d': [2], 'x:e': None})

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

  def test_data_and_rename_are_on_disk_before_the_write_returns(self):
    """fsync of the file before its rename, then of the folder after it: a host
    crash cannot leave the new name without its data."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
      events.append(('fsync', 'folder' if stat.S_ISDIR(os.fstat(fd).st_mode) else 'file'))
      real_fsync(fd)

    def replace(src, dst):
      events.append(('replace', pathlib.Path(dst).name))
      real_replace(src, dst)

    with tempfile.TemporaryDirectory() as tmp, mock.patch('os.fsync', fsync), \
        mock.patch('os.replace', replace):
      files.write_atomic(pathlib.Path(tmp, 'new', 'out.bin'), b'data')
    self.assertEqual(events, [('fsync', 'folder'),  # the new folder, in its parent
                              ('fsync', 'file'), ('replace', 'out.bin'), ('fsync', 'folder')])


class FolderLockTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    tmp = tempfile.TemporaryDirectory()
    self.addCleanup(tmp.cleanup)
    self.folder = tmp.name

  def test_one_holder_at_a_time_and_the_refusal_names_it(self):
    first, second = files.FolderLock(self.folder), files.FolderLock(self.folder)
    self.assertIsNone(first.acquire())
    holder = json.loads(first.path.read_text())
    self.assertEqual(set(holder), {'host', 'pid', 'started', 'token'})
    self.assertEqual((holder['host'], holder['pid']), (socket.gethostname(), os.getpid()))
    with self.assertRaises(files.FolderLockedError) as caught:
      second.acquire()  # this process is alive: the lock is not stale
    message = str(caught.exception)
    self.assertIn(str(first.path), message)
    self.assertIn(f'pid {os.getpid()} on host {socket.gethostname()}', message)
    self.assertIn('--config.break_lock=True', message)
    second.release()  # not its lock: nothing happens
    self.assertTrue(first.path.exists())
    first.release()
    self.assertFalse(first.path.exists())
    self.assertIsNone(second.acquire())
    self.assertEqual(os.listdir(self.folder), ['job.lock'])  # no temporary file left

  def test_a_dead_holder_on_this_host_is_taken_over(self):
    gone = subprocess.Popen([sys.executable, '-c', 'pass'])
    gone.wait()
    lock = files.FolderLock(self.folder)
    lock.path.write_text(json.dumps(dict(host=socket.gethostname(), pid=gone.pid,
                                         started='2024-01-01T00:00:00')))
    self.assertIn(f'pid {gone.pid}', lock.acquire())
    self.assertEqual(json.loads(lock.path.read_text()), lock.holder)

  def test_two_jobs_breaking_one_stale_lock_leave_one_holder(self):
    """Job A takes the lock while job B, having judged the old lock stale, removes it:
    B must not remove A's fresh lock (it did, and then both held the folder)."""
    gone = subprocess.Popen([sys.executable, '-c', 'pass'])
    gone.wait()
    first, second = files.FolderLock(self.folder), files.FolderLock(self.folder)
    first.path.write_text(json.dumps(dict(host=socket.gethostname(), pid=gone.pid,
                                          started='2024-01-01T00:00:00')))
    read, reads = files._read_holder, []

    def read_then_first_acquires(path):
      holder = read(path)
      reads.append(path)
      if len(reads) == 2:  # second's read just before it removes the stale lock
        first.acquire()  # first takes the stale lock (or its freed name) meanwhile
      return holder

    with mock.patch.object(files, '_read_holder', read_then_first_acquires):
      with self.assertRaises(files.FolderLockedError):
        second.acquire()  # first, alive, holds it now
    self.assertEqual(json.loads(first.path.read_text()), first.holder)
    self.assertEqual(os.listdir(self.folder), ['job.lock'])

  def test_a_holder_on_another_host_needs_break_lock(self):
    lock = files.FolderLock(self.folder)
    stale = dict(host='node-7', pid=123, started='2024-01-01T00:00:00')
    lock.path.write_text(json.dumps(stale))
    with self.assertRaisesRegex(files.FolderLockedError,
                                'check that process 123 on node-7 no longer runs'):
      lock.acquire()
    self.assertEqual(json.loads(lock.path.read_text()), stale)  # untouched
    self.assertIn('break_lock is set (the holder was pid 123 on host node-7',
                  lock.acquire(break_lock=True))
    self.assertEqual(json.loads(lock.path.read_text()), lock.holder)

  def test_refuse_if_held_takes_nothing_and_counts_only_a_live_holder(self):
    lock = files.FolderLock(self.folder)
    lock.refuse_if_held()  # no lock file
    lock.path.write_text('{"not": "a lock"}')
    lock.refuse_if_held()  # a file of that name that is no lock
    gone = subprocess.Popen([sys.executable, '-c', 'pass'])
    gone.wait()
    lock.path.write_text(json.dumps(dict(host=socket.gethostname(), pid=gone.pid)))
    lock.refuse_if_held()  # a dead holder on this host
    lock.path.unlink()
    holder = files.FolderLock(self.folder)
    holder.acquire()
    with self.assertRaisesRegex(files.FolderLockedError, f'held by pid {os.getpid()}'):
      lock.refuse_if_held()
    self.assertEqual(json.loads(lock.path.read_text()), holder.holder)  # untouched
    other = dict(host='node-7', pid=123)
    lock.path.write_text(json.dumps(other))
    with self.assertRaisesRegex(files.FolderLockedError, 'process 123 on node-7'):
      lock.refuse_if_held()
    self.assertEqual(json.loads(lock.path.read_text()), other)


if __name__ == '__main__':
  absltest.main()
