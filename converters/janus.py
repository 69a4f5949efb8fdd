r"""Converts the Janus-Pro generation path (original DeepSeek layout) to an Orbax checkpoint.

Usage:
  python -m specdec_jax.converters.janus \
    --input_dir ckpts/Janus-Pro-7B --output ckpts/janus_pro_7b_jax \
    [--config pro-7b|pro-1b|path/to/config.json] [--dtype stored|float32|bfloat16]

Reads `pytorch_model.bin.index.json` + `pytorch_model-*.bin` shards (the
released format, memory-mapped one shard at a time) or safetensors
(`model.safetensors.index.json` + shards, or a single file), checks every key
and shape the generation path needs, and writes the Flax params of
`models/janus.py` (`JanusModel`) atomically with `specdec_meta.json`.

Read: `language_model.model.*` (HF Llama), `gen_embed`, `gen_aligner`,
`gen_head`. Present but not read: the understanding branch (`vision_model.*`,
`aligner.*`), the text `language_model.lm_head`, the VQ-16 tokenizer
(`gen_vision_model.*`, converted by the VQ converter) and legacy
`rotary_emb.inv_freq` buffers.

The config is read from the release's config.json (`language_config`,
`gen_head_config`, `gen_aligner_config`); dimensions it does not state are
an error, never filled in. Only the fields the original code leaves to
`LlamaConfig` defaults (it builds `LlamaConfig(**language_config)`) take those
defaults: `num_key_value_heads`, `rms_norm_eps`, the RoPE base and
`max_position_embeddings`.

Checkpoints re-saved in transformers' own Janus layout
(`JanusForConditionalGeneration`: `text_config` / `vq_config` in config.json,
`model.language_model.*`, `model.generation_*` weights) are refused by name:
that layout renames and re-nests every tensor, and its config.json leaves out
values equal to transformers' defaults. Convert the original DeepSeek release
(deepseek-ai/Janus-Pro-7B, -1B) instead.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping
from typing import Any

from absl import logging
import jax
import jax.numpy as jnp

from specdec_jax import precision
from specdec_jax.converters import chameleon as chameleon_converter
from specdec_jax.converters import command
from specdec_jax.converters import common
from specdec_jax.converters import hf_streaming
from specdec_jax.models import chameleon as chameleon_model
from specdec_jax.models import janus
from specdec_jax.models import layers

IGNORED_PREFIXES = ('vision_model.', 'aligner.', 'gen_vision_model.',
                    'language_model.lm_head.')
IGNORED_SUFFIXES = ('.rotary_emb.inv_freq',)
LM_PREFIX = 'language_model.model.'
# The language_config fields that fix the parameter shapes: never defaulted.
REQUIRED_LM_FIELDS = ('vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers',
                      'num_attention_heads')
# Hugging Face LlamaConfig defaults for the fields the released config.json
# leaves out (the original builds LlamaConfig(**language_config)).
LLAMA_DEFAULTS = dict(rms_norm_eps=1e-6, max_position_embeddings=2048)
# transformers' native Janus layout (JanusForConditionalGeneration).
HF_NATIVE_PREFIXES = ('model.language_model.', 'model.generation_', 'model.vqmodel.')
HF_NATIVE_HINT = (
    "transformers' native Janus layout (JanusForConditionalGeneration: config.json "
    'with text_config / vq_config, weights model.language_model.*, '
    'model.generation_embeddings/aligner/head.*, model.vqmodel.*) is not supported: it '
    'renames every tensor and its config.json omits values equal to transformers\' '
    'defaults. Convert the original DeepSeek release instead (deepseek-ai/Janus-Pro-7B '
    'or Janus-Pro-1B: config.json with language_config, weights language_model.model.*, '
    'gen_embed, gen_aligner, gen_head).')


class UnsupportedLayoutError(common.CheckpointMismatchError):
  """The checkpoint is in transformers' native Janus layout."""


