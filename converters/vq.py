"""Converts released VQ tokenizer checkpoints to Flax params for `models.vq`.

Kinds:
  llamagen_vq16    LlamaGen `vq_ds16_*.pt` ({'model': sd} or {'ema': sd}, or a
                   raw state dict); Janus-Pro checkpoints too: keys under
                   `gen_vision_model.` are taken and the prefix stripped.
  chameleon_vqgan  Chameleon / Lumina-mGPT `vqgan.ckpt` ({'state_dict': sd});
                   only encoder/decoder/quantize/quant_conv/post_quant_conv keys
                   are kept (the loss/discriminator entries are dropped).

Every key and shape is checked against the assumed config before anything is
written; the Orbax checkpoint and its `specdec_meta.json` (config, kind, source
sha256) are written atomically by `converters.common`.

Usage:
  python -m specdec_jax.converters.vq --input vq_ds16_c2i.pt --output out/vq16 \
      --kind llamagen_vq16 [--dtype float32] [--use_ema] [--config_json '{...}']

Legend: V codebook size, Cq codebook dim; conv weights are OIHW in PyTorch and
HWIO in Flax.
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from absl import app
from absl import flags
from absl import logging
import jax
import numpy as np

from specdec_jax.converters import common
from specdec_jax.models import vq

KINDS = ('llamagen_vq16', 'chameleon_vqgan')
CONVERTER_NAME = 'specdec_jax.converters.vq'
JANUS_PREFIX = 'gen_vision_model.'
# Buffers that are not weights (LlamaGen's codebook usage counter).
DROPPED_BUFFERS = ('quantize.codebook_used',)
KEPT_PREFIXES = ('encoder.', 'decoder.', 'quantize.', 'quant_conv.', 'post_quant_conv.')


def preset_config(kind: str, overrides: Mapping[str, Any] | None = None) -> vq.VQConfig:
  """The VQConfig a kind assumes, with optional field overrides."""
  if kind not in KINDS:
    raise ValueError(f'kind must be one of {KINDS}, got {kind!r}.')
  preset = vq.vq16_config if kind == 'llamagen_vq16' else vq.chameleon_vqgan_config
  return preset(**dict(overrides or {}))


# ------------------------------------------------------------ key mapping ---


def _llamagen_name(path: Sequence[str]) -> str:
  """Flax path ('decoder', 'conv_blocks_0', 'res_1', 'conv1', 'kernel') -> torch name."""
  if tuple(path) == ('quantize', 'embedding'):
    return 'quantize.embedding.weight'
  modules = [re.sub(r'_(\d+)$', r'.\1', part) for part in path[:-1]]
  leaf = {'kernel': 'weight', 'scale': 'weight', 'bias': 'bias'}[path[-1]]
  return '.'.join(modules + [leaf])


def _chameleon_name(llamagen_name: str, num_levels: int) -> str:
  """LlamaGen-style name -> the taming/Chameleon name of the same tensor."""
  name = llamagen_name
  for index, taming in (('0', 'block_1'), ('1', 'attn_1'), ('2', 'block_2')):
    name = re.sub(rf'^(encoder|decoder)\.mid\.{index}\.', rf'\1.mid.{taming}.', name)

  def encoder_level(m):
    part = {'res': 'block'}.get(m.group(2), m.group(2))
    return f'encoder.down.{m.group(1)}.{part}'

  def decoder_level(m):
    part = {'res': 'block'}.get(m.group(2), m.group(2))
    return f'decoder.up.{num_levels - 1 - int(m.group(1))}.{part}'

  name = re.sub(r'^encoder\.conv_blocks\.(\d+)\.(res|attn|downsample)', encoder_level, name)
  return re.sub(r'^decoder\.conv_blocks\.(\d+)\.(res|attn|upsample)', decoder_level, name)


def _torch_shape(path: Sequence[str], shape: Sequence[int]) -> tuple[int, ...]:
  if path[-1] == 'kernel':  # HWIO -> OIHW
    height, width, fan_in, fan_out = shape
    return (fan_out, fan_in, height, width)
  return tuple(shape)


def param_layout(
    config: vq.VQConfig, kind: str
) -> dict[str, tuple[tuple[str, ...], tuple[int, ...]]]:
  """{original torch name: (Flax path, original shape)} for every parameter."""
  shapes = vq.VQTokenizer(config).param_shapes()
  layout = {}
  for key_path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
    path = tuple(str(k.key) for k in key_path)
    name = _llamagen_name(path)
    if kind == 'chameleon_vqgan':
      name = _chameleon_name(name, len(config.ch_mult))
    layout[name] = (path, _torch_shape(path, leaf.shape))
  return layout


def expected_shapes(config: vq.VQConfig, kind: str) -> dict[str, tuple[int, ...]]:
  """{original torch name: shape} a checkpoint of this config must hold."""
  return {name: shape for name, (_, shape) in param_layout(config, kind).items()}


# -------------------------------------------------------------- filtering ---


def select_weights(state: Mapping[str, Any], kind: str) -> dict[str, Any]:
  """Drops what is not a tokenizer weight; strips Janus's `gen_vision_model.` prefix."""
  if any(k.startswith(JANUS_PREFIX) for k in state):
    logging.info('Found %s keys (Janus-Pro checkpoint): keeping only those.', JANUS_PREFIX)
    state = {k[len(JANUS_PREFIX):]: v for k, v in state.items() if k.startswith(JANUS_PREFIX)}
  state = common.drop_keys(state, DROPPED_BUFFERS)
  if kind == 'chameleon_vqgan':
    kept = {k: v for k, v in state.items() if k.startswith(KEPT_PREFIXES)}
    if len(kept) != len(state):
      dropped = sorted({k.split('.')[0] for k in state if k not in kept})
      logging.info('Dropped %d non-tokenizer entries (prefixes: %s).',
                   len(state) - len(kept), ', '.join(dropped))
    state = kept
  return dict(state)


