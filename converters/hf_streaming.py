"""Streaming reader for Hugging Face sharded checkpoints, one tensor at a time.

Handles the layouts the released Lumina-mGPT and Janus-Pro weights use:

  model.safetensors.index.json + model-0000k-of-0000n.safetensors
  model.safetensors                                (single file)
  pytorch_model.bin.index.json + pytorch_model-0000k-of-0000n.bin
  pytorch_model.bin                                (single file)

`open_checkpoint` validates the index against the shards before anything is
converted: a shard file that is missing, a tensor the index lists but its shard
does not hold, a tensor a shard holds that the index does not list, or a
truncated safetensors file are reported with their names. Safetensors shapes
come from the file headers, without reading any tensor data.

`iter_tensors` then yields `(name, numpy array)` shard by shard, each tensor
read on its own (safetensors: plain reads at the header's offsets, no mmap, so
the page cache does not count as resident memory; `.bin`: memory-mapped
`torch.load`), so a converter that turns every tensor into its output form
before asking for the next never holds the model twice. `assemble_params` is
that loop for the converters in this package; `write_sharded_safetensors`
writes the layout (tests, benchmark) from numpy arrays or torch tensors,
without needing torch or the safetensors package for numpy input.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from absl import logging
import jax
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


@dataclasses.dataclass(frozen=True)
class ShardedCheckpoint:
  """A validated checkpoint folder.

  Attributes:
    root: the folder.
    kind: 'safetensors' or 'torch'.
    index_file: the index json, or None for a single-file checkpoint.
    tensors: `{name: TensorInfo}` for every tensor, in shard order.
  """

  root: pathlib.Path
  kind: str
  index_file: pathlib.Path | None
  tensors: Mapping[str, TensorInfo]

  @property
  def shards(self) -> tuple[str, ...]:
    return tuple(dict.fromkeys(info.shard for info in self.tensors.values()))

  @property
  def files(self) -> list[pathlib.Path]:
    """Every file the conversion reads (recorded with its sha256)."""
    files = [self.root / shard for shard in self.shards]
    return files + ([self.index_file] if self.index_file else [])

  @property
  def total_bytes(self) -> int:
    return sum((self.root / shard).stat().st_size for shard in self.shards)

  def shapes(self) -> dict[str, tuple[int, ...]]:
    return {name: info.shape for name, info in self.tensors.items()}

  def describe(self) -> str:
    return (f'{self.kind} checkpoint {str(self.root)!r} ({len(self.shards)} shard(s), '
            f'{len(self.tensors)} tensors)')


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
  header.pop('__metadata__', None)
  data_bytes = size - 8 - header_len
  infos = {}
  for name, entry in header.items():
    end = entry['data_offsets'][1]
    if end > data_bytes:
      raise ShardIndexError(
          f'{str(path)!r} is truncated: tensor {name!r} ends at byte {end} of the '
          f'data section but the file holds only {data_bytes}. Download it again.')
    start = entry['data_offsets'][0]
    infos[name] = TensorInfo(path.name, tuple(int(d) for d in entry['shape']),
                             _ST_DTYPES.get(entry['dtype'], entry['dtype']),
                             offset=8 + header_len + start)
  return infos


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


def _torch_load(path: pathlib.Path) -> dict[str, Any]:
  """A `.bin` state dict, memory-mapped when the file format allows it."""
  import torch  # pylint: disable=g-import-not-at-top  (only .bin checkpoints need it)
  try:
    return torch.load(str(path), map_location='cpu', weights_only=True, mmap=True)
  except RuntimeError as e:
    if 'mmap' not in str(e):
      raise
    logging.warning('%s is in the legacy (non-zip) torch format and cannot be '
                    'memory-mapped; reading the whole shard.', path)
    return torch.load(str(path), map_location='cpu', weights_only=True)


def _read_torch_infos(path: pathlib.Path) -> dict[str, TensorInfo]:
  try:
    state = _torch_load(path)
  except Exception as e:  # pylint: disable=broad-except
    raise ShardIndexError(f'Could not read shard {str(path)!r} as a PyTorch state '
                          f'dict (truncated or corrupt?): {type(e).__name__}: {e}') from e
  state = common.unwrap_checkpoint(state)
  import torch  # pylint: disable=g-import-not-at-top
  infos = {name: TensorInfo(path.name, tuple(t.shape), str(t.dtype).removeprefix('torch.'))
           for name, t in state.items() if isinstance(t, torch.Tensor)}
  del state
  return infos


def _read_index(index_file: pathlib.Path) -> dict[str, str]:
  try:
    with open(index_file) as f:
      weight_map = json.load(f)['weight_map']
  except (json.JSONDecodeError, KeyError, TypeError) as e:
    raise ShardIndexError(
        f'{str(index_file)!r} is not a valid index: expected JSON with a '
        f'"weight_map" {{tensor name: shard file}}: {type(e).__name__}: {e}') from e
  return {str(k): str(v) for k, v in weight_map.items()}


def _listing(items: Iterable[str], limit: int = 10) -> str:
  items = sorted(items)
  text = ', '.join(items[:limit])
  return text + (f', ... ({len(items)} in all)' if len(items) > limit else '')


def open_checkpoint(input_dir: str | pathlib.Path) -> ShardedCheckpoint:
  """Finds and validates the checkpoint files in `input_dir`.

  Raises:
    ShardIndexError: no checkpoint found, a shard missing or unreadable, or
      the index and the shards disagree (listing the tensors concerned).
  """
  root = pathlib.Path(input_dir)
  if not root.is_dir():
    raise ShardIndexError(f'--input_dir {str(root)!r} is not a folder. Pass the folder '
                          f'holding {SAFETENSORS_INDEX} (or {SAFETENSORS_SINGLE}).')
  layouts = ((SAFETENSORS_INDEX, 'safetensors', True), (SAFETENSORS_SINGLE, 'safetensors', False),
             (TORCH_INDEX, 'torch', True), (TORCH_SINGLE, 'torch', False))
  for filename, kind, is_index in layouts:
    if (root / filename).is_file():
      break
  else:
    raise ShardIndexError(
        f'No checkpoint in {str(root)!r}: expected one of '
        f'{[name for name, _, _ in layouts]} (found '
        f'{sorted(p.name for p in root.iterdir())[:10]}).')
  read_infos = read_safetensors_header if kind == 'safetensors' else _read_torch_infos
  if not is_index:
    tensors = read_infos(root / filename)
    logging.info('%s: single file %s, %d tensors', root, filename, len(tensors))
    return ShardedCheckpoint(root, kind, None, tensors)

  index_file = root / filename
  weight_map = _read_index(index_file)
  shards = list(dict.fromkeys(weight_map.values()))
  missing_files = [s for s in shards if not (root / s).is_file()]
  if missing_files:
    raise ShardIndexError(
        f'{index_file.name} lists {len(shards)} shard file(s) but {len(missing_files)} '
        f'are missing from {str(root)!r}: {_listing(missing_files)}. Download them '
        'again; nothing was converted.')
  tensors = {}
  for shard in shards:
    infos = read_infos(root / shard)
    listed = {name for name, s in weight_map.items() if s == shard}
    absent = listed - set(infos)
    extra = set(infos) - listed
    if absent or extra:
      parts = [f'Shard {shard!r} does not match {index_file.name}:']
      if absent:
        parts.append(f'{len(absent)} tensor(s) listed for it are not in the file: '
                     f'{_listing(absent)}')
      if extra:
        elsewhere = {n for n in extra if n in weight_map}
        parts.append(f'{len(extra)} tensor(s) in the file are not listed for it'
                     + (f' ({len(elsewhere)} listed for another shard)' if elsewhere else '')
                     + f': {_listing(extra)}')
      parts.append('The shard and the index come from different versions; download '
                   'both again. Nothing was converted.')
      raise ShardIndexError('\n  '.join(parts))
    for name in infos:
      tensors[name] = infos[name]
  logging.info('%s: %d shard(s), %d tensors, index consistent', root, len(shards),
               len(tensors))
  return ShardedCheckpoint(root, kind, index_file, tensors)


def iter_tensors(ckpt: ShardedCheckpoint,
                 keep: Callable[[str], bool] = lambda name: True
                 ) -> Iterator[tuple[str, np.ndarray]]:
  """Yields `(name, array)` shard by shard, one tensor read at a time.

  Arrays keep their stored dtype (bf16 as `ml_dtypes.bfloat16`, no upcast).
  A yielded array is backed by its own buffer; drop it before the next one to
  keep memory at one tensor above what the caller holds.

  Args:
    ckpt: from `open_checkpoint`.
    keep: which tensors to read (others are never loaded).
  """
  for shard in ckpt.shards:
    path = ckpt.root / shard
    names = [n for n, info in ckpt.tensors.items() if info.shard == shard and keep(n)]
    if not names:
      continue
    logging.info('reading shard %s (%d tensors)', shard, len(names))
    if ckpt.kind == 'safetensors':
      names.sort(key=lambda n: ckpt.tensors[n].offset)  # sequential reads
      with open(path, 'rb') as f:
        for name in names:
          yield name, _read_safetensors_tensor(f, ckpt.tensors[name])
    else:
      state = common.unwrap_checkpoint(_torch_load(path))
      for name in names:
        yield name, common.to_numpy(state.pop(name), upcast_bf16=False)
      del state


# A rule maps one source tensor to (path in the param tree, array transform).
Rule = tuple[tuple[str, ...], Callable[[np.ndarray], np.ndarray]]


def assemble_params(
    ckpt: ShardedCheckpoint,
    rules: Mapping[str, Rule],
    *,
    dtype: Any = None,
    sharding: Callable[[tuple[str, ...], tuple[int, ...]], jax.sharding.Sharding] | None = None,
) -> dict[str, Any]:
  """Builds the nested param tree tensor by tensor.

  Args:
    ckpt: the validated checkpoint.
    rules: `{source name: (param path, transform)}`; tensors without a rule
      are not read.
    dtype: cast floating tensors to this dtype (None: keep the stored one).
    sharding: optional `(param path, shape) -> Sharding` to place each tensor
      directly into its target sharding as soon as it is converted. Default:
      the host CPU device. Either way every leaf is a jax.Array, which Orbax
      writes without a second host copy (it copies numpy leaves).
  Returns:
    The nested params dict.
  """
  target_dtype = None if dtype is None else jnp.dtype(dtype)
  host = jax.sharding.SingleDeviceSharding(jax.devices('cpu')[0])
  params: dict[str, Any] = {}
  progress = common.Progress(len(rules), verb='converting')
  for name, array in iter_tensors(ckpt, keep=lambda n: n in rules):
    path, transform = rules[name]
    array = transform(array)
    is_float = np.issubdtype(array.dtype, np.floating) or array.dtype.name == 'bfloat16'
    if dtype is not None and is_float:
      array = array.astype(target_dtype, copy=False)
    array = np.ascontiguousarray(array)
    target = sharding(path, array.shape) if sharding is not None else host
    array = jax.device_put(array, target)
    node = params
    for key in path[:-1]:
      node = node.setdefault(key, {})
    if path[-1] in node:
      raise ValueError(f'assemble_params: two source tensors map to {"/".join(path)}.')
    node[path[-1]] = array
    progress.step(name)
  return params


def sharding_from_rules(mesh: jax.sharding.Mesh, rules=None):
  """A `sharding` callable for `assemble_params` from (regex, PartitionSpec) rules.

  Uses the engine's rules (`specdec_jax.sharding.LLAMA_RULES` by default) on
  the '/'-joined param path, so a converter can write params already laid out
  for the decode mesh.
  """
  from specdec_jax import sharding as sharding_lib  # pylint: disable=g-import-not-at-top

  compiled = [(re.compile(pattern), spec)
              for pattern, spec in (rules or sharding_lib.LLAMA_RULES)]

  def place(path, shape):
    name = '/'.join(path)
    spec = next((spec for pattern, spec in compiled if pattern.search(name)),
                jax.sharding.PartitionSpec())
    return jax.sharding.NamedSharding(mesh, sharding_lib.fit_spec(shape, spec, mesh))

  return place


def stored_float_dtype(ckpt: ShardedCheckpoint, names: Iterable[str]) -> str | None:
  """The one floating dtype the named tensors are stored in, or None if mixed."""
  dtypes = {ckpt.tensors[n].dtype for n in names if n in ckpt.tensors}
  dtypes = {d for d in dtypes if d.startswith(('float', 'bfloat'))}
  return dtypes.pop() if len(dtypes) == 1 else None


def transpose(array: np.ndarray) -> np.ndarray:
  """torch Linear weight [out, in] -> Flax Dense kernel [in, out]."""
  return array.T


def identity(array: np.ndarray) -> np.ndarray:
  return array


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
