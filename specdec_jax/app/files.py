"""Files written whole or not at all, durably (a temporary file in the target's folder,
fsynced, then a rename and an fsync of the folder), file hashes, and a folder's lock.

A killed writer leaves either the previous file (or none) or a `*.tmp` file
beside it, never a half-written target (`os.replace` is atomic on one file
system); after a host crash a renamed file holds its data, since the data was
on disk before the rename and the rename before the call returned.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import pathlib
import secrets
import socket
import tempfile

from absl import logging
import numpy as np

TEMP_SUFFIX = '.tmp'


def _umask() -> int:
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


# The permissions `open()` would give a new file: `tempfile.mkstemp` makes 0600
# files, which would keep a shared output folder's files from its other readers.
NEW_FILE_MODE = 0o666 & ~_umask()


def fsync_folder(folder: str | os.PathLike) -> None:
  """Makes a folder's entries (a rename, a new file) durable."""
  fd = os.open(folder, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def make_folder(folder: str | os.PathLike) -> pathlib.Path:
  """mkdir -p, with each folder it creates made durable in its parent."""
  folder = pathlib.Path(folder)
  if not folder.is_dir():
    make_folder(folder.parent)
    folder.mkdir(exist_ok=True)
    fsync_folder(folder.parent)
  return folder


def folder_problem(folder: str | os.PathLike) -> str | None:
  """Why `make_folder(folder)` and writing in it cannot work: the path, or a
  folder above it, is a file, or the nearest folder that exists refuses new
  entries (read-only, not ours; probed with a temporary folder, removed again).
  None when it can."""
  folder = pathlib.Path(folder)
  for path in (folder, *folder.parents):
    if path.exists():
      if not path.is_dir():
        return (f'{path} is a file, not a folder' if path == folder
                else f'{path}, a folder above it, is a file')
      try:
        os.rmdir(tempfile.mkdtemp(prefix='.specdec-write-probe-', dir=path))
      except OSError as e:
        return (f'{path} cannot be written ({e.strerror})' if path == folder
                else f'no folder can be made in {path} ({e.strerror})')
      return None
  return None


def missing_folders(folder: str | os.PathLike) -> list[pathlib.Path]:
  """The folders `make_folder(folder)` would create, deepest first."""
  folder, missing = pathlib.Path(folder), []
  while not folder.exists() and folder != folder.parent:
    missing.append(folder)
    folder = folder.parent
  return missing


def remove_empty(folders: list[pathlib.Path]) -> None:
  """Removes the given folders, deepest first, stopping at the first that is not
  empty (or already gone): undoes `make_folder` when nothing was written."""
  for folder in folders:
    try:
      folder.rmdir()
    except OSError:
      return


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike):
  """A binary file object for `path`; written to a temporary file in the same
  folder (`.<name>.<random>.tmp`), fsynced and renamed when the block ends
  (removed if it raises). Creates the folder. The file gets the permissions
  a plain `open()` would give it (0666 less the umask at import)."""
  path = pathlib.Path(path)
  make_folder(path.parent)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix=TEMP_SUFFIX)
  try:
    os.fchmod(fd, NEW_FILE_MODE)
    with os.fdopen(fd, 'wb') as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_folder(path.parent)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
  """Writes `data` to `path` through `atomic_file`."""
  with atomic_file(path) as f:
    f.write(data)


def strict_json_value(value):
  """`value` with every non-finite float (NaN, +-inf) as None, NumPy and JAX
  numbers and arrays as Python numbers and lists, other leaves unchanged.

  An NLL is inf when a relaxed method keeps a token outside the target's
  top-k, and its standard error NaN; `json.dumps` would write them as
  `Infinity`/`NaN`, which strict JSON readers (JavaScript, jq, Go) refuse.
  """
  if isinstance(value, dict):
    return {key.item() if isinstance(key, np.generic) else key: strict_json_value(item)
            for key, item in value.items()}
  if isinstance(value, (list, tuple)):
    return [strict_json_value(item) for item in value]
  if isinstance(value, (np.ndarray, np.generic)) or hasattr(value, '__array__'):
    return strict_json_value(np.asarray(value).tolist())
  if isinstance(value, float) and not np.isfinite(value):
    return None
  return value


def json_text(value, *, indent: int | None = 1, sort_keys: bool = False) -> str:
  """Strict JSON text of `value` (`strict_json_value`: null where a float is
  not finite); objects JSON has no type for are written as their str."""
  return json.dumps(strict_json_value(value), indent=indent, sort_keys=sort_keys,
                    allow_nan=False, default=str)


def write_json(path: str | os.PathLike, value) -> None:
  """Writes `value` as strict JSON (`json_text`: null for a non-finite float) through
  `write_atomic`, so a run killed mid-write keeps the last whole file."""
  write_atomic(path, json_text(value).encode())


def dotted_fields(nested, prefix: str = '') -> dict:
  """{'a.b.c': leaf} of nested mappings (dicts, ConfigDicts: anything with `items`)."""
  flat = {}
  for name, value in nested.items():
    if hasattr(value, 'items'):
      flat.update(dotted_fields(value, f'{prefix}{name}.'))
    else:
      flat[prefix + name] = value
  return flat


def json_lines(records) -> bytes:
  """JSON Lines: one strict, key-sorted JSON object per record."""
  return ''.join(json_text(r, indent=None, sort_keys=True) + '\n' for r in records).encode()


def sha256(path: str | os.PathLike) -> str:
  """Hex SHA-256 of a file, read in 1 MiB blocks."""
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


class FolderLockedError(RuntimeError):
  """Another job holds the folder's lock."""


