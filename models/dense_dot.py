"""The dot product of the models' dense layers: kernels read transposed on CPU.

Flax stores a dense kernel [K, N] (in, out). XLA:CPU's matmul (YNNPACK) reads
a kernel stored [N, K], contracted on its minor dimension, faster when many
rows multiply it, and [K, N] faster at two rows
(`python bench/cpu_matmul_rows.py`, GPT-B-sized kernels on a 2-core Xeon:
12 rows 8.7 -> 10.6 GB/s of weights, 52 rows 5.9 -> 6.9, 2 rows 15.5 -> 12.7).
A decode multiplies the same kernels at both: 2 rows per drafting step or
vanilla token with CFG, 12-52 in a verify forward of 6-26 tokens.
`weight_dot` gives each call the layout that suits its rows, without changing
the parameters (checkpoints and partition rules are untouched). Small
kernels keep [K, N]: on the bundled model's (at most 64 KB) the transposed
dots made the speculative decodes 1.07-1.35x slower (bench/compare_trees.py),
while LlamaGen GPT-B's (2.4-50 MB) EAGLE-1 chain ran 1.16x faster, informally
timed (docs/results.md, "Transposed kernels on CPU"); in between, 256-768 KB
kernels neither gained nor lost (`python bench/transposed_kernels.py`).
Kernels below 1 MiB are the ones `layers.project` merges.

The price is a second copy of the large kernels while a compiled call runs
(LlamaGen GPT-B's: ~390 MB in float32). Where memory matters more than
speed, set the environment variable SPECDEC_JAX_TRANSPOSED_KERNELS=0 before
the first import: every kernel is then read as stored.
"""

from __future__ import annotations

import math
import os

import jax

# On XLA:CPU a matmul of at least this many rows, by a kernel of at least this
# many bytes, runs on the kernel transposed.
TRANSPOSE_MIN_ROWS = 6
TRANSPOSE_MIN_BYTES = 1 << 20

ENVIRONMENT_VARIABLE = 'SPECDEC_JAX_TRANSPOSED_KERNELS'


def enabled_by(value: str | None) -> bool:
  """Whether the environment variable's value (None: unset) turns transposed kernels on."""
  if value is None or value == '1':
    return True
  if value == '0':
    return False
  raise ValueError(f"{ENVIRONMENT_VARIABLE} must be '1' (the default: many-row matmuls on "
                   f"transposed copies of large kernels on CPU) or '0' (every kernel read as "
                   f"stored, no second copy), got {value!r}.")


# Read once, at import: a compiled program must not depend on when it was traced.
ENABLED = enabled_by(os.environ.get(ENVIRONMENT_VARIABLE))


def weight_dot(lhs: jax.Array, rhs: jax.Array, dimension_numbers, precision=None,
               preferred_element_type=None) -> jax.Array:
  """`lax.dot_general` of x [..., K] and a kernel [K, N] (as `nn.Dense(dot_general=...)`).

  On XLA:CPU, with at least TRANSPOSE_MIN_ROWS rows and a kernel of at least
  TRANSPOSE_MIN_BYTES, the kernel is read from a transposed copy [N, K], made
  behind an optimization barrier so that XLA does not fold the transpose back
  into the dot. The copy depends only on the parameters, so XLA hoists it out
  of a decode loop: the price is a second copy of those kernels during a
  call, as for merged projections (`layers.project`). Fewer rows, smaller
  kernels, other contractions, other backends, and any call when
  SPECDEC_JAX_TRANSPOSED_KERNELS=0 (`ENABLED` False) run `lax.dot_general` as
  it is.
  """
  def plain(lhs, rhs):
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type)

  dense = rhs.ndim == 2 and dimension_numbers == (((lhs.ndim - 1,), (0,)), ((), ()))
  if (not ENABLED or not dense or math.prod(lhs.shape[:-1]) < TRANSPOSE_MIN_ROWS
      or rhs.size * rhs.dtype.itemsize < TRANSPOSE_MIN_BYTES):
    return plain(lhs, rhs)

  def transposed(lhs, rhs):
    kernel_nk = jax.lax.optimization_barrier(rhs.T)  # [N, K]
    return jax.lax.dot_general(lhs, kernel_nk, (((lhs.ndim - 1,), (1,)), ((), ())),
                               precision=precision, preferred_element_type=preferred_element_type)

  return jax.lax.platform_dependent(lhs, rhs, cpu=transposed, default=plain)


def dot_for(transpose_kernels: bool):
  """A dense layer's dot: `weight_dot`, or `lax.dot_general` when off (scanned layers,
  whose kernels are sliced inside the scan, where a copy would be made every layer)."""
  return weight_dot if transpose_kernels else jax.lax.dot_general
