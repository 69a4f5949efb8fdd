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

from specdec_jax.topk import check_int
from specdec_jax.topk import check_number
from specdec_jax.topk import check_settings
# Re-exported: the filtering lives in `topk`; callers and tests use these names.
from specdec_jax.topk import TOPK_METHODS  # pylint: disable=unused-import
from specdec_jax.topk import filter_logits
from specdec_jax.topk import top_k_mask  # pylint: disable=unused-import
from specdec_jax.topk import top_p_mask  # pylint: disable=unused-import


def cfg_combine(cond_logits: jax.Array, uncond_logits: jax.Array, scale) -> jax.Array:
  """Classifier-free guidance: uncond + scale * (cond - uncond), in float32.

  Args:
    cond_logits, uncond_logits: [..., V], the same shape (one unconditional row
      per conditional row; broadcasting is refused).
    scale: guidance scale (1.0 returns the conditional logits).
  """
  if jnp.shape(cond_logits) != jnp.shape(uncond_logits):
    raise ValueError(f'cfg_combine: uncond_logits must have the shape of cond_logits '
                     f'{jnp.shape(cond_logits)} (one unconditional row of V logits per '
                     f'conditional row), got {jnp.shape(uncond_logits)}.')
  cond = cond_logits.astype(jnp.float32)
  uncond = uncond_logits.astype(jnp.float32)
  return uncond + scale * (cond - uncond)


def process_logits(logits: jax.Array, *, temperature=1.0, top_k: int = 0, top_p=1.0,
                   greedy: bool | None = None, nucleus: bool | None = None,
                   topk_method: str = 'exact', topk_recall: float = 0.95,
                   topk_blocks: int = 1) -> jax.Array:
  """Temperature, then top-k, then top-p; returns float32 probabilities [..., V].

  temperature == 0 means greedy: a one-hot distribution on the argmax (the
  distribution a greedy draft is actually "sampled" from, so SD stays exact).
  temperature and top_p may be traced if the static decisions are given:
  greedy (default temperature == 0) and nucleus (default top_p < 1).
  topk_method, topk_recall, topk_blocks: see `filter_logits`.
  Concrete values are checked as `Sampling` checks them (ValueError).
  """
  check_temperature('process_logits: temperature', temperature, traced_ok=True)
  check_settings('process_logits: ', top_k, top_p, topk_method, topk_recall, topk_blocks)
  logits = logits.astype(jnp.float32)
  greedy = bool(temperature == 0) if greedy is None else greedy
  nucleus = bool(top_p < 1.0) if nucleus is None else nucleus
  if greedy:
    one_hot = jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)
    # NaN where the softmax would be (a NaN or +inf logit, or every logit -inf), so the
    # decode reports broken logits under greedy decoding too instead of emitting token 0.
    broken = (jnp.any(jnp.isnan(logits) | (logits == jnp.inf), axis=-1, keepdims=True)
              | jnp.all(logits == -jnp.inf, axis=-1, keepdims=True))
    return jnp.where(broken, jnp.nan, one_hot)
  # A product, not a quotient: XLA treats a division as expensive and gives it a
  # kernel of its own, while a product fuses into the softmax's reductions.
  logits = filter_logits(logits * (1.0 / temperature), top_k=top_k, top_p=top_p,
                         nucleus=nucleus, topk_method=topk_method, topk_recall=topk_recall,
                         topk_blocks=topk_blocks)
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
    # Both guide at every scale but 1 (guide_below_one), as does Janus-Pro.
    'lumina_mgpt': dict(cfg_scale=4.0, temperature=1.0, top_k=2000, top_p=1.0,
                        guide_below_one=True),
    # Lumina-mGPT inference_solver.create_logits_processor defaults (cfg=3.0,
    # image_top_k=2000; also SJD's and LANTERN's Lumina scripts).
    'lumina_mgpt_default': dict(cfg_scale=3.0, temperature=1.0, top_k=2000, top_p=1.0,
                                guide_below_one=True),
    # Janus-Pro generation_inference.py / demo/app_januspro.py: cfg_weight 5,
    # temperature 1, softmax(logits / T) with no top-k or top-p.
    'janus_pro': dict(cfg_scale=5.0, temperature=1.0, top_k=0, top_p=1.0, guide_below_one=True),
}


# The smallest temperature > 0: float32's smallest normal number. Its reciprocal,
# the factor the logits are scaled by, is finite in float32; below it the
# reciprocal overflows (or XLA flushes the subnormal temperature to 0) and every
# probability is NaN. Near it, logits * (1 / temperature) still overflows for any
# logit above about 3.4e38 * temperature in magnitude (then the row is NaN, and the
# decode reports non-finite probabilities): for near-greedy decoding use 0.
MIN_TEMPERATURE = float(np.finfo(np.float32).tiny)


