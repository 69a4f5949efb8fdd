r"""Converts Lumina-mGPT / Chameleon Hugging Face checkpoints to an Orbax checkpoint.

Usage:
  python -m specdec_jax.converters.chameleon \
    --input_dir ckpts/Lumina-mGPT-7B-768 --output ckpts/lumina_7b_768_jax \
    [--config 7b|34b|path/to/config.json] [--dtype stored|float32|bfloat16]

Reads `model.safetensors.index.json` and its shards (or a single
`model.safetensors`) one tensor at a time, checks every key and shape against
the config (default: `config.json` in `--input_dir`), converts (Linear weights
transposed to Flax kernels, q/k norm params expanded to one row per head, see
`expand_norm_rows`) and writes the Orbax checkpoint atomically with
`specdec_meta.json` (config, sha256 of every source file). The
`model.vqmodel.*` tensors (the VQ encoder, unused for text-to-image) are not
read.

The RoPE base comes from `rope_theta` (transformers 4) or
`rope_parameters.rope_theta` (transformers 5); a config asking for scaled
RoPE is refused (see `models.chameleon.rope_theta_from_hf`).

Param layout written: see `models/chameleon.py` (`ChameleonModel`).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from collections.abc import Callable, Mapping
from typing import Any

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import precision
from specdec_jax.converters import command
from specdec_jax.converters import common
from specdec_jax.converters import hf_streaming
from specdec_jax.models import chameleon
from specdec_jax.models import layers
from specdec_jax.models import lumina_layout

IGNORED_PREFIXES = ('model.vqmodel.',)
_LAYER_KEY = re.compile(r'^model\.layers\.(\d+)\.(.+)$')
LINEAR_NAMES = {'self_attn.q_proj': ('self_attn', 'q_proj'),
            'self_attn.k_proj': ('self_attn', 'k_proj'),
            'self_attn.v_proj': ('self_attn', 'v_proj'),
            'self_attn.o_proj': ('self_attn', 'o_proj'),
            'mlp.gate_proj': ('mlp', 'gate'),
            'mlp.up_proj': ('mlp', 'up'),
            'mlp.down_proj': ('mlp', 'down')}
NORM_NAMES = ('input_layernorm', 'post_attention_layernorm')


def expected_shapes(config: chameleon.ChameleonConfig) -> dict[str, tuple[int, ...]]:
  """HF key -> shape for `config` (q/k norms in the (heads, D) layout)."""
  c = config
  e, f, d = c.hidden_size, c.intermediate_size, c.head_dim
  shapes = {'model.embed_tokens.weight': (c.vocab_size, e),
            'model.norm.weight': (e,),
            'lm_head.weight': (c.vocab_size, e)}
  per_layer = {'self_attn.q_proj.weight': (c.num_heads * d, e),
               'self_attn.k_proj.weight': (c.num_kv_heads * d, e),
               'self_attn.v_proj.weight': (c.num_kv_heads * d, e),
               'self_attn.o_proj.weight': (e, c.num_heads * d),
               'self_attn.q_norm.weight': (c.num_heads, d),
               'self_attn.q_norm.bias': (c.num_heads, d),
               'self_attn.k_norm.weight': (c.num_kv_heads, d),
               'self_attn.k_norm.bias': (c.num_kv_heads, d),
               'mlp.gate_proj.weight': (f, e),
               'mlp.up_proj.weight': (f, e),
               'mlp.down_proj.weight': (e, f),
               'input_layernorm.weight': (e,),
               'post_attention_layernorm.weight': (e,)}
  for i in range(c.num_layers):
    for name, shape in per_layer.items():
      shapes[f'model.layers.{i}.{name}'] = shape
  return shapes


def expand_norm_rows(num_heads: int) -> Callable[[np.ndarray], np.ndarray]:
  """q/k LayerNorm params (R, D) -> (num_heads, D), R dividing num_heads.

  Checkpoints store these norms in three layouts: (1, D) (Lumina-mGPT 7B),
  (heads, D) (current Hugging Face conversions), and, for checkpoints trained
  with tensor parallelism, (model_parallel_size, D): Lumina-mGPT's
  `ChameleonLayerNorm` keeps one row per model-parallel shard and
  repeat-interleaves it over that shard's `num_heads // model_parallel_size`
  heads. All three are the same rule: row r applies to heads
  [r * H / R, (r + 1) * H / R).
  """

  def transform(array):
    rows = array.shape[0]
    if num_heads % rows:
      raise ValueError(f'q/k norm with {rows} rows cannot be spread over {num_heads} heads.')
    return np.repeat(array, num_heads // rows, axis=0)

  return transform


def norm_rows_ok(rows: int, num_heads: int) -> bool:
  """Whether a (rows, D) q/k norm tensor fits `num_heads` (see `expand_norm_rows`)."""
  return rows >= 1 and num_heads % rows == 0


def conversion_rules(config: chameleon.ChameleonConfig) -> dict[str, hf_streaming.Rule]:
  """HF key -> (Flax param path, transform)."""
  rules = {'model.embed_tokens.weight': (('embed_tokens', 'embedding'), hf_streaming.identity),
           'model.norm.weight': (('model', 'norm', 'weight'), hf_streaming.identity),
           'lm_head.weight': (('lm_head', 'kernel'), hf_streaming.transpose)}
  for i in range(config.num_layers):
    prefix, layer = f'model.layers.{i}.', ('model', f'layers_{i}')
    for hf_name, path in LINEAR_NAMES.items():
      rules[f'{prefix}{hf_name}.weight'] = (layer + path + ('kernel',), hf_streaming.transpose)
    for norm in NORM_NAMES:
      rules[f'{prefix}{norm}.weight'] = (layer + (norm, 'weight'), hf_streaming.identity)
    for name, heads in (('q_norm', config.num_heads), ('k_norm', config.num_kv_heads)):
      for field in ('weight', 'bias'):
        rules[f'{prefix}self_attn.{name}.{field}'] = (
            layer + ('self_attn', name, field), expand_norm_rows(heads))
  return rules


def validate_checkpoint(found: Mapping[str, tuple[int, ...]],
                        config: chameleon.ChameleonConfig, *, config_source: str,
                        tied: bool = False) -> None:
  """Raises CheckpointMismatchError unless `found` is exactly `config`'s key set
  (without lm_head.weight when `tied`: the head is the embedding, `tied_head`).

  q/k norm tensors may have 1, model_parallel_size or `heads` rows (any row
  count dividing the head count; see `expand_norm_rows`).
  """
  expected = expected_shapes(config)
  if tied:
    del expected['lm_head.weight']
  bad_rows = []
  for name, shape in expected.items():
    if not re.search(r'\.[qk]_norm\.', name) or name not in found:
      continue
    rows_shape = tuple(found[name])
    heads = config.num_heads if '.q_norm.' in name else config.num_kv_heads
    if len(rows_shape) == 2 and rows_shape[1] == shape[1] and norm_rows_ok(rows_shape[0], heads):
      expected[name] = rows_shape
    elif len(rows_shape) == 2 and rows_shape[1] == shape[1]:
      bad_rows.append(f'{name} {rows_shape}')
  found = {k: v for k, v in found.items() if not k.startswith(IGNORED_PREFIXES)}
  hint = ('Pass the config.json that came with the checkpoint (--config) or the '
          'right preset (--config 7b|34b).')
  if bad_rows:
    hint = (f'{len(bad_rows)} q/k norm tensor(s) have a row count that does not divide '
            f'their head count ({config.num_heads} query heads for q_norm, '
            f'{config.num_kv_heads} key/value heads for k_norm; e.g. {bad_rows[0]}). '
            'Accepted are (1, D), (model_parallel_size, D) with the heads split evenly '
            'over the rows, and (heads, D); if the rows are right, the head counts '
            'in the config are not. ' + hint)
  common.validate_keys(
      found, expected, what=(f'Chameleon config from {config_source}: {config_summary(config)}'
                             + (', LM head tied to the embedding' if tied else '')),
      hint=hint)


def config_summary(config: chameleon.ChameleonConfig) -> str:
  c = config
  return (f'vocab {c.vocab_size}, hidden {c.hidden_size}, {c.num_layers} layers, '
          f'{c.num_heads} heads ({c.num_kv_heads} kv), head_dim {c.head_dim}, '
          f'ffn {c.intermediate_size}, swin_norm {c.swin_norm}')


def config_to_dict(config) -> dict[str, Any]:
  """A config dataclass as JSON-able values (dtypes by name)."""
  out = {}
  for field in dataclasses.fields(config):
    value = getattr(config, field.name)
    out[field.name] = jnp.dtype(value).name if field.name in ('dtype', 'param_dtype') else value
  return out


def config_file(config_arg: str | None, input_dir: str | pathlib.Path,
                presets: Mapping[str, Any]) -> pathlib.Path | None:
  """The config.json a --config value reads (None for a preset): the file named,
  or `input_dir/config.json` when --config is not given."""
  if config_arg in presets:
    return None
  return pathlib.Path(config_arg) if config_arg else pathlib.Path(input_dir) / 'config.json'


def _check_vocabulary_map(vocabulary_map: Any) -> None:
  """ValueError unless `vocabulary_map` holds the image-token table `lumina_layout`
  assumes (BPE id = code + 4)."""
  try:
    if not isinstance(vocabulary_map, Mapping):
      raise ValueError('it must be an object {token name: id}')
    lumina_layout.image_token_table(vocabulary_map)
  except ValueError as e:
    raise ValueError(f'its vocabulary_map is not a Lumina-mGPT / Chameleon one ({e}). Pass '
                     'the config.json that came with the checkpoint (--config).') from e


def resolve_config(config_arg: str | None, input_dir: pathlib.Path
                   ) -> tuple[chameleon.ChameleonConfig, str, dict[str, Any] | None]:
  """(config, where it came from, the raw HF config dict if read from json).

  A config.json's `vocabulary_map`, if any, is checked here (before any weight
  is read): its image tokens must be the table `lumina_layout` assumes.
  """
  path = config_file(config_arg, input_dir, chameleon.CONFIGS)
  if path is None:
    return chameleon.CONFIGS[config_arg](), f'preset {config_arg!r}', None
  if not path.is_file():
    raise ValueError(
        f'--config {config_arg!r}: neither a preset ({sorted(chameleon.CONFIGS)}) nor a '
        f'config.json file ({str(path)!r} does not exist).')
  hf_config = common.read_json_object(path)
  try:
    config = chameleon.ChameleonConfig.from_hf_config(hf_config)
    if 'vocabulary_map' in hf_config:
      _check_vocabulary_map(hf_config['vocabulary_map'])
    return config, str(path), hf_config
  except KeyError as e:
    raise ValueError(f'{str(path)!r} is not a Chameleon config.json: field {e} is '
                     'missing.') from e
  except ValueError as e:
    raise ValueError(f'{str(path)!r}: {e}') from e


def tied_head(hf_config: Mapping[str, Any] | None, shapes: Mapping[str, Any]) -> bool:
  """Whether the LM head is the embedding: config.json sets tie_word_embeddings
  (transformers' PreTrainedModel field) and the checkpoint stores no lm_head.weight.
  A stored lm_head.weight is converted as stored (with a warning when the config
  says tied: transformers would replace it with the embedding)."""
  if not (hf_config or {}).get('tie_word_embeddings', False):
    return False
  if 'lm_head.weight' in shapes:
    logging.warning('config.json sets tie_word_embeddings but the checkpoint stores '
                    'lm_head.weight: converting the stored head.')
    return False
  return 'model.embed_tokens.weight' in shapes


def convert(input_dir: str | pathlib.Path, output: str | pathlib.Path, *,
            config: str | None = None, dtype: str | None = common.STORED,
            overwrite: bool = False, sharding=None) -> pathlib.Path:
  """Validates and converts; returns the output folder.

  Args:
    input_dir: folder with the HF checkpoint.
    output: folder to create (atomically).
    config: preset name, config.json path, or None for `input_dir/config.json`.
    dtype: 'stored' (default; None too) keeps the checkpoint's own dtype (one
      dtype, or float32 for a mix: `common.output_dtype`), so the converted
      model reproduces the original's logits; 'float32' or 'bfloat16' casts.
    overwrite: replace an existing output folder.
    sharding: optional `(param path, shape) -> jax.sharding.Sharding` placing
      each tensor as it is converted (see `hf_streaming.assemble_params`).
  """
  input_dir, output = pathlib.Path(input_dir), pathlib.Path(output)
  dtype = common.check_output_dtype(dtype)
  common.check_output_dir(output, overwrite)  # before any tensor is read
  model_config, config_source, hf_config = resolve_config(config, input_dir)
  ckpt = hf_streaming.open_checkpoint(input_dir)
  logging.info('%s; config %s (%s)', ckpt.describe(), config_source,
               config_summary(model_config))
  shapes = ckpt.shapes()
  tied = tied_head(hf_config, shapes)
  if tied:  # the head is the embedding matrix, stored once
    logging.info('config.json sets tie_word_embeddings and the checkpoint has no '
                 'lm_head.weight: the LM head is model.embed_tokens.weight.')
  validate_checkpoint(shapes, model_config, config_source=config_source, tied=tied)
  extra = {'model': 'chameleon', 'config_source': config_source}
  if hf_config is not None and 'vocabulary_map' in hf_config:  # checked by resolve_config
    extra['image_token_offset'] = lumina_layout.FIRST_IMAGE_TOKEN
  else:
    logging.warning('No vocabulary_map in the config; the image-token table '
                    '(BPE id = code + 4) is assumed, not checked.')
  rules = conversion_rules(model_config)
  if tied:
    del rules['lm_head.weight']
  params_dtype = common.output_dtype(dtype, hf_streaming.stored_dtypes(ckpt, rules))
  params = hf_streaming.assemble_params(ckpt, rules, dtype=params_dtype, sharding=sharding)
  if tied:
    kernel = params['embed_tokens']['embedding'].T  # [E, V] of the [V, E] embedding
    params['lm_head'] = {'kernel': jax.device_put(
        kernel, sharding(('lm_head', 'kernel'), kernel.shape) if sharding else kernel.sharding)}
  model_config = dataclasses.replace(model_config, dtype=jnp.dtype(params_dtype),
                                     param_dtype=jnp.dtype(params_dtype))
  config_path = config_file(config, input_dir, chameleon.CONFIGS)  # the one read, if any
  files = ckpt.files + ([config_path] if config_path else [])
  return common.write_params_atomic(
      output, params, config=config_to_dict(model_config), source_files=files,
      converter='specdec_jax.converters.chameleon', extra_meta=extra,
      overwrite=overwrite)


def config_from_meta(config_cls, meta_config: dict, dtype: Any = None):
  """Rebuilds a config dataclass stored by `config_to_dict` (dtype names -> dtypes),
  optionally overriding the compute and parameter dtype."""
  values = dict(meta_config)
  if dtype is not None:
    values['dtype'] = values['param_dtype'] = dtype
  values['dtype'] = precision.resolve_dtype(values['dtype'])
  values['param_dtype'] = precision.resolve_dtype(values['param_dtype'])
  return config_cls(**values)


def load_converted(out_dir: str | pathlib.Path, dtype: Any = None, scan_layers: bool = False
                   ) -> tuple[chameleon.ChameleonModel, Any]:
  """(ChameleonModel, params) from a folder written by `convert`.

  dtype: cast params and set the compute dtype ('float32', 'bfloat16', or
  'auto': float32 on CPU, bfloat16 on accelerators); None keeps the stored one.
  scan_layers: one scan over the blocks, params stacked for it.
  """
  common.read_meta_of(out_dir, 'chameleon', 'a Lumina-mGPT (Chameleon) model',
                      'specdec_jax.converters.chameleon')
  dtype = None if dtype is None else precision.resolve_dtype(dtype)
  params, meta = common.load_params(out_dir, dtype)
  config = config_from_meta(chameleon.ChameleonConfig, meta['config'], dtype)
  unscanned = chameleon.ChameleonModel(dataclasses.replace(config, scan_layers=False))
  common.check_loaded_params(params, jax.eval_shape(unscanned.init_params, jax.random.key(0)),
                             what='Chameleon (Lumina-mGPT)', where=out_dir)
  return (chameleon.ChameleonModel(dataclasses.replace(config, scan_layers=scan_layers)),
          layers.stack_layer_params(params) if scan_layers else params)


def define_flags() -> None:
  command.define_folder_flags('HF', '7b, 34b')


main = command.folder_main(resolve_config, convert)


if __name__ == '__main__':
  define_flags()
  command.run(main)
