"""Chameleon / Lumina-mGPT language model, implementing the engine's `DecodeModel`.

Legend: B batch rows (with CFG: conditional rows first, then unconditional
rows), P prompt length, T new tokens, S cache slots, V vocabulary, E width,
H query heads, K key/value heads, D head dim, F feed-forward width.

Architecture (Hugging Face Chameleon as used by Lumina-mGPT): token embedding,
N Llama blocks with per-head q/k LayerNorm before a rotate_half 1D RoPE
(positions are absolute positions in the sequence, 0 at BOS), pre-norm
(7B) or swin-norm (34B) block ordering, final RMSNorm, `lm_head`, float32
logits.

Classifier-free guidance. Lumina-mGPT's CFG processor runs the unconditional
stream as a sequence of its own, `[8197, h_grid, w_grid, image tokens...]`: no
text, no BOS, positions restarting at 0, its own cache. The engine keeps all
rows in one `KVCache`, each row with its own length, `key_valid` and
`position_offset`, so the unconditional stream is an ordinary row whose prompt
is the image header left-padded to the conditional prompt's length:

  cond row:    [bos, text ..., 8710, 8197, h_grid, w_grid]      positions 0..P-1
  uncond row:  [pad, ..., pad,       8197, h_grid, w_grid]      positions -(P-3)..2

`prefill` marks the padding slots invalid (`key_valid` False) and sets
`position_offset` to the padding count, so the unconditional row attends only
to its own header and sees positions 0, 1, 2, ... exactly as the original's
separate sequence. Both rows then receive the same generated image tokens.
The image start and the two resolution tokens, which the original samples
without CFG, are part of the prompt here (they are fixed by the requested
size); `build_prompt` builds both kinds of rows.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import kv_cache as kv
from specdec_jax import protocol
from specdec_jax.models import dense_dot
from specdec_jax.models import layers
from specdec_jax.models import lumina_layout
# The configuration lives in chameleon_config; re-exported here.
from specdec_jax.models.chameleon_config import (CONFIGS, PAD_ID, ChameleonConfig, chameleon_34b,
                                                 lumina_7b, rope_theta_from_hf)


@flax.struct.dataclass
class ChameleonPrompt:
  """Prompt tokens, left-padded.

  Attributes:
    tokens: int32[B, P].
    mask: bool[B, P], True on real tokens, False on left padding; None when
      no row is padded.
  """

  tokens: jax.Array
  mask: jax.Array | None = None


def build_prompt(
    prompts: Sequence[Sequence[int]],
    layout: lumina_layout.ImageLayout,
    *,
    cfg: bool = True,
) -> ChameleonPrompt:
  """Prompt rows for text-to-image generation of one image size.

  Args:
    prompts: per image, the tokenised prompt `[bos, ...text, 8710]`.
    layout: the image size in latent tokens; its header (image start and the
      two resolution tokens) is appended to every row.
    cfg: also build the unconditional rows (the header alone, left-padded).
  Returns:
    A ChameleonPrompt with B = len(prompts) rows ([cond; uncond] with cfg:
    2 * len(prompts)), left-padded to the longest row.
  """
  if not prompts:
    raise ValueError('build_prompt: prompts is empty; pass at least one prompt.')
  header = list(layout.header_tokens())
  rows = [list(map(int, p)) + header for p in prompts]
  if cfg:
    rows += [header] * len(prompts)
  length = max(len(r) for r in rows)
  tokens = np.full((len(rows), length), PAD_ID, np.int32)
  mask = np.zeros((len(rows), length), bool)
  for i, row in enumerate(rows):
    tokens[i, length - len(row):] = row
    mask[i, length - len(row):] = True
  return ChameleonPrompt(jnp.asarray(tokens), None if mask.all() else jnp.asarray(mask))


class DecoderStack(nn.Module):
  """Embedded inputs -> N rotate_half Llama blocks -> final RMSNorm.

  Shared by Chameleon (q/k norm) and the Janus-Pro language model.
  """

  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  ffn_dim: int
  norm_eps: float
  rope_theta: float
  qk_norm: bool = False
  swin_norm: bool = False
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  scan_layers: bool = False

  @nn.compact
  def __call__(self, x, cache: kv.KVCache, window_mask=None, depths=None):
    """x [B, T, E] -> (hidden [B, T, E] after the final norm, cache advanced by T)."""
    num_new = x.shape[1]
    positions = kv.window_positions(cache, num_new, depths)  # [B, T]
    angles = layers.rope_1d_angles(positions, self.head_dim, self.rope_theta)
    cos, sin = jnp.cos(angles), jnp.sin(angles)  # [B, T, D/2]
    make_layer = lambda name: layers.DecoderLayer(
        self.num_heads, self.num_kv_heads, self.head_dim, self.ffn_dim,
        norm_eps=self.norm_eps, rope='half', qk_norm=self.qk_norm,
        swin_norm=self.swin_norm, dtype=self.dtype, param_dtype=self.param_dtype,
        merge_projections=not self.scan_layers,
        transpose_kernels=not self.scan_layers, name=name)
    if self.scan_layers:
      x, cache = layers.scan_layers(make_layer(layers.SCANNED), self.num_layers, x, cos, sin,
                                    cache, window_mask)
    else:
      for i in range(self.num_layers):
        x, cache = make_layer(f'layers_{i}')(x, cos, sin, cache, i, window_mask)
    hidden = layers.RMSNorm(self.norm_eps, self.param_dtype, name='norm')(x)
    return hidden, kv.advance(cache, num_new)


class ChameleonLM(nn.Module):
  """Tokens -> (float32 logits, final-norm hidden, cache)."""

  config: ChameleonConfig

  @nn.compact
  def __call__(self, tokens, cache: kv.KVCache, window_mask=None, depths=None,
               logits_at=None):
    """tokens int32[B, T] -> (logits f32[B, T, V], hidden [B, T, E], cache).

    logits_at int32[B] (optional): the head at that position only, [B, 1, V].
    """
    c = self.config
    embed = nn.Embed(c.vocab_size, c.hidden_size, dtype=c.dtype,
                     param_dtype=c.param_dtype, name='embed_tokens')
    x = embed(tokens)  # [B, T, E]
    hidden, cache = DecoderStack(
        c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim,
        c.intermediate_size, c.rms_norm_eps, c.rope_theta, qk_norm=True,
        swin_norm=c.swin_norm, dtype=c.dtype, param_dtype=c.param_dtype,
        scan_layers=c.scan_layers, name='model')(x, cache, window_mask, depths)
    lm_head = nn.Dense(c.vocab_size, use_bias=False, dtype=c.dtype,
                       param_dtype=c.param_dtype, dot_general=dense_dot.weight_dot,
                       name='lm_head')
    logits = lm_head(protocol.at_positions(hidden, logits_at))
    return logits.astype(jnp.float32), hidden, cache


def mark_prefix_padding(cache: kv.KVCache, mask: jax.Array) -> kv.KVCache:
  """Marks left padding of a P-token prompt in a fresh cache.

  Args:
    cache: an empty cache (lengths 0).
    mask: bool[B, P], True on real tokens; padding must be on the left.
  Returns:
    The cache with key_valid[:, :P] = mask and position_offset = number of
    padding slots, so each row's first real token has position 0. The prompt
    then runs in one forward: `kv.attention_mask` lets a padding query see
    only itself and a real query the real slots before it and itself.
  """
  prompt_length = mask.shape[1]
  key_valid = cache.key_valid.at[:, :prompt_length].set(mask)
  offset = prompt_length - jnp.sum(mask, axis=1, dtype=jnp.int32)
  return cache.replace(key_valid=key_valid, position_offset=offset)


def prompt_length(cond, prompt_type: type, what: str) -> int:
  """P of a prompt `cond` (a `prompt_type` holding int tokens [B, P], P >= 1), checked."""
  if not isinstance(cond, prompt_type):
    raise ValueError(f'{what}: cond must be a {prompt_type.__name__} (int32 tokens [B, P], '
                     f'optional mask), got {type(cond).__name__}.')
  tokens = cond.tokens
  if (jnp.ndim(tokens) != 2 or jnp.shape(tokens)[1] < 1
      or not jnp.issubdtype(jnp.result_type(tokens), jnp.integer)):
    raise ValueError(f'{what}: prompt tokens must be int32[B, P] with P >= 1, got '
                     f'{jnp.result_type(tokens)}{tuple(jnp.shape(tokens))}.')
  return int(tokens.shape[1])


def check_prompt(tokens, mask, *, vocab_size: int, what: str) -> None:
  """Validates prompt shapes (and, for concrete arrays, ids and left padding)."""
  if tokens.ndim != 2:
    raise ValueError(f'{what}: prompt tokens must be int32[B, P], got shape '
                     f'{tuple(tokens.shape)}.')
  if mask is not None and tuple(mask.shape) != tuple(tokens.shape):
    raise ValueError(f'{what}: prompt mask shape {tuple(mask.shape)} must equal '
                     f'the tokens shape {tuple(tokens.shape)}.')
  if isinstance(tokens, jax.core.Tracer):
    return
  ids = np.asarray(tokens)
  if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
    raise ValueError(f'{what}: prompt token ids must lie in [0, {vocab_size}), got '
                     f'min {ids.min()}, max {ids.max()}.')
  if mask is not None and not isinstance(mask, jax.core.Tracer):
    m = np.asarray(mask, bool)
    if (m[:, 1:] < m[:, :-1]).any():
      rows = np.nonzero((m[:, 1:] < m[:, :-1]).any(axis=1))[0].tolist()
      raise ValueError(f'{what}: prompt mask rows {rows} are not left-padded '
                       '(a False after a True); pad on the left.')
    if not m[:, -1].all():
      raise ValueError(f'{what}: every prompt row needs at least one real token '
                       'at the end (mask[:, -1] must be True).')


@dataclasses.dataclass(frozen=True)
class ChameleonModel:
  """Chameleon / Lumina-mGPT as a `DecodeModel`.

  Params are the Flax tree `{'embed_tokens', 'model', 'lm_head'}` (what
  `init_params` returns and the converter writes).
  """

  config: ChameleonConfig
  # prefill and forward take logits_at (`protocol.prefill_last`, drafters' catch-up).
  head_at_one_position = True

  @property
  def module(self) -> ChameleonLM:
    return ChameleonLM(self.config)

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def hidden_size(self) -> int:
    return self.config.hidden_size

  @property
  def image_token_range(self) -> tuple[int, int]:
    """Image tokens are the BPE ids 4..8195 (VQ code + 4); see `protocol.image_token_range`."""
    first = lumina_layout.FIRST_IMAGE_TOKEN
    return first, first + lumina_layout.NUM_IMAGE_CODES

  def init_params(self, rng: jax.Array) -> Any:
    """Random parameters (tests, benchmarks)."""
    cache = self.init_cache(1, 1)
    tokens = jnp.zeros((1, 1), jnp.int32)
    return self.module.init(rng, tokens, cache)['params']

  def prefix_length(self, cond: ChameleonPrompt) -> int:
    return prompt_length(cond, ChameleonPrompt, 'ChameleonModel')

  def check_cond(self, cond: ChameleonPrompt) -> None:
    """Checks a concrete prompt's ids and padding too (`specdec_jax.checks`)."""
    check_prompt(cond.tokens, cond.mask, vocab_size=self.vocab_size, what='generate: cond')

  def check_sampling(self, sampling, cond: ChameleonPrompt | None = None) -> None:
    """Warns when image tokens are sampled without Lumina-mGPT's image layout; raises
    when a concrete prompt's resolution header (its last three ids, as `build_prompt`
    writes them) names another size than the layout's."""
    if not isinstance(sampling, lumina_layout.LuminaSampling):
      warnings.warn(
          f'generate: ChameleonModel sampled with a plain {type(sampling).__name__}: nothing '
          'keeps the tokens to the image layout (image ids only, an end-of-row token after '
          'each row), so they may not form an image. For Lumina-mGPT images pass '
          "lumina_layout.LuminaSampling.preset('lumina_mgpt', layout=...).", UserWarning,
          stacklevel=6)
      return
    if cond is None or isinstance(cond.tokens, jax.core.Tracer) or cond.tokens.shape[1] < 3:
      return
    last = np.asarray(cond.tokens)[:, -3:]
    has_header = ((last[:, 0] == lumina_layout.IMAGE_START)
                  & (last[:, 1:] > lumina_layout.GRID_TOKEN_BASE).all(axis=1))
    rows = np.flatnonzero(has_header)
    sizes = (last[rows, 1:] - lumina_layout.GRID_TOKEN_BASE) * lumina_layout.LATENT_PER_GRID
    layout = sampling.layout
    bad = (sizes != (layout.height, layout.width)).any(axis=1)  # [R]
    if bad.any():
      (h, w), wrong = sizes[bad][0], rows[bad].tolist()
      raise ValueError(
          f'generate: prompt row(s) {wrong[:8]} end in the resolution header of a {h} x {w} '
          f'latent image, but LuminaSampling.layout is {layout.height} x {layout.width}; '
          'build the prompt with chameleon.build_prompt(..., layout) for the layout sampled.')

  def init_cache(self, batch_size: int, capacity: int) -> kv.KVCache:
    c = self.config
    return kv.init_cache(num_layers=c.num_layers, batch_size=batch_size,
                         capacity=capacity, num_kv_heads=c.num_kv_heads,
                         head_dim=c.head_dim, dtype=c.dtype, stacked=c.scan_layers)

  def forward(self, params, cache, tokens, window_mask=None, depths=None, logits_at=None):
    """T tokens int32[B, T] at each row's length; logits_at int32[B]: logits [B, 1, V]."""
    protocol.check_logits_at(logits_at, tokens.shape[0], 'ChameleonModel')
    logits, hidden, cache = self.module.apply(
        {'params': params}, tokens, cache, window_mask, depths, logits_at)
    return protocol.ForwardOutput(logits=logits, hidden=hidden, cache=cache)

  def prefill(self, params, cache, cond: ChameleonPrompt,
              logits_at=None) -> protocol.ForwardOutput:
    """Runs the prompt on a fresh cache (lengths 0); see the module docstring."""
    check_prompt(cond.tokens, cond.mask, vocab_size=self.vocab_size,
                 what='ChameleonModel.prefill')
    kv.check_capacity(cache.capacity, cond.tokens.shape[1], 'ChameleonModel.prefill')
    if cond.mask is not None:
      cache = mark_prefix_padding(cache, cond.mask)
    return self.forward(params, cache, cond.tokens, logits_at=logits_at)
