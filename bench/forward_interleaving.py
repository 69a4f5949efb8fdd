"""What the target's and the drafter's forwards cost when they alternate (not a test).

  python bench/forward_interleaving.py --out bench/results/forward_interleaving.json
  python bench/forward_interleaving.py --cpus=0 --out bench/results/forward_interleaving_pinned.json

`bench/iteration_cost.py` splits an SD iteration into its forwards, each
timed in a loop of its own, and "other", the rest. This bench asks how much
of "other" is the forwards themselves running slower when they alternate,
as they do in the decode, rather than the loop's bookkeeping. On the
bundled family, one image with CFG (2 cache rows), the main command's XLA
options, three jitted loops of --iterations steps each:
  * target: the target's forward over k + 1 = 5 tokens;
  * eagle: the EAGLE head's catch-up over 5 tokens and k - 1 = 3 one-token
    drafting forwards (the drafter's forwards of one chain iteration);
  * both: the two in turn, each step feeding the next (the decode's order,
    with no sampling, verification or bookkeeping between them).
With --small_kernels N > 0, three more loops ask what small kernels of the
loop's own (sampling, verification, bookkeeping) cost beside the forwards:
  * small: N reductions over a [2, 256] array (about 2N kernels, each with
    its own constants), nothing else;
  * both_small: `both`, then the small kernels (after the drafter);
  * both_small_between: the small kernels between the target's forward and
    the drafter's, where the decode's target sampling and verification run.
Every step moves both caches' lengths between L and L + 1, so each forward
writes at a new position as in a decode (before 2026-12-04 they stayed at
one length, where XLA hoists the position-dependent work out of the loop),
and the catch-up runs the LM head at one position, as the decode does.
Reported per step: each loop's best time over --rounds interleaved rounds,
the excess of `both` over `target` + `eagle`, and of each `both_small*`
over `both` + `small`. --cpus pins the process
to those cores before JAX starts (the main command runs on all of them).
Prints a table and writes JSON.
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bundle_pieces  # pylint: disable=g-import-not-at-top  (bench/bundle_pieces.py)
import hlo_kernels  # pylint: disable=g-import-not-at-top  (bench/hlo_kernels.py)
import resume  # pylint: disable=g-import-not-at-top  (bench/resume.py)
import timing  # pylint: disable=g-import-not-at-top  (bench/timing.py)
from specdec_jax.app import generate as generate_app  # pylint: disable=g-import-not-at-top

_OUT = flags.DEFINE_string('out', 'bench/results/forward_interleaving.json', 'JSON results.')
_ITERATIONS = flags.DEFINE_integer('iterations', 100, 'Steps per timed loop.')
_ROUNDS = flags.DEFINE_integer('rounds', 7, 'Interleaved rounds per pass (best is kept).')
_PASSES = flags.DEFINE_integer('passes', 3, 'Measurement passes.')
_CPUS = flags.DEFINE_list('cpus', [], 'Cores to pin the process to (default: all).')
_SMALL = flags.DEFINE_integer('small_kernels', 0, 'Reductions in the small-kernel loops (0: none).')
K = bundle_pieces.K


def step_loops(family, options: dict | None, iterations: int,
               small_kernels: int = 0) -> tuple[dict, dict]:
  """({'target', 'eagle', 'both'} (and with small_kernels, 'small', 'both_small',
  'both_small_between'): no-argument calls of jitted loops of `iterations` steps,
  {the same names: kernels per step of the loop body})."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specdec_jax import kv_cache as kv  # pylint: disable=g-import-not-at-top
  target, eagle = family.target, family.eagle
  cond = target.cfg_cond(family.target_params, jnp.array([3]))
  cache, eagle_cache = bundle_pieces.forward_caches(family, cond)
  width = target.config.dim

  def target_step(carry):
    target_cache, eagle_cache, tokens, features, small = carry
    out = target.forward(family.target_params, target_cache, tokens)
    tokens = jnp.argmax(out.logits, -1).astype(jnp.int32)
    small = small + out.logits[:, -1, :1]  # the small kernels read the target's output
    return kv.set_lengths(out.cache, target_cache.lengths), eagle_cache, tokens, out.hidden, small

  def small_step(carry):  # ~2 kernels per reduction, distinct constants, [2, 256] data
    *rest, small = carry
    for j in range(small_kernels):
      small = jnp.exp(small - jnp.max(small * (1.0 + 1e-3 * j), axis=-1, keepdims=True))
    return (*rest, small)

  def eagle_step(carry):
    target_cache, eagle_cache, tokens, features, small = carry
    last = jnp.full((tokens.shape[0],), tokens.shape[1] - 1, jnp.int32)  # the decode's catch-up
    out = eagle.forward(family.eagle_params, eagle_cache, tokens, features, logits_at=last)
    draft_cache = out.cache
    draft = jnp.argmax(out.logits, -1).astype(jnp.int32)
    hidden = out.hidden[:, -1:]
    for _ in range(K - 1):
      out = eagle.forward(family.eagle_params, draft_cache, draft, hidden)
      draft_cache, hidden = out.cache, out.hidden
      draft = jnp.argmax(out.logits, -1).astype(jnp.int32)
    # The draft feeds the next step's tokens, as the drafts feed the next verify.
    # (and the drafts read the small kernels' output, as they read verification's)
    tokens = tokens.at[:, :1].set(draft + (small[:, :1] > 1e30).astype(jnp.int32))
    return (target_cache, kv.set_lengths(draft_cache, eagle_cache.lengths), tokens, features,
            small)

  steps = {'target': target_step, 'eagle': eagle_step,
           'both': lambda carry: eagle_step(target_step(carry))}
  if small_kernels:
    steps.update(small=small_step,
                 both_small=lambda carry: small_step(eagle_step(target_step(carry))),
                 both_small_between=lambda carry: eagle_step(small_step(target_step(carry))))
  carry = (cache, eagle_cache, jnp.zeros((2, K + 1), jnp.int32), jnp.zeros((2, K + 1, width)),
           jnp.zeros((2, 256)))

  def moving(step):  # cache lengths L, L + 1 in turn: every forward writes at a new position
    def body(index, carry):
      target_cache, eagle_cache, *rest = step(carry)
      move = lambda cache: kv.set_lengths(cache, bundle_pieces.moved_lengths(cache.lengths, index))
      return (move(target_cache), move(eagle_cache), *rest)
    return body

  calls, kernels = {}, {}
  for name, step in steps.items():
    run = jax.jit(lambda c, step=step: jax.lax.fori_loop(0, iterations, moving(step), c),
                  compiler_options=options)
    calls[name] = lambda run=run: run(carry)
    kernels[name] = hlo_kernels.loop_kernels(run.lower(carry).compile().as_text())['total']
  return calls, kernels


