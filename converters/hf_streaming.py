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
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.converters import common
from specdec_jax.converters.safetensors_io import _read_safetensors_tensor  # noqa: F401
from specdec_jax.converters.safetensors_io import read_safetensors_header
from specdec_jax.converters.safetensors_io import read_safetensors_tensors
from specdec_jax.converters.safetensors_io import SAFETENSORS_INDEX
from specdec_jax.converters.safetensors_io import SAFETENSORS_SINGLE
from specdec_jax.converters.safetensors_io import ShardIndexError
from specdec_jax.converters.safetensors_io import TensorInfo
from specdec_jax.converters.safetensors_io import TORCH_INDEX
from specdec_jax.converters.safetensors_io import TORCH_SINGLE
from specdec_jax.converters.safetensors_io import write_safetensors  # noqa: F401 (re-export)
from specdec_jax.converters.safetensors_io import write_sharded_safetensors  # noqa: F401

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
  """{tensor name: shard file name} of an index, checked: a JSON object whose
  "weight_map" maps names to files in the index's own folder ('x' or './x')."""
  try:
    with open(index_file) as f:
      weight_map = json.load(f)['weight_map']
    if not isinstance(weight_map, Mapping):
      raise TypeError(f'"weight_map" is a {type(weight_map).__name__}, not an object')
  except (json.JSONDecodeError, KeyError, TypeError) as e:
    raise ShardIndexError(
        f'{str(index_file)!r} is not a valid index: expected JSON with a '
        f'"weight_map" {{tensor name: shard file}}: {type(e).__name__}: {e}') from e
  not_names = sorted({f'{v!r} ({type(v).__name__})' for v in weight_map.values()
                      if not isinstance(v, str)})
  if not_names:
    raise ShardIndexError(f'{str(index_file)!r}: its "weight_map" values must be shard file '
                          f'names (strings), got {_listing(not_names)}.')
  shards = {str(k): _shard_name(v) for k, v in weight_map.items()}
  elsewhere = sorted({weight_map[k] for k, shard in shards.items() if shard is None})
  if elsewhere:
    raise ShardIndexError(
        f'{str(index_file)!r} names shard files outside its own folder: '
        f'{_listing(elsewhere)}. A Hugging Face index lists files beside it; move the '
        'shards there and list them by name.')
  return shards


def _shard_name(value: str) -> str | None:
  """The file name of a weight_map value naming a file in the index's folder ('x' or
  './x'), else None (a subfolder, '..', an empty name)."""
  path = pathlib.PurePosixPath(value)
  if '\\' in value or path.parent != pathlib.PurePosixPath('.') or path.name in ('', '..'):
    return None
  return path.name


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


def stored_dtypes(ckpt: ShardedCheckpoint, names: Iterable[str]) -> set[str]:
  """The dtype names ('float32', 'bfloat16', ...) the named tensors are stored in
  (read from the headers; `common.output_dtype` picks the lossless one)."""
  return {ckpt.tensors[n].dtype for n in names if n in ckpt.tensors}


def transpose(array: np.ndarray) -> np.ndarray:
  """torch Linear weight [out, in] -> Flax Dense kernel [in, out]."""
  return array.T


def identity(array: np.ndarray) -> np.ndarray:
  return array
