"""One layer's cache write plus attention, heads-major cache against slot-major (not a test).

  python bench/attention_layout.py --out bench/results/attention_layout.json

The engine stores each layer's keys and values heads-major, [B, K, S, D]
(`kv_cache`), and attends with `attention.einsum_attention`. This times that
against the layout it replaced, [B, S, K, D] with the grouped einsum
'btkgd,bskd->bkgts' (written out below as the baseline), in one process:
a jitted fori_loop of (write T new keys/values at a moving slot, attend),
at the shapes of the 8-layer bundled target the change was made for (2 rows
= one image with CFG, 4 heads of 32, 220 slots; the current target has 2
heads of 32) on XLA:CPU with one thread per op, as the main command runs.
Prints a table of us per layer and the ratio, and writes JSON.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import timing  # pylint: disable=g-import-not-at-top  (bench/timing.py)
from specdec_jax.app import generate as generate_app  # pylint: disable=g-import-not-at-top

_OUT = flags.DEFINE_string('out', 'bench/results/attention_layout.json', 'JSON results.')
_REPEATS = flags.DEFINE_integer('repeats', 15, 'Timed calls per measurement (best is kept).')
_PASSES = flags.DEFINE_integer('passes', 3, 'Measurement passes (the table shows each).')
ROWS, HEADS, SLOTS, HEAD_DIM, LENGTH, ITERS = 2, 4, 220, 32, 100, 400


def slot_major_attention(queries, keys, values, mask):
  """The replaced form: keys/values [B, S, K, D], grouped einsum over the slot-major cache."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  batch, num_new, num_heads, head_dim = queries.shape
  num_kv_heads = keys.shape[2]
  q = queries.reshape(batch, num_new, num_kv_heads, num_heads // num_kv_heads, head_dim)
  scores = jnp.einsum('btkgd,bskd->bkgts', q, keys) * head_dim ** -0.5
  scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
  out = jnp.einsum('bkgts,bskd->btkgd', jax.nn.softmax(scores, axis=-1), values)
  return out.reshape(batch, num_new, num_heads, head_dim)


def main(argv):
  del argv
  generate_app.use_single_thread_xla()
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from specdec_jax import attention, kv_cache as kv  # pylint: disable=g-import-not-at-top

  def time_loop(write, attend, keys, values, queries, mask):
    """us per iteration of (write the T new keys/values at a moving slot, attend)."""

    def body(i, carry):
      keys, values, q = carry
      new = q * 1e-3  # [B, T, K, D] (as many key/value heads as query heads here)
      starts = jnp.full((ROWS,), LENGTH + i % 50, jnp.int32)
      keys, values = write(keys, new, starts), write(values, new, starts)
      return keys, values, attend(q, keys, values, mask)

    run = jax.jit(lambda carry: jax.lax.fori_loop(0, ITERS, body, carry))
    return 1e3 * timing.best_ms(lambda: run((keys, values, queries)), _REPEATS.value) / ITERS

  rng = np.random.default_rng(0)
  results = []
  print('| pass | tokens T | slot-major [B, S, K, D] us | heads-major [B, K, S, D] us | ratio |')
  print('|---|---|---|---|---|')
  for index in range(_PASSES.value):
    for num_new in (1, 5):
      queries = jnp.asarray(rng.normal(size=(ROWS, num_new, HEADS, HEAD_DIM)), jnp.float32)
      slot_major = jnp.asarray(rng.normal(size=(ROWS, SLOTS, HEADS, HEAD_DIM)), jnp.float32)
      mask = jnp.asarray(np.arange(SLOTS)[None, None] < LENGTH + 1 + np.arange(num_new)[:, None])
      mask = jnp.broadcast_to(mask, (ROWS, num_new, SLOTS))
      heads_major = jnp.swapaxes(slot_major, 1, 2)
      np.testing.assert_allclose(  # the two forms compute the same attention
          attention.einsum_attention(queries, heads_major, heads_major, mask),
          slot_major_attention(queries, slot_major, slot_major, mask), rtol=1e-5, atol=1e-5)
      before = time_loop(kv.write_rows, slot_major_attention, slot_major, slot_major, queries,
                         mask)
      after = time_loop(kv.write_slots, attention.einsum_attention, heads_major, heads_major,
                        queries, mask)
      results.append(dict(tokens=num_new, slot_major_us=before, heads_major_us=after,
                          ratio=before / after, pass_index=index))
      print(f'| {index} | {num_new} | {before:.1f} | {after:.1f} | {before / after:.2f}x |',
            flush=True)
  os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
  with open(_OUT.value, 'w') as f:
    json.dump({'rows': ROWS, 'heads': HEADS, 'slots': SLOTS, 'head_dim': HEAD_DIM,
               'cached': LENGTH, 'backend': jax.default_backend(), 'us_per_layer': results},
              f, indent=1)
  print('wrote', _OUT.value)


if __name__ == '__main__':
  app.run(main)
