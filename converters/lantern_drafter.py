r"""Converts LANTERN / EAGLE-1 drafter folders to a specdec Orbax checkpoint.

Usage:
  python -m specdec_jax.converters.lantern_drafter --input llamagen_drafter/ \
      --output ckpts/llamagen_t2i_drafter [--kind auto|llamagen|lumina] \
      [--dtype stored|float32|bfloat16]    # default stored: the weights' own dtype

A drafter folder holds `config.json` (the base model's config with
`num_hidden_layers: 1`, optional `bias`, and for LlamaGen `input_type` in
c2i/t2i/t2i2) and `pytorch_model.bin` (the released name) or `model.safetensors` (read first
when both are there). The key set is
strict (LANTERN loads with strict=True):

  embed_tokens.weight                           embed_tokens/embedding
  fc.weight, fc.bias                            fc/kernel (.T), fc/bias
  layers.{i}.self_attn.{q,k,v,o}_proj.weight    layers_{i}/self_attn/{q,k,v,o}_proj/kernel (.T)
  layers.{i}.self_attn.{q,k}_norm.{weight,bias} layers_{i}/self_attn/{q,k}_norm/{weight,bias}
                                                (Lumina; (1, D) is broadcast to (H, D))
  layers.{i}.mlp.{gate,up,down}_proj.weight     layers_{i}/mlp/{gate,up,down}/kernel (.T)
  layers.{i}.input_layernorm.weight             layers_{i}/input_layernorm/weight
                                                (absent in LlamaGen's layer 0)
  layers.{i}.post_attention_layernorm.weight    layers_{i}/post_attention_layernorm/weight

The drafter has no head: `load_drafter(out_dir, head_kernel)` attaches the
target's (for LlamaGen, `target_params['output']['kernel']`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Mapping, MutableMapping
from typing import Any

from absl import app
from absl import flags
from absl import logging
import jax
import numpy as np

from specdec_jax.converters import command
from specdec_jax.converters import common
from specdec_jax.models import eagle

CONVERTER_NAME = 'specdec_jax.converters.lantern_drafter'
# safetensors first, as `hf_streaming.open_checkpoint` (a .bin beside it may be a stale
# download or a Git LFS pointer).
WEIGHT_FILES = ('model.safetensors', 'pytorch_model.bin')
# LANTERN `cnets_llamagen.py` hard-codes the 2D table per input_type:
# (block_size, cls_token_num).
LLAMAGEN_INPUT_TYPES = {'c2i': (576, 0), 't2i': (256, 119), 't2i2': (1024, 119)}
LLAMAGEN_ROPE_BASE = 10000.0  # LANTERN's cnets_llamagen.py, for every input_type
KINDS = ('llamagen', 'lumina')


def read_drafter_dir(path: str | os.PathLike) -> tuple[dict[str, Any], pathlib.Path]:
  """Returns (config.json contents, weight file path) of a drafter folder."""
  path = pathlib.Path(path)
  if path.is_file():
    raise common.CheckpointReadError(
        f'--input {str(path)!r} is a file; pass the drafter folder holding config.json and '
        f'model.safetensors (or pytorch_model.bin), e.g. {str(path.parent)!r}.')
  if not path.is_dir():
    raise common.CheckpointReadError(
        f'Drafter folder {str(path)!r} does not exist. Pass the folder holding '
        'config.json and model.safetensors (or pytorch_model.bin).')
  config_path = path / 'config.json'
  if not config_path.is_file():
    raise common.CheckpointReadError(f'{str(path)!r} has no config.json.')
  try:
    with open(config_path) as f:
      config_json = json.load(f)
  except json.JSONDecodeError as e:
    raise common.CheckpointReadError(f'{str(config_path)!r} is not valid JSON: {e}') from e
  present = [name for name in WEIGHT_FILES if (path / name).is_file()]
  if present:
    if len(present) > 1:
      logging.info('%s holds %s: reading %s.', path, ' and '.join(present), present[0])
    return config_json, path / present[0]
  raise common.CheckpointReadError(
      f'{str(path)!r} has no weights: expected one of {WEIGHT_FILES}.')


def detect_kind(config_json: Mapping[str, Any]) -> str:
  """'llamagen' when config.json names a LlamaGen input_type, else 'lumina'."""
  return 'llamagen' if 'input_type' in config_json else 'lumina'


def drafter_config_from_json(config_json: Mapping[str, Any], kind: str = 'auto',
                             dtype: str | None = None) -> eagle.DrafterConfig:
  """Builds a DrafterConfig from a LANTERN drafter config.json (dtype None: auto)."""
  kind = detect_kind(config_json) if kind == 'auto' else kind
  if kind not in KINDS:
    raise ValueError(f'kind must be auto or one of {KINDS}, got {kind!r}.')
  try:
    fields = dict(
        hidden_size=int(config_json['hidden_size']),
        num_heads=int(config_json['num_attention_heads']),
        num_kv_heads=int(config_json.get('num_key_value_heads')
                         or config_json['num_attention_heads']),
        intermediate_size=int(config_json['intermediate_size']),
        vocab_size=int(config_json['vocab_size']),
        num_layers=int(config_json.get('num_hidden_layers', 1)),
        rms_norm_eps=float(config_json.get('rms_norm_eps', 1e-6)),
        fc_bias=bool(config_json.get('bias', True)),
        rope_theta=float(config_json.get('rope_theta', 10000.0)),
        dtype=dtype)
  except KeyError as e:
    raise common.CheckpointReadError(
        f'Drafter config.json lacks {e.args[0]!r}; expected a Llama-style config '
        '(hidden_size, num_attention_heads, intermediate_size, vocab_size).') from e
  if kind == 'llamagen':
    input_type = config_json.get('input_type')
    if input_type is None:  # LANTERN requires it: it sets the 2D table
      raise ValueError(f'A LlamaGen drafter\'s config.json must name its input_type, one '
                       f'of {sorted(LLAMAGEN_INPUT_TYPES)} (c2i: 576-token class-conditional; '
                       't2i: 256-token and t2i2: 1024-token text-to-image targets); add it, '
                       'or pass --kind lumina for a Lumina-mGPT drafter.')
    if input_type not in LLAMAGEN_INPUT_TYPES:
      raise ValueError(f'config.json input_type {input_type!r} is not one of '
                       f'{sorted(LLAMAGEN_INPUT_TYPES)}; set the one the drafter was '
                       'trained for.')
    block_size, cls_token_num = LLAMAGEN_INPUT_TYPES[input_type]
    # LANTERN's cnets_llamagen.py builds the 2D table with base 10000 whatever
    # config.json says (LlamaGen's rope_base), so the port does too.
    if float(config_json.get('rope_theta', LLAMAGEN_ROPE_BASE)) != LLAMAGEN_ROPE_BASE:
      logging.warning('Drafter config.json sets rope_theta %s; LANTERN\'s LlamaGen drafter '
                      'ignores it and uses %s, and so does the converted drafter.',
                      config_json['rope_theta'], LLAMAGEN_ROPE_BASE)
    fields.update(rope='2d', grid_size=int(round(block_size ** 0.5)),
                  rope_theta=LLAMAGEN_ROPE_BASE,
                  cls_token_num=cls_token_num, input_layernorm=False, qk_norm=False)
  else:
    fields.update(rope='1d', input_layernorm=True, qk_norm=True, cls_token_num=0)
  try:
    return eagle.DrafterConfig(**fields)
  except ValueError as e:  # e.g. hidden_size not divisible by num_attention_heads
    raise ValueError(f'Drafter config.json does not describe a valid drafter: {e} Pass the '
                     'config.json that came with the drafter weights.') from e


def expected_shapes(config: eagle.DrafterConfig) -> dict[str, tuple[int, ...]]:
  """`{torch key: shape}` of a LANTERN drafter state dict for `config`."""
  c = config
  e, f, hd = c.hidden_size, c.intermediate_size, c.head_dim
  shapes = {'embed_tokens.weight': (c.vocab_size, e), 'fc.weight': (e, 2 * e)}
  if c.fc_bias:
    shapes['fc.bias'] = (e,)
  for i in range(c.num_layers):
    p = f'layers.{i}.'
    shapes[p + 'self_attn.q_proj.weight'] = (c.num_heads * hd, e)
    shapes[p + 'self_attn.k_proj.weight'] = (c.num_kv_heads * hd, e)
    shapes[p + 'self_attn.v_proj.weight'] = (c.num_kv_heads * hd, e)
    shapes[p + 'self_attn.o_proj.weight'] = (e, c.num_heads * hd)
    shapes[p + 'mlp.gate_proj.weight'] = (f, e)
    shapes[p + 'mlp.up_proj.weight'] = (f, e)
    shapes[p + 'mlp.down_proj.weight'] = (e, f)
    shapes[p + 'post_attention_layernorm.weight'] = (e,)
    if c.input_layernorm or i > 0:
      shapes[p + 'input_layernorm.weight'] = (e,)
    if c.qk_norm:
      for which, heads in (('q_norm', c.num_heads), ('k_norm', c.num_kv_heads)):
        shapes[p + f'self_attn.{which}.weight'] = (heads, hd)
        shapes[p + f'self_attn.{which}.bias'] = (heads, hd)
  return shapes


def describe(config: eagle.DrafterConfig) -> str:
  c = config
  return (f'EAGLE-1 drafter ({c.num_layers} layer(s), hidden {c.hidden_size}, '
          f'{c.num_heads} heads, ffn {c.intermediate_size}, vocab {c.vocab_size}, '
          f'fc bias {c.fc_bias}, layer-0 input norm {c.input_layernorm}, qk-norm '
          f'{c.qk_norm}, rope {c.rope})')


def convert_drafter(state_dict: MutableMapping[str, Any], config: eagle.DrafterConfig,
                    *, consume: bool = False) -> dict[str, Any]:
  """Maps a LANTERN drafter state dict to `DrafterModule` params (no lm_head).

  Raises:
    common.CheckpointMismatchError: missing, unexpected or mis-shaped keys.
  """
  if not consume:
    state_dict = dict(state_dict)
  dtype = config.compute_dtype
  arrays = {k: common.to_numpy(v, upcast_bf16=False) for k, v in state_dict.items()}
  if consume:
    state_dict.clear()
  # q/k norms stored per model-parallel rank (1, D) apply to every head.
  for key, value in list(arrays.items()):
    if ('q_norm' in key or 'k_norm' in key) and value.ndim == 2 and value.shape[0] == 1:
      heads = config.num_heads if 'q_norm' in key else config.num_kv_heads
      arrays[key] = np.broadcast_to(value, (heads, value.shape[1]))
  common.validate_keys(common.shapes_of(arrays), expected_shapes(config),
                       what=describe(config),
                       hint='Check --kind (llamagen/lumina) and the config.json next '
                            'to the weights.')
  progress = common.Progress(len(arrays))

  def take(key: str, transpose: bool = False) -> np.ndarray:
    value = arrays.pop(key)
    progress.step(key)
    return np.ascontiguousarray(value.T if transpose else value, dtype=dtype)

  params: dict[str, Any] = {'embed_tokens': {'embedding': take('embed_tokens.weight')},
                            'fc': {'kernel': take('fc.weight', True)}}
  if config.fc_bias:
    params['fc']['bias'] = take('fc.bias')
  for i in range(config.num_layers):
    p = f'layers.{i}.'
    attn = {name: {'kernel': take(p + f'self_attn.{name}.weight', True)}
            for name in ('q_proj', 'k_proj', 'v_proj', 'o_proj')}
    if config.qk_norm:
      for name in ('q_norm', 'k_norm'):
        attn[name] = {'weight': take(p + f'self_attn.{name}.weight'),
                      'bias': take(p + f'self_attn.{name}.bias')}
    layer = {
        'self_attn': attn,
        'mlp': {'gate': {'kernel': take(p + 'mlp.gate_proj.weight', True)},
                'up': {'kernel': take(p + 'mlp.up_proj.weight', True)},
                'down': {'kernel': take(p + 'mlp.down_proj.weight', True)}},
        'post_attention_layernorm': {'weight': take(p + 'post_attention_layernorm.weight')},
    }
    if config.input_layernorm or i > 0:
      layer['input_layernorm'] = {'weight': take(p + 'input_layernorm.weight')}
    params[f'layers_{i}'] = layer
  return params


def convert_dir(input_dir: str | os.PathLike, output_dir: str | os.PathLike, *,
                kind: str = 'auto', dtype: str = common.STORED,
                overwrite: bool = False) -> str:
  """Reads, validates, converts and writes one drafter folder; returns the output.

  dtype: 'stored' (default) keeps the weights' own dtype (`common.output_dtype`);
  'float32' or 'bfloat16' casts. The output folder is checked first.
  """
  common.check_output_dtype(dtype)
  common.check_output_dir(output_dir, overwrite)
  config_json, weights = read_drafter_dir(input_dir)
  drafter_config_from_json(config_json, kind)  # config errors before the weights are read
  state = common.load_state_dict(weights, upcast_bf16=False)
  written = common.output_dtype(dtype, (value.dtype for value in state.values()))
  config = drafter_config_from_json(config_json, kind, written)
  logging.info('converting %s as %s (%s)', weights, describe(config), written)
  params = convert_drafter(state, config, consume=True)
  out = common.write_params_atomic(
      output_dir, params, config=dataclasses.asdict(config),
      source_files=[weights, pathlib.Path(input_dir) / 'config.json'],
      converter=CONVERTER_NAME, extra_meta={'model': 'eagle_drafter'},
      overwrite=overwrite)
  return str(out)


def load_drafter(out_dir: str | os.PathLike, head_kernel: Any, dtype: str | None = None):
  """(EagleDrafter, params with the target's head attached) from a converted folder.

  Args:
    out_dir: folder written by this converter.
    head_kernel: the target's LM head kernel [E, V].
    dtype: compute dtype override ('float32', 'bfloat16' or 'auto').
  """
  meta = common.read_meta_of(out_dir, 'eagle_drafter', 'an EAGLE drafter', CONVERTER_NAME)
  fields = dict(meta['config'])
  if dtype is not None:
    fields['dtype'] = dtype
  config = eagle.DrafterConfig(**fields)
  want = (config.hidden_size, config.vocab_size)
  if tuple(np.shape(head_kernel)) != want:
    raise common.CheckpointMismatchError(
        f'load_drafter: head_kernel must have shape {want} (hidden, vocab) to match the '
        f'drafter, got {tuple(np.shape(head_kernel))}: a drafter for another target.')
  params, _ = common.load_params(out_dir, dtype=config.dtype)
  drafter = eagle.EagleDrafter(config)
  expected = dict(jax.eval_shape(drafter.init_params, jax.random.key(0)))
  expected.pop('lm_head', None)  # the target's, attached below
  common.check_loaded_params(params, expected, what='EAGLE drafter', where=out_dir)
  return drafter, eagle.attach_head(params, head_kernel)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the command-line flags (only when run as a program)."""
  fv = dict(flag_values=flag_values)
  flags.DEFINE_string('input', None, 'Drafter folder (config.json + weights).', **fv)
  flags.DEFINE_string('output', None, 'Output folder (must not exist).', **fv)
  flags.DEFINE_enum('kind', 'auto', ['auto', *KINDS], 'Drafter flavour.', **fv)
  flags.DEFINE_enum('dtype', common.STORED, list(common.OUTPUT_DTYPES), 'Output param dtype '
                    '(stored, the default: the weights\' own).', **fv)
  flags.DEFINE_bool('overwrite', False, command.OVERWRITE_HELP, **fv)


def main(argv, flag_values: flags.FlagValues = flags.FLAGS):
  del argv
  fv = flag_values
  if not fv.input or not fv.output:
    raise app.UsageError('--input and --output are required.')
  try:
    common.check_output_dir(fv.output, fv.overwrite)
    config_json, _ = read_drafter_dir(fv.input)
  except (ValueError, FileExistsError) as e:  # a message, not a traceback
    raise app.UsageError(str(e)) from e
  try:  # config errors (input_type, head counts) too, before the weights are read
    drafter_config_from_json(config_json, fv.kind)
  except ValueError as e:
    raise app.UsageError(f'{os.path.join(fv.input, "config.json")!r}: {e}') from e
  print(convert_dir(fv.input, fv.output, kind=fv.kind, dtype=fv.dtype,
                    overwrite=fv.overwrite))


if __name__ == '__main__':
  define_flags()
  command.run(main)
