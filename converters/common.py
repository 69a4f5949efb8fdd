"""Shared pieces of every checkpoint converter: read, unwrap, validate, write.

A converter reads the released file (`load_state_dict`), drops what is not a
weight, checks every key and shape against the config it assumes
(`validate_keys`), renames/transposes into a Flax param tree, and writes it with
`write_params_atomic`: an Orbax checkpoint plus `specdec_meta.json` (config,
sha256 of each source file, converter, dtype, date), written to a temporary
sibling folder and renamed into place, so a failed run leaves nothing behind.
`load_params` reads it back for the engine.

Legend: a "state dict" is a flat `{name: array}` mapping in the original
(PyTorch) key layout; "params" is the nested Flax parameter tree.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import os
import pathlib
import pickle
import shutil
import sys
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

META_FILENAME = 'specdec_meta.json'
PARAMS_SUBDIR = 'params'
PER_KEY_LAYOUT = 'per_top_level_key'  # params/<key>/ holds one Orbax item per entry
TORCH_SUFFIXES = ('.pt', '.pth', '.bin', '.ckpt')
SAFETENSORS_SUFFIXES = ('.safetensors',)

# Top-level keys of training checkpoints that wrap the weights, most preferred
# first after the caller's own preference: LlamaGen DDP (`model`, `ema`),
# deepspeed (`module`), Lightning/taming (`state_dict`).
WRAPPER_KEYS = ('model', 'module', 'state_dict')
# Prefixes left by DDP (`module.`) and torch.compile (`_orig_mod.`).
WRAPPER_PREFIXES = ('module.', '_orig_mod.')


class CheckpointMismatchError(ValueError):
  """The checkpoint's keys or shapes do not match the config assumed."""


class CheckpointReadError(ValueError):
  """A checkpoint file is missing, truncated, corrupt or of an unknown kind."""


# ---------------------------------------------------------------- reading ---


def _torch():
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
        'Reading PyTorch checkpoints needs torch: pip install '
        '"specdec-jax[torch]".') from e
  return torch


def _is_legacy_format_error(error: Exception) -> bool:
  """torch.load(mmap=True) on a pre-1.6 (non-zip) file fails with this error."""
  return isinstance(error, RuntimeError) and 'mmap' in str(error)


