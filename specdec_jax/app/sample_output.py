"""The output folder of an evaluation set: fingerprint, atomic chunks, merge.

Legend: N images, H x W pixels, n images of one chunk.

  config.json             what the images depend on (the fingerprint) + run info
  images/<index>.png      one PNG per image, named by its global index
  chunks/chunk_<c>.npz    the images of chunk c (uint8[n, H, W, 3], and index int64[n])
  chunks/chunk_<c>.jsonl  per-image metrics of chunk c
  chunks/chunk_<c>.json   the chunk's manifest, written last: the sizes and
                          SHA-256 of the chunk's files (and of its PNGs)
  samples.npz             uint8[N, H, W, 3] under `arr_0` (the layout the
                          ADM/guided-diffusion evaluator and LlamaGen's FID
                          scripts read), written by the merge
  metrics.jsonl           every image's metrics, in index order
  summary.json            throughput and means of the run
  job.lock                while a job runs: its host, pid and start time
                          (`files.FolderLock`, taken by process 0)

Every file is written to a temporary file in its own folder, fsynced and
renamed (`files.atomic_file`), so a killed run leaves whole files or `*.tmp`
files, which `remove_temporaries` deletes on the next start. A chunk counts
as committed when its manifest reads and its files have the manifest's sizes
and hashes (`chunk_problem`); a restart redoes any other chunk, and rewrites
from a chunk's .npz any PNG that is missing or damaged (`repair_pngs`). The
folder must be visible to every process (a shared file system) for resuming
and for the merge.
"""

from __future__ import annotations

import hashlib
import io
import json
import pathlib
import zipfile
from typing import Iterable

from absl import logging
import numpy as np

from specdec_jax.app import files
from specdec_jax.app import images as images_lib

CONFIG = 'config.json'
SAMPLES = 'samples.npz'
METRICS = 'metrics.jsonl'
SUMMARY = 'summary.json'


def write_json(path, value) -> None:
  text = files.json_text(value, sort_keys=True) + '\n'
  files.write_atomic(path, text.encode())


def remove_temporaries(out_dir) -> int:
  """Deletes `*.tmp` files a killed run left in the folder; returns how many."""
  removed = 0
  for folder in (pathlib.Path(out_dir), pathlib.Path(out_dir) / 'chunks',
                 pathlib.Path(out_dir) / 'images'):
    for path in folder.glob(f'*{files.TEMP_SUFFIX}') if folder.is_dir() else ():
      path.unlink(missing_ok=True)
      removed += 1
  if removed:
    logging.info('removed %d temporary files of an interrupted run', removed)
  return removed


def remove_merged(out_dir) -> None:
  """Deletes the merged set (summary.json first, samples.npz, metrics.jsonl) an earlier
  run wrote, if any. The sampler does so while chunks are still
  to do, so a folder never shows a finished set other than its config.json's (one
  being extended, or stopped while it was): the merge writes them again."""
  found = [path for path in (pathlib.Path(out_dir) / name for name in (SUMMARY, SAMPLES, METRICS))
           if path.is_file()]  # not a folder of that name: the merge stops on it
  for path in found:
    path.unlink()
  if found:
    logging.info('removed the merged set of an earlier run: it is written again once every '
                 'chunk is done')


def holds_images(out_dir) -> bool:
  """Whether the folder holds an image: any file under images/ or chunks/
  (whole or temporary), or the merged samples and metrics."""
  root = pathlib.Path(out_dir)
  if any((root / name).exists() for name in (SAMPLES, METRICS, SUMMARY)):
    return True
  return any(any((root / sub).iterdir()) for sub in ('images', 'chunks') if (root / sub).is_dir())


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


def _describe(data: bytes) -> dict:
  return dict(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())


def commit_chunk(out_dir, chunk: int, index: np.ndarray, images: np.ndarray,
                 records: list[dict], process: int, write_png: bool = True) -> None:
  """Writes one chunk (PNGs, images, metrics) and then its manifest.

  Args:
    index: int64[n] global image indices (consecutive).
    images: uint8[n, H, W, 3].
    records: n per-image metric dicts, in index order.
    process: the writing process (recorded in the manifest).
  """
  pngs = None
  if write_png:
    pngs = []
    for i, image in zip(index, images):
      data = images_lib.encode_png(image)
      files.write_atomic(png_path(out_dir, int(i)), data)
      pngs.append(_describe(data))
  stem = chunk_stem(out_dir, chunk)
  arrays = npz_bytes(dict(images=images, index=np.asarray(index, np.int64)))
  lines = files.json_lines(records)
  files.write_atomic(stem.with_suffix('.npz'), arrays)
  files.write_atomic(stem.with_suffix('.jsonl'), lines)
  write_json(stem.with_suffix('.json'), dict(
      chunk=chunk, process=process, start=int(index[0]), stop=int(index[-1]) + 1, count=len(index),
      npz=_describe(arrays), jsonl=_describe(lines), pngs=pngs))


