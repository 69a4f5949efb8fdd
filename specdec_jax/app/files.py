"""Files written whole or not at all (a temporary file in the target's folder, then a
rename), and file hashes.

A killed writer leaves either the previous file (or none) or a `*.tmp` file
beside it, never a half-written target (`os.replace` is atomic on one file
system).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import tempfile

TEMP_SUFFIX = '.tmp'


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike):
  """A binary file object for `path`; written to a temporary file in the same
  folder (`.<name>.<random>.tmp`) and renamed when the block ends (removed if it
  raises). Creates the folder."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix=TEMP_SUFFIX)
  try:
    with os.fdopen(fd, 'wb') as f:
      yield f
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
  """Writes `data` to `path` through `atomic_file`."""
  with atomic_file(path) as f:
    f.write(data)


def sha256(path: str | os.PathLike) -> str:
  """Hex SHA-256 of a file, read in 1 MiB blocks."""
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()
