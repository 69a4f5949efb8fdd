"""Safetensors files without torch: header and tensor reads, and writes.

The format of the safetensors project (huggingface/safetensors): an 8-byte
little-endian header length, a JSON header (name -> dtype, shape, data
offsets), then the raw little-endian C-order data. Reads use plain file reads
at the header's offsets (no mmap, so the page cache does not count as
resident memory); `write_sharded_safetensors` writes Hugging Face's sharded
layout (shards plus `model.safetensors.index.json`).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import struct
from collections.abc import Iterable, Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from specdec_jax.converters import common

SAFETENSORS_INDEX = 'model.safetensors.index.json'
SAFETENSORS_SINGLE = 'model.safetensors'
TORCH_INDEX = 'pytorch_model.bin.index.json'
TORCH_SINGLE = 'pytorch_model.bin'

# safetensors dtype codes -> numpy dtype names (bf16 through ml_dtypes).
_ST_DTYPES = {'F64': 'float64', 'F32': 'float32', 'F16': 'float16', 'BF16': 'bfloat16',
              'I64': 'int64', 'I32': 'int32', 'I16': 'int16', 'I8': 'int8',
              'U8': 'uint8', 'BOOL': 'bool'}


class ShardIndexError(common.CheckpointReadError):
  """The index and the shard files disagree, or a shard is missing or broken."""


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  """What a shard says about one tensor, without its data."""

  shard: str
  shape: tuple[int, ...]
  dtype: str
  offset: int = -1  # safetensors: absolute byte offset of the data in the file


def read_safetensors_header(path: pathlib.Path) -> dict[str, TensorInfo]:
  """`{name: TensorInfo}` from a safetensors header, checking the file is complete."""
  size = path.stat().st_size
  try:
    with open(path, 'rb') as f:
      (header_len,) = struct.unpack('<Q', f.read(8))
      if header_len > size - 8:
        raise ValueError(f'header length {header_len} exceeds the file size {size}')
      header = json.loads(f.read(header_len))
  except (struct.error, ValueError, UnicodeDecodeError) as e:
    raise ShardIndexError(
        f'{str(path)!r} is not a valid safetensors file ({size} bytes; it may be '
        f'truncated or corrupt): {e}') from e
  if not isinstance(header, dict):
    raise ShardIndexError(f'{str(path)!r} is not a valid safetensors file: its header is a '
                          f'JSON {type(header).__name__}, not an object. The file is corrupt.')
  header.pop('__metadata__', None)
  data_bytes = size - 8 - header_len
  infos, spans = {}, []
  for name, entry in header.items():
    start, end, shape, dtype = _header_entry(path, name, entry)
    if end > data_bytes:
      raise ShardIndexError(
          f'{str(path)!r} is truncated: tensor {name!r} ends at byte {end} of the '
          f'data section but the file holds only {data_bytes}. Download it again.')
    infos[name] = TensorInfo(path.name, shape, dtype, offset=8 + header_len + start)
    if end > start:  # an empty tensor holds no bytes to share
      spans.append((start, end, name))
  spans.sort()
  for (_, end, name), (start, _, next_name) in zip(spans, spans[1:]):
    if start < end:
      raise ShardIndexError(
          f'{str(path)!r}: tensors {name!r} and {next_name!r} share data bytes (one ends '
          f'at {end}, the other starts at {start}). The file is corrupt.')
  return infos


def _header_entry(path: pathlib.Path, name: str, entry: Any) -> tuple[int, int, tuple, str]:
  """(start, end, shape, numpy dtype name) of one header entry, checked: a known
  dtype, and data offsets spanning exactly shape x itemsize bytes."""
  try:
    dtype = _ST_DTYPES[entry['dtype']]
    shape = tuple(int(d) for d in entry['shape'])
    start, end = (int(x) for x in entry['data_offsets'])
  except (KeyError, TypeError, ValueError) as e:
    known = sorted(_ST_DTYPES)
    raise ShardIndexError(
        f'{str(path)!r}: the header entry of tensor {name!r} is malformed ({entry!r}; '
        f'needs dtype in {known}, shape and two data_offsets): {type(e).__name__}: {e}. '
        'The file is corrupt or of an unsupported dtype.') from None
  nbytes = int(np.prod(shape, dtype=np.int64)) * jnp.dtype(dtype).itemsize
  if start < 0 or end - start != nbytes:
    raise ShardIndexError(
        f'{str(path)!r}: tensor {name!r} ({entry["dtype"]}{list(shape)}, {nbytes} bytes) has '
        f'data_offsets [{start}, {end}] ({end - start} bytes). The file is corrupt.')
  return start, end, shape, dtype


def _read_safetensors_tensor(f, info: TensorInfo) -> np.ndarray:
  """Reads one tensor with plain file reads (no mmap: the page cache stays out of RSS)."""
  array = np.empty(info.shape, jnp.dtype(info.dtype))
  f.seek(info.offset)
  buffer = memoryview(array.reshape(-1).view(np.uint8))
  if f.readinto(buffer) != array.nbytes:
    raise ShardIndexError(f'{f.name!r}: short read for a tensor of {array.nbytes} bytes '
                          f'at offset {info.offset}; the file is truncated.')
  return array


def read_safetensors_tensors(path: str | pathlib.Path, infos: Mapping[str, TensorInfo],
                             names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
  """Reads the named tensors (default: all) of one safetensors file, nothing else.

  Args:
    path: the file.
    infos: its header, from `read_safetensors_header`.
    names: the tensors to read; the others' data is never touched.
  Returns:
    `{name: array}` in the stored dtype (bf16 as `ml_dtypes.bfloat16`).
  """
  names = list(infos) if names is None else list(names)
  names.sort(key=lambda n: infos[n].offset)  # sequential reads
  out = {}
  with open(path, 'rb') as f:
    for name in names:
      out[name] = _read_safetensors_tensor(f, infos[name])
  return out


_ST_CODES = {name: code for code, name in _ST_DTYPES.items()}


def _as_numpy(tensor: Any) -> np.ndarray:
  """A numpy array or torch tensor as a C-contiguous numpy array (bf16 kept)."""
  if not isinstance(tensor, np.ndarray):
    tensor = common.to_numpy(tensor, upcast_bf16=False)
  return np.ascontiguousarray(tensor)


def write_safetensors(path: str | pathlib.Path, tensors: Mapping[str, Any], *,
                      metadata: Mapping[str, str] | None = None) -> None:
  """Writes one safetensors file (8-byte header length, JSON header, raw data).

  The format of the safetensors project (huggingface/safetensors): tensors
  little-endian, C order, data back to back in the header's order, header
  padded with spaces to a multiple of 8 bytes.

  Args:
    path: file to write.
    tensors: `{name: numpy array or torch tensor}`; dtypes F64/F32/F16/BF16
      and the integer/bool types.
    metadata: optional string-to-string `__metadata__`.
  """
  arrays = {name: _as_numpy(t) for name, t in tensors.items()}
  header: dict[str, Any] = {}
  if metadata:
    header['__metadata__'] = {str(k): str(v) for k, v in metadata.items()}
  offset = 0
  for name, array in arrays.items():
    code = _ST_CODES.get(array.dtype.name)
    if code is None:
      raise ValueError(f'write_safetensors: tensor {name!r} has dtype {array.dtype.name}, '
                       f'which safetensors cannot store here; use one of {sorted(_ST_CODES)}.')
    header[name] = {'dtype': code, 'shape': list(array.shape),
                    'data_offsets': [offset, offset + array.nbytes]}
    offset += array.nbytes
  encoded = json.dumps(header, separators=(',', ':')).encode('utf-8')
  encoded += b' ' * (-len(encoded) % 8)
  with open(path, 'wb') as f:
    f.write(struct.pack('<Q', len(encoded)))
    f.write(encoded)
    for array in arrays.values():
      if array.dtype.byteorder == '>':
        array = array.astype(array.dtype.newbyteorder('<'))
      f.write(memoryview(array.reshape(-1).view(np.uint8)))


def write_sharded_safetensors(tensors: Iterable[tuple[str, Any]], out_dir: str | pathlib.Path,
                              *, max_shard_bytes: int) -> list[pathlib.Path]:
  """Writes tensors in the HF layout: `model-0000k-of-0000n.safetensors` + index.

  Tensors are consumed one at a time and at most one shard is held in memory
  (tests and the conversion-memory benchmark use this to make checkpoints).

  Args:
    tensors: `(name, numpy array or torch.Tensor)` pairs (torch is needed
      only for torch tensors).
    out_dir: folder to write into (created if needed).
    max_shard_bytes: start a new shard once the current one would exceed this.
  Returns:
    The shard paths.
  """
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  shard_names: list[list[str]] = []
  temp_paths: list[pathlib.Path] = []
  current: dict[str, np.ndarray] = {}
  current_bytes = total_bytes = 0

  def flush():
    nonlocal current, current_bytes
    if current:
      temp = out_dir / f'.shard-{len(temp_paths):05d}.tmp'
      write_safetensors(temp, current, metadata={'format': 'pt'})
      temp_paths.append(temp)
      shard_names.append(list(current))
      current, current_bytes = {}, 0

  for name, tensor in tensors:
    array = _as_numpy(tensor)
    size = array.nbytes
    if current and current_bytes + size > max_shard_bytes:
      flush()
    current[name] = array
    current_bytes += size
    total_bytes += size
  flush()
  count = len(temp_paths)
  weight_map, paths = {}, []
  for k, (temp, names) in enumerate(zip(temp_paths, shard_names)):
    final = out_dir / f'model-{k + 1:05d}-of-{count:05d}.safetensors'
    temp.rename(final)
    paths.append(final)
    weight_map.update({name: final.name for name in names})
  with open(out_dir / SAFETENSORS_INDEX, 'w') as f:
    json.dump({'metadata': {'total_size': total_bytes}, 'weight_map': weight_map}, f, indent=2)
  return paths
