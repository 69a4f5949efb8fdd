"""Chameleon / Lumina-mGPT configuration: `ChameleonConfig`, presets and the HF rope-theta reader."""

from __future__ import annotations

import dataclasses
from typing import Any


from specdec_jax import precision

PAD_ID = 1  # Chameleon `<pad>`; its value is irrelevant (padding is masked).


@dataclasses.dataclass(frozen=True)
class ChameleonConfig:
  """Chameleon language-model dimensions (defaults: Lumina-mGPT 7B).

  `dtype` (compute and KV cache) None or 'auto' resolves when the config is
  built: float32 on CPU, bfloat16 on accelerators (`specdec_jax.precision`);
  `param_dtype` None follows `dtype`. Both fields then hold jnp dtypes.
  `scan_layers` runs the blocks as one `nn.scan` (see `GPTConfig`): params
  `model/layers` with a leading layer axis, stacked caches.
  """

  vocab_size: int = 65536
  hidden_size: int = 4096
  num_layers: int = 32
  num_heads: int = 32
  num_kv_heads: int = 32
  head_dim: int = 128
  intermediate_size: int = 11008
  rms_norm_eps: float = 1e-5
  rope_theta: float = 10000.0
  swin_norm: bool = False
  max_position_embeddings: int = 4096
  dtype: Any = None  # compute and cache dtype
  param_dtype: Any = None
  scan_layers: bool = False

  def __post_init__(self):
    resolve_dtypes(self)
    if self.num_heads * self.head_dim != self.hidden_size:
      raise ValueError(
          f'ChameleonConfig: num_heads * head_dim = {self.num_heads} * '
          f'{self.head_dim} must equal hidden_size = {self.hidden_size}.')
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f'ChameleonConfig: num_heads {self.num_heads} must be a multiple of '
          f'num_kv_heads {self.num_kv_heads}.')

  @classmethod
  def from_hf_config(cls, hf: dict[str, Any], **overrides) -> 'ChameleonConfig':
    """Reads a Hugging Face `config.json` dict (ChameleonConfig fields).

    The RoPE base is read from either layout transformers writes (see
    `rope_theta_from_hf`); RoPE scaling is refused.
    """
    hidden = int(hf['hidden_size'])
    heads = int(hf['num_attention_heads'])
    values = dict(
        vocab_size=int(hf['vocab_size']),
        hidden_size=hidden,
        num_layers=int(hf['num_hidden_layers']),
        num_heads=heads,
        num_kv_heads=int(hf.get('num_key_value_heads') or heads),
        head_dim=hidden // heads,
        intermediate_size=int(hf['intermediate_size']),
        rms_norm_eps=float(hf.get('rms_norm_eps', 1e-5)),
        rope_theta=rope_theta_from_hf(hf, what='Chameleon config.json'),
        swin_norm=bool(hf.get('swin_norm', False)),
        max_position_embeddings=int(hf.get('max_position_embeddings', 4096)),
    )
    values.update(overrides)
    return cls(**values)


def resolve_dtypes(config) -> None:
  """Resolves a frozen config's `dtype` and `param_dtype` fields in place.

  dtype None/'auto' -> `precision.default_dtype()`; param_dtype None ->
  dtype. Shared by the Chameleon and Janus-Pro configs.
  """
  dtype = precision.resolve_dtype(config.dtype)
  param_dtype = dtype if config.param_dtype is None else precision.resolve_dtype(
      config.param_dtype)
  object.__setattr__(config, 'dtype', dtype)
  object.__setattr__(config, 'param_dtype', param_dtype)


def rope_theta_from_hf(hf: dict[str, Any], *, what: str,
                       default: float = 10000.0) -> float:
  """The plain-RoPE base of a Hugging Face config dict, in either layout.

  transformers 4.x writes `rope_theta` at the top level (and `rope_scaling`
  for scaled variants); transformers 5 writes
  `rope_parameters: {rope_type, rope_theta, ...}`. Both are read; a config
  naming a RoPE variant other than plain RoPE ('default'), or giving two
  different bases, is refused, since converting it with plain RoPE would give
  wrong logits without any error.

  Args:
    hf: the config dict (e.g. a config.json, or its `language_config`).
    what: names the config in error messages.
    default: the base when neither layout gives one (HF Llama and Chameleon
      default to 10000).
  Returns:
    The RoPE base theta.
  Raises:
    ValueError: unknown RoPE type, scaling parameters, or conflicting bases.
  """
  thetas = {}
  if hf.get('rope_theta') is not None:
    thetas['rope_theta'] = float(hf['rope_theta'])
  for field in ('rope_parameters', 'rope_scaling'):
    params = hf.get(field)
    if not params:
      continue
    if not isinstance(params, dict):
      raise ValueError(f'{what}: {field} must be a JSON object, got {params!r}.')
    rope_type = params.get('rope_type', params.get('type', 'default'))
    extra = sorted(set(params) - {'rope_type', 'type', 'rope_theta'})
    if rope_type != 'default' or extra:
      raise ValueError(
          f'{what}: {field}={params!r} asks for RoPE type {rope_type!r}'
          + (f' with parameters {extra}' if extra else '') + '; only plain RoPE '
          "(rope_type 'default' or absent, as in Lumina-mGPT, Chameleon and "
          'Janus-Pro) is implemented. Convert a checkpoint saved without RoPE '
          'scaling.')
    if params.get('rope_theta') is not None:
      thetas[f'{field}.rope_theta'] = float(params['rope_theta'])
  if len(set(thetas.values())) > 1:
    raise ValueError(f'{what}: conflicting RoPE bases {thetas}; fix the config so '
                     'they agree (transformers 5 reads rope_parameters.rope_theta).')
  return next(iter(thetas.values()), float(default))


def lumina_7b(**overrides) -> ChameleonConfig:
  """Lumina-mGPT 7B (Chameleon 7B dimensions, pre-norm)."""
  return ChameleonConfig(**overrides)


def chameleon_34b(**overrides) -> ChameleonConfig:
  """Chameleon / Lumina-mGPT 34B: swin-norm ordering.

  Only `swin_norm=True` is documented for 34B (the Chameleon paper, arXiv
  2405.09818, reorders the norms Swin-style for 34B). The other
  dimensions here (hidden 8192, 48 layers, 64 heads, 8 KV heads, intermediate
  22016) are an unverified guess at Meta's 34B params.json; the converter
  reads the real ones from the checkpoint's config.json by default, and its
  key/shape check rejects a preset that does not match.
  """
  values = dict(hidden_size=8192, num_layers=48, num_heads=64, num_kv_heads=8,
                head_dim=128, intermediate_size=22016, swin_norm=True)
  values.update(overrides)
  return ChameleonConfig(**values)


CONFIGS = {'7b': lumina_7b, '34b': chameleon_34b}
