"""Attention phases on the bundled Fashion-MNIST family: one decode loop over the whole
target cache against P loops on a cache that grows between them (not a test).

  python bench/attention_phases.py --out bench/results/attention_phases.json

`decode.generate(attention_phases=P)` splits the decode into P while_loops;
phase p's target cache holds about prefix + p/P of the image's tokens, so its
attention reads that many slots instead of the whole capacity. For each batch
(images with CFG, classes 0, 1, ...) and each of vanilla and the EAGLE-1 chain
(k = 4, UniformRelaxed(omega 2)), every phase count is compiled (compile
seconds recorded) and timed in interleaved rounds (each piece's best kept,
the order rotated every round), with XLA:CPU on one thread per op and the
main command's XLA options. The tokens of every phase count are compared with
the one-loop decode's (same keys). Prints a table; writes JSON.
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

_OUT = flags.DEFINE_string('out', 'bench/results/attention_phases.json', 'JSON results.')
_BATCHES = flags.DEFINE_list('batches', ['1', '20'], 'Images per decode call.')
_PHASES = flags.DEFINE_list('phases', ['1', '3'], 'Phase counts (the first is the baseline).')
_ROUNDS = flags.DEFINE_integer('rounds', 8, 'Interleaved rounds per batch (best is kept).')
NUM_TOKENS = 196


def main(argv):
  del argv
  generate_app.use_single_thread_xla()
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from specdec_jax import decode, logits, rules  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import family as family_lib  # pylint: disable=g-import-not-at-top
  from specdec_jax.configs import generate as generate_config  # pylint: disable=g-import-not-at-top
  family = family_lib.load()
  options = generate_app.compiler_options(generate_config.get_config())
  methods = {
      'vanilla': dict(mode=decode.Vanilla()),
      'chain': dict(mode=decode.ChainDraft(k=4, drafter='eagle'), draft=family.eagle,
                    draft_params=family.eagle_params, rule=rules.UniformRelaxed(omega=2.0)),
  }
  phase_counts = [int(p) for p in _PHASES.value]
  rows = []
  print('| batch | method | phases | compile s | ms per image | vs one loop | same tokens |')
  print('|---|---|---|---|---|---|---|')
  for batch in (int(b) for b in _BATCHES.value):
    cond = family.target.cfg_cond(family.target_params, jnp.arange(batch) % 10)
    calls, info = {}, {}
    for method, kwargs in methods.items():
      baseline = None
      for phases in phase_counts:
        call = (lambda kwargs=kwargs, phases=phases: decode.generate(
            family.target, family.target_params, cond, num_tokens=NUM_TOKENS,
            key=jax.random.key(0), sampling=logits.Sampling(cfg_scale=2.0),
            compiler_options=options, attention_phases=phases, **kwargs))
        result = call()
        tokens = np.asarray(result.tokens)
        baseline = tokens if baseline is None else baseline
        info[(method, phases)] = dict(
            compile_s=result.compile_seconds, same_tokens=bool((tokens == baseline).all()),
            tokens_per_forward=result.metrics.summary()['tokens_per_target_forward'])
        calls[(method, phases)] = call
        print(f'compiled batch {batch} {method} phases {phases}: '
              f'{result.compile_seconds:.1f} s', flush=True)
    best = timing.best_ms_interleaved(calls, _ROUNDS.value)
    for (method, phases), ms in best.items():
      ratio = best[(method, phase_counts[0])] / ms
      row = dict(batch=batch, method=method, phases=phases, ms_per_image=ms / batch,
                 speedup_vs_first=ratio, **info[(method, phases)])
      rows.append(row)
      print(f"| {batch} | {method} | {phases} | {row['compile_s']:.1f} | "
            f"{row['ms_per_image']:.2f} | {ratio:.2f}x | {row['same_tokens']} |", flush=True)
  resume.write_json(
      _OUT.value,
      {'times_in': 'ms per image, best of interleaved rounds', 'num_tokens': NUM_TOKENS,
       'host': timing.host(), 'backend': jax.default_backend(), 'rows': rows})
  print('wrote', _OUT.value)


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