def expected_shapes(config: janus.JanusConfig) -> dict[str, tuple[int, ...]]:
  """Original key -> shape for the generation path of `config`."""
  c = config
  e, f, d, g = c.hidden_size, c.intermediate_size, c.head_dim, c.gen_head_dim
  shapes = {f'{LM_PREFIX}embed_tokens.weight': (c.text_vocab_size, e),
            f'{LM_PREFIX}norm.weight': (e,),
            'gen_embed.weight': (c.image_vocab_size, c.gen_embed_dim),
            'gen_aligner.layers.0.weight': (e, c.gen_embed_dim),
            'gen_aligner.layers.0.bias': (e,),
            'gen_aligner.layers.2.weight': (e, e),
            'gen_aligner.layers.2.bias': (e,),
            'gen_head.output_mlp_projector.weight': (g, e),
            'gen_head.output_mlp_projector.bias': (g,),
            'gen_head.vision_head.weight': (c.image_vocab_size, g),
            'gen_head.vision_head.bias': (c.image_vocab_size,)}
  per_layer = {'self_attn.q_proj.weight': (c.num_heads * d, e),
               'self_attn.k_proj.weight': (c.num_kv_heads * d, e),
               'self_attn.v_proj.weight': (c.num_kv_heads * d, e),
               'self_attn.o_proj.weight': (e, c.num_heads * d),
               'mlp.gate_proj.weight': (f, e),
               'mlp.up_proj.weight': (f, e),
               'mlp.down_proj.weight': (e, f),
               'input_layernorm.weight': (e,),
               'post_attention_layernorm.weight': (e,)}
  for i in range(c.num_layers):
    for name, shape in per_layer.items():
      shapes[f'{LM_PREFIX}layers.{i}.{name}'] = shape
  return shapes


def conversion_rules(config: janus.JanusConfig) -> dict[str, hf_streaming.Rule]:
  """Original key -> (Flax param path, transform)."""
  ident, trans = hf_streaming.identity, hf_streaming.transpose
  rules = {f'{LM_PREFIX}embed_tokens.weight': (('embed_tokens', 'embedding'), ident),
           f'{LM_PREFIX}norm.weight': (('model', 'norm', 'weight'), ident),
           'gen_embed.weight': (('gen_embed', 'embedding'), ident)}
  for i in (0, 2):
    rules[f'gen_aligner.layers.{i}.weight'] = (('gen_aligner', f'layers_{i}', 'kernel'), trans)
    rules[f'gen_aligner.layers.{i}.bias'] = (('gen_aligner', f'layers_{i}', 'bias'), ident)
  for name in ('output_mlp_projector', 'vision_head'):
    rules[f'gen_head.{name}.weight'] = (('gen_head', name, 'kernel'), trans)
    rules[f'gen_head.{name}.bias'] = (('gen_head', name, 'bias'), ident)
  for i in range(config.num_layers):
    prefix, layer = f'{LM_PREFIX}layers.{i}.', ('model', f'layers_{i}')
    for hf_name, path in chameleon_converter.LINEAR_NAMES.items():
      rules[f'{prefix}{hf_name}.weight'] = (layer + path + ('kernel',), trans)
    for norm in chameleon_converter.NORM_NAMES:
      rules[f'{prefix}{norm}.weight'] = (layer + (norm, 'weight'), ident)
  return rules


def is_ignored(name: str) -> bool:
  return name.startswith(IGNORED_PREFIXES) or name.endswith(IGNORED_SUFFIXES)


def config_summary(config: janus.JanusConfig) -> str:
  c = config
  return (f'text vocab {c.text_vocab_size}, hidden {c.hidden_size}, {c.num_layers} '
          f'layers, {c.num_heads} heads ({c.num_kv_heads} kv), ffn {c.intermediate_size}, '
          f'image vocab {c.image_vocab_size}, gen embed {c.gen_embed_dim}, gen head '
          f'{c.gen_head_dim}')


def validate_checkpoint(found: Mapping[str, tuple[int, ...]], config: janus.JanusConfig,
                        *, config_source: str) -> None:
  """Raises CheckpointMismatchError unless the generation-path keys match `config`.

  Raises:
    UnsupportedLayoutError: the keys are in transformers' native Janus layout.
    common.CheckpointMismatchError: missing, unexpected or mis-shaped keys.
  """
  native = sorted(k for k in found if k.startswith(HF_NATIVE_PREFIXES))
  if native:
    raise UnsupportedLayoutError(
        f'The checkpoint has {len(native)} tensors in transformers\' native Janus layout '
        f'(e.g. {native[0]!r}). {HF_NATIVE_HINT}')
  found = {k: v for k, v in found.items() if not is_ignored(k)}
  common.validate_keys(
      found, expected_shapes(config),
      what=f'Janus-Pro config from {config_source}: {config_summary(config)}',
      hint='Pass the config.json that came with the checkpoint (--config) or the '
           'right preset (--config pro-7b|pro-1b).')


