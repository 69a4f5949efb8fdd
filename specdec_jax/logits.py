"""Logits processing shared by target and draft.

Legend: V vocabulary, `...` any leading batch/window dims.

Speculative decoding is only correct when the draft distribution it divides
by is the distribution the draft token was sampled from, and the target
distribution is the one plain decoding would sample from. Both go through
`Sampling.probs`: CFG combine on raw float32 logits, then temperature, then
top-k, then top-p (the order of LlamaGen's `sample`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

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


TOPK_METHODS = ('exact', 'approx')


def _top_k_active(top_k: int, vocab: int) -> bool:
  return 0 < top_k < vocab


def top_k_mask(logits: jax.Array, top_k: int, method: str = 'exact',
               recall: float = 0.95) -> jax.Array:
  """Drops logits below the k-th largest (ties with it are kept, as LlamaGen).

  method 'exact' reads the k-th value off a descending sort (`lax.top_k` is
  about 1.1x faster on one CPU, but XLA's partitioner gathers its batch: over
  a 'data' mesh every step would all-gather [B, T, V]); 'approx' finds it
  with `jax.lax.approx_max_k` at the given recall target (TPU; exact on
  other backends).
  """
  if not _top_k_active(top_k, logits.shape[-1]):
    return logits
  return jnp.where(logits < _kth_value(logits, top_k, method, recall), _NEG_INF, logits)


def _kth_value(logits, top_k: int, method: str, recall: float) -> jax.Array:
  """The k-th largest logit [..., 1]."""
  if method == 'approx':
    values = jax.lax.approx_max_k(logits, top_k, recall_target=recall)[0]
    return jnp.min(values, axis=-1, keepdims=True)
  return jnp.sort(logits, axis=-1, descending=True)[..., top_k - 1:top_k]


def _nucleus_keep(logits, candidates, candidate_probs, top_p, complete: bool) -> jax.Array:
  """Hugging Face's nucleus as a mask over the unsorted logits, without an inverse
  permutation.

  Args:
    logits: [..., V].
    candidates: [..., C] logits sorted descending (-inf past a top-k cut).
    candidate_probs: [..., C] their probabilities after the top-k cut.
    complete: the candidates are all V logits (else the top-k ones only).
  Returns:
    bool[..., V]: sorted position i is kept iff i == 0 or the mass before it
    is <= top_p, i.e. a prefix of `kept` positions. Tokens above the last
    kept value are kept; of those equal to it, the first (kept - #above) in
    index order are, as a stable descending argsort orders ties.
  """
  cumulative = jnp.cumsum(candidate_probs, axis=-1)
  kept = 1 + jnp.sum(cumulative[..., :-1] <= top_p, axis=-1, keepdims=True)  # [..., 1]
  threshold = jnp.take_along_axis(candidates, kept - 1, axis=-1)
  # Counted on the logits before the top-k cut: equal whenever the threshold is
  # a kept value; if it is -inf the cut tokens are -inf whatever this says.
  above = logits > threshold
  tied = logits == threshold
  ties_kept = kept - jnp.sum(above, axis=-1, keepdims=True)
  if not complete:  # the nucleus ran past the k candidates: keep every tie with the k-th
    ties_kept = jnp.where(kept == candidates.shape[-1], logits.shape[-1], ties_kept)
  return above | (tied & (jnp.cumsum(tied, axis=-1) <= ties_kept))


def top_p_mask(logits: jax.Array, top_p) -> jax.Array:
  """Nucleus filtering as Hugging Face: keep the smallest prefix (by
  descending probability) whose mass reaches top_p; the first token is always
  kept. A concrete top_p >= 1 returns the logits; top_p may be traced.
  """
  if isinstance(top_p, (int, float)) and top_p >= 1.0:
    return logits
  return filter_logits(logits, top_k=0, top_p=top_p, nucleus=True)


def filter_logits(logits: jax.Array, *, top_k: int = 0, top_p=1.0, nucleus: bool = True,
                  topk_method: str = 'exact', topk_recall: float = 0.95) -> jax.Array:
  """Top-k (ties with the k-th kept), then top-p on what is left; -inf where dropped.

  Exact: one descending sort of V (the k-th value and the nucleus threshold
  are read off it and compared with the unsorted logits, so there is no
  inverse permutation, and a batch split over a mesh stays split).
  topk_method 'approx' takes the k candidates from `jax.lax.approx_max_k`
  (recall target topk_recall) and runs the nucleus on them, with no sort of
  V at all; if the nucleus reaches the k-th value it keeps every token tied
  with it (the exact path keeps ties in index order).

  Args:
    logits: float32 [..., V] (after temperature).
    top_k: 0 (or >= V) disables; top_p: may be traced; nucleus: top-p is on.
  """
  vocab = logits.shape[-1]
  use_top_k = _top_k_active(top_k, vocab)
  if not nucleus:
    return top_k_mask(logits, top_k, topk_method, topk_recall)
  if use_top_k and topk_method == 'approx':
    values = jax.lax.approx_max_k(logits, top_k, recall_target=topk_recall)[0]
    candidates = jnp.sort(values, axis=-1, descending=True)  # [..., k]
    keep_k = logits >= candidates[..., -1:]
    # Normalised over every top-k survivor (ties past the k candidates included).
    shifted = jnp.where(keep_k, jnp.exp(logits - candidates[..., :1]), 0.0)
    probs = jnp.exp(candidates - candidates[..., :1]) / jnp.sum(shifted, -1, keepdims=True)
    keep = keep_k & _nucleus_keep(logits, candidates, probs, top_p, complete=False)
    return jnp.where(keep, logits, _NEG_INF)
  candidates = jnp.sort(logits, axis=-1, descending=True)  # [..., V]
  keep = jnp.ones(logits.shape, bool)
  if use_top_k:
    kth = candidates[..., top_k - 1:top_k]
    keep = logits >= kth
    candidates = jnp.where(candidates < kth, _NEG_INF, candidates)
  probs = jax.nn.softmax(candidates, axis=-1)
  keep &= _nucleus_keep(logits, candidates, probs, top_p, complete=True)
  return jnp.where(keep, logits, _NEG_INF)


def process_logits(logits: jax.Array, *, temperature=1.0, top_k: int = 0, top_p=1.0,
                   greedy: bool | None = None, nucleus: bool | None = None,
                   topk_method: str = 'exact', topk_recall: float = 0.95) -> jax.Array:
  """Temperature, then top-k, then top-p; returns float32 probabilities [..., V].

  temperature == 0 means greedy: a one-hot distribution on the argmax (the
  distribution a greedy draft is actually "sampled" from, so SD stays exact).
  temperature and top_p may be traced if the static decisions are given:
  greedy (default temperature == 0) and nucleus (default top_p < 1).
  topk_method, topk_recall: see `filter_logits`.
  """
  logits = logits.astype(jnp.float32)
  greedy = bool(temperature == 0) if greedy is None else greedy
  nucleus = bool(top_p < 1.0) if nucleus is None else nucleus
  if greedy:
    return jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)
  logits = filter_logits(logits / temperature, top_k=top_k, top_p=top_p, nucleus=nucleus,
                         topk_method=topk_method, topk_recall=topk_recall)
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


# The float fields of `Sampling` that are pytree children (traced under jit,
# so sweeping them reuses one compiled decode). Everything else, and the
# structural flags derived from these values, is static (pytree aux data).
TRACED_FIELDS = ('cfg_scale', 'temperature', 'top_p')


class SamplingFlags(NamedTuple):
  """The structural decisions a `Sampling` makes from its values (static under jit).

  cfg: guide with an unconditional row (cfg_scale > 1; the cache then holds
    2 rows per image); greedy: temperature == 0 (one-hot on the argmax);
  nucleus: top-p filtering is on (top_p < 1).
  """

  cfg: bool
  greedy: bool
  nucleus: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sampling:
  """How logits become the distribution tokens are sampled from.

  Attributes:
    cfg_scale: classifier-free guidance scale. As LlamaGen's `generate`, CFG
      is used only when cfg_scale > 1.0 (then the cache holds a conditional
      and an unconditional row per image); any scale <= 1.0 decodes the
      conditional rows alone.
    cfg_interval: LlamaGen's interval; -1 (default) guides every token. For
      cfg_interval = c >= 0 the tokens with 0-based index 0..c+1 are guided
      and the rest use the conditional logits alone: LlamaGen guides the token
      its prefill samples (index 0) and decode-loop step i (which samples token
      i + 1) while i <= c (`decode_n_tokens` in autoregressive/models/
      generate.py).
    temperature: > 0, or 0 for greedy.
    top_k: 0 disables.
    top_p: 1.0 disables.
    topk_method: 'exact' or 'approx' (`jax.lax.approx_max_k`, for TPU;
      see `filter_logits`).
    topk_recall: approx_max_k's recall target (topk_method 'approx').

  A Sampling is a pytree: cfg_scale, temperature and top_p are its children
  (traced under jit, so a sweep over their values compiles one decode);
  cfg_interval, top_k and the `flags` (CFG on, greedy, top-p on) are static
  aux data, so crossing cfg_scale = 1, temperature = 0 or top_p = 1 compiles
  a new program. Values are checked when a Sampling is built from concrete
  values; jit rebuilds it from tracers without checks (the flags come along).
  Subclasses (e.g. `LuminaSampling`) are registered the same way, their
  extra fields static.

  `Sampling.preset(name)` builds the released models' own settings
  (`SAMPLING_PRESETS`); subclasses inherit it, e.g.
  `LuminaSampling.preset('lumina_mgpt', layout=layout)`.
  """

  cfg_scale: float = 1.0
  cfg_interval: int = -1
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  topk_method: str = 'exact'
  topk_recall: float = 0.95

  def __post_init__(self):
    if not self.temperature >= 0:
      raise ValueError(f'Sampling.temperature must be >= 0, got {self.temperature}.')
    if not 0 < self.top_p <= 1:
      raise ValueError(f'Sampling.top_p must be in (0, 1], got {self.top_p}.')
    if self.top_k < 0:
      raise ValueError(f'Sampling.top_k must be >= 0 (0 disables), got {self.top_k}.')
    if self.cfg_interval < -1:
      raise ValueError(f'Sampling.cfg_interval must be >= -1, got {self.cfg_interval}.')
    if self.topk_method not in TOPK_METHODS:
      raise ValueError(f'Sampling.topk_method must be one of {TOPK_METHODS}, got '
                       f'{self.topk_method!r}.')
    if not 0 < self.topk_recall <= 1:
      raise ValueError(f'Sampling.topk_recall must be in (0, 1], got {self.topk_recall}.')
    for name in TRACED_FIELDS:  # one dtype per field: an int scale must not retrace
      value = getattr(self, name)
      if isinstance(value, (int, float, np.number)):
        object.__setattr__(self, name, float(value))
    object.__setattr__(self, '_flags', SamplingFlags(
        cfg=bool(self.cfg_scale > 1.0), greedy=bool(self.temperature == 0),
        nucleus=bool(self.top_p < 1.0)))

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    _register_pytree(cls)

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
  def flags(self) -> SamplingFlags:
    """The static structural decisions (CFG on, greedy, top-p on)."""
    return self._flags

  @property
  def uses_cfg(self) -> bool:
    """CFG is on only for cfg_scale > 1.0, as LlamaGen's `generate`."""
    return self._flags.cfg

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
                          top_p=self.top_p, greedy=self._flags.greedy,
                          nucleus=self._flags.nucleus, topk_method=self.topk_method,
                          topk_recall=self.topk_recall)


def _register_pytree(cls) -> None:
  """Children: TRACED_FIELDS; aux: the other fields' values and the flags."""

  def flatten(sampling):
    static = tuple((field.name, getattr(sampling, field.name))
                   for field in dataclasses.fields(sampling) if field.name not in TRACED_FIELDS)
    return tuple(getattr(sampling, name) for name in TRACED_FIELDS), (static, sampling.flags)

  def unflatten(aux, children):
    static, flags = aux
    if all(isinstance(x, (int, float, np.number)) for x in children):
      return cls(**dict(static), **dict(zip(TRACED_FIELDS, children)))  # concrete: checked
    sampling = object.__new__(cls)  # tracers (or jax placeholders): no checks
    for name, value in static + tuple(zip(TRACED_FIELDS, children)):
      object.__setattr__(sampling, name, value)
    object.__setattr__(sampling, '_flags', flags)
    return sampling

  jax.tree_util.register_pytree_node(cls, flatten, unflatten)


_register_pytree(Sampling)
