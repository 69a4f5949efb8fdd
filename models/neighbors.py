"""LANTERN latent neighbour tables: the k nearest codebook entries of each code.

LANTERN (arXiv 2410.03355, `entrypoints/generate_codebook.py`) relaxes
acceptance by pooling the target probability of a token's nearest neighbours
in the VQ latent space. The table is built from the *raw* codebook weights
(`quantize.embedding.weight`, even for LlamaGen whose lookup L2-normalises
them), with Euclidean distance, each code's own row excluded, nearest first.
LANTERN stores the full V x (V-1) argsort; we keep only the k columns the
acceptance rule reads.

Distances are computed in float64 as |a|^2 + |b|^2 - 2 a.b, `block_rows` rows
at a time, so V = 16384 never needs a V x V matrix. Pairs at equal computed
distance are ordered by the lower code index (a deterministic choice; the
original's float32 `torch.cdist` + `topk` leaves near-ties unspecified).

Token ids: LlamaGen and Janus image tokens are the codes themselves; in
Lumina-mGPT's vocabulary image token = code + 4. With `token_offset`, row r
describes token r + token_offset and its entries are token ids too.

Legend: V codebook size, Cq codebook dim, k neighbours kept, B/T any batch
shape of token ids.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

LUMINA_TOKEN_OFFSET = 4


def _k_nearest_rows(distances: np.ndarray, k: int) -> np.ndarray:
  """Column ids of the k smallest entries per row, nearest first, ties -> lower id.

  Args:
    distances: float64[b, V].
    k: 1 <= k <= V.
  Returns:
    int64[b, k].
  """
  kth = np.partition(distances, k - 1, axis=1)[:, k - 1:k]  # [b, 1] k-th smallest
  below = distances < kth
  at_kth = distances == kth
  # Among the entries equal to the k-th value, keep the lowest column ids.
  room = k - below.sum(axis=1, keepdims=True)  # [b, 1]
  chosen = below | (at_kth & (np.cumsum(at_kth, axis=1) <= room))
  columns = np.nonzero(chosen)[1].reshape(distances.shape[0], k)  # ascending ids
  order = np.argsort(np.take_along_axis(distances, columns, axis=1), axis=1, kind='stable')
  return np.take_along_axis(columns, order, axis=1)


def neighbor_table(
    codebook: Any,
    k: int,
    *,
    token_offset: int = 0,
    block_rows: int = 512,
) -> np.ndarray:
  """The k nearest other codebook entries of every code (LANTERN's table, top-k only).

  Args:
    codebook: [V, Cq] raw codebook weights (numpy, jax or torch array).
    k: neighbours kept per code, 1 <= k <= V - 1 (LANTERN's default
      lantern_k = 1000).
    token_offset: added to every entry (4 for Lumina-mGPT); row r then belongs
      to token r + token_offset.
    block_rows: rows of the distance matrix computed at once (memory
      ~ 24 * block_rows * V bytes).
  Returns:
    int32[V, k]: entry [r, j] is the (j+1)-th nearest code to code r, plus
    token_offset; never r + token_offset itself.
  Raises:
    ValueError: on a non-2D or non-finite codebook, or k out of range.
  """
  book = np.asarray(codebook, dtype=np.float64)
  if book.ndim != 2 or book.shape[0] < 2:
    raise ValueError(f'neighbor_table: codebook must be [V, Cq] with V >= 2, got shape '
                     f'{book.shape}. Pass quantize.embedding.weight.')
  num_codes = book.shape[0]
  if not 1 <= int(k) <= num_codes - 1:
    raise ValueError(f'neighbor_table: k must be in [1, V-1] = [1, {num_codes - 1}], got {k}.')
  if not np.all(np.isfinite(book)):
    raise ValueError('neighbor_table: the codebook holds NaN or inf values.')
  if int(block_rows) < 1:
    raise ValueError(f'neighbor_table: block_rows must be >= 1, got {block_rows}.')
  k = int(k)
  squared_norms = np.sum(book * book, axis=1)  # [V]
  table = np.empty((num_codes, k), np.int32)
  for start in range(0, num_codes, int(block_rows)):
    rows = np.arange(start, min(start + int(block_rows), num_codes))
    distances = squared_norms[rows, None] + squared_norms[None, :] - 2.0 * (book[rows] @ book.T)
    np.maximum(distances, 0.0, out=distances)  # rounding can dip below 0
    distances[np.arange(rows.size), rows] = np.inf  # a code is not its own neighbour
    table[rows] = _k_nearest_rows(distances, k)
  return table + np.int32(token_offset)


def neighbor_table_from_params(params: Any, k: int, *, token_offset: int = 0) -> np.ndarray:
  """`neighbor_table` of a `models.vq` tokenizer's raw codebook (params['quantize'])."""
  return neighbor_table(np.asarray(params['quantize']['embedding']), k, token_offset=token_offset)


def neighbors_of(table: jax.Array, tokens: jax.Array, token_offset: int = 0) -> jax.Array:
  """Looks up the neighbour rows of token ids (jit-friendly).

  Args:
    table: int32[V, k] from `neighbor_table` with the same token_offset.
    tokens: int[...] token ids; ids outside [offset, offset + V) (text or
      layout tokens) are clipped into range, so callers mask them out.
  Returns:
    int32[..., k] neighbour token ids.
  """
  table = jnp.asarray(table)
  rows = jnp.clip(jnp.asarray(tokens) - token_offset, 0, table.shape[0] - 1)
  return jnp.take(table, rows, axis=0)