def _params_of(hf: Mapping[str, Any], name: str, source: str) -> dict[str, Any]:
  """`hf[name]['params']` (the released sub-config layout), or an error naming it."""
  entry = hf.get(name)
  params = entry.get('params') if isinstance(entry, Mapping) else None
  if not isinstance(params, Mapping):
    raise ValueError(
        f'{source}: {name}.params is missing; the released Janus-Pro config.json has it '
        f'(e.g. {name}: {{"params": {{...}}}}). Pass the config.json that came with the '
        'checkpoint or a preset (--config pro-7b|pro-1b).')
  return dict(params)


def config_from_hf(hf: Mapping[str, Any], source: str = 'config.json') -> janus.JanusConfig:
  """JanusConfig from the released config.json (`language_config`, `gen_*_config`).

  Args:
    hf: the parsed config.json.
    source: where it came from (for error messages).
  Raises:
    UnsupportedLayoutError: a transformers-native config (`text_config`).
    ValueError: `language_config`, a shape-defining field of it, or a
      gen_head/gen_aligner parameter is missing or unsupported (the message
      names it).
  """
  if 'language_config' not in hf:
    if 'text_config' in hf or hf.get('model_type') == 'janus':
      raise UnsupportedLayoutError(f'{source} is a transformers-native Janus config '
                                   f'(it has text_config). {HF_NATIVE_HINT}')
    raise ValueError(
        f'{source} has no language_config (the Janus-Pro language model dimensions; '
        f'top-level fields: {sorted(hf)[:12]}). Pass the config.json of the original '
        'release or a preset (--config pro-7b|pro-1b).')
  lm = dict(hf['language_config'] or {})
  missing = [f for f in REQUIRED_LM_FIELDS if lm.get(f) is None]
  if missing:
    raise ValueError(
        f'{source}: language_config lacks {missing}, which fix the parameter shapes; '
        'add them (the released config.json states them) or use a preset '
        '(--config pro-7b|pro-1b).')
  defaulted = sorted(f for f in LLAMA_DEFAULTS if lm.get(f) is None)
  if defaulted:
    logging.info('%s: language_config leaves %s to the LlamaConfig defaults %s, as the '
                 'original code does.', source, defaulted,
                 {f: LLAMA_DEFAULTS[f] for f in defaulted})
  lm = {**LLAMA_DEFAULTS, **{k: v for k, v in lm.items() if v is not None}}
  head = _params_of(hf, 'gen_head_config', source)
  aligner = _params_of(hf, 'gen_aligner_config', source)
  for name, params, fields in (('gen_head_config', head, ('image_token_size', 'image_token_embed')),
                               ('gen_aligner_config', aligner, ('input_dim',))):
    absent = [f for f in fields if params.get(f) is None]
    if absent:
      raise ValueError(f'{source}: {name}.params lacks {absent}; add them (the released '
                       'config.json states them) or use a preset (--config pro-7b|pro-1b).')
  # Janus's MlpProjector reads depth with a default of 1 when the config omits it.
  if aligner.get('depth', 1) != 2 or aligner.get('projector_type', 'mlp_gelu') != 'mlp_gelu':
    raise ValueError(
        f'{source}: gen_aligner_config.params has depth {aligner.get("depth", 1)!r} (1 when '
        f'absent, as the original code), projector_type {aligner.get("projector_type")!r}; '
        'only the released aligner (mlp_gelu, depth 2) is implemented.')
  heads = int(lm['num_attention_heads'])
  hidden = int(lm['hidden_size'])
  return janus.JanusConfig(
      text_vocab_size=int(lm['vocab_size']), hidden_size=hidden,
      num_layers=int(lm['num_hidden_layers']), num_heads=heads,
      num_kv_heads=int(lm.get('num_key_value_heads') or heads), head_dim=hidden // heads,
      intermediate_size=int(lm['intermediate_size']),
      rms_norm_eps=float(lm['rms_norm_eps']),
      rope_theta=chameleon_model.rope_theta_from_hf(lm, what=f'{source} language_config'),
      image_vocab_size=int(head['image_token_size']),
      gen_embed_dim=int(aligner['input_dim']),
      gen_head_dim=int(head['image_token_embed']),
      max_position_embeddings=int(lm['max_position_embeddings']))


