"""Where a batch-1 SD iteration's time goes, on the bundled Fashion-MNIST family (not a test).

  python bench/iteration_cost.py --out bench/results/iteration_cost.json

One image with CFG (2 cache rows), XLA:CPU on one thread per op and with the
main command's XLA options (`generate.compiler_options`), as it runs. Measures, in one process:
  * target forward at T = 1 and T = k + 1 tokens and EAGLE-head forwards at
    T = 1 and T = k + 1 (the catch-up: its LM head at one position per row,
    as the decode runs it; jitted fori_loops of forwards at cache lengths 100
    and 101 in turn, so host dispatch is excluded), on caches with the slots
    the decodes allocate (T = 1: vanilla's, the others: the chain's), since
    attention reads every slot. Each forward writes at another position than
    the last, as a decode's do; the same forwards at one fixed position are
    timed too (`*_fixed_ms`): there XLA hoists the position-dependent work
    (RoPE rows, masks, write offsets) out of the loop, which made them
    0.02-0.03 ms cheaper than a decode's forward (before 2026-12-04 this
    bench timed only those, and "other" held that work);
  * whole-image decodes: vanilla and UniformRelaxed(omega 2) with the EAGLE
    head at k = 4, per token and per verify iteration;
  * "other": the iteration minus its forwards (one verify forward, the
    head's catch-up over k + 1 tokens and k - 1 drafting steps), i.e.
    sampling, random numbers, verification and loop bookkeeping, and the
    forwards' slowdown inside the loop (`sd_other_ms_per_iteration`; with the
    fixed-position forwards, `sd_other_fixed_position_ms_per_iteration`);
  * the forwards-only bound: vanilla's time over the SD decode's forwards
    alone (iterations x the forwards above), the speedup with "other" at
    zero. A target above that bound cannot be reached by cutting the loop's
    own work; only cheaper forwards or more tokens per iteration reach it.
Each pass runs --repeats rounds that call all six pieces in turn (order rotated
each round) and keeps each piece's best, so a pass's ratios come from one
stretch of time. Each pass prints one table row. Writes JSON.
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bundle_pieces  # pylint: disable=g-import-not-at-top  (bench/bundle_pieces.py)
import resume  # pylint: disable=g-import-not-at-top  (bench/resume.py)
import timing  # pylint: disable=g-import-not-at-top  (bench/timing.py)
from specdec_jax.app import generate as generate_app  # pylint: disable=g-import-not-at-top

_OUT = flags.DEFINE_string('out', 'bench/results/iteration_cost.json', 'JSON results.')
_PASSES = flags.DEFINE_integer('passes', 3, 'Measurement passes.')
_REPEATS = flags.DEFINE_integer('repeats', 7, 'Interleaved rounds per pass (best is kept).')
K = bundle_pieces.K


FORWARDS_PER_CALL = 200


def _forward_call(forward, cache, tokens, features, options: dict | None, moving: bool):
  """A call of a jitted fori_loop of FORWARDS_PER_CALL forwards (`bundle_pieces.forward_loop`)."""
  run = bundle_pieces.forward_loop(forward, FORWARDS_PER_CALL, options, moving_positions=moving)
  return lambda: run((cache, tokens, features))


def main(argv):
  del argv
  generate_app.use_single_thread_xla()
  from specdec_jax.app import compile_cache  # pylint: disable=g-import-not-at-top
  compile_cache.enable()
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import family as family_lib  # pylint: disable=g-import-not-at-top

  family = family_lib.load()
  target, eagle = family.target, family.eagle
  cond = target.cfg_cond(family.target_params, jnp.array([3]))
  num_tokens, repeats = bundle_pieces.NUM_TOKENS, _REPEATS.value
  # One image's two CFG rows share a length: the decode writes their caches with one
  # dynamic_update_slice per layer (KVCache.shared_length), and so do these forwards.
  vanilla_cache, _ = bundle_pieces.forward_caches(family, cond, 'vanilla')
  cache, eagle_cache = bundle_pieces.forward_caches(family, cond, 'chain')
  width = family.target.config.dim
  from specdec_jax.configs import generate as generate_config  # pylint: disable=g-import-not-at-top
  options = generate_app.compiler_options(generate_config.get_config())  # the main command's

  def target_forward(cache, tokens, features):
    del features
    return target.forward(family.target_params, cache, tokens)

  def eagle_forward(cache, tokens, features):  # T = k + 1: the catch-up, head at one position
    at = (None if tokens.shape[1] == 1
          else jnp.full(tokens.shape[:1], tokens.shape[1] - 1, jnp.int32))
    out = eagle.forward(family.eagle_params, cache, tokens, features, logits_at=at)
    return out.replace(logits=jnp.broadcast_to(out.logits, tokens.shape + out.logits.shape[-1:]))

  calls = {}
  for t in (1, K + 1):
    tokens = jnp.zeros((2, t), jnp.int32)
    for moving, suffix in ((True, 'ms'), (False, 'fixed_ms')):
      calls[f'target_t{t}_{suffix}'] = _forward_call(
          target_forward, vanilla_cache if t == 1 else cache, tokens, None, options, moving)
      calls[f'eagle_t{t}_{suffix}'] = _forward_call(eagle_forward, eagle_cache, tokens,
                                                    jnp.zeros((2, t, width)), options, moving)
  calls['vanilla_ms'] = bundle_pieces.decode_call(family, cond, options, 'vanilla')
  calls['sd_ms'] = bundle_pieces.decode_call(family, cond, options, 'chain')
  iterations = int(calls['sd_ms']().metrics.verify_steps[0])

  passes = []
  print('| pass | target T=1 | target T=5 | ratio | EAGLE T=1 | EAGLE T=5 | vanilla / token '
        '| SD / iteration | of which other | other / vanilla token | other, fixed-position '
        'forwards | tokens / iteration | speedup | forwards-only bound |')
  print('|---' * 14 + '|')
  for index in range(_PASSES.value):
    row = timing.best_ms_interleaved(calls, repeats)
    for name in calls:
      if name.startswith(('target_', 'eagle_')):
        row[name] /= FORWARDS_PER_CALL
    vanilla_ms, sd_ms = row['vanilla_ms'], row['sd_ms']
    row.update(sd_iterations=iterations,
               vanilla_ms_per_token=vanilla_ms / num_tokens, sd_ms_per_iteration=sd_ms / iterations)
    forwards, fixed = (row[f'target_t{K + 1}_{s}'] + row[f'eagle_t{K + 1}_{s}']
                       + (K - 1) * row[f'eagle_t1_{s}'] for s in ('ms', 'fixed_ms'))
    row['sd_other_ms_per_iteration'] = row['sd_ms_per_iteration'] - forwards
    row['sd_other_fixed_position_ms_per_iteration'] = row['sd_ms_per_iteration'] - fixed
    row['sd_other_over_vanilla_token'] = (row['sd_other_ms_per_iteration']
                                          / row['vanilla_ms_per_token'])
    row['speedup'] = vanilla_ms / sd_ms
    row['forwards_only_speedup'] = vanilla_ms / (iterations * forwards)
    passes.append(row)
    print(f"| {index} | {row['target_t1_ms']:.3f} | {row[f'target_t{K + 1}_ms']:.3f} | "
          f"{row[f'target_t{K + 1}_ms'] / row['target_t1_ms']:.2f} | {row['eagle_t1_ms']:.3f} | "
          f"{row[f'eagle_t{K + 1}_ms']:.3f} | {row['vanilla_ms_per_token']:.3f} | "
          f"{row['sd_ms_per_iteration']:.3f} | {row['sd_other_ms_per_iteration']:.3f} | "
          f"{row['sd_other_over_vanilla_token']:.2f} | "
          f"{row['sd_other_fixed_position_ms_per_iteration']:.3f} | "
          f"{num_tokens / iterations:.2f} | {row['speedup']:.2f}x | "
          f"{row['forwards_only_speedup']:.2f}x |", flush=True)
  os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
  result = {'times_in': 'ms, best of interleaved rounds', 'k': K, 'rows': 2,
            'forward_positions': 'moving (lengths 100, 101 in turn); *_fixed_ms: length 100',
            'cache_slots': dict(target_t1=vanilla_cache.capacity, target=cache.capacity,
                                eagle=eagle_cache.capacity),
            'num_tokens': num_tokens, 'backend': jax.default_backend(), 'host': timing.host(),
            'flags': timing.flag_values(),
            'passes': passes}
  resume.write_json(_OUT.value, result)
  print('wrote', _OUT.value)


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
