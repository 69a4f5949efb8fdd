"""VQ checkpoint key mapping: kinds, presets, PyTorch <-> Flax names and shapes, key filtering.

Legend: V codebook size, Cq codebook dim; conv weights are OIHW in PyTorch and HWIO in Flax.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from absl import logging
import jax

from specdec_jax.converters import common
from specdec_jax.models import vq

KINDS = ('llamagen_vq16', 'chameleon_vqgan')
CONVERTER_NAME = 'specdec_jax.converters.vq'
JANUS_PREFIX = 'gen_vision_model.'
# Prefixes under which language-model checkpoints store their tokenizer:
# Hugging Face Chameleon / Lumina-mGPT (`model.vqmodel.`, encoder only), the
# same without the outer module (`vqmodel.`), Janus-Pro (`gen_vision_model.`).
TOKENIZER_PREFIXES = ('model.vqmodel.', 'vqmodel.', JANUS_PREFIX)
# LlamaGen VQ-8: VQ-16 with one level fewer; attention stays at the last level.
VQ8_OVERRIDES = {'ch_mult': [1, 2, 2, 4], 'attn_levels': [3]}
# Buffers that are not weights (LlamaGen's codebook usage counter).
DROPPED_BUFFERS = ('quantize.codebook_used',)
KEPT_PREFIXES = ('encoder.', 'decoder.', 'quantize.', 'quant_conv.', 'post_quant_conv.')


def preset_config(kind: str, overrides: Mapping[str, Any] | None = None) -> vq.VQConfig:
  """The VQConfig a kind assumes, with optional field overrides.

  Raises:
    ValueError: unknown kind, overrides that are not a mapping, unknown field
      names (listed with the known ones), or values VQConfig rejects (the
      message names the field).
  """
  if kind not in KINDS:
    raise ValueError(f'kind must be one of {KINDS}, got {kind!r}.')
  if overrides is not None and not isinstance(overrides, Mapping):
    raise ValueError(f'config overrides must be a JSON object of VQConfig fields, got '
                     f'{type(overrides).__name__} {overrides!r}.')
  overrides = dict(overrides or {})
  names = {f.name for f in dataclasses.fields(vq.VQConfig)}
  unknown = sorted(set(overrides) - names)
  if unknown:
    raise ValueError(f'config overrides: unknown VQConfig field(s) {unknown}; known '
                     f'fields: {sorted(names)}.')
  values = {k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()}
  preset = vq.vq16_config if kind == 'llamagen_vq16' else vq.chameleon_vqgan_config
  try:
    return preset(**values)
  except (TypeError, ValueError) as e:
    raise ValueError(f'config overrides {overrides}: {e}') from e


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


def tokenizer_prefix(names: Iterable[str]) -> str:
  """The `TOKENIZER_PREFIXES` entry the tokenizer's keys are stored under ('' if none).

  Raises:
    common.CheckpointReadError: keys under two different known prefixes.
  """
  names = list(names)
  found = [p for p in TOKENIZER_PREFIXES if any(n.startswith(p) for n in names)]
  if len(found) > 1:
    raise common.CheckpointReadError(
        f'The checkpoint has tokenizer keys under several prefixes {found}; cannot tell '
        'which tokenizer to convert. Pass a checkpoint holding one tokenizer.')
  return found[0] if found else ''


def _selected_names(names: Iterable[str], kind: str, prefix: str) -> dict[str, str]:
  """{stored name: tokenizer name} of the entries to convert (prefix stripped,
  buffers and, for the VQGAN, loss/discriminator entries dropped)."""
  selected = {}
  for name in names:
    if prefix:
      if not name.startswith(prefix):
        continue
      short = name[len(prefix):]
    else:
      short = name
    if any(b in short for b in DROPPED_BUFFERS):
      continue
    if kind == 'chameleon_vqgan' and not short.startswith(KEPT_PREFIXES):
      continue
    selected[name] = short
  return selected


def select_weights(state: Mapping[str, Any], kind: str) -> dict[str, Any]:
  """Keeps the tokenizer's entries of `state`, with a known prefix stripped.

  Entries under one of `TOKENIZER_PREFIXES` (if any key has one) are kept
  and renamed; buffers (`quantize.codebook_used`) are dropped; for
  `chameleon_vqgan` so is everything outside encoder/decoder/quantize/
  quant_conv/post_quant_conv. Values are not touched (no copies).
  """
  prefix = tokenizer_prefix(state)
  selected = _selected_names(state, kind, prefix)
  if prefix:
    logging.info('Found keys under %r: keeping only those (%d of %d entries).', prefix,
                 len(selected), len(state))
  elif len(selected) != len(state):
    dropped = sorted({k.split('.')[0] for k in state if k not in selected})
    logging.info('Dropped %d non-tokenizer entries (prefixes: %s).',
                 len(state) - len(selected), ', '.join(dropped))
  return {short: state[name] for name, short in selected.items()}


def _kind_hint(found: Sequence[str], kind: str, config: vq.VQConfig, prefix: str = '') -> str:
  looks_chameleon = any('.up.' in k or '.down.' in k or 'mid.block_1' in k for k in found)
  looks_llamagen = any('conv_blocks.' in k for k in found)
  hints = []
  if prefix in ('model.vqmodel.', 'vqmodel.') and kind == 'llamagen_vq16' and looks_chameleon:
    hints.append(f'The tokenizer is stored under {prefix!r} with renamed keys '
                 "(transformers' native Janus layout, not supported): convert the "
                 "original Janus-Pro release's gen_vision_model.* instead.")
  elif kind == 'llamagen_vq16' and looks_chameleon and not looks_llamagen:
    hints.append('The keys use taming/Chameleon names (up./down./mid.block_1): '
                 'pass --kind chameleon_vqgan.')
  if kind == 'chameleon_vqgan' and looks_llamagen and not looks_chameleon:
    hints.append('The keys use LlamaGen names (conv_blocks.): pass --kind llamagen_vq16.')
  if found and not any(k.startswith('decoder.') for k in found):
    hints.append('The checkpoint holds no decoder: Hugging Face Chameleon / Lumina-mGPT '
                 'checkpoints keep only the VQ encoder under model.vqmodel.; convert '
                 "Meta's vqgan.ckpt instead.")
  hints.append(f'Assumed config: {json.dumps(config.to_dict())}. A different '
               f'architecture (e.g. LlamaGen VQ-8: {json.dumps(VQ8_OVERRIDES)}) needs '
               '--config_json with the fields that differ.')
  return '\n'.join(hints)