def resolve_config(config_arg: str | None, input_dir: pathlib.Path
                   ) -> tuple[janus.JanusConfig, str]:
  path = chameleon_converter.config_file(config_arg, input_dir, janus.CONFIGS)
  if path is None:
    return janus.CONFIGS[config_arg](), f'preset {config_arg!r}'
  if not path.is_file():
    raise ValueError(
        f'--config {config_arg!r}: neither a preset ({sorted(janus.CONFIGS)}) nor a '
        f'config.json file ({str(path)!r} does not exist).')
  return config_from_hf(common.read_json_object(path), repr(str(path))), str(path)


def convert(input_dir: str | pathlib.Path, output: str | pathlib.Path, *,
            config: str | None = None, dtype: str | None = common.STORED,
            overwrite: bool = False, sharding=None) -> pathlib.Path:
  """Validates and converts; returns the output folder (see chameleon.convert)."""
  input_dir, output = pathlib.Path(input_dir), pathlib.Path(output)
  dtype = common.check_output_dtype(dtype)
  common.check_output_dir(output, overwrite)  # before any tensor is read
  model_config, config_source = resolve_config(config, input_dir)
  ckpt = hf_streaming.open_checkpoint(input_dir)
  logging.info('%s; config %s (%s)', ckpt.describe(), config_source,
               config_summary(model_config))
  validate_checkpoint(ckpt.shapes(), model_config, config_source=config_source)
  rules = conversion_rules(model_config)
  params_dtype = common.output_dtype(dtype, hf_streaming.stored_dtypes(ckpt, rules))
  params = hf_streaming.assemble_params(ckpt, rules, dtype=params_dtype, sharding=sharding)
  model_config = dataclasses.replace(model_config, dtype=jnp.dtype(params_dtype),
                                     param_dtype=jnp.dtype(params_dtype))
  config_path = chameleon_converter.config_file(config, input_dir, janus.CONFIGS)
  files = ckpt.files + ([config_path] if config_path else [])  # the config.json read, if any
  return common.write_params_atomic(
      output, params, config=chameleon_converter.config_to_dict(model_config),
      source_files=files, converter='specdec_jax.converters.janus',
      extra_meta={'model': 'janus', 'config_source': config_source},
      overwrite=overwrite)


def load_converted(out_dir: str | pathlib.Path, dtype: Any = None, scan_layers: bool = False
                   ) -> tuple[janus.JanusModel, Any]:
  """(JanusModel, params) from a folder written by `convert`.

  dtype: cast params and set the compute dtype ('float32', 'bfloat16', or
  'auto': float32 on CPU, bfloat16 on accelerators); None keeps the stored one.
  scan_layers: one scan over the blocks, params stacked for it.
  """
  common.read_meta_of(out_dir, 'janus', 'a Janus-Pro model', 'specdec_jax.converters.janus')
  dtype = None if dtype is None else precision.resolve_dtype(dtype)
  params, meta = common.load_params(out_dir, dtype)
  config = chameleon_converter.config_from_meta(janus.JanusConfig, meta['config'], dtype)
  unscanned = janus.JanusModel(dataclasses.replace(config, scan_layers=False))
  common.check_loaded_params(params, jax.eval_shape(unscanned.init_params, jax.random.key(0)),
                             what='Janus-Pro', where=out_dir)
  return (janus.JanusModel(dataclasses.replace(config, scan_layers=scan_layers)),
          layers.stack_layer_params(params) if scan_layers else params)


def define_flags() -> None:
  command.define_folder_flags('Janus-Pro', 'pro-7b, pro-1b')


main = command.folder_main(resolve_config, convert)


if __name__ == '__main__':
  define_flags()
  command.run(main)
