"""Attention phases: one decode as P loops on a target cache that grows between them.

Legend: S cache slots, n image tokens, W the mode's verify window (tokens per forward).

The target cache is sized for the whole decode, and attention reads every
slot of it, masked, at every step. With P phases (`decode.generate(
attention_phases=P)`) the cache starts at the first phase's span, phase p runs
while the next window still fits below its span, and the cache then grows
(`grow`) to the next span; the last phase has the whole capacity and runs
until every image is finished. Every phase runs the same loop body, and the
slots a phase leaves out lie beyond every row's length (zero weight in one
loop), so the tokens' law is that of one loop (docs/engine.md, "Attention
phases").
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from specdec_jax import checks
from specdec_jax import kv_cache as kv

# Spans are rounded up to this many slots.
SPAN_ALIGNMENT = 8


def spans(prefix_length: int, num_tokens: int, width: int, capacity: int,
          phases: int) -> tuple[int, ...]:
  """Cache slots of every phase but the last (which has the whole capacity).

  Phase p of P holds the prefix, ceil(n p / P) tokens and one window of W,
  rounded up to SPAN_ALIGNMENT; spans that would not be below the capacity
  (or above the previous span) are dropped, so P = 1 gives ().
  """
  phases = checks.check_attention_phases(phases)
  out = []
  for phase in range(1, phases):
    span = prefix_length + -(-num_tokens * phase // phases) + width
    span = -(-span // SPAN_ALIGNMENT) * SPAN_ALIGNMENT
    if span < capacity and (not out or span > out[-1]):
      out.append(span)
  return tuple(out)


# Tests replace this to let a phase run one step too many (the law test must then fail).
def window_fits(lengths: jax.Array, width: int, span: int) -> jax.Array:
  """Whether a window of `width` tokens written at every row's length (int32[R]) stays
  below slot `span`."""
  return jnp.max(lengths) + width <= span


def grow(cache: kv.KVCache, capacity: int) -> kv.KVCache:
  """The same cache with `capacity` slots: every buffer padded with zero slots after
  its last one (valid keys, as `kv_cache.init_cache` makes them); lengths unchanged."""
  if capacity < cache.capacity:
    raise ValueError(f'phases.grow: capacity {capacity} is below the cache\'s '
                     f'{cache.capacity}; a cache only grows.')
  extra = capacity - cache.capacity

  def pad(buffer, slot_axis):  # one layer's [B, K, D, S] or [B, K, S, D]
    widths = [(0, 0)] * buffer.ndim
    widths[slot_axis] = (0, extra)
    return jnp.pad(buffer, widths)

  key_valid = jnp.pad(cache.key_valid, [(0, 0), (0, extra)], constant_values=True)
  return kv.map_buffers(pad, cache).replace(key_valid=key_valid)


def run(state, body: Callable, unfinished: Callable, *, phase_spans: tuple[int, ...],
        capacity: int, width: int, lengths: Callable, grown: Callable):
  """The decode's while_loops: one per span of `phase_spans`, then one to the end.

  Args:
    state: the loop state, its target cache at phase_spans[0] slots (or at
      `capacity` when there are no phases).
    body, unfinished: the loop body and the decode's own condition.
    phase_spans: `spans(...)`; capacity: the whole cache's slots.
    width: W, the slots one iteration writes past a row's length.
    lengths: state -> the target cache's int32[R] lengths.
    grown: (state, slots) -> the state with its target cache grown to `slots`.
  """
  for span, next_span in zip(phase_spans, phase_spans[1:] + (capacity,)):
    fits = lambda s, span=span: unfinished(s) & window_fits(lengths(s), width, span)
    state = grown(jax.lax.while_loop(fits, body, state), next_span)
  return jax.lax.while_loop(unfinished, body, state)
