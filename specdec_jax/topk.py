"""Top-k and top-p filtering of logits (ties with the k-th kept, as LlamaGen).

Legend: V vocabulary, n top-k blocks, k top_k, `...` any leading batch/window dims.

The exact k-th value of top-k alone comes from `kth_largest`, a bisection
on the values' bits (32 counting passes over V, no sort: on XLA:CPU about
100x faster than a sort of V = 16384, bench/logits_processing.py); with
`topk_blocks` = n > 1, from a sort of each of n vocabulary blocks and of the
n * k candidates they give: when the LM head is vocab-parallel (V sharded over
the mesh's 'model' axis, one block per device) each block sorts where it lives
and only the candidates cross devices, where a sort of V would all-gather the
whole row (docs/tpu.md). Top-p needs the candidates in order, so with top-p
on the k candidates come from one sort (or the blocks).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_NEG_INF = -jnp.inf


TOPK_METHODS = ('exact', 'approx')


def check_number(label: str, value, ok, requirement: str, traced_ok: bool = False) -> None:
  """Raises unless `value` is one finite number meeting `ok` (a Python or NumPy
  scalar, or a 0-d array); `label` names it (e.g. 'Sampling.top_p'). With
  traced_ok a tracer passes unchecked (its value is not known at trace time)."""
  if traced_ok and isinstance(value, jax.core.Tracer):
    return
  number = None
  if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
    number = float(value)
  elif isinstance(value, (np.ndarray, jax.Array)) and np.ndim(value) == 0 and not isinstance(
      value, jax.core.Tracer) and jnp.issubdtype(jnp.result_type(value), jnp.number):
    number = float(value)
  if number is None or not (np.isfinite(number) and ok(number)):
    raise ValueError(f'{label} must be a finite number {requirement}, got {value!r}.')


def check_int(label: str, value, least: int, requirement: str) -> None:
  """Raises unless `value` is a Python or NumPy int >= least (not a bool or float)."""
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
    raise ValueError(f'{label} must be an int {requirement}, got {value!r}.')


def check_settings(where: str, top_k, top_p=1.0, method: str = 'exact', recall=0.95,
                   blocks=1) -> None:
  """The checks `logits.Sampling` makes, for the functions that take these settings
  bare (`filter_logits`, `top_k_mask`, `logits.process_logits`); `where` prefixes
  the names in the message (e.g. 'filter_logits: '). A traced top_p is not
  checked. Python at trace time: nothing is added to the compiled program."""
  check_int(f'{where}top_k', top_k, 0, '>= 0 (0 disables)')
  check_number(f'{where}top_p', top_p, lambda v: 0 < v <= 1, 'in (0, 1] (1.0 disables)',
               traced_ok=True)
  if not isinstance(method, str) or method not in TOPK_METHODS:
    raise ValueError(f'{where}topk_method must be one of {TOPK_METHODS}, got {method!r}.')
  check_number(f'{where}topk_recall', recall, lambda v: 0 < v <= 1, 'in (0, 1]')
  check_int(f'{where}topk_blocks', blocks, 1, '>= 1')


def _top_k_active(top_k: int, vocab: int) -> bool:
  return 0 < top_k < vocab


def top_k_mask(logits: jax.Array, top_k: int, method: str = 'exact',
               recall: float = 0.95, blocks: int = 1) -> jax.Array:
  """Drops logits below the k-th largest (ties with it are kept, as LlamaGen):
  logits f32[..., V] -> f32[..., V] with the dropped entries at -inf.

  method 'exact' finds the k-th value with `kth_largest` (bisection; a sort
  of V and `lax.top_k` cost about 100x more on one CPU core, and XLA's
  partitioner gathers a TopK's batch: over a 'data' mesh every step would
  all-gather [B, T, V]); 'approx' finds it with `jax.lax.approx_max_k` at the
  given recall target (TPU; exact on other backends). blocks > 1 (exact only)
  takes it from `block_candidates`.
  """
  check_settings('top_k_mask: ', top_k, method=method, recall=recall, blocks=blocks)
  if not _top_k_active(top_k, logits.shape[-1]):
    return logits
  if method == 'exact' and blocks == 1:
    kth = kth_largest(logits, top_k)
  else:
    kth = top_k_candidates(logits, top_k, method, recall, blocks)[..., -1:]
  return jnp.where(logits < kth, _NEG_INF, logits)


def _ordered_bits(values: jax.Array) -> jax.Array:
  """float32 -> uint32 with the same order (negative floats: bits flipped; others: the
  sign bit set), so integer comparisons of the keys order the floats."""
  bits = jax.lax.bitcast_convert_type(values.astype(jnp.float32), jnp.uint32)
  negative = (bits >> 31) == 1
  return jnp.where(negative, ~bits, bits | jnp.uint32(0x80000000))


def _float_of_ordered_bits(keys: jax.Array) -> jax.Array:
  """The inverse of `_ordered_bits`."""
  positive = (keys >> 31) == 1
  bits = jnp.where(positive, keys & jnp.uint32(0x7FFFFFFF), ~keys)
  return jax.lax.bitcast_convert_type(bits, jnp.float32)


def kth_largest(logits: jax.Array, k: int) -> jax.Array:
  """The k-th largest value of each row (counted with multiplicity, as the k-th entry
  of a descending sort), [..., 1] float32, without sorting.

  Bisection on the values' order-preserving 32-bit keys: the answer is the
  largest key t with at least k keys >= t; each of 32 steps halves the
  interval [lo, hi] that holds it with one counting pass over V. Bit-exact
  (the result is one of the row's own values); a NaN sorts above +inf.
  """
  keys = _ordered_bits(logits)
  lo = jnp.min(keys, axis=-1, keepdims=True)  # count(keys >= lo) = V >= k
  hi = jnp.max(keys, axis=-1, keepdims=True)

  def halve(_, bounds):
    lo, hi = bounds
    gap = hi - lo
    mid = lo + (gap >> 1) + (gap & 1)  # upper midpoint, without overflowing 32 bits
    enough = jnp.sum(keys >= mid, axis=-1, keepdims=True) >= k
    return jnp.where(enough, mid, lo), jnp.where(enough, hi, mid - 1)

  lo, _ = jax.lax.fori_loop(0, 32, halve, (lo, hi))
  return _float_of_ordered_bits(lo)


def top_k_candidates(logits: jax.Array, top_k: int, method: str = 'exact',
                     recall: float = 0.95, blocks: int = 1) -> jax.Array:
  """The k largest logits [..., k], descending: from `jax.lax.approx_max_k`
  (method 'approx'), `block_candidates` (exact, blocks > 1) or one sort of V."""
  if method == 'approx':
    values = jax.lax.approx_max_k(logits, top_k, recall_target=recall)[0]
    return jnp.sort(values, axis=-1, descending=True)
  if blocks > 1:
    return block_candidates(logits, top_k, blocks)
  return jnp.sort(logits, axis=-1, descending=True)[..., :top_k]


def check_blocks(vocab: int, blocks: int) -> None:
  """Raises unless `blocks` vocabulary blocks of equal size tile V."""
  if blocks < 1 or vocab % blocks:
    raise ValueError(f'topk_blocks={blocks} must be >= 1 and divide the vocabulary size '
                     f'{vocab}; use a divisor of {vocab} (e.g. the mesh\'s model axis '
                     f'size) or 1.')


def block_candidates(logits: jax.Array, top_k: int, blocks: int) -> jax.Array:
  """The k largest logits [..., k], descending, from n vocabulary blocks.

  Each block [..., n, V/n] is sorted on its own axis (a sort along an
  unsharded axis: with the block axis split over 'model' it stays on its
  device, where `lax.top_k` would make the partitioner gather), its top
  min(k, V/n) values kept, and the n * min(k, V/n) >= k candidates sorted.

  Exact, ties included: let v be the k-th largest of the row, and S a set of
  k positions holding the k largest values, chosen (swapping equal values)
  so that S meets each block in a prefix of that block's descending order.
  A block holds at most min(k, V/n) positions of S, so S lies within the
  candidates: the candidates' k-th largest is >= v. They are also values of
  the row, so it is <= v. Hence the candidates' k largest values are the
  row's, as a multiset, and `logits >= kth` keeps the same tokens as the
  single sort.
  """
  vocab = logits.shape[-1]
  check_blocks(vocab, blocks)
  per_block = min(top_k, vocab // blocks)
  blocked = logits.reshape(*logits.shape[:-1], blocks, vocab // blocks)  # [..., n, V/n]
  tops = jnp.sort(blocked, axis=-1, descending=True)[..., :per_block]  # [..., n, min(k, V/n)]
  tops = tops.reshape(*logits.shape[:-1], blocks * per_block)
  return jnp.sort(tops, axis=-1, descending=True)[..., :top_k]  # [..., k]


def _index_order_count(tied: jax.Array, blocks: int) -> jax.Array:
  """cumsum(tied) over V [..., V], int32. With n blocks: a cumsum within each
  block plus the ties of the blocks before it, so that a block axis split over
  'model' is not gathered (only the n block totals move)."""
  if blocks == 1:
    return jnp.cumsum(tied, axis=-1)
  vocab = tied.shape[-1]
  within = jnp.cumsum(tied.reshape(*tied.shape[:-1], blocks, vocab // blocks).astype(jnp.int32),
                      axis=-1)  # [..., n, V/n]
  totals = within[..., -1]  # [..., n]
  before = jnp.cumsum(totals, axis=-1) - totals
  return (within + before[..., None]).reshape(tied.shape)


def _ties_past_candidates(cumulative, candidate_probs, top_p, survivors) -> jax.Array:
  """How many sorted positions past the C candidates one sort's nucleus keeps, [..., 1].

  Past the candidates one descending sort holds the E = survivors - C other
  top-k survivors, all tied with the k-th value (each of probability p = the
  last candidate's), so its cumulative mass there is c + m p (c = the
  candidates' total, m = 0..E-1) and position C + m is kept iff c + m p <=
  top_p: the count is the number of such m, found without the sort.
  """
  extra = (survivors - cumulative.shape[-1]).astype(jnp.float32)  # E
  room = top_p - cumulative[..., -1:]  # top_p - c
  tie_prob = candidate_probs[..., -1:]  # p
  steps = jnp.floor(room / jnp.where(tie_prob > 0, tie_prob, 1.0)) + 1
  count = jnp.where(tie_prob > 0, jnp.clip(steps, 0, extra), extra)
  return jnp.where(room < 0, 0, count).astype(jnp.int32)


def _nucleus_keep(logits, candidates, candidate_probs, top_p, survivors=None,
                  blocks: int = 1) -> jax.Array:
  """Hugging Face's nucleus as a mask over the unsorted logits, without an inverse
  permutation.

  Args:
    logits: [..., V].
    candidates: [..., C] logits sorted descending (-inf past a top-k cut).
    candidate_probs: [..., C] their probabilities after the top-k cut.
    survivors: None when the candidates are all V logits; else int32[..., 1],
      the top-k survivors (the C = k candidates and every other tie with the
      k-th value), which the nucleus may run on into (`_ties_past_candidates`).
    blocks: count ties per vocabulary block (`_index_order_count`).
  Returns:
    bool[..., V]: sorted position i is kept iff i == 0 or the mass before it
    is <= top_p, i.e. a prefix of `kept` positions. Tokens above the last
    kept value are kept; of those equal to it, the first (kept - #above) in
    index order are, as a stable descending argsort orders ties.
  """
  cumulative = jnp.cumsum(candidate_probs, axis=-1)
  kept = 1 + jnp.sum(cumulative[..., :-1] <= top_p, axis=-1, keepdims=True)  # [..., 1]
  if survivors is not None:
    kept = kept + _ties_past_candidates(cumulative, candidate_probs, top_p, survivors)
  last = jnp.minimum(kept, candidates.shape[-1]) - 1  # past C: the k-th value
  threshold = jnp.take_along_axis(candidates, last, axis=-1)
  # Counted on the logits before the top-k cut: equal whenever the threshold is
  # a kept value; if it is -inf the cut tokens are -inf whatever this says.
  above = logits > threshold
  tied = logits == threshold
  ties_kept = kept - jnp.sum(above, axis=-1, keepdims=True)
  return above | (tied & (_index_order_count(tied, blocks) <= ties_kept))


def top_p_mask(logits: jax.Array, top_p) -> jax.Array:
  """Nucleus filtering as Hugging Face: keep the smallest prefix (by
  descending probability) whose mass reaches top_p; the first token is always
  kept. A concrete top_p >= 1 returns the logits; top_p may be traced.
  logits f32[..., V] -> f32[..., V], the dropped entries at -inf.
  """
  if isinstance(top_p, (int, float)) and top_p >= 1.0:
    return logits
  return filter_logits(logits, top_k=0, top_p=top_p, nucleus=True)


def filter_logits(logits: jax.Array, *, top_k: int = 0, top_p=1.0, nucleus: bool = True,
                  topk_method: str = 'exact', topk_recall: float = 0.95,
                  topk_blocks: int = 1) -> jax.Array:
  """Top-k (ties with the k-th kept), then top-p on what is left; -inf where dropped.

  The law of every path is LlamaGen's `top_k_top_p_filtering` with a stable
  sort: top-k drops the logits below the k-th largest (ties with it stay),
  then the nucleus keeps the smallest prefix, in descending order with ties
  in index order, whose mass reaches top_p.

  Exact: one descending sort of V (the k candidates, or without top-k the
  nucleus threshold, are read off it and compared with the unsorted logits,
  so there is no inverse permutation, and a batch split over a mesh stays
  split).
  topk_method 'approx' takes the k candidates from `jax.lax.approx_max_k`
  (recall target topk_recall) and runs the nucleus on them, with no sort of
  V at all (the same tokens as one sort whenever the candidates are the true
  top k: always on CPU).
  topk_blocks = n > 1 (exact method, top-k on; n must divide V) takes the k
  candidates from `block_candidates` (n sorts of V/n and one of n * k, no
  sort of V) and runs the nucleus on them as 'approx' does: the same tokens
  as one sort of V. A nucleus that reaches the k-th value continues into the
  other ties with it, in index order, as one sort does
  (`_ties_past_candidates`). Without top-k, top-p still sorts all of V.

  Args:
    logits: float32 [..., V] (after temperature).
    top_k: 0 (or >= V) disables; top_p: in (0, 1], may be traced; nucleus: top-p is on.
  A NaN logit is never dropped, so the softmax of its row is NaN, whatever the
  filters (the decode's check for broken target rows relies on it).
  """
  check_settings('filter_logits: ', top_k, top_p, topk_method, topk_recall, topk_blocks)
  vocab = logits.shape[-1]
  use_top_k = _top_k_active(top_k, vocab)
  blocks = topk_blocks if use_top_k and topk_method == 'exact' else 1
  if not nucleus:
    return top_k_mask(logits, top_k, topk_method, topk_recall, blocks)
  if use_top_k:
    # Every top-k path runs the nucleus on the same k candidates with the same
    # arithmetic, so one sort, n blocks and (exact) approx_max_k agree bit for
    # bit, at a cumulative mass equal to top_p too.
    candidates = top_k_candidates(logits, top_k, topk_method, topk_recall, blocks)  # [..., k]
    keep_k = logits >= candidates[..., -1:]
    # Normalised over every top-k survivor (ties past the k candidates included).
    shifted = jnp.where(keep_k, jnp.exp(logits - candidates[..., :1]), 0.0)
    probs = jnp.exp(candidates - candidates[..., :1]) / jnp.sum(shifted, -1, keepdims=True)
    survivors = jnp.sum(keep_k, axis=-1, keepdims=True, dtype=jnp.int32)
    keep = keep_k & _nucleus_keep(logits, candidates, probs, top_p, survivors, blocks)
  else:
    candidates = jnp.sort(logits, axis=-1, descending=True)  # [..., V]
    probs = jax.nn.softmax(candidates, axis=-1)
    keep = _nucleus_keep(logits, candidates, probs, top_p)
  # NaN logits stay, so their rows' softmax is NaN: with top-k on, `logits >= kth`
  # drops a NaN and the nucleus, on NaN masses, keeps the largest finite logits.
  return jnp.where(keep | jnp.isnan(logits), logits, _NEG_INF)
