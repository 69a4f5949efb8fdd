"""The output folder of an evaluation set: fingerprint, atomic chunks, merge.

Legend: N images, H x W pixels, n images of one chunk.

  config.json             what the images depend on (the fingerprint) + run info
  images/<index>.png      one PNG per image, named by its global index
  chunks/chunk_<c>.npz    the images of chunk c (uint8[n, H, W, 3], and index int64[n])
  chunks/chunk_<c>.jsonl  per-image metrics of chunk c
  chunks/chunk_<c>.json   the chunk's manifest, written last: the chunk is
                          committed once it exists (it holds the other files'
                          SHA-256)
  samples.npz             uint8[N, H, W, 3] under `arr_0` (the layout the
                          ADM/guided-diffusion evaluator and LlamaGen's FID
                          scripts read), written by the merge
  metrics.jsonl           every image's metrics, in index order
  summary.json            throughput and means of the run

Every file is written to a temporary file in its own folder and renamed
(`os.replace`), so a killed run leaves whole files or `*.tmp` files, which
`remove_temporaries` deletes on the next start. The folder must be visible to
every process (a shared file system) for resuming and for the merge.
"""

from __future__ import annotations

import hashlib
import io
import json
import pathlib
import zipfile
from typing import Iterable

import numpy as np

from specdec_jax.app import files
from specdec_jax.app import images as images_lib

CONFIG = 'config.json'
SAMPLES = 'samples.npz'
METRICS = 'metrics.jsonl'
SUMMARY = 'summary.json'


class FolderMismatchError(ValueError):
  """The output folder was written by a configuration that gives other images."""


def write_json(path, value) -> None:
  text = json.dumps(value, indent=1, sort_keys=True, default=str) + '\n'
  files.write_atomic(path, text.encode())


def remove_temporaries(out_dir) -> int:
  """Deletes `*.tmp` files a killed run left in the folder; returns how many."""
  removed = 0
  for folder in (pathlib.Path(out_dir), pathlib.Path(out_dir) / 'chunks',
                 pathlib.Path(out_dir) / 'images'):
    for path in folder.glob(f'*{files.TEMP_SUFFIX}') if folder.is_dir() else ():
      path.unlink(missing_ok=True)
      removed += 1
  return removed


def differences(old, new, prefix: str = '') -> list[str]:
  """'key: old -> new' for every leaf that differs between two nested dicts."""
  if isinstance(old, dict) and isinstance(new, dict):
    out = []
    for key in sorted(set(old) | set(new)):
      out += differences(old.get(key), new.get(key), f'{prefix}{key}.')
    return out
  return [] if old == new else [f'{prefix[:-1]}: {old!r} (folder) -> {new!r} (now)']


def check_folder(out_dir, fingerprint: dict) -> bool:
  """Raises FolderMismatchError unless the folder is new or has this fingerprint.

  Returns:
    True when the folder already holds a config.json (a restart).
  """
  path = pathlib.Path(out_dir) / CONFIG
  if not path.exists():
    return False
  stored = json.loads(path.read_text())['fingerprint']
  # A JSON round trip turns tuples into lists, so compare like with like.
  changed = differences(stored, json.loads(json.dumps(fingerprint, default=str)))
  if changed:
    raise FolderMismatchError(
        f'{out_dir} holds images of another configuration; what differs:\n  '
        + '\n  '.join(changed)
        + '\nWrite to a new --config.out_dir, rerun with the folder\'s values '
        f'(see {path}), or delete the folder to start over.')
  return True


def chunk_stem(out_dir, chunk: int) -> pathlib.Path:
  return pathlib.Path(out_dir) / 'chunks' / f'chunk_{chunk:05d}'


def png_path(out_dir, index: int) -> pathlib.Path:
  return pathlib.Path(out_dir) / 'images' / f'{index:06d}.png'


def _write_npz_to(target, arrays: dict[str, tuple[tuple, np.dtype, Iterable[np.ndarray]]]
                  ) -> None:
  """Writes an uncompressed .npz with fixed zip timestamps (same arrays, same
  bytes); each array is (shape, dtype, pieces along axis 0), streamed."""
  with zipfile.ZipFile(target, 'w', zipfile.ZIP_STORED, allowZip64=True) as archive:
    for name, (shape, dtype, pieces) in arrays.items():
      info = zipfile.ZipInfo(f'{name}.npy', date_time=(1980, 1, 1, 0, 0, 0))
      with archive.open(info, 'w', force_zip64=True) as f:
        np.lib.format.write_array_header_2_0(f, dict(
            descr=np.lib.format.dtype_to_descr(np.dtype(dtype)), fortran_order=False,
            shape=tuple(shape)))
        written = 0
        for piece in pieces:
          f.write(np.ascontiguousarray(piece, dtype).tobytes())
          written += len(piece)
        if written != shape[0]:
          raise ValueError(f'{name}: {written} rows written, {shape[0]} announced.')


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
  """The deterministic .npz of a few arrays, in memory."""
  buffer = io.BytesIO()
  _write_npz_to(buffer, {name: (a.shape, a.dtype, [a]) for name, a in arrays.items()})
  return buffer.getvalue()


