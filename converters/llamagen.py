r"""Converts LlamaGen GPT checkpoints (c2i, t2i) to a specdec Orbax checkpoint.

Usage:
  python -m specdec_jax.converters.llamagen --input c2i_B_256.pt \
      --output ckpts/llamagen_c2i_B_256 --config GPT-B --model_type c2i \
      [--image_size 256] [--dtype stored|float32|bfloat16]

`--dtype` defaults to `stored`: the checkpoint's own dtype (fp32 stays fp32,
as Hugging Face's `torch_dtype='auto'`), so the converted model computes the
original's logits; casting to bfloat16 is a load-time choice
(`load_llamagen(dtype='auto')` picks it on accelerators) or `--dtype bfloat16`.

`--image_size` (the training resolution) fixes the 2D RoPE grid and the
number of image tokens, and nothing in the weights reveals it, so a wrong
value would convert without error and generate wrong images. It is required
unless the file name states it as the released files do (`c2i_XL_384.pt`,
`t2i_XL_stage1_256.pt`, `t2i_XL_stage2_512.pt`): then it is inferred, and
logged.

Reads `.pt` training dicts (`model`, optionally `ema` with --use_ema),
raw FSDP state dicts (`consolidated.pth`) and `.safetensors`. Drops what is not
a weight (`freqs_cis`, `*kv_cache*`), checks every key and shape against the
chosen config, and writes atomically (see `converters/common.py`).

Key mapping (torch name -> Flax path in `models/llamagen.GPTModule`; Linear
weights [out, in] are transposed to Dense kernels [in, out]):
  tok_embeddings.weight                    tok_embeddings/embedding
  cls_embedding.embedding_table.weight     cls_embedding/embedding_table/embedding  (c2i)
  cls_embedding.cap_proj.fc{1,2}.weight    cls_embedding/cap_proj/fc{1,2}/kernel    (t2i, .T)
  cls_embedding.uncond_embedding           cls_embedding/uncond_embedding           (t2i)
  layers.{i}.attention.wqkv.weight         layers_{i}/self_attn/{q,k,v}_proj/kernel (rows
                                           [q | k | v] split, each .T; no permutation:
                                           both sides rotate interleaved pairs)
  layers.{i}.attention.wo.weight           layers_{i}/self_attn/o_proj/kernel       (.T)
  layers.{i}.feed_forward.w1/w3/w2.weight  layers_{i}/mlp/gate/up/down/kernel       (.T)
  layers.{i}.attention_norm.weight         layers_{i}/input_layernorm/weight
  layers.{i}.ffn_norm.weight               layers_{i}/post_attention_layernorm/weight
  norm.weight                              norm/weight
  output.weight                            output/kernel                            (.T)
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
from collections.abc import MutableMapping, Mapping
from typing import Any

from absl import app
from absl import flags
from absl import logging
import jax
import numpy as np

from specdec_jax.converters import command
from specdec_jax.converters import common
from specdec_jax.models import layers
from specdec_jax.models import llamagen

NON_WEIGHT_KEYS = ('freqs_cis', 'kv_cache')
CONVERTER_NAME = 'specdec_jax.converters.llamagen'
# The released checkpoints end in _<resolution>: c2i_B_256.pt, c2i_XL_384.pt,
# t2i_XL_stage1_256.pt, t2i_XL_stage2_512.pt (FoundationVision/LlamaGen README).
_SIZE_IN_NAME = re.compile(r'_(\d{2,4})(?:px)?\.(?:pt|pth|bin|ckpt|safetensors)$',
                           re.IGNORECASE)


def infer_image_size(path: str | os.PathLike, downsample: int = 16) -> int | None:
  """The training resolution a released file name states (`c2i_XL_384.pt` -> 384).

  Returns None unless the name ends in `_<size>.<suffix>` with a size that is
  a multiple of `downsample`.
  """
  match = _SIZE_IN_NAME.search(pathlib.Path(path).name)
  if not match:
    return None
  size = int(match.group(1))
  return size if size >= downsample and size % downsample == 0 else None


def resolve_image_size(path: str | os.PathLike, image_size: int | None,
                       downsample: int = 16) -> int:
  """--image_size, or the size the file name states (logged); an error if neither.

  Raises:
    ValueError: no --image_size and the file name states none, or it is not a
      positive multiple of the VQ downsampling.
  """
  if image_size is not None and (image_size < downsample or image_size % downsample):
    raise ValueError(f'--image_size: image_size {image_size} must be a multiple of the VQ '
                     f'downsampling {downsample} and at least {downsample} (256, 384 or 512 '
                     'for the released models).')
  inferred = infer_image_size(path)
  if image_size is None:
    if inferred is None:
      raise ValueError(
          f'--image_size is required: the file name {pathlib.Path(path).name!r} does not '
          'state the training resolution (released files end in _256, _384 or _512, '
          'e.g. c2i_XL_384.pt). Pass the resolution the checkpoint was trained at '
          '(it sets the 2D RoPE grid; a wrong value gives wrong images without any '
          'error).')
    logging.info('--image_size not given: using %d from the file name %s.', inferred,
                 pathlib.Path(path).name)
    return inferred
  if inferred is not None and inferred != image_size:
    logging.warning('--image_size %d differs from the %d the file name %s states; '
                    'converting with %d as asked.', image_size, inferred,
                    pathlib.Path(path).name, image_size)
  return image_size


def describe(config: llamagen.GPTConfig) -> str:
  """The config in words, for error messages."""
  preset = next((name for name, dims in llamagen.PRESETS.items()
                 if dims == (config.n_layer, config.n_head, config.dim)), 'custom')
  return (f'LlamaGen {preset} {config.model_type} ({config.n_layer} layers, dim '
          f'{config.dim}, {config.n_head} heads, ffn {config.ffn_dim}, vocab '
          f'{config.vocab_size}, {config.block_size} image tokens, '
          f'{config.cls_token_num} condition tokens)')


def expected_shapes(config: llamagen.GPTConfig) -> dict[str, tuple[int, ...]]:
  """`{torch key: shape}` of an original state dict for `config`."""
  c = config
  d, f, hd = c.dim, c.ffn_dim, c.head_dim
  shapes = {'tok_embeddings.weight': (c.vocab_size, d), 'norm.weight': (d,),
            'output.weight': (c.vocab_size, d)}
  if c.model_type == 'c2i':
    shapes['cls_embedding.embedding_table.weight'] = (c.num_classes + 1, d)
  else:
    shapes['cls_embedding.uncond_embedding'] = (c.cls_token_num, c.caption_dim)
    shapes['cls_embedding.cap_proj.fc1.weight'] = (d, c.caption_dim)
    shapes['cls_embedding.cap_proj.fc2.weight'] = (d, d)
  for i in range(c.n_layer):
    p = f'layers.{i}.'
    shapes[p + 'attention.wqkv.weight'] = ((c.n_head + 2 * c.n_kv_head) * hd, d)
    shapes[p + 'attention.wo.weight'] = (d, c.n_head * hd)
    shapes[p + 'feed_forward.w1.weight'] = (f, d)
    shapes[p + 'feed_forward.w3.weight'] = (f, d)
    shapes[p + 'feed_forward.w2.weight'] = (d, f)
    shapes[p + 'attention_norm.weight'] = (d,)
    shapes[p + 'ffn_norm.weight'] = (d,)
  return shapes


def guess_dims(shapes: Mapping[str, tuple[int, ...]]) -> str:
  """A hint naming the preset whose dims match the checkpoint, if any."""
  layer_ids = {int(m.group(1)) for k in shapes if (m := re.match(r'layers\.(\d+)\.', k))}
  dim = shapes.get('tok_embeddings.weight', (None, None))[1]
  kind = ('t2i' if any('cap_proj' in k for k in shapes) else
          'c2i' if any('embedding_table' in k for k in shapes) else 'unknown')
  n_layer = max(layer_ids) + 1 if layer_ids else 0
  match = [name for name, (layers_, _, dim_) in llamagen.PRESETS.items()
           if layers_ == n_layer and dim_ == dim]
  looks = f' ({match[0]})' if match else ''
  return (f'The checkpoint looks like a {kind} model with {n_layer} layers and dim '
          f'{dim}{looks}. Pass the matching --config and --model_type (and '
          '--set field=value for non-preset sizes).')


def prepare_state_dict(state: Mapping[str, Any]) -> dict[str, Any]:
  """Drops `freqs_cis` and kv-cache buffers."""
  return common.drop_keys(state, NON_WEIGHT_KEYS)


def convert_llamagen_gpt(
    state_dict: MutableMapping[str, Any],
    config: llamagen.GPTConfig,
    *,
    consume: bool = False,
) -> dict[str, Any]:
  """Maps an original LlamaGen state dict to the Flax param tree.

  Args:
    state_dict: `{torch key: array}` (numpy or torch), buffers already
      dropped or not.
    config: the config the checkpoint is expected to match.
    consume: pop entries from `state_dict` as they are converted, so a large
      checkpoint is not held twice.
  Returns:
    Nested params of numpy arrays in `config.dtype`.
  Raises:
    common.CheckpointMismatchError: a key is missing, unexpected or
      mis-shaped; the message lists them and the config assumed.
  """
  if not consume:
    state_dict = dict(state_dict)
  for key in [k for k in state_dict if any(s in k for s in NON_WEIGHT_KEYS)]:
    del state_dict[key]
  found = common.shapes_of(state_dict)
  common.validate_keys(found, expected_shapes(config), what=describe(config),
                       hint=guess_dims(found))
  dtype = config.compute_dtype
  progress = common.Progress(len(found))

  def take(key: str, transpose: bool = False) -> np.ndarray:
    value = common.to_numpy(state_dict.pop(key), upcast_bf16=False)
    progress.step(key)
    value = value.T if transpose else value
    return np.ascontiguousarray(value, dtype=dtype)

  c = config
  params: dict[str, Any] = {
      'tok_embeddings': {'embedding': take('tok_embeddings.weight')},
  }
  if c.model_type == 'c2i':
    params['cls_embedding'] = {'embedding_table': {
        'embedding': take('cls_embedding.embedding_table.weight')}}
  else:
    params['cls_embedding'] = {
        'uncond_embedding': take('cls_embedding.uncond_embedding'),
        'cap_proj': {'fc1': {'kernel': take('cls_embedding.cap_proj.fc1.weight', True)},
                     'fc2': {'kernel': take('cls_embedding.cap_proj.fc2.weight', True)}},
    }
  q_rows, kv_rows = c.n_head * c.head_dim, c.n_kv_head * c.head_dim
  for i in range(c.n_layer):
    p = f'layers.{i}.'
    wqkv = common.to_numpy(state_dict.pop(p + 'attention.wqkv.weight'), upcast_bf16=False)
    progress.step(p + 'attention.wqkv.weight')
    def split(lo: int, hi: int, wqkv=wqkv) -> np.ndarray:
      return np.ascontiguousarray(wqkv[lo:hi].T, dtype=dtype)
    params[f'layers_{i}'] = {
        'self_attn': {
            'q_proj': {'kernel': split(0, q_rows)},
            'k_proj': {'kernel': split(q_rows, q_rows + kv_rows)},
            'v_proj': {'kernel': split(q_rows + kv_rows, q_rows + 2 * kv_rows)},
            'o_proj': {'kernel': take(p + 'attention.wo.weight', True)},
        },
        'mlp': {
            'gate': {'kernel': take(p + 'feed_forward.w1.weight', True)},
            'up': {'kernel': take(p + 'feed_forward.w3.weight', True)},
            'down': {'kernel': take(p + 'feed_forward.w2.weight', True)},
        },
        'input_layernorm': {'weight': take(p + 'attention_norm.weight')},
        'post_attention_layernorm': {'weight': take(p + 'ffn_norm.weight')},
    }
    del wqkv
  params['norm'] = {'weight': take('norm.weight')}
  params['output'] = {'kernel': take('output.weight', True)}
  return params


def convert_file(
    input_path: str | os.PathLike,
    output_dir: str | os.PathLike,
    config: llamagen.GPTConfig,
    *,
    use_ema: bool = False,
    overwrite: bool = False,
    trust_pickle: bool = False,
    dtype: str = common.STORED,
) -> str:
  """Reads, validates, converts and writes one checkpoint; returns the output dir.

  dtype: 'stored' (default) writes the checkpoint's own dtype (`common.
  output_dtype`), 'float32' or 'bfloat16' casts; the written config's dtype is
  the params' (config.dtype is replaced). Nothing is written if reading or
  validation fails (the output folder is checked first), and a failure while
  writing leaves no partial output folder.
  """
  common.check_output_dtype(dtype)
  common.check_output_dir(output_dir, overwrite)
  state = prepare_state_dict(common.load_state_dict(
      input_path, use_ema=use_ema, trust_pickle=trust_pickle,
      upcast_bf16=False))  # bf16 stays bf16 unless cast once to the output dtype
  written = common.output_dtype(dtype, (value.dtype for value in state.values()))
  config = dataclasses.replace(config, dtype=written)
  logging.info('writing %s params (--dtype %s)', written, dtype)
  params = convert_llamagen_gpt(state, config, consume=True)
  out = common.write_params_atomic(
      output_dir, params, config=dataclasses.asdict(config), source_files=[input_path],
      converter=CONVERTER_NAME, extra_meta={'model': 'llamagen_gpt', 'use_ema': use_ema},
      overwrite=overwrite, consume=True)
  return str(out)


def load_llamagen(out_dir: str | os.PathLike, dtype: str | None = None,
                  scan_layers: bool = False):
  """Loads a converted checkpoint: (LlamaGenGPT, params) ready for the engine.

  Args:
    out_dir: folder written by this converter.
    dtype: compute/param dtype override ('float32', 'bfloat16', or 'auto':
      float32 on CPU, bfloat16 on accelerators); default as converted.
    scan_layers: build the model with one scan over its blocks, and stack
      the per-layer params for it (`models.layers.stack_layer_params`).
  """
  meta = common.read_meta_of(out_dir, 'llamagen_gpt', 'a LlamaGen GPT', CONVERTER_NAME)
  fields = dict(meta['config'])
  if dtype is not None:
    fields['dtype'] = dtype
  fields['scan_layers'] = scan_layers
  config = llamagen.GPTConfig(**fields)
  params, _ = common.load_params(out_dir, dtype=config.dtype)
  model = llamagen.LlamaGenGPT(dataclasses.replace(config, scan_layers=False))
  common.check_loaded_params(params, jax.eval_shape(model.init_params, jax.random.key(0)),
                             what=f'LlamaGen GPT ({config.model_type})', where=out_dir)
  if scan_layers:
    params = layers.stack_layer_params(params)
  return llamagen.LlamaGenGPT(config), params


def parse_overrides(items: list[str]) -> dict[str, Any]:
  """`['dim=64', 'rope_base=1e4']` -> typed GPTConfig overrides.

  Raises:
    ValueError: an item is not field=value, names no GPTConfig field, or its
      value does not parse as the field's type (the message names the field).
  """
  types = {f.name: f.type for f in dataclasses.fields(llamagen.GPTConfig)}
  out = {}
  for item in items:
    name, sep, value = item.partition('=')
    if not sep or name not in types:
      raise ValueError(f'--set {item!r}: expected field=value with field one of '
                       f'{sorted(types)}.')
    kind = str(types[name])
    type_name = next((t for t in ('bool', 'float', 'int') if t in kind), 'str')
    parse = {'bool': _parse_bool, 'float': float, 'int': int, 'str': str}[type_name]
    try:
      out[name] = parse(value)
    except ValueError as e:
      raise ValueError(f'--set {item!r}: {name} must be {type_name}, got '
                       f'{value!r}.') from e
  return out


def _parse_bool(value: str) -> bool:
  """'true'/'1' or 'false'/'0' (any case); anything else is a ValueError."""
  if value.lower() in ('true', '1'):
    return True
  if value.lower() in ('false', '0'):
    return False
  raise ValueError(value)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the command-line flags (only when run as a program, so importing
  several converters in one process does not define `--input` twice)."""
  fv = dict(flag_values=flag_values)
  flags.DEFINE_string('input', None, 'Checkpoint file (.pt/.pth/.bin/.safetensors).', **fv)
  flags.DEFINE_string('output', None, 'Output folder (must not exist).', **fv)
  flags.DEFINE_string('config', 'GPT-B', 'Preset: GPT-B, GPT-L, GPT-XL, GPT-XXL, '
                      'GPT-XXXL, GPT-1B, GPT-3B, GPT-7B.', **fv)
  flags.DEFINE_enum('model_type', 'c2i', list(llamagen.MODEL_TYPES),
                    'Class- or text-conditional.', **fv)
  flags.DEFINE_integer('image_size', None, 'Training resolution (sets the 2D RoPE '
                       'grid: (image_size/16)^2 tokens). Required unless the file name '
                       'states it (c2i_XL_384.pt -> 384).', **fv)
  flags.DEFINE_enum('dtype', common.STORED, list(common.OUTPUT_DTYPES), 'Output param '
                    'dtype: stored (default) keeps the checkpoint\'s own, so the original '
                    'logits are reproduced; bfloat16 halves an fp32 checkpoint\'s size.', **fv)
  flags.DEFINE_bool('use_ema', False, 'Convert the "ema" weights.', **fv)
  flags.DEFINE_bool('overwrite', False, command.OVERWRITE_HELP, **fv)
  flags.DEFINE_bool('trust_pickle', False, 'Allow full unpickling of files the safe '
                    'loader refuses (trusted files only).', **fv)
  flags.DEFINE_multi_string('set', [], 'GPTConfig override field=value, e.g. --set '
                            'dim=64 (for non-preset sizes).', **fv)


def main(argv, flag_values: flags.FlagValues = flags.FLAGS):
  del argv
  fv = flag_values
  if not fv.input or not fv.output:
    raise app.UsageError('--input and --output are required.')
  try:
    image_size = resolve_image_size(fv.input, fv.image_size)
    config = llamagen.gpt_config(
        fv.config, image_size=image_size, model_type=fv.model_type, **parse_overrides(fv.set))
    common.check_output_dir(fv.output, fv.overwrite)  # before the (slow) conversion
  except (TypeError, ValueError, FileExistsError) as e:  # a message, not a traceback
    raise app.UsageError(str(e)) from e
  logging.info('converting %s as %s', fv.input, describe(config))
  out = convert_file(fv.input, fv.output, config, use_ema=fv.use_ema,
                     overwrite=fv.overwrite, trust_pickle=fv.trust_pickle, dtype=fv.dtype)
  print(out)


if __name__ == '__main__':
  define_flags()
  command.run(main)
