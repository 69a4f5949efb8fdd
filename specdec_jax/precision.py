"""The default numeric precision of models: float32 on CPU, bfloat16 on accelerators.

Model configs (LlamaGen `GPTConfig`, `ChameleonConfig`, `JanusConfig`, the
EAGLE `DrafterConfig`) take `dtype=None` (or 'auto') by default and resolve it
here once, when the config is built, for the compute, parameter and KV-cache
dtypes:

  jax.default_backend() == 'cpu'  -> float32   (tests, parity checks, the
                                                 bundled Fashion-MNIST family)
  any other backend (gpu, tpu)    -> bfloat16  (halves weight and cache reads,
                                                 which bound decode speed)

An explicit dtype ('float32', 'bfloat16', a jnp dtype) is kept as given.
Logits stay float32 whatever the compute dtype (the models cast them), since
acceptance tests compare target and draft probabilities.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

AUTO = 'auto'


def default_dtype() -> jnp.dtype:
  """float32 on the CPU backend, bfloat16 on GPU/TPU (queried, not cached)."""
  return jnp.dtype(jnp.float32 if jax.default_backend() == 'cpu' else jnp.bfloat16)


def resolve_dtype(dtype: Any) -> jnp.dtype:
  """None or 'auto' -> `default_dtype()`; anything else -> jnp.dtype(dtype).

  Raises:
    TypeError: an unknown dtype name (numpy's message names it).
  """
  if dtype is None or (isinstance(dtype, str) and dtype == AUTO):
    return default_dtype()
  return jnp.dtype(dtype)
