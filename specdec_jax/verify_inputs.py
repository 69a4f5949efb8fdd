"""Input checks of the verification functions (`specdec_jax.verify`).

Shapes are checked always (they are static under jit); values (NaN, negative or
unnormalised probabilities, token ids) only when the arrays are concrete.

Legend: V vocabulary, k number of drafted tokens, N tree nodes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_PROB_SUM_TOLERANCE = 1e-3


def is_concrete(x) -> bool:
  return not isinstance(x, jax.core.Tracer)


def check_probs(name: str, probs, vocab_size: int | None = None) -> None:
  """Raises ValueError naming `name` if probs [..., V] are not distributions."""
  shape = jnp.shape(probs)
  if len(shape) < 1:
    raise ValueError(f'{name} must have a vocabulary axis [..., V], got shape {shape}.')
  if vocab_size is not None and shape[-1] != vocab_size:
    raise ValueError(f'{name} has vocabulary size {shape[-1]} but {vocab_size} was '
                     'expected: draft and target must share one vocabulary.')
  if not is_concrete(probs):
    return
  dtype = np.dtype(getattr(probs, 'dtype', np.float32))
  # Row sums of rounded probabilities are off by up to eps / 2 of their dtype
  # (bfloat16 softmax rows sum to 1 +- 0.004): allow twice the dtype's eps.
  tolerance = max(_PROB_SUM_TOLERANCE, 2 * float(jnp.finfo(dtype).eps)
                  if jnp.issubdtype(dtype, jnp.floating) else 0.0)
  values = np.asarray(probs, dtype=np.float64)
  if not np.all(np.isfinite(values)):
    raise ValueError(f'{name} contains NaN or inf; check the logits that produced it.')
  if np.any(values < 0):
    raise ValueError(f'{name} has negative entries (min {values.min():.3g}); pass '
                     'probabilities, not logits.')
  sums = values.sum(-1)
  if np.any(np.abs(sums - 1) > tolerance):
    worst = float(sums.reshape(-1)[np.argmax(np.abs(sums - 1))])
    raise ValueError(f'{name} rows must sum to 1 (found a row summing to {worst:.6g}); '
                     'pass probabilities, e.g. from logits.process_logits.')


def check_rank(name: str, x, rank: int, what: str) -> None:
  if jnp.ndim(x) != rank:
    raise ValueError(f'{name} must be {what} (rank {rank}), got shape {jnp.shape(x)}.')


def tokens_array(name: str, tokens, ids: str = 'token ids') -> jax.Array:
  """`tokens` as an integer array (a list or tuple is converted); raises on float or
  bool ids, which JAX's indexing would refuse with an unrelated message."""
  if isinstance(tokens, (list, tuple)):
    tokens = jnp.asarray(tokens)
  dtype = getattr(tokens, 'dtype', None)
  if dtype is None or dtype == jnp.bool_ or not jnp.issubdtype(dtype, jnp.integer):
    raise ValueError(f'{name} must be an int array of {ids}, got '
                     f'{getattr(dtype, "name", type(tokens).__name__)}.')
  return tokens


def check_token_range(name: str, tokens, vocab: int) -> None:
  """Raises when concrete token ids fall outside [0, vocab)."""
  if is_concrete(tokens) and np.size(tokens):
    values = np.asarray(tokens)
    if values.min() < 0 or values.max() >= vocab:
      raise ValueError(f'{name} must be in [0, {vocab}), got {values.tolist()}.')


def check_drafts_have_mass(draft_tokens, draft_probs) -> None:
  """Raises when a concrete draft token has zero probability under the law it was
  drawn from (the rules read d(x) = 0 as 'accept': such a token is not a draft)."""
  if is_concrete(draft_tokens) and is_concrete(draft_probs):
    mass = np.take_along_axis(np.asarray(draft_probs), np.asarray(draft_tokens)[:, None], -1)
    empty = np.flatnonzero(mass[:, 0] <= 0)
    if empty.size:
      i = int(empty[0])
      raise ValueError(f'draft_tokens[{i}]={int(draft_tokens[i])} has probability 0 under '
                       f'draft_probs[{i}]: each draft must be sampled from the law given for '
                       'it.')


def check_children(children) -> None:
  """Raises when a concrete children table [N, C] names a node outside [-1, N)."""
  if is_concrete(children) and np.size(children):
    values = np.asarray(children)
    if values.min() < -1 or values.max() >= values.shape[0]:
      raise ValueError(f'verify_dynamic_tree: children entries must be node ids in [0, '
                       f'{values.shape[0]}) or -1 (no child), got {values.tolist()}.')


def target_vocab(target_at, vocab: int | None, what: str) -> int:
  """The vocabulary of a target function node -> f32[V] (its output shape), checked
  against `vocab` (the drafts') when that is known."""
  shape = jax.eval_shape(target_at, jnp.int32(0)).shape
  if len(shape) != 1 or (vocab is not None and shape[0] != vocab):
    raise ValueError(f'{what}: the target function returns shape {shape}, expected [V]'
                     + (f' = [{vocab}] (the drafts\' vocabulary)' if vocab is not None else '')
                     + '.')
  return shape[0]