def load_raw_checkpoint(path: str | os.PathLike, *, trust_pickle: bool = False,
                        mmap: bool = False) -> Any:
  """Reads a `.pt/.pth/.bin/.ckpt` or `.safetensors` file as stored.

  Torch files are read with `weights_only=True` (argparse.Namespace, which
  LlamaGen stores under `args`, is allowed); tensors stay torch tensors.
  Safetensors files give a flat `{name: numpy array}` dict (bf16 as
  `ml_dtypes.bfloat16`), read without torch.

  Args:
    path: the checkpoint file.
    trust_pickle: read torch files with full unpickling when the safe loader
      refuses them (only for files from a source you trust).
    mmap: memory-map torch files (`torch.load(..., mmap=True)`): tensors are
      read from disk only when used, so a caller that needs a few tensors of a
      large file (a tokenizer inside an LLM checkpoint) never holds the rest.
      Files in the legacy (non-zip) format cannot be mapped and are read
      whole, with a warning.
  Returns:
    The object stored in the file.
  Raises:
    CheckpointReadError: the file is missing, truncated, corrupt or has an
      unknown suffix.
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise CheckpointReadError(
        f'Checkpoint file {str(path)!r} does not exist (or is not a file). '
        'Pass the path of a .pt/.pth/.bin or .safetensors file.')
  suffix = path.suffix.lower()
  if suffix in SAFETENSORS_SUFFIXES:
    from specdec_jax.converters import hf_streaming  # pylint: disable=g-import-not-at-top
    try:
      infos = hf_streaming.read_safetensors_header(path)
      return hf_streaming.read_safetensors_tensors(path, infos)
    except (OSError, ValueError, TypeError, KeyError) as e:
      raise CheckpointReadError(
          f'Could not read {str(path)!r} as a safetensors file (expected a '
          f'JSON header followed by tensor data; the file may be truncated or '
          f'corrupt, size {path.stat().st_size} bytes): {e}') from e
  if suffix not in TORCH_SUFFIXES:
    raise CheckpointReadError(
        f'Checkpoint file {str(path)!r} has suffix {suffix!r}; expected one of '
        f'{TORCH_SUFFIXES + SAFETENSORS_SUFFIXES}.')
  torch = _torch()

  def load(weights_only: bool, use_mmap: bool):
    with torch.serialization.safe_globals([argparse.Namespace]):
      return torch.load(str(path), map_location='cpu', weights_only=weights_only,
                        mmap=use_mmap)

  try:
    try:
      return load(True, mmap)
    except Exception as e:  # pylint: disable=broad-except
      if not (mmap and _is_legacy_format_error(e)):
        raise
      logging.warning('%s is in the legacy (non-zip) torch format and cannot be '
                      'memory-mapped; reading the whole file.', path)
      mmap = False
      return load(True, False)
  except Exception as e:  # pylint: disable=broad-except
    if isinstance(e, pickle.UnpicklingError) and trust_pickle:
      logging.warning('Safe loading of %s failed (%s); retrying with full '
                      'unpickling because trust_pickle=True.', path, e)
      return load(False, mmap)
    hint = ('; it holds objects the safe loader refuses: pass trust_pickle=True '
            '(--trust_pickle) if you trust its source'
            if isinstance(e, pickle.UnpicklingError) else '')
    raise CheckpointReadError(
        f'Could not read {str(path)!r} as a PyTorch checkpoint (expected a '
        f'torch.save zip archive; the file may be truncated or corrupt, size '
        f'{path.stat().st_size} bytes){hint}: {type(e).__name__}: {e}') from e


def _is_array(value: Any) -> bool:
  """A numpy array or torch tensor (a tensor implies torch is already imported)."""
  if isinstance(value, np.ndarray):
    return True
  torch = sys.modules.get('torch')
  return torch is not None and isinstance(value, torch.Tensor)


def unwrap_checkpoint(
    obj: Any,
    prefer: Sequence[str] = ('model',),
    *,
    use_ema: bool = False,
) -> dict[str, Any]:
  """Finds the flat weight dict inside a training checkpoint.

  Handles LlamaGen DDP dicts (`model`, optional `ema`, `optimizer`, `args`,
  `steps`), deepspeed (`module`), `state_dict` wrappers and raw (FSDP) state
  dicts that are already flat `{name: tensor}` mappings. `module.` and
  `_orig_mod.` prefixes shared by every key are stripped.

  Args:
    obj: what `load_raw_checkpoint` returned.
    prefer: wrapper keys to look at first, in order.
    use_ema: take the `ema` weights (error if the checkpoint has none).
  Returns:
    A flat `{name: tensor}` dict.
  Raises:
    CheckpointReadError: no weight dict is found, or `use_ema` without `ema`.
  """
  if not isinstance(obj, Mapping):
    raise CheckpointReadError(
        f'Expected the checkpoint to hold a dict, got {type(obj).__name__}.')
  if use_ema:
    if 'ema' not in obj:
      raise CheckpointReadError(
          f'use_ema=True but the checkpoint has no "ema" entry (top-level keys: '
          f'{sorted(map(str, obj))[:10]}). Convert without --use_ema.')
    state = obj['ema']
  else:
    state = None
    for key in tuple(prefer) + WRAPPER_KEYS:
      if key in obj and isinstance(obj[key], Mapping):
        state = obj[key]
        break
    if state is None:
      if obj and all(_is_array(v) for v in obj.values()):
        state = obj  # raw (FSDP consolidated) state dict
      else:
        raise CheckpointReadError(
            f'Could not find the weights in the checkpoint: none of '
            f'{tuple(prefer) + WRAPPER_KEYS} holds a dict and the top level is '
            f'not a flat tensor dict (top-level keys: '
            f'{sorted(map(str, obj))[:10]}).')
  state = {str(k): v for k, v in state.items()}
  for prefix in WRAPPER_PREFIXES:
    if state and all(k.startswith(prefix) for k in state):
      state = {k[len(prefix):]: v for k, v in state.items()}
  return state


def to_numpy(value: Any, *, upcast_bf16: bool = True) -> np.ndarray:
  """A torch tensor or array as numpy (zero-copy where the dtype allows).

  bf16 tensors become float32 (default) or `ml_dtypes.bfloat16` without a copy
  (`upcast_bf16=False`, for converting large checkpoints in low memory).
  """
  if isinstance(value, np.ndarray):
    if upcast_bf16 and value.dtype == jnp.bfloat16:
      return value.astype(np.float32)
    return value
  torch = _torch()
  tensor = value.detach().cpu()
  if tensor.dtype == torch.bfloat16:
    if upcast_bf16:
      return tensor.float().numpy()
    return tensor.view(torch.int16).numpy().view(jnp.bfloat16)
  return tensor.numpy()


def load_state_dict(
    path: str | os.PathLike,
    *,
    prefer: Sequence[str] = ('model',),
    use_ema: bool = False,
    upcast_bf16: bool = True,
    trust_pickle: bool = False,
) -> dict[str, np.ndarray]:
  """Reads a checkpoint file into a flat `{name: numpy array}` dict.

  Args:
    path: `.pt/.pth/.bin/.ckpt` or `.safetensors` file.
    prefer: wrapper keys tried first (see `unwrap_checkpoint`).
    use_ema: take the EMA weights of a training checkpoint.
    upcast_bf16: bf16 tensors become float32 (else ml_dtypes bfloat16).
    trust_pickle: see `load_raw_checkpoint`.
  Returns:
    Flat dict of numpy arrays in the original key layout; values that are not
    tensors (e.g. `_extra_state`) are dropped with a log line.
  """
  raw = load_raw_checkpoint(path, trust_pickle=trust_pickle)
  state = unwrap_checkpoint(raw, prefer, use_ema=use_ema)
  out = {}
  for name, value in state.items():
    if not _is_array(value):
      logging.info('Skipping non-tensor entry %r (%s) in %s.', name,
                   type(value).__name__, path)
      continue
    out[name] = to_numpy(value, upcast_bf16=upcast_bf16)
  return out


def drop_keys(state: Mapping[str, Any], substrings: Sequence[str]) -> dict[str, Any]:
  """Returns `state` without keys containing any of `substrings` (buffers)."""
  kept = {k: v for k, v in state.items() if not any(s in k for s in substrings)}
  if len(kept) != len(state):
    logging.info('Dropped %d non-weight entries (%s).', len(state) - len(kept),
                 ', '.join(substrings))
  return kept


# ------------------------------------------------------------- validation ---


def shapes_of(state: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
  """`{name: shape}` of a state dict."""
  return {k: tuple(int(d) for d in np.shape(v)) for k, v in state.items()}


def _listing(items: list[str], limit: int = 25) -> str:
  shown = '\n'.join(f'    {item}' for item in items[:limit])
  if len(items) > limit:
    shown += f'\n    ... and {len(items) - limit} more'
  return shown


def validate_keys(
    found: Mapping[str, Sequence[int]],
    expected: Mapping[str, Sequence[int]],
    *,
    what: str,
    hint: str = '',
) -> None:
  """Checks that a checkpoint has exactly the expected keys and shapes.

  Args:
    found: `{name: shape}` of the checkpoint (after dropping buffers).
    expected: `{name: shape}` the assumed config needs.
    what: the config assumed, e.g. "LlamaGen GPT-B c2i, 256 tokens".
    hint: appended to the message (e.g. which flag to change).
  Raises:
    CheckpointMismatchError: listing missing keys, unexpected keys and
      mis-shaped keys (expected vs found).
  """
  found = {k: tuple(v) for k, v in found.items()}
  expected = {k: tuple(v) for k, v in expected.items()}
  missing = sorted(set(expected) - set(found))
  unexpected = sorted(set(found) - set(expected))
  misshaped = sorted(k for k in set(found) & set(expected) if found[k] != expected[k])
  if not (missing or unexpected or misshaped):
    return
  parts = [f'Checkpoint does not match {what}: {len(missing)} missing, '
           f'{len(unexpected)} unexpected, {len(misshaped)} mis-shaped key(s) '
           f'(checkpoint has {len(found)} keys, the config expects '
           f'{len(expected)}).']
  if missing:
    parts.append('  missing keys:\n' + _listing(
        [f'{k} (expected shape {expected[k]})' for k in missing]))
  if unexpected:
    parts.append('  unexpected keys:\n' + _listing(
        [f'{k} (shape {found[k]})' for k in unexpected]))
  if misshaped:
    parts.append('  mis-shaped keys:\n' + _listing(
        [f'{k}: expected {expected[k]}, found {found[k]}' for k in misshaped]))
  if hint:
    parts.append(hint)
  raise CheckpointMismatchError('\n'.join(parts))


# ---------------------------------------------------------------- progress ---


class Progress:
  """Logs "converting 37/88 tensors" about `num_logs` times over a loop."""

  def __init__(self, total: int, what: str = 'tensors', verb: str = 'converting',
               num_logs: int = 10):
    self.total = total
    self.what = what
    self.verb = verb
    self.count = 0
    self._every = max(1, total // max(1, num_logs))

  def step(self, name: str = '') -> None:
    self.count += 1
    if self.count % self._every == 0 or self.count == self.total:
      logging.info('%s %d/%d %s%s', self.verb, self.count, self.total, self.what,
                   f' ({name})' if name else '')


# --------------------------------------------------------- params helpers ---


def cast_params(params: Any, dtype: Any) -> Any:
  """Casts every floating leaf to `dtype` ('float32', 'bfloat16', ...); ints stay."""
  if dtype is None:
    return params
  target = jnp.dtype(dtype)

  def cast(leaf):
    if jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
      if isinstance(leaf, np.ndarray):
        return leaf.astype(target, copy=False)
      return jnp.asarray(leaf).astype(target)
    return leaf

  return jax.tree_util.tree_map(cast, params)


def params_dtype(params: Any) -> str:
  """Name of the floating dtype(s) in a param tree, e.g. 'float32'."""
  dtypes = sorted({str(jnp.result_type(x)) for x in jax.tree_util.tree_leaves(params)
                   if jnp.issubdtype(jnp.result_type(x), jnp.floating)})
  return ','.join(dtypes) or 'none'


def count_params(params: Any) -> int:
  return int(sum(np.size(x) for x in jax.tree_util.tree_leaves(params)))


# ------------------------------------------------------------ writing ---


def sha256_file(path: str | os.PathLike, chunk_bytes: int = 1 << 22) -> str:
  """Hex sha256 of a file, read in chunks."""
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(chunk_bytes), b''):
      digest.update(chunk)
  return digest.hexdigest()


def _jsonable(config: Any) -> Any:
  if dataclasses.is_dataclass(config) and not isinstance(config, type):
    config = dataclasses.asdict(config)
  if hasattr(config, 'to_dict'):  # ml_collections.ConfigDict
    config = config.to_dict()
  return json.loads(json.dumps(config, default=str))


def write_params_atomic(
    out_dir: str | os.PathLike,
    params: Any,
    *,
    config: Any,
    source_files: Sequence[str | os.PathLike],
    converter: str = '',
    extra_meta: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    use_ocdbt: bool = False,
    consume: bool = False,
) -> pathlib.Path:
  """Writes an Orbax checkpoint of `params` plus `specdec_meta.json`, atomically.

  Everything is written into a temporary sibling folder
  (`<parent>/.<name>.tmp-<id>`) which is renamed to `out_dir` at the end. On
  any exception the temporary folder is removed, so `out_dir` either holds a
  complete checkpoint or does not exist.

  Args:
    out_dir: destination folder; must not exist unless `overwrite`.
    params: the param pytree (numpy or jax arrays).
    config: the model config (dataclass, ConfigDict or dict), stored in meta.
    source_files: files converted; their sha256 and size are recorded.
    converter: name of the converter (stored in meta).
    extra_meta: more JSON-serialisable metadata.
    overwrite: replace an existing `out_dir`.
    use_ocdbt: Orbax's OCDBT format. Off by default: one file per array keeps
      peak host memory near 1.2x the checkpoint, while OCDBT buffers a second
      copy while saving (bench/convert_memory.py measured 1.8x for 2 GB).
    consume: pop the top-level entries of a dict `params` as they are written
      (the caller's dict is emptied), so converted weights are not held twice.
  Returns:
    The absolute path of `out_dir`.
  Raises:
    FileExistsError: `out_dir` exists and `overwrite` is False.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  out_dir = pathlib.Path(out_dir).absolute()
  if out_dir.exists() and not overwrite:
    raise FileExistsError(
        f'Output folder {str(out_dir)!r} already exists. Choose another '
        '--output or pass --overwrite.')
  out_dir.parent.mkdir(parents=True, exist_ok=True)
  tmp_dir = out_dir.parent / f'.{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}'
  try:
    tmp_dir.mkdir()
    meta = {
        'converter': converter,
        'config': _jsonable(config),
        'dtype': params_dtype(params),
        'num_params': count_params(params),
        'date': datetime.datetime.now(datetime.timezone.utc).isoformat(),
        'source_files': [],
    }
    for source in source_files:
      logging.info('hashing %s', source)
      meta['source_files'].append({
          'path': str(pathlib.Path(source).absolute()),
          'sha256': sha256_file(source),
          'bytes': os.path.getsize(source),
      })
    if extra_meta:
      meta.update(_jsonable(dict(extra_meta)))
    logging.info('writing %d parameters (%s) to %s', meta['num_params'],
                 meta['dtype'], out_dir)
    checkpointer = (ocp.StandardCheckpointer() if use_ocdbt
                    else ocp.StandardCheckpointer(use_ocdbt=False))
    if isinstance(params, Mapping) and params:
      # One Orbax item per top-level entry (a layer, the embeddings, ...): the
      # save buffers one entry at a time, and with `consume` each entry is
      # released once written, so peak host memory stays near one copy.
      meta['params_layout'] = PER_KEY_LAYOUT
      meta['params_keys'] = [str(k) for k in params]
      progress = Progress(len(meta['params_keys']), what='parameter groups', verb='writing')
      for name in list(params):
        entry = params.pop(name) if consume else params[name]
        checkpointer.save(tmp_dir / PARAMS_SUBDIR / str(name), {'value': entry})
        checkpointer.wait_until_finished()
        del entry
        progress.step(str(name))
    else:
      checkpointer.save(tmp_dir / PARAMS_SUBDIR, params)
      checkpointer.wait_until_finished()
    checkpointer.close()
    with open(tmp_dir / META_FILENAME, 'w') as f:
      json.dump(meta, f, indent=2, sort_keys=True)
    if out_dir.exists():  # overwrite=True: move the old one aside first
      trash = out_dir.parent / f'.{out_dir.name}.old-{uuid.uuid4().hex[:8]}'
      os.rename(out_dir, trash)
      os.rename(tmp_dir, out_dir)
      shutil.rmtree(trash, ignore_errors=True)
    else:
      os.rename(tmp_dir, out_dir)
  except BaseException:
    shutil.rmtree(tmp_dir, ignore_errors=True)
    raise
  logging.info('wrote %s', out_dir)
  return out_dir


def read_meta(out_dir: str | os.PathLike) -> dict[str, Any]:
  """The `specdec_meta.json` of a converted checkpoint."""
  path = pathlib.Path(out_dir) / META_FILENAME
  if not path.is_file():
    raise CheckpointReadError(
        f'{str(out_dir)!r} is not a converted specdec checkpoint: {META_FILENAME} '
        'is missing. Run a converter (python -m specdec_jax.converters.<model>) '
        'first.')
  with open(path) as f:
    return json.load(f)


def load_params(out_dir: str | os.PathLike, dtype: Any = None) -> tuple[Any, dict[str, Any]]:
  """Reads a folder written by `write_params_atomic`.

  Args:
    out_dir: the converted checkpoint folder.
    dtype: cast floating leaves to this dtype (default: as stored).
  Returns:
    (params pytree of numpy arrays, metadata dict). Jitted calls move them to
    the device; `jax.device_put(params, shardings)` shards them.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  out_dir = pathlib.Path(out_dir).absolute()
  meta = read_meta(out_dir)
  checkpointer = ocp.StandardCheckpointer()
  if meta.get('params_layout') == PER_KEY_LAYOUT:
    params = {name: checkpointer.restore(out_dir / PARAMS_SUBDIR / name)['value']
              for name in meta['params_keys']}
  else:
    params = checkpointer.restore(out_dir / PARAMS_SUBDIR)
  checkpointer.close()
  return cast_params(params, dtype), meta
