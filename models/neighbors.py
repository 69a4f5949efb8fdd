"""LANTERN latent neighbour tables: the k nearest codebook entries of each code.

LANTERN (arXiv 2410.03355, `entrypoints/generate_codebook.py`) relaxes
acceptance by pooling the target probability of a token's nearest neighbours
in the VQ latent space. The table is built from the *raw* codebook weights
(`quantize.embedding.weight`, even for LlamaGen whose lookup L2-normalises
them), with Euclidean distance, each code's own row excluded, nearest first.
LANTERN stores the full C x (C-1) argsort; we keep only the k columns the
acceptance rule reads.

Distances are computed in float64 as |a|^2 + |b|^2 - 2 a.b, `block_rows` rows
at a time, so C = 16384 never needs a C x C matrix. Pairs at equal computed
distance are ordered by the lower code index (a deterministic choice; the
original's float32 `torch.cdist` + `topk` leaves near-ties unspecified).

Rows are token ids. The table has one row per vocabulary id, so the
acceptance rules index it with the token itself and check its row count
against the vocabulary size V. LlamaGen and Janus image tokens are the codes
themselves (V = number of codes). In Lumina-mGPT's vocabulary image token =
code + 4 (`token_offset=4`, `vocab_size=65536`): row 4 + c holds code c's
neighbours as token ids, and the rows of text and layout ids hold only
NO_NEIGHBOR (-1), so the rules leave those tokens lossless. (The row count
costs 4 bytes x V x k: 262 MB for Lumina-mGPT at LANTERN's k = 1000, 2.6 MB
at LANTERN++'s k <= 10.)

Legend: V vocabulary size, C codebook size, Cq codebook dim, k neighbours
kept, `...` any batch shape of token ids.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

LUMINA_TOKEN_OFFSET = 4
NO_NEIGHBOR = -1  # entry of a row (token) without latent neighbours


def _k_nearest_rows(distances: np.ndarray, k: int) -> np.ndarray:
  """Column ids of the k smallest entries per row, nearest first, ties -> lower id.

  Args:
    distances: float64[b, C].
    k: 1 <= k <= C.
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


def code_neighbor_table(codebook: Any, k: int, *, block_rows: int = 512) -> np.ndarray:
  """The k nearest other codebook entries of every code, as code indices.

  Args:
    codebook: [C, Cq] raw codebook weights (numpy, jax or torch array).
    k: neighbours kept per code, 1 <= k <= C - 1.
    block_rows: rows of the distance matrix computed at once (memory
      ~ 24 * block_rows * C bytes).
  Returns:
    int32[C, k]: entry [c, j] is the (j+1)-th nearest code to code c, never c.
  Raises:
    ValueError: on a non-2D or non-finite codebook, or k out of range.
  """
  book = np.asarray(codebook, dtype=np.float64)
  if book.ndim != 2 or book.shape[0] < 2:
    raise ValueError(f'neighbor_table: codebook must be [C, Cq] with C >= 2, got shape '
                     f'{book.shape}. Pass quantize.embedding.weight.')
  num_codes = book.shape[0]
  if not 1 <= int(k) <= num_codes - 1:
    raise ValueError(f'neighbor_table: k must be in [1, C-1] = [1, {num_codes - 1}], got {k}.')
  if not np.all(np.isfinite(book)):
    raise ValueError('neighbor_table: the codebook holds NaN or inf values.')
  if int(block_rows) < 1:
    raise ValueError(f'neighbor_table: block_rows must be >= 1, got {block_rows}.')
  k = int(k)
  squared_norms = np.sum(book * book, axis=1)  # [C]
  table = np.empty((num_codes, k), np.int32)
  for start in range(0, num_codes, int(block_rows)):
    rows = np.arange(start, min(start + int(block_rows), num_codes))
    distances = squared_norms[rows, None] + squared_norms[None, :] - 2.0 * (book[rows] @ book.T)
    np.maximum(distances, 0.0, out=distances)  # rounding can dip below 0
    distances[np.arange(rows.size), rows] = np.inf  # a code is not its own neighbour
    table[rows] = _k_nearest_rows(distances, k)
  return table


def neighbor_table(
    codebook: Any,
    k: int,
    *,
    token_offset: int = 0,
    vocab_size: int | None = None,
    block_rows: int = 512,
) -> np.ndarray:
  """LANTERN's neighbour table (top-k only), one row per vocabulary id.

  Args:
    codebook: [C, Cq] raw codebook weights (numpy, jax or torch array).
    k: neighbours kept per code, 1 <= k <= C - 1 (LANTERN's default
      lantern_k = 1000).
    token_offset: token id of code 0 (4 for Lumina-mGPT): code c is token
      c + token_offset.
    vocab_size: V, the rows of the table (the model's `vocab_size`); default
      token_offset + C. Must be >= token_offset + C.
    block_rows: rows of the distance matrix computed at once (memory
      ~ 24 * block_rows * C bytes).
  Returns:
    int32[V, k]: row x = token id x. For an image token x = c + token_offset,
    entry [x, j] is the token id of the (j+1)-th nearest code to c (never x
    itself); every other row is NO_NEIGHBOR (-1).
  Raises:
    ValueError: on a non-2D or non-finite codebook, k out of range, a negative
      offset or a vocabulary too small for the codes.
  """
  codes = code_neighbor_table(codebook, k, block_rows=block_rows)
  num_codes = codes.shape[0]
  token_offset = int(token_offset)
  if token_offset < 0:
    raise ValueError(f'neighbor_table: token_offset must be >= 0, got {token_offset}.')
  vocab_size = token_offset + num_codes if vocab_size is None else int(vocab_size)
  if vocab_size < token_offset + num_codes:
    raise ValueError(
        f'neighbor_table: vocab_size {vocab_size} cannot hold {num_codes} codes at token ids '
        f'{token_offset}..{token_offset + num_codes - 1}; pass the model\'s vocab_size.')
  table = np.full((vocab_size, codes.shape[1]), NO_NEIGHBOR, np.int32)
  table[token_offset:token_offset + num_codes] = codes + np.int32(token_offset)
  return table


def neighbor_table_from_params(params: Any, k: int, *, token_offset: int = 0,
                               vocab_size: int | None = None) -> np.ndarray:
  """`neighbor_table` of a `models.vq` tokenizer's raw codebook (params['quantize'])."""
  return neighbor_table(np.asarray(params['quantize']['embedding']), k,
                        token_offset=token_offset, vocab_size=vocab_size)


def neighbors_of(table: jax.Array, tokens: jax.Array) -> jax.Array:
  """Looks up the neighbour rows of token ids (jit-friendly).

  Args:
    table: int32[V, k] from `neighbor_table` (row x = token x).
    tokens: int[...] token ids; ids outside [0, V) get a NO_NEIGHBOR row.
  Returns:
    int32[..., k] neighbour token ids, NO_NEIGHBOR where there is none.
  """
  table = jnp.asarray(table)
  tokens = jnp.asarray(tokens)
  inside = (tokens >= 0) & (tokens < table.shape[0])
  rows = jnp.take(table, jnp.clip(tokens, 0, table.shape[0] - 1), axis=0)
  return jnp.where(inside[..., None], rows, NO_NEIGHBOR)
