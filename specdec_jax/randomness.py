"""The random numbers of one decode, drawn before its loop.

Legend: B images, n image tokens, U uniforms one step uses (the mode's
`verify_uniforms + draft_uniforms`).

Every random choice of the loop (accepting a draft, drawing a resampled,
bonus or draft token, a fresh Jacobi draft) uses one uniform number in
[0, 1) (`categorical`). A step needs a fixed number of them, and a decode
runs at most n steps (step 0: the prefill's first token and the first
drafts; every later step commits at least one token), so all of them are
drawn at once, per image, before the loop: f32[B, n, U]. Image b's numbers
come from its own key only, so its tokens do not depend on the batch, and
the loop body itself runs no PRNG (on XLA:CPU every PRNG call is a loop of
its own; on accelerators it is one more kernel per iteration). The one
exception is SCD's Gumbel coupling (`Jacobi(coupling='gumbel')`), which needs
V Gumbel numbers per image token, fixed for the decode: too many to draw
before the loop, so it makes them there from a per-image seed
(`jacobi_drafts.gumbel_noise`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


@functools.partial(jax.jit, static_argnums=1)
def per_image_keys(key: jax.Array, num_images: int) -> jax.Array:
  """[B] keys from one key: image b's is `key` folded with b (its tokens then depend
  on the key and b only, not on the batch it is decoded in)."""
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(num_images))


def loop_uniforms(row_keys: jax.Array, num_steps: int, width: int) -> jax.Array:
  """f32[B, num_steps, width] uniforms in [0, 1): image b's from row_keys[b] only."""
  if num_steps < 1 or width < 1:
    raise ValueError(f'loop_uniforms: num_steps and width must be >= 1, got {num_steps} and '
                     f'{width}.')
  return jax.vmap(lambda key: jax.random.uniform(key, (num_steps, width)))(row_keys)


def step_uniforms(uniforms: jax.Array, step: jax.Array) -> jax.Array:
  """f32[B, width]: the uniforms of one step (`step` clipped to the drawn range)."""
  step = jnp.clip(step, 0, uniforms.shape[1] - 1)
  return jax.lax.dynamic_index_in_dim(uniforms, step, axis=1, keepdims=False)