def write_npz(path, arrays: dict[str, tuple[tuple, np.dtype, Iterable[np.ndarray]]]) -> None:
  """Writes a deterministic .npz atomically; each array is (shape, dtype, pieces
  along axis 0), streamed, so a 50,000-image set never sits in memory."""
  with files.atomic_file(path) as f:
    _write_npz_to(f, arrays)


def commit_chunk(out_dir, chunk: int, index: np.ndarray, images: np.ndarray,
                 records: list[dict], process: int, write_png: bool = True) -> None:
  """Writes one chunk (PNGs, images, metrics) and then its manifest.

  Args:
    index: int64[n] global image indices (consecutive).
    images: uint8[n, H, W, 3].
    records: n per-image metric dicts, in index order.
    process: the writing process (recorded in the manifest).
  """
  if write_png:
    for i, image in zip(index, images):
      images_lib.save_png(str(png_path(out_dir, int(i))), image)
  stem = chunk_stem(out_dir, chunk)
  arrays = npz_bytes(dict(images=images, index=np.asarray(index, np.int64)))
  lines = ''.join(json.dumps(r, sort_keys=True) + '\n' for r in records).encode()
  files.write_atomic(stem.with_suffix('.npz'), arrays)
  files.write_atomic(stem.with_suffix('.jsonl'), lines)
  write_json(stem.with_suffix('.json'), dict(
      chunk=chunk, process=process, start=int(index[0]), stop=int(index[-1]) + 1, count=len(index),
      npz_sha256=hashlib.sha256(arrays).hexdigest(),
      jsonl_sha256=hashlib.sha256(lines).hexdigest()))


def committed(out_dir, chunk: int, expected: range) -> bool:
  """Whether chunk's manifest exists and covers exactly `expected` indices."""
  path = chunk_stem(out_dir, chunk).with_suffix('.json')
  if not path.exists():
    return False
  manifest = json.loads(path.read_text())
  return (manifest['start'], manifest['stop']) == (expected.start, expected.stop)


def read_chunk(out_dir, chunk: int, expected: range) -> tuple[np.ndarray, list[dict]]:
  """(images uint8[n, H, W, 3], records) of a committed chunk, checked against its
  manifest's hashes and the indices it must hold."""
  stem = chunk_stem(out_dir, chunk)
  manifest = json.loads(stem.with_suffix('.json').read_text())
  arrays, lines = stem.with_suffix('.npz').read_bytes(), stem.with_suffix('.jsonl').read_bytes()
  for data, key in ((arrays, 'npz_sha256'), (lines, 'jsonl_sha256')):
    if hashlib.sha256(data).hexdigest() != manifest[key]:
      raise ValueError(f'{stem}: file does not match its manifest ({key}); delete '
                       f'{stem}.json and rerun to redo the chunk.')
  path = stem.with_suffix('.npz')
  with np.load(path) as loaded:
    images, index = loaded['images'], loaded['index']
  records = [json.loads(line) for line in lines.decode().splitlines()]
  if (index.tolist() != list(expected)
      or [r['index'] for r in records] != list(expected)):
    raise ValueError(f'{stem}: holds images {index.min()}..{index.max()} '
                     f'({len(records)} records), expected {expected}.')
  return images, records


def merge(out_dir, chunk_ranges: list[range]) -> list[dict]:
  """Writes samples.npz (arr_0) and metrics.jsonl from every committed chunk, one
  chunk in memory at a time.

  Returns:
    Every image's metric record, in index order.
  """
  records = []
  first, first_records = read_chunk(out_dir, 0, chunk_ranges[0])

  def pieces():
    nonlocal records
    records += first_records
    yield first
    for chunk, expected in enumerate(chunk_ranges[1:], start=1):
      images, chunk_records = read_chunk(out_dir, chunk, expected)
      records += chunk_records
      yield images

  total = sum(len(r) for r in chunk_ranges)
  write_npz(pathlib.Path(out_dir) / SAMPLES,
            dict(arr_0=((total,) + first.shape[1:], first.dtype, pieces())))
  files.write_atomic(pathlib.Path(out_dir) / METRICS,
               ''.join(json.dumps(r, sort_keys=True) + '\n' for r in records).encode())
  return records