def read_manifest(out_dir, chunk: int) -> dict:
  """A chunk's manifest; raises FileNotFoundError, or ValueError when it is damaged."""
  manifest = json.loads(chunk_stem(out_dir, chunk).with_suffix('.json').read_text())
  if not isinstance(manifest, dict) or not all(isinstance(manifest.get(k), t) for k, t in (
      ('start', int), ('stop', int), ('npz', dict), ('jsonl', dict))):  # hand edits too
    raise ValueError(f'fields {manifest}')
  return manifest


def _file_problem(path: pathlib.Path, described: dict) -> str | None:
  """Why a file is not the one the manifest describes (None if it is)."""
  if not path.is_file():
    return f'{path.name} is missing'
  size = path.stat().st_size
  if size != described.get('bytes'):
    return f'{path.name} has {size} bytes, its manifest says {described.get("bytes")}'
  if files.sha256(path) != described.get('sha256'):
    return f'{path.name} does not match its manifest\'s SHA-256'
  return None


def chunk_problem(out_dir, chunk: int, expected: range) -> str | None:
  """Why a chunk is not committed, or None when it is: its manifest reads, covers
  exactly `expected`, and its .npz and .jsonl have the manifest's sizes and SHA-256.

  Returns NOT_WRITTEN when there is no manifest.
  """
  stem = chunk_stem(out_dir, chunk)
  try:
    manifest = read_manifest(out_dir, chunk)
  except FileNotFoundError:
    return NOT_WRITTEN
  except (OSError, ValueError) as e:
    return f'its manifest {stem.name}.json is damaged ({type(e).__name__}: {e})'
  if (manifest['start'], manifest['stop']) != (expected.start, expected.stop):
    return (f'its manifest covers images {manifest["start"]}..{manifest["stop"] - 1}, not '
            f'{expected.start}..{expected.stop - 1}')
  for suffix in ('npz', 'jsonl'):
    problem = _file_problem(stem.with_suffix(f'.{suffix}'), manifest[suffix])
    if problem:
      return problem
  return None


NOT_WRITTEN = 'not written'


def committed(out_dir, chunk: int, expected: range) -> bool:
  """Whether the chunk is committed and whole (`chunk_problem` finds nothing)."""
  return chunk_problem(out_dir, chunk, expected) is None


def repair_pngs(out_dir, chunk: int) -> int:
  """Writes a committed chunk's PNGs that are missing or differ from its manifest,
  from its .npz (no decoding), and records them in the manifest; returns how many."""
  stem = chunk_stem(out_dir, chunk)
  manifest = read_manifest(out_dir, chunk)
  index = range(manifest['start'], manifest['stop'])
  pngs = manifest.get('pngs') or [None] * len(index)
  bad = [j for j, (i, described) in enumerate(zip(index, pngs))
         if described is None or _file_problem(png_path(out_dir, i), described)]
  if not bad:
    return 0
  with np.load(stem.with_suffix('.npz')) as loaded:
    images = loaded['images']
  for j in bad:
    data = images_lib.encode_png(images[j])
    files.write_atomic(png_path(out_dir, index[j]), data)
    pngs[j] = _describe(data)
  write_json(stem.with_suffix('.json'), dict(manifest, pngs=pngs))
  return len(bad)


def read_chunk(out_dir, chunk: int, expected: range) -> tuple[np.ndarray, list[dict]]:
  """(images uint8[n, H, W, 3], records) of a committed chunk, checked against its
  manifest's sizes and hashes and the indices it must hold."""
  stem = chunk_stem(out_dir, chunk)
  problem = chunk_problem(out_dir, chunk, expected)
  if problem:
    raise ValueError(f'{stem}: {problem}; rerun the same command to redo the chunk.')
  lines = stem.with_suffix('.jsonl').read_bytes()
  with np.load(stem.with_suffix('.npz')) as loaded:
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
  files.write_atomic(pathlib.Path(out_dir) / METRICS, files.json_lines(records))
  return records


# The summary's fields measured by the run that decoded the images.
MEASURED = ('images_this_run', 'images_per_s', 'tokens_per_s', 'wall_s', 'decode_loop_s',
            'compile_s', 'processes', 'devices', 'global_batch', 'host')


def write_summary(out_dir: str, summary: dict) -> None:
  """Writes summary.json (updates `summary` in place). A run that decoded nothing keeps
  the measurements of the summary there; without one (runs stopped before merging) null rates."""
  path = pathlib.Path(out_dir, SUMMARY)
  if not summary['images_this_run']:  # no rate (null) unless an earlier summary has one
    summary.update(images_per_s=None, tokens_per_s=None)
    try:
      with open(path) as f:
        earlier = json.load(f)
    except (OSError, ValueError):
      earlier = {}
    summary.update({k: earlier[k] for k in MEASURED if k in earlier})
  write_json(path, summary)
