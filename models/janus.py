"""Janus-Pro image-generation path, implementing the engine's `DecodeModel`.

Legend: B batch rows (with CFG: conditional rows first, then unconditional
rows), P prompt length, T new tokens, S cache slots, V image vocabulary
(16384 VQ-16 codes), E LLM width, G gen-head width, C gen-embedding width (8).

The language model is Hugging Face Llama (rotate_half RoPE, RMSNorm eps 1e-6,
no q/k norm). The prompt runs through the text embedding; every generated
image token enters as `gen_aligner(gen_embed(token))` (`Linear(C->E)`, exact
GELU, `Linear(E->E)`), and the next-token logits are
`gen_head(final-norm hidden)` (`Linear(E->G)`, exact GELU, `Linear(G->V)`).
The text `lm_head` is not used for images.

Classifier-free guidance as in the original: the unconditional prompt is the
conditional one with every token strictly between BOS and `<begin_of_image>`
replaced by the pad id; pads are attended to like ordinary tokens (the
original passes no attention mask). The original interleaves rows (even cond,
odd uncond), as the engine does inside its loop; `decode.generate` takes
all conditional rows first (`build_prompt`) and interleaves them once. Prompts of different lengths are left-padded with a mask.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import kv_cache as kv
from specdec_jax import protocol
from specdec_jax.models import chameleon
from specdec_jax.models import chameleon_config
from specdec_jax.models import dense_dot


@dataclasses.dataclass(frozen=True)
class JanusConfig:
  """Janus-Pro generation-path dimensions (defaults: Janus-Pro-7B).

  dtype/param_dtype None resolve as `ChameleonConfig`'s (float32 on CPU,
  bfloat16 on accelerators; param_dtype follows dtype).
  """

  text_vocab_size: int = 102400
  hidden_size: int = 4096
  num_layers: int = 30
  num_heads: int = 32
  num_kv_heads: int = 32
  head_dim: int = 128
  intermediate_size: int = 11008
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  image_vocab_size: int = 16384
  gen_embed_dim: int = 8
  gen_head_dim: int = 4096
  max_position_embeddings: int = 16384
  dtype: Any = None
  param_dtype: Any = None
  scan_layers: bool = False  # one nn.scan over the blocks, see ChameleonConfig

  def __post_init__(self):
    chameleon_config.resolve_dtypes(self)
    if self.num_heads * self.head_dim != self.hidden_size:
      raise ValueError(
          f'JanusConfig: num_heads * head_dim = {self.num_heads} * '
          f'{self.head_dim} must equal hidden_size = {self.hidden_size}.')
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f'JanusConfig: num_heads {self.num_heads} must be a multiple of '
          f'num_kv_heads {self.num_kv_heads}.')


def janus_pro_7b(**overrides) -> JanusConfig:
  return JanusConfig(**overrides)


def janus_pro_1b(**overrides) -> JanusConfig:
  values = dict(hidden_size=2048, num_layers=24, num_heads=16, num_kv_heads=16,
                intermediate_size=5632, gen_head_dim=2048)
  values.update(overrides)
  return JanusConfig(**values)


CONFIGS = {'pro-7b': janus_pro_7b, 'pro-1b': janus_pro_1b}


@flax.struct.dataclass
class JanusPrompt:
  """Prompt tokens (text vocabulary), ending with `<begin_of_image>`.

  Attributes:
    tokens: int32[B, P].
    mask: bool[B, P] (True on real tokens, padding on the left) or None.
  """

  tokens: jax.Array
  mask: jax.Array | None = None


def build_prompt(prompts: Sequence[Sequence[int]], *, pad_id: int,
                 cfg: bool = True) -> JanusPrompt:
  """Conditional rows, then (cfg) unconditional rows, left-padded to one length.

  Args:
    prompts: per image, `[bos, ...text ids, <begin_of_image>]`.
    pad_id: the tokenizer's pad id (replaces the text of unconditional rows;
      also used for left padding, which is masked).
    cfg: append the unconditional rows.
  """
  rows = [list(map(int, p)) for p in prompts]
  if not rows or min(len(r) for r in rows) < 2:
    raise ValueError('janus.build_prompt: pass at least one prompt, each with at '
                     'least BOS and <begin_of_image>.')
  if cfg:
    rows += [[r[0]] + [pad_id] * (len(r) - 2) + [r[-1]] for r in rows]
  length = max(len(r) for r in rows)
  tokens = np.full((len(rows), length), pad_id, np.int32)
  mask = np.zeros((len(rows), length), bool)
  for i, row in enumerate(rows):
    tokens[i, length - len(row):] = row
    mask[i, length - len(row):] = True
  return JanusPrompt(jnp.asarray(tokens), None if mask.all() else jnp.asarray(mask))


class GenAligner(nn.Module):
  """`layers.0` Linear(C->E), exact GELU, `layers.2` Linear(E->E)."""

  features: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    dense = lambda name: nn.Dense(self.features, dtype=self.dtype,
                                  param_dtype=self.param_dtype, name=name)
    return dense('layers_2')(jax.nn.gelu(dense('layers_0')(x), approximate=False))


class GenHead(nn.Module):
  """`output_mlp_projector` Linear(E->G), exact GELU, `vision_head` Linear(G->V)."""

  head_dim: int
  vocab_size: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, hidden):
    x = nn.Dense(self.head_dim, dtype=self.dtype, param_dtype=self.param_dtype,
                 dot_general=dense_dot.weight_dot, name='output_mlp_projector')(hidden)
    x = jax.nn.gelu(x, approximate=False)
    return nn.Dense(self.vocab_size, dtype=self.dtype, param_dtype=self.param_dtype,
                    dot_general=dense_dot.weight_dot, name='vision_head')(x)


class JanusGenLM(nn.Module):
  """Text or image tokens -> (float32 image logits, final-norm hidden, cache)."""

  config: JanusConfig

  def setup(self):
    c = self.config
    self.embed_tokens = nn.Embed(c.text_vocab_size, c.hidden_size, dtype=c.dtype,
                                 param_dtype=c.param_dtype)
    self.model = chameleon.DecoderStack(
        c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
        c.rms_norm_eps, c.rope_theta, qk_norm=False, dtype=c.dtype,
        param_dtype=c.param_dtype, scan_layers=c.scan_layers)
    self.gen_embed = nn.Embed(c.image_vocab_size, c.gen_embed_dim, dtype=c.dtype,
                              param_dtype=c.param_dtype)
    self.gen_aligner = GenAligner(c.hidden_size, c.dtype, c.param_dtype)
    self.gen_head = GenHead(c.gen_head_dim, c.image_vocab_size, c.dtype, c.param_dtype)

  def __call__(self, tokens, cache: kv.KVCache, window_mask=None, depths=None,
               text: bool = False, logits_at=None):
    """tokens int32[B, T] (text ids if `text`, else image codes).

    logits_at int32[B] (optional): the head at that position only, [B, 1, V].
    """
    if text:
      x = self.embed_tokens(tokens)  # [B, T, E]
    else:
      x = self.gen_aligner(self.gen_embed(tokens))  # [B, T, E]
    hidden, cache = self.model(x, cache, window_mask, depths)
    logits = self.gen_head(protocol.at_positions(hidden, logits_at))
    return logits.astype(jnp.float32), hidden, cache

  def init_all(self, tokens, cache):
    self.embed_tokens(tokens)
    return self(tokens, cache)


@dataclasses.dataclass(frozen=True)
class JanusModel:
  """Janus-Pro generation path as a `DecodeModel` (V = image codes).

  Params: `{'embed_tokens', 'model', 'gen_embed', 'gen_aligner', 'gen_head'}`.
  """

  config: JanusConfig
  # prefill and forward take logits_at (`protocol.prefill_last`, drafters' catch-up).
  head_at_one_position = True

  @property
  def module(self) -> JanusGenLM:
    return JanusGenLM(self.config)

  @property
  def vocab_size(self) -> int:
    return self.config.image_vocab_size

  @property
  def image_token_range(self) -> tuple[int, int]:
    """Every logit is an image code; see `protocol.image_token_range`."""
    return 0, self.config.image_vocab_size

  @property
  def hidden_size(self) -> int:
    return self.config.hidden_size

  def init_params(self, rng: jax.Array) -> Any:
    """Random parameters (tests, benchmarks)."""
    return self.module.init(rng, jnp.zeros((1, 1), jnp.int32), self.init_cache(1, 1),
                            method=JanusGenLM.init_all)['params']

  def prefix_length(self, cond: JanusPrompt) -> int:
    return chameleon.prompt_length(cond, JanusPrompt, 'JanusModel')

  def check_cond(self, cond: JanusPrompt) -> None:
    """Checks a concrete prompt's ids and padding too (`specdec_jax.checks`)."""
    chameleon.check_prompt(cond.tokens, cond.mask, vocab_size=self.config.text_vocab_size,
                           what='generate: cond')

  def init_cache(self, batch_size: int, capacity: int) -> kv.KVCache:
    c = self.config
    return kv.init_cache(num_layers=c.num_layers, batch_size=batch_size,
                         capacity=capacity, num_kv_heads=c.num_kv_heads,
                         head_dim=c.head_dim, dtype=c.dtype, stacked=c.scan_layers)

  def _run(self, params, cache, tokens, window_mask=None, depths=None, text=False,
           logits_at=None):
    protocol.check_logits_at(logits_at, tokens.shape[0], 'JanusModel')
    logits, hidden, cache = self.module.apply(
        {'params': params}, tokens, cache, window_mask, depths, text, logits_at)
    return protocol.ForwardOutput(logits=logits, hidden=hidden, cache=cache)

  def forward(self, params, cache, tokens, window_mask=None, depths=None, logits_at=None):
    """Image tokens int32[B, T] (codes in [0, V)) at each row's cache length.

    logits_at int32[B] (optional): logits [B, 1, V] at that position only.
    """
    return self._run(params, cache, tokens, window_mask, depths, logits_at=logits_at)

  def prefill(self, params, cache, cond: JanusPrompt, logits_at=None) -> protocol.ForwardOutput:
    """Runs the text prompt on a fresh cache; logits [B, P, V] are image logits."""
    chameleon.check_prompt(cond.tokens, cond.mask, vocab_size=self.config.text_vocab_size,
                           what='JanusModel.prefill')
    kv.check_capacity(cache.capacity, cond.tokens.shape[1], 'JanusModel.prefill')
    if cond.mask is not None:
      cache = chameleon.mark_prefix_padding(cache, cond.mask)
    return self._run(params, cache, cond.tokens, text=True, logits_at=logits_at)
