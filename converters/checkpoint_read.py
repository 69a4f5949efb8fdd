"""Reading released checkpoint files: torch `.pt/.pth/.bin/.ckpt` and safetensors.

`load_state_dict` reads a file (`load_raw_checkpoint`), finds the weights
inside a training checkpoint (`unwrap_checkpoint`: LlamaGen's `model`/`ema`,
deepspeed `module`, `state_dict` wrappers, raw FSDP dicts, `module.` /
`_orig_mod.` prefixes) and gives numpy arrays (`to_numpy`). Part of
`specdec_jax.converters.common`, which re-exports every public name.

Legend: a "state dict" is a flat `{name: array}` mapping in the original
(PyTorch) key layout.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import pickle
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from absl import logging
import jax.numpy as jnp
import numpy as np

TORCH_SUFFIXES = ('.pt', '.pth', '.bin', '.ckpt')
SAFETENSORS_SUFFIXES = ('.safetensors',)

# Top-level keys of training checkpoints that wrap the weights, most preferred
# first after the caller's own preference: LlamaGen DDP (`model`, `ema`),
# deepspeed (`module`), Lightning/taming (`state_dict`).
WRAPPER_KEYS = ('model', 'module', 'state_dict')
# Prefixes left by DDP (`module.`) and torch.compile (`_orig_mod.`).
WRAPPER_PREFIXES = ('module.', '_orig_mod.')
# Buffers beside the weights that are no weights: torch.optim.swa_utils.AveragedModel
# (an EMA) keeps its update count with its `module.*` weights.
NON_WEIGHT_KEYS = ('n_averaged',)
# How deep wrappers may nest ({'state_dict': {'model': {...}}} is 2).
_MAX_WRAPPER_DEPTH = 3


class CheckpointReadError(ValueError):
  """A checkpoint file is missing, truncated, corrupt or of an unknown kind."""


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


def _refused_by_safe_loader(error: Exception) -> bool:
  """The safe (weights_only) loader refused an object it does not allow, as opposed
  to failing on bytes that are no pickle at all (a corrupt file, where unpickling
  everything would not help)."""
  message = str(error)
  return isinstance(error, pickle.UnpicklingError) and any(
      marker in message for marker in ('Unsupported global', 'Unsupported class',
                                       'not an allowed global'))


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
    refused = _refused_by_safe_loader(e)
    if refused and trust_pickle:
      logging.warning('Safe loading of %s failed (%s); retrying with full '
                      'unpickling because trust_pickle=True.', path, e)
      return load(False, mmap)
    hint = ('; it holds objects the safe loader refuses: pass trust_pickle=True '
            '(--trust_pickle) if you trust its source' if refused else '')
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
  `steps`), deepspeed (`module`), `state_dict` wrappers (also nested, such as
  `{'state_dict': {'model': ...}}`; a wrapper key holding no tensor, such as a
  config under `model`, is passed over) and raw (FSDP) state dicts that are
  already flat `{name: tensor}` mappings. `module.` and `_orig_mod.` prefixes
  shared by every key are stripped, in any order and repeatedly
  (`_orig_mod.module.`), and an AveragedModel's `n_averaged` count is dropped.

  Args:
    obj: what `load_raw_checkpoint` returned.
    prefer: wrapper keys to look at first, in order.
    use_ema: take the `ema` weights (error if the checkpoint has none).
  Returns:
    A flat `{name: tensor}` dict.
  Raises:
    CheckpointReadError: no weight dict is found, or `use_ema` without `ema` (or
      an `ema` holding no tensor).
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
    if not _holds_tensors(state):
      raise CheckpointReadError(
          f'The checkpoint\'s "ema" entry holds no tensors ({type(state).__name__}'
          f'{_key_list(state)}); convert without --use_ema.')
  else:
    state = None
    found = _find_wrapped(obj, tuple(prefer) + WRAPPER_KEYS)
    if found is not None:
      where, state = found
      if isinstance(obj.get('ema'), Mapping):
        logging.info('converting the %r weights; the checkpoint also holds "ema" weights '
                     '(use_ema=True converts those).', where)
    elif obj and all(_is_array(v) for v in obj.values()):
      state = obj  # raw (FSDP consolidated) state dict
    if state is None:
      raise CheckpointReadError(
          f'Could not find the weights in the checkpoint: none of '
          f'{tuple(prefer) + WRAPPER_KEYS} (nested up to {_MAX_WRAPPER_DEPTH} deep) holds '
          f'a dict of tensors and the top level is not a flat tensor dict (top-level keys: '
          f'{sorted(map(str, obj))[:10]}).')
  state = {str(k): v for k, v in state.items() if str(k) not in NON_WEIGHT_KEYS}
  stripped = True
  while stripped:  # torch.compile(DDP(model)) leaves '_orig_mod.module.'
    stripped = False
    for prefix in WRAPPER_PREFIXES:
      if state and all(k.startswith(prefix) for k in state):
        state = {k[len(prefix):]: v for k, v in state.items()}
        stripped = True
  return state


def _holds_tensors(value: Any) -> bool:
  """A mapping with a tensor or array among its values (a state dict, not a config)."""
  return isinstance(value, Mapping) and any(_is_array(v) for v in value.values())


def _key_list(value: Any) -> str:
  return f' with keys {sorted(map(str, value))[:10]}' if isinstance(value, Mapping) else ''


def _find_wrapped(obj: Mapping, keys: Sequence[str],
                  depth: int = 1) -> tuple[str, Mapping] | None:
  """('state_dict/model', weights): the first wrapper key, in the order of keys and
  nested up to _MAX_WRAPPER_DEPTH deep, whose value holds tensors; or None."""
  for key in keys:
    value = obj.get(key)
    if _holds_tensors(value):
      return key, value
    if isinstance(value, Mapping) and depth < _MAX_WRAPPER_DEPTH:
      found = _find_wrapped(value, keys, depth + 1)
      if found is not None:
        return f'{key}/{found[0]}', found[1]
  return None


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


def read_json_object(path: str | os.PathLike) -> dict[str, Any]:
  """A JSON file holding an object (e.g. a release's config.json), as a dict.

  Raises:
    ValueError: naming the file, when it is not JSON or holds no object.
  """
  try:
    with open(path) as f:
      value = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f'{str(path)!r} is not valid JSON: {e}') from e
  if not isinstance(value, Mapping):
    raise ValueError(f'{str(path)!r} must hold a JSON object, got {type(value).__name__}.')
  return dict(value)


def drop_keys(state: Mapping[str, Any], substrings: Sequence[str]) -> dict[str, Any]:
  """Returns `state` without keys containing any of `substrings` (buffers)."""
  kept = {k: v for k, v in state.items() if not any(s in k for s in substrings)}
  if len(kept) != len(state):
    logging.info('Dropped %d non-weight entries (%s).', len(state) - len(kept),
                 ', '.join(substrings))
  return kept
