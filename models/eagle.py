"""EAGLE-1 drafter head (LlamaGen and Lumina-mGPT flavours of LANTERN).

Legend: B batch rows (with CFG: conditional rows first), T new tokens, S cache
slots, V vocabulary, E width (the target's), H heads, D head dim, F
feed-forward width.

Architecture (EAGLE-1 `cnets.py`, LANTERN `cnets_llamagen.py` /
`cnets_lumina_mgpt.py`):

  h   = fc(concat[embed(x_{t+1}), f_t])       fc: Linear(2E -> E, bias by default)
  h   = DecoderLayer(h)                       layer 0 without input RMSNorm
                                              (LlamaGen); Lumina keeps it and
                                              adds per-head q/k LayerNorm
  out = lm_head(h)                            the target's frozen head; no final norm

f_t is the target's last hidden state after its final norm (the head's
input) at the position that predicted x_{t+1}: drafter slot t pairs target
hidden t with token t+1. The embedding is a frozen copy of the target's.

RoPE: LlamaGen drafters use the target's 2D table with one fewer condition
token (the shift above): c2i 0, t2i 119. A t2i drafter's first 119 slots hold
the target's condition features paired with token 0 (`prefix_pairs`, as
LANTERN's `initialize_tree`), so the slot consuming image token n sits at
position 119 + n, grid cell n. Lumina drafters use 1D rotate_half RoPE and
first consume the prompt (feature t with prompt token t + 1, left padding
masked).

`EagleDrafter` mirrors the `DecodeModel` protocol with one more input:
`forward(params, cache, tokens, target_hidden, window_mask, depths)`. Its
`ForwardOutput.hidden` is the drafter's predicted feature (before the head),
which deeper draft steps feed back as `target_hidden`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec_jax import kv_cache as kv
from specdec_jax import precision
from specdec_jax import protocol
from specdec_jax.models import chameleon
from specdec_jax.models import dense_dot
from specdec_jax.models import layers
from specdec_jax.models import llamagen

ROPE_KINDS = ('2d', '1d')


@dataclasses.dataclass(frozen=True)
class DrafterConfig:
  """EAGLE-1 drafter dimensions (defaults: LANTERN's LlamaGen-XL t2i drafter).

  Attributes:
    input_layernorm: layer 0 has an input RMSNorm (Lumina); later layers
      always have one.
    qk_norm: per-head q/k LayerNorm before the rotation (Lumina/Chameleon).
    fc_bias: the fc layer has a bias (LANTERN config `bias`, default True).
    rope: '2d' (LlamaGen, interleaved pairs) or '1d' (Lumina, rotate_half).
    grid_size, cls_token_num: the 2D table (cls = target's minus one).
    dtype: compute, parameter and cache dtype name; None or 'auto' resolves
      when the config is built (float32 on CPU, bfloat16 on accelerators,
      `specdec_jax.precision`).
  """

  hidden_size: int = 1280
  num_heads: int = 20
  num_kv_heads: int | None = None
  intermediate_size: int = 3584
  vocab_size: int = 16384
  num_layers: int = 1
  rms_norm_eps: float = 1e-6
  fc_bias: bool = True
  input_layernorm: bool = False
  qk_norm: bool = False
  rope: str = '2d'
  rope_theta: float = 10000.0
  grid_size: int = 16
  cls_token_num: int = 119
  dtype: str | None = None

  def __post_init__(self):
    if self.num_kv_heads is None:
      object.__setattr__(self, 'num_kv_heads', self.num_heads)
    if self.rope not in ROPE_KINDS:
      raise ValueError(f'DrafterConfig: rope must be one of {ROPE_KINDS}, got '
                       f'{self.rope!r}.')
    if self.hidden_size % self.num_heads:
      raise ValueError(f'DrafterConfig: hidden_size {self.hidden_size} must be '
                       f'divisible by num_heads {self.num_heads}.')
    if self.cls_token_num < 0:
      raise ValueError(f'DrafterConfig: cls_token_num must be >= 0, got '
                       f'{self.cls_token_num}.')
    object.__setattr__(self, 'dtype', precision.resolve_dtype(self.dtype).name)

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def compute_dtype(self) -> Any:
    return jnp.dtype(self.dtype)


def llamagen_drafter_config(target: llamagen.GPTConfig, **overrides) -> DrafterConfig:
  """The LANTERN drafter shape for a LlamaGen target (rms eps 1e-6, 2D RoPE)."""
  fields = dict(
      hidden_size=target.dim, num_heads=target.n_head, num_kv_heads=target.n_kv_head,
      intermediate_size=target.ffn_dim, vocab_size=target.vocab_size,
      rms_norm_eps=1e-6, rope='2d', rope_theta=target.rope_base,
      grid_size=target.grid_size, cls_token_num=target.cls_token_num - 1,
      dtype=target.dtype)
  fields.update(overrides)
  return DrafterConfig(**fields)


def lumina_drafter_config(**overrides) -> DrafterConfig:
  """LANTERN's Lumina-mGPT 7B drafter: input norm, qk-norm, 1D RoPE."""
  fields = dict(hidden_size=4096, num_heads=32, intermediate_size=11008,
                vocab_size=65536, rms_norm_eps=1e-5, input_layernorm=True,
                qk_norm=True, rope='1d', cls_token_num=0)
  fields.update(overrides)
  return DrafterConfig(**fields)


def rope_tables(config: DrafterConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(cos, sin) float32[B, T, D/2] for the drafter's position ids."""
  if config.rope == '2d':
    return llamagen.rope_2d(positions, config.head_dim, config.grid_size,
                            config.cls_token_num, config.rope_theta)
  angles = layers.rope_1d_angles(positions, config.head_dim, config.rope_theta)
  return jnp.cos(angles), jnp.sin(angles)


class DrafterModule(nn.Module):
  """embed + fc + decoder layer(s) + the target's head (params `lm_head`)."""

  config: DrafterConfig

  @nn.compact
  def __call__(self, tokens, target_hidden, cache: kv.KVCache, window_mask=None,
               depths=None, logits_at=None):
    """tokens int32[B, T], target_hidden [B, T, E] -> (logits f32, hidden, cache).

    logits_at int32[B] (optional): the head runs only at that position of each
    row (logits [B, 1, V]); hidden stays [B, T, E].
    """
    c = self.config
    dtype = c.compute_dtype
    embeds = nn.Embed(c.vocab_size, c.hidden_size, dtype=dtype, param_dtype=dtype,
                      name='embed_tokens')(tokens)
    x = jnp.concatenate([embeds, target_hidden.astype(dtype)], axis=-1)  # [B, T, 2E]
    x = nn.Dense(c.hidden_size, use_bias=c.fc_bias, dtype=dtype, param_dtype=dtype,
                 dot_general=dense_dot.weight_dot, name='fc')(x)
    positions = kv.window_positions(cache, tokens.shape[1], depths)
    cos, sin = rope_tables(c, positions)
    for index in range(c.num_layers):
      layer = layers.DecoderLayer(
          num_heads=c.num_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
          ffn_dim=c.intermediate_size, norm_eps=c.rms_norm_eps,
          rope='interleaved' if c.rope == '2d' else 'half', qk_norm=c.qk_norm,
          input_norm=c.input_layernorm or index > 0, dtype=dtype, param_dtype=dtype,
          name=f'layers_{index}')
      x, cache = layer(x, cos, sin, cache, index, window_mask)
    logits = nn.Dense(c.vocab_size, use_bias=False, dtype=dtype, param_dtype=dtype,
                      dot_general=dense_dot.weight_dot,
                      name='lm_head')(protocol.at_positions(x, logits_at))
    return logits.astype(jnp.float32), x, kv.advance(cache, tokens.shape[1])


def attach_head(drafter_params: Any, head_kernel: jax.Array) -> Any:
  """Drafter params with the target's head kernel [E, V] as `lm_head`.

  For a LlamaGen target: `target_params['output']['kernel']`. The same array
  object is used, so nothing is copied.
  """
  params = dict(drafter_params)
  params['lm_head'] = {'kernel': head_kernel}
  return params


EMBEDDING_SOURCES = ('tok_embeddings', 'output')


def embedding_from_llamagen(target_params: Any, source: str = 'tok_embeddings') -> jax.Array:
  """The frozen drafter embedding [V, E] taken from a LlamaGen target.

  Args:
    target_params: LlamaGen GPT params.
    source: 'tok_embeddings' (EAGLE: a copy of the target's embedding) or
      'output' (LANTERN's fallback for single-file HF bases: the LM head's
      rows, i.e. the transposed head kernel).
  """
  if source == 'tok_embeddings':
    return target_params['tok_embeddings']['embedding']
  if source == 'output':
    return jnp.asarray(target_params['output']['kernel']).T
  raise ValueError(f'embedding_from_llamagen: source must be one of '
                   f'{EMBEDDING_SOURCES}, got {source!r}.')


def _prompt_pairs(cond: Any, target_hidden: jax.Array) -> tuple | None:
  """EAGLE pairs of a prompt prefix (see `EagleDrafter.prefix_pairs`), or None
  when cond holds no prompt tokens or only one."""
  tokens = getattr(cond, 'tokens', None)
  if tokens is None or tokens.shape[1] < 2:
    return None
  if tuple(target_hidden.shape[:2]) != tuple(tokens.shape):
    raise ValueError(f'EagleDrafter.prefix_pairs: the target prefix features '
                     f'{tuple(target_hidden.shape)} must cover the prompt tokens '
                     f'{tuple(tokens.shape)} ([R, P, E] for [R, P]).')
  pairs = (tokens[:, 1:].astype(jnp.int32), target_hidden[:, :-1])
  mask = getattr(cond, 'mask', None)
  return pairs if mask is None else pairs + (mask[:, :-1],)


@dataclasses.dataclass(frozen=True)
class EagleDrafter:
  """EAGLE-1 drafter with the engine's model calls plus the target features.

  Params: `embed_tokens`, `fc`, `layers_{i}` (DecoderLayer), `lm_head` (the
  target's frozen head, see `attach_head`).
  """

  config: DrafterConfig
  # forward takes logits_at (`specdec_jax.drafting.Drafter.forward`).
  head_at_one_position = True

  @property
  def module(self) -> DrafterModule:
    return DrafterModule(self.config)

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def hidden_size(self) -> int:
    return self.config.hidden_size

  def init_cache(self, batch_size: int, capacity: int) -> kv.KVCache:
    c = self.config
    return kv.init_cache(num_layers=c.num_layers, batch_size=batch_size,
                         capacity=capacity, num_kv_heads=c.num_kv_heads,
                         head_dim=c.head_dim, dtype=c.compute_dtype)

  def init_params(self, rng: jax.Array) -> Any:
    """Random parameters (tests; training starts from these plus the target's
    embedding and head)."""
    c = self.config
    tokens = jnp.zeros((1, 1), jnp.int32)
    hidden = jnp.zeros((1, 1, c.hidden_size), c.compute_dtype)
    return _init_params(self, rng, tokens, hidden, self.init_cache(1, 1))

  def _check(self, tokens, target_hidden, cache, what):
    want = tuple(tokens.shape) + (self.config.hidden_size,)
    if tokens.ndim != 2 or tuple(target_hidden.shape) != want:
      raise ValueError(
          f'{what}: tokens must be int32[B, T] and target_hidden [B, T, '
          f'{self.config.hidden_size}] with the same B, T; got tokens '
          f'{tuple(tokens.shape)} and target_hidden {tuple(target_hidden.shape)}.')
    if tokens.shape[0] != cache.batch_size:
      raise ValueError(f'{what}: {tokens.shape[0]} rows but the cache has '
                       f'{cache.batch_size}.')

  def check_target(self, target: Any) -> None:
    """Raises unless a 2D-RoPE drafter's table fits the target's: the same grid
    and one condition position fewer (LANTERN's `input_type`: c2i 0, t2i and
    t2i2 119). Targets without a 2D grid are not checked."""
    c, target_config = self.config, getattr(target, 'config', None)
    grid = getattr(target_config, 'grid_size', None)
    cls_token_num = getattr(target_config, 'cls_token_num', None)
    if c.rope != '2d' or grid is None or cls_token_num is None:
      return
    if c.grid_size != grid or c.cls_token_num != cls_token_num - 1:
      raise ValueError(
          f'generate: the EAGLE drafter\'s 2D RoPE table (grid {c.grid_size}, '
          f'{c.cls_token_num} condition positions) does not fit the target (grid {grid}, '
          f'{cls_token_num} condition positions; the drafter needs grid {grid} and '
          f'{cls_token_num - 1}). Convert the drafter trained for this target (LANTERN '
          f'config.json input_type: c2i for 576-token c2i, t2i for 256-token and t2i2 for '
          f'1024-token t2i targets).')

  def prefix_pairs(self, cond: Any, target_hidden: jax.Array) -> tuple | None:
    """The drafter's prefix before the first image token, or None (none).

    As LANTERN's `initialize_tree` feeds its drafters:
    - a 2D-RoPE drafter with c = cls_token_num > 0 (the t2i drafters: c =
      119): the target's first c condition features paired with token id 0
      [R, c]; the catch-up then pairs the last condition feature with the first
      image token at slot c, the table's first grid row. target_hidden: [R, c +
      1, E], the target's prefix. c = 0 (c2i): None, the head starts empty.
    - a 1D-RoPE drafter (Lumina-mGPT) on a prompt (cond with `tokens` int32[R,
      P] and `mask` bool[R, P] or None, as `models.chameleon.ChameleonPrompt`):
      the pairs (feature t, prompt token t + 1) for t < P - 1, with valid =
      mask[:, :P - 1] (a padded feature's slot is never attended, and each
      row's first real slot is position 0, LANTERN's mask.cumsum - 1).
    Returns:
      (tokens int32[R, Pd], features [R, Pd, E]) or, with a padding mask,
      (tokens, features, valid bool[R, Pd]) for `prefill`; or None.
    """
    if self.config.rope == '1d':
      return _prompt_pairs(cond, target_hidden)
    c = self.config.cls_token_num
    if c == 0:
      return None
    if target_hidden.shape[1] != c + 1:
      raise ValueError(f'EagleDrafter.prefix_pairs: the drafter has {c} condition positions, '
                       f'so the target prefix must have {c + 1}; got '
                       f'{target_hidden.shape[1]} (target_hidden {tuple(target_hidden.shape)}).')
    tokens = jnp.zeros(target_hidden.shape[:1] + (c,), jnp.int32)
    return tokens, target_hidden[:, :c]

  def prefill(self, params: Any, cache: kv.KVCache, tokens: jax.Array,
              target_hidden: jax.Array, valid: jax.Array | None = None
              ) -> protocol.ForwardOutput:
    """First call on a fresh cache: the target prefix's features paired with
    the tokens that follow them (slot t: target hidden t, token t + 1).
    valid: optional bool[B, T], False on left padding (never attended; each
    row's first valid slot is position 0)."""
    kv.check_capacity(cache.capacity, tokens.shape[1], 'EagleDrafter.prefill')
    if valid is not None:
      cache = chameleon.mark_prefix_padding(cache, valid)
    return self.forward(params, cache, tokens, target_hidden)

  def forward(self, params: Any, cache: kv.KVCache, tokens: jax.Array,
              target_hidden: jax.Array, window_mask: jax.Array | None = None,
              depths: jax.Array | None = None,
              logits_at: jax.Array | None = None) -> protocol.ForwardOutput:
    """T new (token, feature) pairs at each row's length.

    Args:
      params: drafter params with `lm_head` attached.
      cache: the drafter's own cache.
      tokens: int32[B, T], token t + 1 for each feature t.
      target_hidden: [B, T, E] target features (or the drafter's own
        predicted features for deeper draft steps).
      window_mask: bool[T, W] or, a tree per row, bool[B, T, W] (W >= T; the first
        W - T columns are the slots just before the row length): tree visibility,
        default causal; the forms of `protocol.DecodeModel.forward`.
      depths: int32[T] or int32[B, T] offsets from the row length (default arange(T)).
      logits_at: int32[B] (optional): the head runs only at this position of
        each row (the catch-up needs one; the head is the largest matmul).
    Returns:
      ForwardOutput: logits f32[B, T, V] (f32[B, 1, V] with logits_at) from
      the target head, hidden [B, T, E] predicted features, cache advanced by T.
    """
    self._check(tokens, target_hidden, cache, 'EagleDrafter.forward')
    protocol.check_logits_at(logits_at, tokens.shape[0], 'EagleDrafter.forward')
    logits, hidden, cache = self.module.apply(
        {'params': params}, tokens, target_hidden, cache, window_mask, depths, logits_at)
    return protocol.ForwardOutput(logits=logits, hidden=hidden, cache=cache)


@functools.partial(jax.jit, static_argnums=0)
def _init_params(drafter: EagleDrafter, rng, tokens, hidden, cache) -> Any:
  """`EagleDrafter.init_params`, compiled once per drafter config."""
  return drafter.module.init(rng, tokens, hidden, cache)['params']
