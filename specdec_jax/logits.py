"""Logits processing shared by target and draft.

Legend: V vocabulary, `...` any leading batch/window dims.

Speculative decoding is only correct when the draft distribution it divides
by is the distribution the draft token was sampled from, and the target
distribution is the one plain decoding would sample from. Both go through
`Sampling.probs`: CFG combine on raw float32 logits, then temperature, then
top-k, then top-p (the order of LlamaGen's `sample`; SPEC section 1).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

_NEG_INF = -jnp.inf


def cfg_combine(cond_logits: jax.Array, uncond_logits: jax.Array, scale) -> jax.Array:
  """Classifier-free guidance: uncond + scale * (cond - uncond), in float32.

  Args:
    cond_logits, uncond_logits: [..., V].
    scale: guidance scale (1.0 returns the conditional logits).
  """
  cond = cond_logits.astype(jnp.float32)
  uncond = uncond_logits.astype(jnp.float32)
  return uncond + scale * (cond - uncond)


def top_k_mask(logits: jax.Array, top_k: int) -> jax.Array:
  """Drops logits below the k-th largest (ties with it are kept, as LlamaGen)."""
  vocab = logits.shape[-1]
  if top_k <= 0 or top_k >= vocab:
    return logits
  kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
  return jnp.where(logits < kth, _NEG_INF, logits)


def top_p_mask(logits: jax.Array, top_p: float) -> jax.Array:
  """Nucleus filtering as Hugging Face: keep the smallest prefix (by
  descending probability) whose mass reaches top_p; the first token is always
  kept."""
  if top_p >= 1.0:
    return logits
  order = jnp.argsort(-logits, axis=-1, stable=True)
  sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
  cumulative = jnp.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1)
  remove_sorted = cumulative > top_p
  # Shift right so the token that crosses top_p is kept.
  remove_sorted = jnp.concatenate(
      [jnp.zeros_like(remove_sorted[..., :1]), remove_sorted[..., :-1]], axis=-1)
  inverse = jnp.argsort(order, axis=-1)
  remove = jnp.take_along_axis(remove_sorted, inverse, axis=-1)
  return jnp.where(remove, _NEG_INF, logits)


def process_logits(logits: jax.Array, *, temperature: float = 1.0, top_k: int = 0,
                   top_p: float = 1.0) -> jax.Array:
  """Temperature, then top-k, then top-p; returns float32 probabilities [..., V].

  temperature == 0 means greedy: a one-hot distribution on the argmax (the
  distribution a greedy draft is actually "sampled" from, so SD stays exact).
  """
  logits = logits.astype(jnp.float32)
  if temperature == 0:
    return jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)
  logits = logits / temperature
  logits = top_k_mask(logits, top_k)
  logits = top_p_mask(logits, top_p)
  return jax.nn.softmax(logits, axis=-1)


# Sampling settings of the released models' own generation code, for
# `Sampling.preset(name)`. Each entry is what that code passes to its sampler:
SAMPLING_PRESETS: dict[str, dict] = {
    # LlamaGen c2i demo, autoregressive/sample/sample_c2i.py argparse defaults.
    'llamagen_c2i': dict(cfg_scale=4.0, cfg_interval=-1, temperature=1.0, top_k=2000, top_p=1.0),
    # LlamaGen c2i FID sampling, autoregressive/sample/sample_c2i_ddp.py
    # defaults (the paper's per-size CFG scales are passed on its command line).
    'llamagen_c2i_fid': dict(cfg_scale=1.5, cfg_interval=-1, temperature=1.0, top_k=0,
                             top_p=1.0),
    # LlamaGen t2i, autoregressive/sample/sample_t2i.py defaults.
    'llamagen_t2i': dict(cfg_scale=7.5, cfg_interval=-1, temperature=1.0, top_k=1000,
                         top_p=1.0),
    # Lumina-mGPT README text-to-image example: temperature 1.0,
    # create_logits_processor(cfg=4.0, image_top_k=2000).
    'lumina_mgpt': dict(cfg_scale=4.0, temperature=1.0, top_k=2000, top_p=1.0),
    # Lumina-mGPT inference_solver.create_logits_processor defaults (cfg=3.0,
    # image_top_k=2000; also SJD's and LANTERN's Lumina scripts).
    'lumina_mgpt_default': dict(cfg_scale=3.0, temperature=1.0, top_k=2000, top_p=1.0),
    # Janus-Pro generation_inference.py / demo/app_januspro.py: cfg_weight 5,
    # temperature 1, softmax(logits / T) with no top-k or top-p.
    'janus_pro': dict(cfg_scale=5.0, temperature=1.0, top_k=0, top_p=1.0),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sampling:
  """How logits become the distribution tokens are sampled from.

  Attributes:
    cfg_scale: classifier-free guidance scale. As LlamaGen's `generate`, CFG
      is used only when cfg_scale > 1.0 (then cache rows are [cond; uncond]);
      any scale <= 1.0 decodes the conditional rows alone.
    cfg_interval: LlamaGen's interval; -1 (default) guides every token. For
      cfg_interval = c >= 0 the tokens with 0-based index 0..c+1 are guided
      and the rest use the conditional logits alone: LlamaGen guides the token
      its prefill samples (index 0) and decode-loop step i (which samples token
      i + 1) while i <= c (`decode_n_tokens` in autoregressive/models/
      generate.py).
    temperature: > 0, or 0 for greedy.
    top_k: 0 disables.
    top_p: 1.0 disables.

  `Sampling.preset(name)` builds the released models' own settings
  (`SAMPLING_PRESETS`); subclasses inherit it, e.g.
  `LuminaSampling.preset('lumina_mgpt', layout=layout)`.
  """

  cfg_scale: float = 1.0
  cfg_interval: int = -1
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if not self.temperature >= 0:
      raise ValueError(f'Sampling.temperature must be >= 0, got {self.temperature}.')
    if not 0 < self.top_p <= 1:
      raise ValueError(f'Sampling.top_p must be in (0, 1], got {self.top_p}.')
    if self.top_k < 0:
      raise ValueError(f'Sampling.top_k must be >= 0 (0 disables), got {self.top_k}.')
    if self.cfg_interval < -1:
      raise ValueError(f'Sampling.cfg_interval must be >= -1, got {self.cfg_interval}.')

  @classmethod
  def preset(cls, name: str, **overrides) -> 'Sampling':
    """The sampling settings of a released model's own code (`SAMPLING_PRESETS`).

    Args:
      name: a key of SAMPLING_PRESETS.
      **overrides: fields to change or add (e.g. `layout=` for LuminaSampling).
    """
    if name not in SAMPLING_PRESETS:
      raise ValueError(f'Sampling.preset: unknown preset {name!r}; known: '
                       f'{sorted(SAMPLING_PRESETS)}.')
    return cls(**{**SAMPLING_PRESETS[name], **overrides})

  @property
  def uses_cfg(self) -> bool:
    """CFG is on only for cfg_scale > 1.0, as LlamaGen's `generate`."""
    return self.cfg_scale > 1.0

  def guided(self, token_index) -> jax.Array | bool:
    """Whether the token with 0-based index `token_index` is guided (bool[...])."""
    if not self.uses_cfg:
      return False
    if self.cfg_interval < 0:
      return True
    return jnp.asarray(token_index) <= self.cfg_interval + 1

  def probs(self, cond_logits: jax.Array, uncond_logits: jax.Array | None = None,
            token_index: jax.Array | int | None = None) -> jax.Array:
    """CFG combine (if uncond_logits given and the token is guided), then process.

    Args:
      cond_logits: [..., V] raw logits of the conditional rows.
      uncond_logits: [..., V] raw logits of the unconditional rows, or None.
      token_index: 0-based index of the token being predicted, broadcastable
        to the leading dims; only needed with cfg_interval >= 0.
    Returns:
      float32 probabilities [..., V].
    """
    logits = cond_logits.astype(jnp.float32)
    if uncond_logits is not None and self.uses_cfg:
      guided = cfg_combine(cond_logits, uncond_logits, self.cfg_scale)
      if self.cfg_interval >= 0:
        if token_index is None:
          raise ValueError('Sampling.probs: cfg_interval >= 0 needs token_index.')
        inside = self.guided(token_index)
        guided = jnp.where(jnp.expand_dims(inside, -1), guided, logits)
      logits = guided
    return process_logits(logits, temperature=self.temperature, top_k=self.top_k,
                          top_p=self.top_p)
