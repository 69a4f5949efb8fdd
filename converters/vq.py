r"""Converts released VQ tokenizer checkpoints to Flax params for `models.vq`.

Kinds:
  llamagen_vq16    LlamaGen `vq_ds16_*.pt` ({'model': sd} or {'ema': sd}, or a
                   raw state dict); Janus-Pro checkpoints too (the tokenizer is
                   stored under `gen_vision_model.`; its images are cast to
                   uint8 as Janus's code does, `uint8_style='chameleon'`).
  chameleon_vqgan  Chameleon / Lumina-mGPT `vqgan.ckpt` ({'state_dict': sd});
                   only encoder/decoder/quantize/quant_conv/post_quant_conv keys
                   are kept (the loss/discriminator entries are dropped).

Tokenizers inside language-model checkpoints. When the keys carry one of
`TOKENIZER_PREFIXES` (`model.vqmodel.`, `vqmodel.`, `gen_vision_model.`), only
the keys under it are read and the prefix is stripped. Such checkpoints are
large, so nothing else is loaded: `.bin/.pt` files are memory-mapped
(`torch.load(..., mmap=True)`), safetensors files are read tensor by tensor
at their header offsets, and a Hugging Face folder (`--input` a directory with
an index and shards) is streamed shard by shard; only the tokenizer's tensors
are materialised. Hugging Face Chameleon / Lumina-mGPT checkpoints keep only
the VQ *encoder* under `model.vqmodel.` (convert the decoder from Meta's
`vqgan.ckpt`), and transformers' native Janus layout renames the VQ keys (not
supported; use the original release's `gen_vision_model.*`).

Every key and shape is checked against the assumed config before anything is
written; the Orbax checkpoint and its `specdec_meta.json` (config, kind, source
sha256) are written atomically by `converters.common`.

Usage:
  python -m specdec_jax.converters.vq --input vq_ds16_c2i.pt --output out/vq16 \
      --kind llamagen_vq16 [--dtype float32] [--use_ema] [--config_json '{...}']

LlamaGen's VQ-8 (`vq_ds8_c2i.pt`) is the same architecture with one stride-2
step fewer: `--config_json '{"ch_mult": [1, 2, 2, 4], "attn_levels": [3]}'`
(attention at the last level, as in FoundationVision/LlamaGen
`tokenizer/tokenizer_image/vq_model.py`).

Legend: V codebook size, Cq codebook dim; conv weights are OIHW in PyTorch and
HWIO in Flax.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from absl import app
from absl import flags
from absl import logging
import numpy as np

from specdec_jax.converters import command
from specdec_jax.converters import common
from specdec_jax.converters import hf_streaming
# Kinds, presets, key mapping and filtering live in vq_keys; re-exported here.
from specdec_jax.converters.vq_keys import (DROPPED_BUFFERS, JANUS_PREFIX, KEPT_PREFIXES, KINDS,
                                            CONVERTER_NAME, TOKENIZER_PREFIXES, VQ8_OVERRIDES,
                                            _chameleon_name, _kind_hint, _llamagen_name,
                                            _selected_names, _torch_shape, expected_shapes,
                                            param_layout, preset_config, select_weights,
                                            tokenizer_prefix)
from specdec_jax.models import patch_tokenizer
from specdec_jax.models import vq


# ------------------------------------------------------------- conversion ---


def convert_state_dict(
    state: Mapping[str, Any],
    config: vq.VQConfig,
    kind: str,
    *,
    dtype: Any = None,
    what: str | None = None,
    prefix: str = '',
) -> dict[str, Any]:
  """Validates a filtered state dict and returns the Flax param tree.

  Args:
    state: {original name: array} after `select_weights`.
    config: the architecture assumed.
    kind: one of KINDS (naming scheme).
    dtype: cast floating params to this dtype (default: keep).
    what: description for error messages.
    prefix: the prefix the keys were stored under (for the hint).
  Returns:
    Nested dict of numpy arrays (conv kernels HWIO).
  Raises:
    common.CheckpointMismatchError: listing missing/unexpected/mis-shaped keys.
  """
  layout = param_layout(config, kind)
  common.validate_keys(
      common.shapes_of(state), {k: s for k, (_, s) in layout.items()},
      what=what or f'{kind} tokenizer', hint=_kind_hint(list(state), kind, config, prefix))
  params: dict[str, Any] = {}
  progress = common.Progress(len(layout), 'tensors')
  for name, (path, _) in layout.items():
    value = common.to_numpy(state[name])
    if path[-1] == 'kernel':
      value = np.ascontiguousarray(np.transpose(value, (2, 3, 1, 0)))  # OIHW -> HWIO
    node = params
    for part in path[:-1]:
      node = node.setdefault(part, {})
    node[path[-1]] = value
    progress.step(name)
  return common.cast_params(params, dtype)


@dataclasses.dataclass
class LazySource:
  """One input opened without reading tensor data.

  Attributes:
    path: the file or folder.
    names: every tensor name it holds.
    read: `names -> {name: tensor}`, materialising only those (memory-mapped
      torch tensors, or numpy arrays read at their safetensors offsets).
    files: the files behind it (recorded with their sha256).
  """

  path: pathlib.Path
  names: list[str]
  read: Callable[[Sequence[str]], dict[str, Any]]
  files: list[pathlib.Path]


def open_source(path: str | pathlib.Path, kind: str, *, use_ema: bool = False,
                trust_pickle: bool = False) -> LazySource:
  """Opens one checkpoint file or Hugging Face folder without reading its tensors."""
  path = pathlib.Path(path)
  if path.is_dir():
    if use_ema:
      raise ValueError(f'--use_ema: {str(path)!r} is a Hugging Face folder, which has no '
                       'EMA weights; convert without --use_ema.')
    ckpt = hf_streaming.open_checkpoint(path)

    def read_folder(names):
      wanted = set(names)
      return dict(hf_streaming.iter_tensors(ckpt, keep=wanted.__contains__))

    return LazySource(path, list(ckpt.tensors), read_folder, ckpt.files)
  if path.is_file() and path.suffix.lower() in common.SAFETENSORS_SUFFIXES:
    if use_ema:
      raise ValueError(f'--use_ema: {str(path)!r} is a safetensors file, which has no '
                       'EMA weights; convert without --use_ema.')
    try:
      infos = hf_streaming.read_safetensors_header(path)
    except (common.CheckpointReadError, OSError, KeyError, TypeError) as e:
      raise common.CheckpointReadError(
          f'Could not read {str(path)!r} as a safetensors file (the file may be truncated '
          f'or corrupt): {e}') from e
    return LazySource(path, list(infos),
                      lambda names: hf_streaming.read_safetensors_tensors(path, infos, names),
                      [path])
  prefer = ('state_dict',) if kind == 'chameleon_vqgan' else ('model',)
  raw = common.load_raw_checkpoint(path, trust_pickle=trust_pickle, mmap=True)
  state = common.unwrap_checkpoint(raw, prefer, use_ema=use_ema)
  del raw
  tensors = {k: v for k, v in state.items() if hasattr(v, 'shape')}  # tensors only
  return LazySource(path, list(tensors), lambda names: {n: tensors[n] for n in names},
                    [path])


def read_tokenizer_state(
    paths: Sequence[str | pathlib.Path], kind: str, *, use_ema: bool = False,
    trust_pickle: bool = False,
) -> tuple[dict[str, Any], str, list[pathlib.Path]]:
  """Reads the tokenizer entries of one or more checkpoints, and nothing else.

  Args:
    paths: checkpoint files (`.pt/.pth/.bin/.ckpt/.safetensors`) or Hugging
      Face folders (index + shards); entries of several are merged.
    kind: one of KINDS.
    use_ema: LlamaGen training checkpoints: the `ema` weights.
    trust_pickle: see `common.load_raw_checkpoint`.
  Returns:
    ({tokenizer name: tensor}, the prefix stripped ('' if none), the files read).
  Raises:
    common.CheckpointReadError: unreadable input, tokenizer keys under two
      different prefixes, or a tokenizer tensor in more than one input.
  """
  sources = []
  for path in paths:
    logging.info('opening %s', path)
    sources.append(open_source(path, kind, use_ema=use_ema, trust_pickle=trust_pickle))
  prefix = tokenizer_prefix(n for source in sources for n in source.names)
  if prefix:
    logging.info('Tokenizer keys are stored under %r: reading only those.', prefix)
  selections = [_selected_names(source.names, kind, prefix) for source in sources]
  seen: dict[str, list[str]] = {}
  for source, selected in zip(sources, selections):
    for name in selected.values():
      seen.setdefault(name, []).append(str(source.path))
  in_several = {name: where for name, where in seen.items() if len(where) > 1}
  if in_several:
    name, where = sorted(in_several.items())[0]
    raise common.CheckpointReadError(
        f'{len(in_several)} tokenizer tensor(s) are in more than one input, such as '
        f'{name!r} in {where}: {sorted(in_several)[:10]}. Pass each tensor once (one '
        'checkpoint, or the shards of one checkpoint).')
  merged: dict[str, Any] = {}
  files: list[pathlib.Path] = []
  for source, selected in zip(sources, selections):
    skipped = len(source.names) - len(selected)
    if skipped:
      logging.info('%s: reading %d tokenizer tensors, skipping %d others.', source.path,
                   len(selected), skipped)
    values = source.read(list(selected)) if selected else {}
    merged.update({selected[name]: value for name, value in values.items()})
    files.extend(source.files)
  return merged, prefix, files


def convert(
    inputs: str | pathlib.Path | Sequence[str | pathlib.Path],
    output: str | pathlib.Path,
    kind: str,
    *,
    dtype: str = 'float32',
    config_overrides: Mapping[str, Any] | None = None,
    use_ema: bool = False,
    overwrite: bool = False,
    trust_pickle: bool = False,
) -> pathlib.Path:
  """Reads, validates and writes one tokenizer checkpoint.

  Args:
    inputs: checkpoint file or Hugging Face folder, or several (Janus shards);
      entries are merged.
    output: destination folder (created atomically).
    kind: one of KINDS.
    dtype: output parameter dtype ('float32' or 'bfloat16').
    config_overrides: VQConfig fields that differ from the kind's preset.
    use_ema: LlamaGen: take the `ema` weights instead of `model`.
    overwrite: replace an existing output folder.
    trust_pickle: see `common.load_raw_checkpoint`.
  Returns:
    The output folder.
  """
  if kind not in KINDS:
    raise ValueError(f'--kind must be one of {KINDS}, got {kind!r}.')
  if dtype not in ('float32', 'bfloat16'):
    raise ValueError(f'--dtype must be float32 or bfloat16, got {dtype!r}.')
  paths = [str(inputs)] if isinstance(inputs, (str, pathlib.Path)) else [str(p) for p in inputs]
  if not paths:
    raise ValueError('--input: give at least one checkpoint file.')
  output = common.check_output_dir(output, overwrite)  # fail before the (slow) read
  config = preset_config(kind, config_overrides)
  state, prefix, files = read_tokenizer_state(paths, kind, use_ema=use_ema,
                                              trust_pickle=trust_pickle)
  if prefix == JANUS_PREFIX and 'uint8_style' not in (config_overrides or {}):
    # Janus's generation_inference.py writes clip((x + 1) / 2 * 255) cast to
    # uint8, LlamaGen's own scripts 127.5 x + 128: one grey level apart.
    config = dataclasses.replace(config, uint8_style='chameleon')
  params = convert_state_dict(state, config, kind, dtype=dtype, prefix=prefix,
                              what=f'{kind} tokenizer ({", ".join(paths)})')
  del state
  return common.write_params_atomic(
      output, params, config=config, source_files=files, converter=CONVERTER_NAME,
      extra_meta={'kind': kind, 'use_ema': use_ema, 'tokenizer_prefix': prefix},
      overwrite=overwrite)


def load_tokenizer(out_dir: str | pathlib.Path, dtype: Any = None) -> tuple[Any, Any]:
  """Reads a converted or trained tokenizer: (VQTokenizer or PatchTokenizer, params)."""
  held = common.read_meta(out_dir).get('model')
  if held:  # a tokenizer's metadata has a `kind` instead: refused before reading weights
    raise common.CheckpointReadError(
        f'{str(out_dir)!r} holds a {held!r} checkpoint, not a tokenizer; convert one with '
        'python -m specdec_jax.converters.vq.')
  params, meta = common.load_params(out_dir, dtype)
  if isinstance(meta.get('config'), dict) and meta['config'].get('kind') == 'patch_kmeans':
    config = patch_tokenizer.PatchTokenizerConfig.from_dict(meta['config'])
    tokenizer = patch_tokenizer.PatchTokenizer(config)
    tokenizer.codebook(params)  # validates the codebook shape
    return tokenizer, params
  try:
    config = vq.VQConfig.from_dict(meta['config'])
  except (KeyError, TypeError, ValueError) as e:
    raise common.CheckpointReadError(
        f'{str(out_dir)!r} (written by {meta.get("converter")!r}) does not hold a '
        f'VQ tokenizer: its config is not a VQConfig ({e}).') from e
  tokenizer = vq.VQTokenizer(config)
  common.check_loaded_params(params, tokenizer.param_shapes(), what='VQ tokenizer',
                             where=out_dir)
  return tokenizer, params


# -------------------------------------------------------------------- CLI ---

def define_flags() -> None:
  """Defines the command-line flags (only when run as a program, so importing
  this module next to other converters does not clash on flag names)."""
  flags.DEFINE_list('input', None, 'Checkpoint file(s): .pt/.pth/.bin/.ckpt/.safetensors, '
                    'or a Hugging Face folder (index + shards); several files for '
                    'sharded Janus checkpoints.')
  flags.DEFINE_string('output', None, 'Output folder (must not exist).')
  flags.DEFINE_enum('kind', None, KINDS, 'Checkpoint family.')
  flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Output param dtype.')
  flags.DEFINE_string('config_json', None, 'JSON object of VQConfig fields overriding the preset.')
  flags.DEFINE_bool('use_ema', False, 'LlamaGen: convert the EMA weights.')
  flags.DEFINE_bool('overwrite', False, command.OVERWRITE_HELP)
  flags.DEFINE_bool('trust_pickle', False, 'Allow full unpickling of trusted torch files.')
  flags.mark_flags_as_required(['input', 'output', 'kind'])


def parse_config_json(text: str | None) -> dict[str, Any] | None:
  """--config_json as a dict of VQConfig overrides (UsageError naming the flag)."""
  if not text:
    return None
  try:
    overrides = json.loads(text)
  except json.JSONDecodeError as e:
    raise app.UsageError(f'--config_json is not valid JSON ({e}): {text!r}. Pass an object '
                         f'of VQConfig fields, e.g. {json.dumps(VQ8_OVERRIDES)!r}.') from e
  if not isinstance(overrides, dict):
    raise app.UsageError(f'--config_json must be a JSON object of VQConfig fields, got '
                         f'{text!r}.')
  return overrides


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected positional arguments: {argv[1:]}.')
  values = flags.FLAGS
  overrides = parse_config_json(values.config_json)
  try:
    preset_config(values.kind, overrides)  # config errors before any file is read
  except ValueError as e:
    raise app.UsageError(f'--config_json: {e}') from e
  try:
    common.check_output_dir(values.output, values.overwrite)
  except (ValueError, FileExistsError) as e:
    raise app.UsageError(str(e)) from e
  out = convert(values.input, values.output, values.kind, dtype=values.dtype,
                config_overrides=overrides, use_ema=values.use_ema,
                overwrite=values.overwrite, trust_pickle=values.trust_pickle)
  print(out)


if __name__ == '__main__':
  define_flags()
  command.run(main)