def tree_sha256(tree) -> str:
  """Hex SHA-256 of a pytree of arrays: each leaf's path, dtype, shape and bytes."""
  import jax  # pylint: disable=g-import-not-at-top
  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    array = np.ascontiguousarray(np.asarray(leaf))
    digest.update(f'{jax.tree_util.keystr(path)} {array.dtype} {array.shape};'.encode())
    digest.update(array.reshape(-1).view(np.uint8))
  return digest.hexdigest()


def _read_holder(path: pathlib.Path) -> dict:
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):  # removed meanwhile, or not ours
    return {}


def _pid_is_dead(pid) -> bool:
  """Whether no process `pid` runs on this host (an unknown pid counts as alive)."""
  try:
    os.kill(int(pid), 0)
  except ProcessLookupError:
    return True
  except (PermissionError, TypeError, ValueError, OverflowError):
    return False
  return False


class FolderLock:
  """An exclusive lock on a folder: a file holding its holder's host, pid and start time.

  The file is written whole under a temporary name and hard-linked to its
  name, which fails when the name exists (atomic, also on NFS), so of two
  jobs exactly one gets it. A lock left by a killed job is taken over when its
  holder ran on this host and its pid is gone; else, once you have checked
  that the holder no longer runs, `acquire(break_lock=True)` takes it over (or
  delete the file by hand).
  """

  def __init__(self, folder: str | os.PathLike, name: str = 'job.lock',
               break_flag: str | None = '--config.break_lock=True'):
    """break_flag: the flag that breaks the lock, named in the refusal (None: the
    command has none; the refusal says to delete the lock file)."""
    self.path = pathlib.Path(folder) / name
    self.break_flag = break_flag
    # token: tells this lock from another one of the same process and second
    self.holder = dict(host=socket.gethostname(), pid=os.getpid(),
                       started=datetime.datetime.now().astimezone().isoformat(timespec='seconds'),
                       token=secrets.token_hex(8))

  def acquire(self, break_lock: bool = False) -> str | None:
    """Takes the lock; returns why an earlier holder's lock was taken over (None if
    there was none). Raises FolderLockedError naming the holder if it may still run."""
    make_folder(self.path.parent)
    taken_over = None
    for _ in range(3):  # another job may take or break the lock meanwhile
      fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f'.{self.path.name}.',
                                 suffix=TEMP_SUFFIX)
      try:
        os.fchmod(fd, NEW_FILE_MODE)  # other users' jobs can read who holds it
        with os.fdopen(fd, 'w') as f:
          json.dump(self.holder, f)
          f.flush()
          os.fsync(f.fileno())
        os.link(tmp, self.path)
        fsync_folder(self.path.parent)
        return taken_over
      except FileNotFoundError:  # the holder's start removed our temporary file
        continue
      except FileExistsError:
        old = _read_holder(self.path)
        if old == self.holder:  # made by a retried link (NFS)
          return taken_over
        taken_over = self._stale(old, break_lock)
        self._remove_if_still(old)
      finally:
        if os.path.exists(tmp):
          os.remove(tmp)
    raise FolderLockedError(f'{self.path}: other jobs keep taking the lock; rerun when they '
                            'are done.')

  def _remove_if_still(self, old: dict) -> None:
    """Removes the lock file if it still holds `old`. Checking, then unlinking, would let
    two jobs breaking one stale lock each remove the other's fresh lock: the file is
    moved aside first (a rename: only one job moves it), and a lock that is not `old`
    (taken meanwhile) goes back unless yet another was taken."""
    aside = self.path.with_name(f'.{self.path.name}.{self.holder["token"]}.stale')
    try:
      os.rename(self.path, aside)
    except FileNotFoundError:  # another job moved it first
      return
    if _read_holder(aside) != old:
      with contextlib.suppress(FileExistsError):
        os.link(aside, self.path)
    os.remove(aside)

  def _stale(self, old: dict, break_lock: bool) -> str:
    """Why the lock `old` may be taken over; raises FolderLockedError if it may not."""
    same_host = old.get('host') == self.holder['host']
    if same_host and _pid_is_dead(old.get('pid')):
      return f'its holder, {self.describe(old)}, is no longer running'
    if break_lock:
      return f'break_lock is set (the holder was {self.describe(old)})'
    if same_host:
      gone = (f'process {old.get("pid")} still runs on this host; if it is not that job (a '
              'reused pid)')
    else:
      gone = (f'if that job is gone (check that process {old.get("pid")} on {old.get("host")} '
              'no longer runs, e.g. its host crashed)')
    raise FolderLockedError(
        f'{self.path.parent} is in use by another job: {self.path} is held by '
        f'{self.describe(old)}. Wait for that job to end or write to another folder; {gone}, '
        + (f'rerun with {self.break_flag} or ' if self.break_flag else '')
        + f'delete {self.path}.')

  def __enter__(self) -> 'FolderLock':
    """Takes the lock (logging a takeover of a dead holder's); released at the end."""
    taken_over = self.acquire()
    if taken_over:
      logging.warning('took over the lock %s: %s', self.path, taken_over)
    return self

  def __exit__(self, *exc_info) -> None:
    self.release()

  def release(self) -> None:
    """Removes the lock file if this lock still holds it."""
    if _read_holder(self.path) == self.holder:
      self.path.unlink(missing_ok=True)
      fsync_folder(self.path.parent)

  def refuse_if_held(self) -> None:
    """Raises FolderLockedError (as `acquire` does) if a job that may still run holds
    the lock; takes nothing. A lock whose holder is gone, and a file of that name that
    is not such a lock, do not count."""
    old = _read_holder(self.path)
    if isinstance(old, dict) and {'host', 'pid'} <= old.keys():
      self._stale(old, break_lock=False)

  @staticmethod
  def describe(holder: dict) -> str:
    return (f'pid {holder.get("pid", "?")} on host {holder.get("host", "?")} '
            f'(started {holder.get("started", "?")})')
