"""The model protocol the decoding engine needs.

Toy models, LlamaGen, Lumina-mGPT (Chameleon), Janus-Pro and drafters all
implement it, so every decoding mode runs on every model.

Legend: B batch rows, T new tokens, P prefix (condition) length, V
vocabulary, E hidden width, S cache capacity. With CFG, B = 2 x images and
the rows are interleaved: rows 2b and 2b + 1 are image b's conditional and
unconditional rows. `generate` takes `[cond; uncond]` halves (what the
models' `cfg_cond` returns) and interleaves them once (docs/engine.md, "CFG
rows"), so `prefill` and `forward` see interleaved rows; the optional
`check_cond` hook sees the halves as passed.

A model object is a frozen, hashable description (its config); parameters
are a separate pytree passed to every call, so the object can be a static jit
argument and the parameters can be sharded.
"""

from __future__ import annotations

from typing import Any, Protocol

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import kv_cache as kv


@flax.struct.dataclass
class ForwardOutput:
  """What one forward returns.

  Attributes:
    logits: float32[B, T, V], raw (before CFG or any processing).
    hidden: [B, T, E], the last hidden state after the final norm (the LM
      head's input; EAGLE drafters consume it).
    cache: the cache with the T new tokens written and `lengths` advanced by T.
  """

  logits: jax.Array
  hidden: jax.Array
  cache: kv.KVCache


class DecodeModel(Protocol):
  """What the engine calls. Implementations are frozen dataclasses."""

  @property
  def vocab_size(self) -> int:
    """Number of logits per position (V)."""

  @property
  def hidden_size(self) -> int:
    """Width E of `ForwardOutput.hidden`."""

  def prefix_length(self, cond: Any) -> int:
    """Static number of cache slots the condition occupies (P)."""

  # Optional: `image_token_range -> (start, stop)`, the half-open range of
  # token ids that are image tokens (what Jacobi decoding's random drafts are
  # drawn from). Models without it use the whole vocabulary (0, V); see
  # `image_token_range` below.
  # Optional: `head_at_one_position = True` (a class attribute) says that
  # `prefill` and `forward` take a keyword `logits_at=int32[B]` and then run the
  # LM head at that one position of each row only: logits [B, 1, V], hidden and
  # cache as without it (`prefill_last` below; EAGLE drafters' catch-up).
  # Optional: `check_cond(cond)`, checks of a concrete condition's values (class
  # ids in range, left padding), and `max_image_tokens`, the most tokens one
  # decode may generate (LlamaGen: its grid); `specdec_jax.checks` calls them.
  # Optional: `check_sampling(sampling, cond)`, run on every `generate` call (Chameleon
  # warns without `lumina_layout.LuminaSampling`, and refuses a prompt whose
  # resolution header names another size than its layout).

  def init_cache(self, batch_size: int, capacity: int) -> kv.KVCache:
    """An empty cache for B rows and S slots, in the model's compute dtype."""

  def prefill(self, params: Any, cache: kv.KVCache, cond: Any) -> ForwardOutput:
    """Runs the condition (class ids, caption features, prompt tokens).

    Returns logits [B, P, V]; the last position predicts the first generated
    token. The returned cache holds the P prefix slots with `lengths`
    advanced to P (`kv.advance`): the loop writes the first image token at
    that length, so a prefill that leaves it at 0 overwrites the prefix and
    gives wrong tokens without an error. Conditioning shapes are
    model-specific and validated here.
    """

  def forward(
      self,
      params: Any,
      cache: kv.KVCache,
      tokens: jax.Array,
      window_mask: jax.Array | None = None,
      depths: jax.Array | None = None,
  ) -> ForwardOutput:
    """Runs T >= 1 new tokens int32[B, T] at each row's cache length.

    window_mask bool[T, T] and depths int32[T] describe a token tree (default:
    a causal chain with depths arange(T)); positions are row length + depth.
    A tree per row passes bool[B, T, T] and int32[B, T] (EAGLE-2's dynamic
    trees). The mask may also be wider than the new tokens, bool[T, W] or
    [B, T, W] with W > T: its first W - T columns are the slots just before
    the row length (a tree's earlier levels, already written), and a [B, T, W]
    mask can come with shared int32[T] depths (EAGLE-2's drafter grows its
    tree a level at a time). Build positions and masks with
    `kv.window_positions` / `kv.attention_mask`, which accept every form.
    """


def image_token_range(model: Any) -> tuple[int, int]:
  """The model's image-token ids as a half-open range (start, stop).

  Models declare it with an `image_token_range` property (Lumina-mGPT /
  Chameleon: (4, 8196), its 8192 VQ codes); without one the whole vocabulary
  (0, V) is image tokens (LlamaGen, Janus-Pro, the toys). SJD draws its random
  Jacobi drafts uniformly from this range (Teng et al. 2025, released code).

  Raises:
    ValueError: if the declared range is empty or not inside [0, V).
  """
  vocab = int(model.vocab_size)
  declared = getattr(model, 'image_token_range', None)
  if declared is None:
    return 0, vocab
  start, stop = (int(x) for x in declared)
  if not 0 <= start < stop <= vocab:
    raise ValueError(f'{type(model).__name__}.image_token_range must be a non-empty range '
                     f'(start, stop) inside [0, vocab_size={vocab}], got {declared!r}.')
  return start, stop


def check_logits_at(logits_at: jax.Array | None, batch_size: int, what: str) -> None:
  """Raises ValueError unless logits_at is None or int32[B], one position per row."""
  if logits_at is not None and tuple(logits_at.shape) != (batch_size,):
    raise ValueError(f'{what}: logits_at must be int32[B] = [{batch_size}], one position '
                     f'per row; got shape {tuple(logits_at.shape)}.')


def at_positions(values: jax.Array, positions: jax.Array | None) -> jax.Array:
  """values [B, T, ...] at one position per row, [B, 1, ...] (all of values if None).

  An LM head's input at `logits_at`, or a gather from a full forward's output.
  """
  if positions is None:
    return values
  index = positions.reshape(positions.shape + (1,) * (values.ndim - 1))
  return jnp.take_along_axis(values, index, axis=1)


def prefill_last(model: Any, params: Any, cache: kv.KVCache, cond: Any) -> ForwardOutput:
  """`model.prefill` with logits [B, 1, V] at the last prefix position only.

  The engine reads only the prefix's last logits (the first image token's);
  a model with `head_at_one_position` runs its LM head there alone (at a
  65,536-token vocabulary and a long prompt the head over every prefix
  position is the prefill's largest tensor); others are sliced. Hidden and
  cache are the full prefill's.
  """
  if getattr(model, 'head_at_one_position', False):
    last = jnp.full((cache.batch_size,), model.prefix_length(cond) - 1, jnp.int32)
    return model.prefill(params, cache, cond, logits_at=last)
  out = model.prefill(params, cache, cond)
  return out.replace(logits=out.logits[:, -1:])