def main(argv):
  del argv
  if _CPUS.value:
    os.sched_setaffinity(0, {int(c) for c in _CPUS.value})  # before JAX starts its threads
  generate_app.use_single_thread_xla()
  import jax  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import family as family_lib  # pylint: disable=g-import-not-at-top
  from specdec_jax.configs import generate as generate_config  # pylint: disable=g-import-not-at-top
  options = generate_app.compiler_options(generate_config.get_config())
  calls, kernels = step_loops(family_lib.load(), options, _ITERATIONS.value, _SMALL.value)
  print('kernels per step:', kernels)
  passes = []
  small = (' small | both_small - (both + small) | between - (both + small) |'
           if _SMALL.value else '')
  print('| pass | target ms / step | eagle ms / step | both ms / step | both - (target + eagle) |'
        + small)
  print('|---' * (8 if _SMALL.value else 5) + '|')
  for index in range(_PASSES.value):
    ms = timing.best_ms_interleaved(calls, _ROUNDS.value)
    row = {f'{name}_ms': value / _ITERATIONS.value for name, value in ms.items()}
    row['excess_ms'] = row['both_ms'] - row['target_ms'] - row['eagle_ms']
    line = (f"| {index} | {row['target_ms']:.3f} | {row['eagle_ms']:.3f} | {row['both_ms']:.3f} | "
            f"{row['excess_ms']:.3f} |")
    if _SMALL.value:
      for name in ('both_small', 'both_small_between'):
        row[f'{name}_excess_ms'] = row[f'{name}_ms'] - row['both_ms'] - row['small_ms']
      line += (f" {row['small_ms']:.3f} | {row['both_small_excess_ms']:.3f} | "
               f"{row['both_small_between_excess_ms']:.3f} |")
    passes.append(row)
    print(line, flush=True)
  resume.write_json(
      _OUT.value,
      {'times_in': 'ms per step, best of interleaved rounds', 'k': K, 'rows': 2,
       'iterations': _ITERATIONS.value, 'cpus': sorted(os.sched_getaffinity(0)),
       'small_kernels': _SMALL.value, 'kernels_per_step': kernels,
       'backend': jax.default_backend(), 'host': timing.host(), 'passes': passes})
  print('wrote', _OUT.value)


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
