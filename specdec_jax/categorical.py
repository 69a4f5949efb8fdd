"""Categorical draws from uniform random numbers (inverse-CDF sampling).

Legend: V vocabulary, `...` any leading dims, n draws without replacement.

The decode loop draws every token it samples (draft tokens, resampled and
bonus tokens, Jacobi drafts) from one uniform number in [0, 1) each: token =
the first index whose cumulative probability exceeds u * total. That is an
exact draw from probs (up to float rounding of the cumulative sums, as for
any sampler), and it needs one random number per draw instead of the V
Gumbel numbers of the Gumbel-max trick, so a whole decode's random numbers
can be drawn before its loop (`randomness.loop_uniforms`): the loop body
runs no PRNG at all (on XLA:CPU each PRNG call is a small loop of its own).

For large vocabularies the cumulative sum is taken in two levels: over
blocks of `BLOCK` tokens, then inside the chosen block, so a draw costs two
short scans instead of one over V (a scan over V on XLA:CPU is a log(V)-deep
tree of passes over the row).

A zero-probability token is never drawn: the chosen index is the first whose
cumulative sum exceeds the threshold, which is always an index with mass; if
rounding leaves the threshold at or above the last cumulative value, the
first index whose cumulative sum reaches the total (the last with mass) is
taken instead. Entries that are negative, NaN or infinite carry no mass, so a
row without mass (a broken drafter's NaN row among them) gives index 0, a
token inside the vocabulary, never V.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Tokens per block of the two-level draw; vocabularies up to 4 blocks use one level.
BLOCK = 128


def _first_above(cumulative: jax.Array, threshold: jax.Array) -> jax.Array:
  """First index i with cumulative[..., i] > threshold[...]; if none, the first index
  whose cumulative sum reaches the total (the last index with mass; 0 if there is
  none). cumulative [..., m] (non-decreasing), threshold [...] -> int32[...].

  One min-reduction over the indices (XLA fuses the comparisons into it), not an
  argmax, an any and a max: at batch 1 each reduction is a kernel of its own.
  """
  total = cumulative[..., -1:]
  hit = (cumulative > threshold[..., None]) | (cumulative >= total)
  size = cumulative.shape[-1]
  index = jnp.arange(size, dtype=jnp.int32)
  return jnp.min(jnp.where(hit, index, size), axis=-1)


def sample(uniforms: jax.Array, probs: jax.Array) -> jax.Array:
  """One token per distribution: uniforms f32[...] in [0, 1), probs f32[..., V] -> int32[...].

  probs need not be normalised (the draw is from probs / sum(probs)); negative,
  NaN and infinite entries count as 0.
  """
  if jnp.shape(uniforms) != jnp.shape(probs)[:-1]:
    raise ValueError(f'categorical.sample: uniforms {jnp.shape(uniforms)} must have the shape '
                     f'of probs {jnp.shape(probs)} without its vocabulary axis (one uniform per '
                     'draw).')
  return _sample_with_total(uniforms, probs)[0]


def _with_mass(probs: jax.Array) -> jax.Array:
  """probs as f32 with every entry that is not a finite positive number set to 0."""
  probs = probs.astype(jnp.float32)
  return jnp.where(jnp.isfinite(probs) & (probs > 0), probs, 0.0)


def _sample_with_total(uniforms: jax.Array, probs: jax.Array) -> tuple[jax.Array, jax.Array]:
  """`sample`, and the total mass of probs f32[...] it computed on the way (the
  last cumulative sum of the finite positive probs: > 0 exactly when some entry is)."""
  probs = _with_mass(probs)
  vocab = probs.shape[-1]
  if vocab <= 4 * BLOCK:
    cumulative = jnp.cumsum(probs, axis=-1)
    return _first_above(cumulative, uniforms * cumulative[..., -1]), cumulative[..., -1]
  num_blocks = -(-vocab // BLOCK)
  padded = jnp.pad(probs, [(0, 0)] * (probs.ndim - 1) + [(0, num_blocks * BLOCK - vocab)])
  blocks = padded.reshape(probs.shape[:-1] + (num_blocks, BLOCK))  # [..., nb, BLOCK]
  block_mass = jnp.sum(blocks, axis=-1)  # [..., nb]
  block_cumulative = jnp.cumsum(block_mass, axis=-1)
  threshold = uniforms * block_cumulative[..., -1]
  block = _first_above(block_cumulative, threshold)  # [...]
  before = jnp.where(
      block > 0,
      jnp.take_along_axis(block_cumulative, jnp.maximum(block - 1, 0)[..., None], axis=-1)[..., 0],
      0.0)
  inside = jnp.take_along_axis(blocks, block[..., None, None], axis=-2)[..., 0, :]  # [..., BLOCK]
  offset = _first_above(jnp.cumsum(inside, axis=-1), threshold - before)
  return block * BLOCK + offset, block_cumulative[..., -1]


def sample_distinct(uniforms: jax.Array, probs: jax.Array) -> jax.Array:
  """n tokens drawn without replacement, in draw order: uniforms f32[..., n], probs
  f32[..., V] -> int32[..., n].

  Draw i is from probs with the earlier draws removed and renormalised (the
  law EAGLE-1's tree verification assumes of siblings). Once the mass is used
  up, the remaining draws take the lowest indices not drawn yet (zero
  probability, so verification skips them), keeping the tokens distinct.
  """
  probs = _with_mass(probs)
  index = jnp.arange(probs.shape[-1], dtype=jnp.int32)
  taken = None  # bool[..., V] once a token is drawn
  picks = []
  for draw in range(uniforms.shape[-1]):
    remaining = probs if taken is None else jnp.where(taken, 0.0, probs)
    pick, total = _sample_with_total(uniforms[..., draw], remaining)
    # The lowest index not drawn yet is 0 before the first draw; written as an argmax
    # over the all-False mask, XLA would constant-fold that argmax at every call site,
    # seconds of compilation each at [100, 4, 256].
    lowest_free = 0 if taken is None else jnp.argmax(~taken, axis=-1).astype(jnp.int32)
    pick = jnp.where(total > 0, pick, lowest_free)  # total > 0: some entry has mass
    is_pick = index == pick[..., None]
    taken = is_pick if taken is None else taken | is_pick
    picks.append(pick)
  return jnp.stack(picks, axis=-1)


def randint(uniforms: jax.Array, start: int, stop: int) -> jax.Array:
  """Integers uniform in [start, stop) from uniforms in [0, 1), int32[...] (same shape)."""
  if not start < stop:
    raise ValueError(f'categorical.randint: need start < stop, got [{start}, {stop}).')
  draws = start + jnp.floor(uniforms * (stop - start)).astype(jnp.int32)
  return jnp.clip(draws, start, stop - 1)
