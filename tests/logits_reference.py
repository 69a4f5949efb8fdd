"""The top-k / top-p masks as implemented before the single-sort path: the reference
the new path must equal (tests/test_logits.py) and the "before" of
bench/logits_processing.py.
"""

import jax
import jax.numpy as jnp


def top_k_mask(x, top_k):
  """The implementation before the single-sort path (kept here as the reference)."""
  if top_k <= 0 or top_k >= x.shape[-1]:
    return x
  kth = jax.lax.top_k(x, top_k)[0][..., -1:]
  return jnp.where(x < kth, -jnp.inf, x)


def top_p_mask(x, top_p):
  """argsort, gather, inverse argsort: the implementation before the single-sort path."""
  order = jnp.argsort(-x, axis=-1, stable=True)
  cumulative = jnp.cumsum(jax.nn.softmax(jnp.take_along_axis(x, order, axis=-1), -1), -1)
  remove_sorted = cumulative > top_p
  remove_sorted = jnp.concatenate(
      [jnp.zeros_like(remove_sorted[..., :1]), remove_sorted[..., :-1]], axis=-1)
  remove = jnp.take_along_axis(remove_sorted, jnp.argsort(order, axis=-1), axis=-1)
  return jnp.where(remove, -jnp.inf, x)

