"""Random parameters at a model's shapes, compiled once per distinct shape (benchmarks).

A model's `init_params` traced as one program holds the random-number and
key-derivation code of every parameter: 328 leaves for LlamaGen GPT-XL, about
20 s of compilation on a 2-core CPU and more than 80 s on an H200
(`bench/results/accelerator/h200_first_runs/`), before anything is measured.
`random_params` keeps the model's tree, shapes and dtypes (from `jax.eval_shape`,
which compiles nothing) and fills each leaf with one small program per
distinct (shape, dtype): GPT-XL has 7. The values follow a GPT-style law, not
the model's own initialisers: matrices and embeddings N(0, 0.02^2), vectors
(norm scales, biases) ones, integer leaves zeros. The benchmarks measure cost,
which does not depend on the values; acceptance on random weights is low
either way.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

WEIGHT_STD = 0.02


@functools.partial(jax.jit, static_argnums=(1, 2))
def _fill(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
  if not jnp.issubdtype(dtype, jnp.floating):
    return jnp.zeros(shape, dtype)
  if len(shape) < 2:
    return jnp.ones(shape, dtype)
  return (WEIGHT_STD * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def random_params(init_params: Callable[[jax.Array], Any], seed: int, dtype: Any) -> Any:
  """A tree shaped like `init_params(key)`'s; floating leaves in `dtype`, on the default device."""
  shapes = jax.eval_shape(init_params, jax.random.key(0))
  leaves, treedef = jax.tree.flatten(shapes)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  filled = []
  for key, leaf in zip(keys, leaves):
    leaf_dtype = jnp.dtype(dtype) if jnp.issubdtype(leaf.dtype, jnp.floating) else leaf.dtype
    filled.append(_fill(key, tuple(leaf.shape), leaf_dtype))
  return jax.tree.unflatten(treedef, filled)