def _kind_hint(found: Sequence[str], kind: str, config: vq.VQConfig) -> str:
  looks_chameleon = any('.up.' in k or '.down.' in k or 'mid.block_1' in k for k in found)
  looks_llamagen = any('conv_blocks.' in k for k in found)
  hints = []
  if kind == 'llamagen_vq16' and looks_chameleon and not looks_llamagen:
    hints.append('The keys use taming/Chameleon names (up./down./mid.block_1): '
                 'pass --kind chameleon_vqgan.')
  if kind == 'chameleon_vqgan' and looks_llamagen and not looks_chameleon:
    hints.append('The keys use LlamaGen names (conv_blocks.): pass --kind llamagen_vq16.')
  hints.append(f'Assumed config: {json.dumps(config.to_dict())}. A different '
               'architecture (e.g. VQ-8: ch_mult [1,2,2,4]) needs --config_json '
               'with the fields that differ.')
  return '\n'.join(hints)


# ------------------------------------------------------------- conversion ---


def convert_state_dict(
    state: Mapping[str, Any],
    config: vq.VQConfig,
    kind: str,
    *,
    dtype: Any = None,
    what: str | None = None,
) -> dict[str, Any]:
  """Validates a filtered state dict and returns the Flax param tree.

  Args:
    state: {original name: array} after `select_weights`.
    config: the architecture assumed.
    kind: one of KINDS (naming scheme).
    dtype: cast floating params to this dtype (default: keep).
    what: description for error messages.
  Returns:
    Nested dict of numpy arrays (conv kernels HWIO).
  Raises:
    common.CheckpointMismatchError: listing missing/unexpected/mis-shaped keys.
  """
  layout = param_layout(config, kind)
  common.validate_keys(
      common.shapes_of(state), {k: s for k, (_, s) in layout.items()},
      what=what or f'{kind} tokenizer', hint=_kind_hint(list(state), kind, config))
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


def _read_states(
    paths: Sequence[str], kind: str, use_ema: bool, trust_pickle: bool
) -> dict[str, Any]:
  """Reads and merges the tokenizer entries of one or more checkpoint files."""
  prefer = ('state_dict',) if kind == 'chameleon_vqgan' else ('model',)
  merged: dict[str, Any] = {}
  for path in paths:
    logging.info('reading %s', path)
    raw = common.load_raw_checkpoint(path, trust_pickle=trust_pickle)
    state = common.unwrap_checkpoint(raw, prefer, use_ema=use_ema)
    del raw
    state = {k: v for k, v in state.items() if hasattr(v, 'shape')}  # tensors only
    # Filter before converting to numpy so a Janus LLM shard costs no copies.
    merged.update(select_weights(state, kind))
  return merged


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
    inputs: checkpoint file, or several (Janus shards); entries are merged.
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
  output = pathlib.Path(output)
  if output.exists() and not overwrite:  # fail before the (slow) read
    raise FileExistsError(f'Output folder {str(output)!r} already exists. Choose '
                          'another --output or pass --overwrite.')
  config = preset_config(kind, config_overrides)
  state = _read_states(paths, kind, use_ema, trust_pickle)
  params = convert_state_dict(state, config, kind, dtype=dtype,
                              what=f'{kind} tokenizer ({", ".join(paths)})')
  del state
  return common.write_params_atomic(
      output, params, config=config, source_files=paths, converter=CONVERTER_NAME,
      extra_meta={'kind': kind, 'use_ema': use_ema}, overwrite=overwrite)


def load_tokenizer(out_dir: str | pathlib.Path, dtype: Any = None) -> tuple[vq.VQTokenizer, Any]:
  """Reads a converted tokenizer: (VQTokenizer, params)."""
  params, meta = common.load_params(out_dir, dtype)
  try:
    config = vq.VQConfig.from_dict(meta['config'])
  except (KeyError, TypeError, ValueError) as e:
    raise common.CheckpointReadError(
        f'{str(out_dir)!r} (written by {meta.get("converter")!r}) does not hold a '
        f'VQ tokenizer: its config is not a VQConfig ({e}).') from e
  return vq.VQTokenizer(config), params


# -------------------------------------------------------------------- CLI ---

def define_flags() -> None:
  """Defines the command-line flags (only when run as a program, so importing
  this module next to other converters does not clash on flag names)."""
  flags.DEFINE_list('input', None, 'Checkpoint file(s): .pt/.pth/.bin/.ckpt/.safetensors; '
                    'several for sharded Janus checkpoints.')
  flags.DEFINE_string('output', None, 'Output folder (must not exist).')
  flags.DEFINE_enum('kind', None, KINDS, 'Checkpoint family.')
  flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Output param dtype.')
  flags.DEFINE_string('config_json', None, 'JSON object of VQConfig fields overriding the preset.')
  flags.DEFINE_bool('use_ema', False, 'LlamaGen: convert the EMA weights.')
  flags.DEFINE_bool('overwrite', False, 'Replace an existing output folder.')
  flags.DEFINE_bool('trust_pickle', False, 'Allow full unpickling of trusted torch files.')
  flags.mark_flags_as_required(['input', 'output', 'kind'])


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected positional arguments: {argv[1:]}.')
  values = flags.FLAGS
  overrides = json.loads(values.config_json) if values.config_json else None
  out = convert(values.input, values.output, values.kind, dtype=values.dtype,
                config_overrides=overrides, use_ema=values.use_ema,
                overwrite=values.overwrite, trust_pickle=values.trust_pickle)
  print(out)


if __name__ == '__main__':
  define_flags()
  app.run(main)