def check_temperature(label: str, value, traced_ok: bool = False) -> None:
  """Raises unless `value` is 0 (greedy) or a finite number >= MIN_TEMPERATURE."""
  check_number(label, value, lambda v: v == 0 or v >= MIN_TEMPERATURE,
               f'>= 0 (0: greedy) and, if not 0, >= {MIN_TEMPERATURE:.8g} (float32\'s '
               'smallest normal number: below it 1 / temperature is not finite in float32)',
               traced_ok=traced_ok)


# The float fields of `Sampling` that are pytree children (traced under jit,
# so sweeping them reuses one compiled decode). Everything else, and the
# structural flags derived from these values, is static (pytree aux data).
TRACED_FIELDS = ('cfg_scale', 'temperature', 'top_p')


class SamplingFlags(NamedTuple):
  """The structural decisions a `Sampling` makes from its values (static under jit).

  cfg: guide with an unconditional row (cfg_scale > 1, or != 1 with
    guide_below_one; the cache then holds
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
    cfg_scale: classifier-free guidance scale, a finite number >= 0. As
      LlamaGen's `generate`, CFG is used only when cfg_scale > 1.0 (then the
      cache holds a conditional and an unconditional row per image) and any
      scale in [0, 1] decodes the conditional rows alone; with guide_below_one
      it is used at every scale but 1.0.
    guide_below_one: False (LlamaGen's convention) or True (Lumina-mGPT's and
      Janus's code, which guide with u + s (c - u) whenever s != 1, so s < 1
      moves away from the condition and s = 0 samples the unconditional law;
      their presets and `LuminaSampling` set it).
    cfg_interval: LlamaGen's interval; -1 (default) guides every token. For
      cfg_interval = c >= 0 the tokens with 0-based index 0..c+1 are guided
      and the rest use the conditional logits alone: LlamaGen guides the token
      its prefill samples (index 0) and decode-loop step i (which samples token
      i + 1) while i <= c (`decode_n_tokens` in autoregressive/models/
      generate.py).
    temperature: finite, >= MIN_TEMPERATURE (1/temperature finite in float32),
      or 0 for greedy.
    top_k: an int; 0 disables.
    top_p: 1.0 disables.
    topk_method: 'exact' or 'approx' (`jax.lax.approx_max_k`, for TPU;
      see `filter_logits`).
    topk_recall: approx_max_k's recall target (topk_method 'approx').
    topk_blocks: n >= 1; n > 1 finds the exact top-k from n vocabulary
      blocks (n must divide V when top-k is on; `topk.block_candidates`), so
      vocab-sharded logits are not gathered. `decode.generate` sets it to the
      mesh's 'model' axis size when left at 1.

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
  topk_blocks: int = 1
  guide_below_one: bool = False

  def __post_init__(self):
    check_number('Sampling.cfg_scale', self.cfg_scale, lambda v: v >= 0,
                 '>= 0 (CFG is on above 1.0, or at every scale but 1.0 with guide_below_one)')
    if not isinstance(self.guide_below_one, bool):
      raise ValueError('Sampling.guide_below_one must be a bool (True: CFG at every scale but '
                       f'1.0, as Lumina-mGPT and Janus), got {self.guide_below_one!r}.')
    check_temperature('Sampling.temperature', self.temperature)
    check_number('Sampling.top_p', self.top_p, lambda v: 0 < v <= 1, 'in (0, 1] (1.0 disables)')
    check_int('Sampling.cfg_interval', self.cfg_interval, -1, '>= -1 (-1 guides every token)')
    check_settings('Sampling.', self.top_k, self.top_p, self.topk_method, self.topk_recall,
                   self.topk_blocks)
    # One kind of leaf per field, whatever the caller passed (an int, a NumPy
    # scalar, a 0-d jnp array: concrete here, `check_number` refuses tracers):
    # each would otherwise compile its own, identical, program.
    for name in TRACED_FIELDS:
      object.__setattr__(self, name, float(getattr(self, name)))
    object.__setattr__(self, '_flags', SamplingFlags(
        cfg=bool(self.cfg_scale != 1.0 if self.guide_below_one else self.cfg_scale > 1.0),
        greedy=bool(self.temperature == 0),
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
    """CFG is on for cfg_scale > 1.0 (LlamaGen's `generate`), or for every
    cfg_scale != 1.0 with guide_below_one (Lumina-mGPT, Janus)."""
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
                          topk_recall=self.topk_recall, topk_blocks=self.topk_blocks)


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
