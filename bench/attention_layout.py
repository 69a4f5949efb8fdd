"""One layer's cache write plus attention in three cache layouts (not a test).

  python bench/attention_layout.py --out bench/results/attention_layout.json

The engine stores each layer's values heads-major, [B, K, S, D], and its keys
transposed, [B, K, D, S] (`kv_cache`), and attends with
`attention.einsum_attention`. This times that against the two layouts it
replaced, written out below as baselines:
  * slot-major: keys and values [B, S, K, D], grouped einsum
    'btkgd,bskd->bkgts';
  * heads-major: keys and values [B, K, S, D], the scores einsum
    'bkmd,bksd->bkms' contracting the keys' last axis;
in one process: a jitted fori_loop of (write T new keys/values at a moving
slot, attend) at the bundled target's shapes (2 rows = one image with CFG,
2 heads of 32, 220 slots), T = 1 (a decode step) and T = 5 (a k = 4 verify
forward), on XLA:CPU with one thread per op, as the main command runs.
Prints a table of us per layer and writes JSON.
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import resume  # pylint: disable=g-import-not-at-top  (bench/resume.py)
import timing  # pylint: disable=g-import-not-at-top  (bench/timing.py)
from specdec_jax.app import generate as generate_app  # pylint: disable=g-import-not-at-top

_OUT = flags.DEFINE_string('out', 'bench/results/attention_layout.json', 'JSON results.')
_REPEATS = flags.DEFINE_integer('repeats', 15, 'Timed calls per measurement (best is kept).')
_PASSES = flags.DEFINE_integer('passes', 3, 'Measurement passes (the table shows each).')
ROWS, HEADS, SLOTS, HEAD_DIM, LENGTH, ITERS = 2, 2, 220, 32, 100, 400


def slot_major_attention(queries, keys, values, mask):
  """The first form: keys/values [B, S, K, D], grouped einsum over the slot-major cache."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  batch, num_new, num_heads, head_dim = queries.shape
  num_kv_heads = keys.shape[2]
  q = queries.reshape(batch, num_new, num_kv_heads, num_heads // num_kv_heads, head_dim)
  scores = jnp.einsum('btkgd,bskd->bkgts', q, keys) * head_dim ** -0.5
  scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
  out = jnp.einsum('bkgts,bskd->btkgd', jax.nn.softmax(scores, axis=-1), values)
  return out.reshape(batch, num_new, num_heads, head_dim)


def heads_major_attention(queries, keys, values, mask):
  """The previous form: keys and values [B, K, S, D], one query per head (K = H here)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  q = jnp.swapaxes(queries, 1, 2)  # [B, H, T, D]
  scores = jnp.einsum('bkmd,bksd->bkms', q, keys) * q.shape[-1] ** -0.5
  scores = jnp.where(mask[:, None], scores, jnp.finfo(jnp.float32).min)
  out = jnp.einsum('bkms,bksd->bkmd', jax.nn.softmax(scores, axis=-1), values)
  return jnp.swapaxes(out, 1, 2)


def main(argv):
  del argv
  generate_app.use_single_thread_xla()
  from specdec_jax.app import compile_cache  # pylint: disable=g-import-not-at-top
  compile_cache.enable()
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from specdec_jax import attention, kv_cache as kv  # pylint: disable=g-import-not-at-top

  def time_loop(write_keys, write_values, attend, keys, values, queries, mask):
    """us per iteration of (write the T new keys/values at a moving slot, attend)."""

    def body(i, carry):
      keys, values, q = carry
      new = q * 1e-3  # [B, T, K, D] (as many key/value heads as query heads here)
      starts = jnp.full((ROWS,), LENGTH + i % 50, jnp.int32)
      keys, values = write_keys(keys, new, starts), write_values(values, new, starts)
      return keys, values, attend(q, keys, values, mask)

    run = jax.jit(lambda carry: jax.lax.fori_loop(0, ITERS, body, carry))
    return 1e3 * timing.best_ms(lambda: run((keys, values, queries)), _REPEATS.value) / ITERS

  write_keys = lambda buffer, new, starts: kv.write_slots(buffer, new, starts, kv.KEY_SLOT_AXIS)
  rng = np.random.default_rng(0)
  results = []
  print('| pass | tokens T | slot-major us | heads-major us | keys transposed (engine) us '
        '| slot-major / engine | heads-major / engine |')
  print('|---|---|---|---|---|---|---|')
  for index in range(_PASSES.value):
    for num_new in (1, 5):
      queries = jnp.asarray(rng.normal(size=(ROWS, num_new, HEADS, HEAD_DIM)), jnp.float32)
      slot_major = jnp.asarray(rng.normal(size=(ROWS, SLOTS, HEADS, HEAD_DIM)), jnp.float32)
      mask = jnp.asarray(np.arange(SLOTS)[None, None] < LENGTH + 1 + np.arange(num_new)[:, None])
      mask = jnp.broadcast_to(mask, (ROWS, num_new, SLOTS))
      heads_major = jnp.swapaxes(slot_major, 1, 2)  # [B, K, S, D]
      keys_transposed = jnp.transpose(slot_major, (0, 2, 3, 1))  # [B, K, D, S]
      want = slot_major_attention(queries, slot_major, slot_major, mask)
      for got in (heads_major_attention(queries, heads_major, heads_major, mask),
                  attention.einsum_attention(queries, keys_transposed, heads_major, mask)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # the same attention
      row = dict(
          tokens=num_new, pass_index=index,
          slot_major_us=time_loop(kv.write_rows, kv.write_rows, slot_major_attention,
                                  slot_major, slot_major, queries, mask),
          heads_major_us=time_loop(kv.write_slots, kv.write_slots, heads_major_attention,
                                   heads_major, heads_major, queries, mask),
          keys_transposed_us=time_loop(write_keys, kv.write_slots, attention.einsum_attention,
                                       keys_transposed, heads_major, queries, mask))
      results.append(row)
      print(f"| {index} | {num_new} | {row['slot_major_us']:.1f} | {row['heads_major_us']:.1f} "
            f"| {row['keys_transposed_us']:.1f} "
            f"| {row['slot_major_us'] / row['keys_transposed_us']:.2f}x "
            f"| {row['heads_major_us'] / row['keys_transposed_us']:.2f}x |", flush=True)
  resume.write_json(
      _OUT.value,
      {'rows': ROWS, 'heads': HEADS, 'slots': SLOTS, 'head_dim': HEAD_DIM,
       'cached': LENGTH, 'backend': jax.default_backend(), 'us_per_layer': results})
  print('wrote', _OUT.value)


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
