"""Which target shape lets batch-1 SD pay on this CPU: random-weight targets (not a test).

  python bench/target_shapes.py --out bench/results/target_shapes.json
  python bench/target_shapes.py --shapes 16x64x2,8x128x4 --rounds 12

For each LlamaGen c2i shape LAYERSxDIMxHEADS (SwiGLU width from the dim, as
`GPTConfig`) with random weights, and its LANTERN-shaped EAGLE-1 head, times
whole-image decodes of one image with CFG (2 cache rows, XLA:CPU on one
thread per op as the main command runs it):
  * vanilla, per token;
  * ChainDraft(k=4, EAGLE head) + UniformRelaxed(omega 2), per verify
    iteration (random weights accept little, but an iteration's work does
    not depend on how much it accepts).
The shapes are timed round-robin (`timing.best_ms_interleaved`), `--rounds`
times each, and the best time of each is kept, so slow phases of a noisy
machine hit every shape alike.
`predicted` = tokens per iteration (`--tokens_per_iteration`, what the
trained family accepts) x vanilla per token / SD per iteration: the batch-1
speedup the shape would give at that acceptance. Prints a table, writes JSON.
"""

from __future__ import annotations

import functools
import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import resume  # pylint: disable=g-import-not-at-top  (bench/resume.py)
import timing  # pylint: disable=g-import-not-at-top  (bench/timing.py)
from specdec_jax.app import generate as generate_app  # pylint: disable=g-import-not-at-top

_OUT = flags.DEFINE_string('out', 'bench/results/target_shapes.json', 'JSON results.')
_SHAPES = flags.DEFINE_string(
    'shapes', '8x128x4,12x96x4,16x64x2,20x64x2,12x64x2,16x48x2',
    'Comma-separated LAYERSxDIMxHEADS target shapes.')
_ROUNDS = flags.DEFINE_integer('rounds', 12, 'Round-robin timing rounds (best is kept).')
_TOKENS_PER_ITERATION = flags.DEFINE_float(
    'tokens_per_iteration', 4.45, 'Accepted tokens + 1 per iteration for the prediction.')
K = 4
NUM_TOKENS = 196


def parse_shape(text: str) -> tuple[int, int, int]:
  """'16x64x2' -> (layers 16, dim 64, heads 2)."""
  parts = text.strip().split('x')
  if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
    raise ValueError(f'--shapes: expected LAYERSxDIMxHEADS with positive integers, got '
                     f'{text!r}.')
  layers, dim, heads = map(int, parts)
  return layers, dim, heads


def main(argv):
  del argv
  generate_app.use_single_thread_xla()
  from specdec_jax.app import compile_cache  # pylint: disable=g-import-not-at-top
  compile_cache.enable()
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specdec_jax import decode, logits, rules  # pylint: disable=g-import-not-at-top
  from specdec_jax.models import eagle, llamagen  # pylint: disable=g-import-not-at-top

  shapes = [parse_shape(s) for s in _SHAPES.value.split(',')]
  sampling = logits.Sampling(cfg_scale=2.0)
  candidates = []
  for layers, dim, heads in shapes:
    config = llamagen.GPTConfig(
        n_layer=layers, dim=dim, n_head=heads, vocab_size=256, model_type='c2i',
        num_classes=10, block_size=NUM_TOKENS, multiple_of=32, dtype='float32')
    target = llamagen.LlamaGenGPT(config)
    target_params = target.init_params(jax.random.key(0))
    head = eagle.EagleDrafter(eagle.llamagen_drafter_config(config, dtype='float32'))
    head_params = head.init_params(jax.random.key(1))
    cond = target.cfg_cond(target_params, jnp.array([3]))

    call = functools.partial(decode.generate, target, target_params, cond,
                             num_tokens=NUM_TOKENS, key=jax.random.key(0), sampling=sampling)
    vanilla = functools.partial(call, mode=decode.Vanilla())
    sd = functools.partial(call, mode=decode.ChainDraft(k=K, drafter='eagle'), draft=head,
                           draft_params=head_params, rule=rules.UniformRelaxed(omega=2.0))
    iterations = int(sd().metrics.verify_steps[0])  # also compiles
    jax.block_until_ready(vanilla())
    candidates.append(dict(
        shape=f'{layers}x{dim}x{heads}', layers=layers, dim=dim, heads=heads,
        ffn_dim=config.ffn_dim,
        target_parameters=sum(x.size for x in jax.tree.leaves(target_params)),
        sd_iterations=iterations, vanilla=vanilla, sd=sd))
    print(f'compiled {layers}x{dim}x{heads}', flush=True)

  best = timing.best_ms_interleaved(
      {(index, name): (lambda call=c[name]: call().tokens)
       for index, c in enumerate(candidates) for name in ('vanilla', 'sd')},
      _ROUNDS.value, progress=True)

  tokens = _TOKENS_PER_ITERATION.value
  rows = []
  print('| shape | parameters | SwiGLU width | vanilla ms / token | SD ms / iteration '
        f'| predicted speedup at {tokens} tokens / iteration |')
  print('|---|---|---|---|---|---|')
  for index, c in enumerate(candidates):
    per_token = best[(index, 'vanilla')] / NUM_TOKENS
    per_iteration = best[(index, 'sd')] / c['sd_iterations']
    row = {k: c[k] for k in ('shape', 'layers', 'dim', 'heads', 'ffn_dim', 'target_parameters',
                             'sd_iterations')}
    row.update(vanilla_ms_per_token=per_token, sd_ms_per_iteration=per_iteration,
               predicted_speedup=tokens * per_token / per_iteration)
    rows.append(row)
    print(f"| {row['shape']} | {row['target_parameters'] / 1e6:.2f}M | {row['ffn_dim']} | "
          f"{per_token:.3f} | {per_iteration:.3f} | {row['predicted_speedup']:.2f}x |")
  os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
  result = {'times_in': 'ms, best of round-robin rounds', 'k': K, 'rows': 2,
            'num_tokens': NUM_TOKENS, 'rounds': _ROUNDS.value,
            'tokens_per_iteration': tokens, 'backend': jax.default_backend(), 'shapes': rows}
  resume.write_json(_OUT.value, result)
  print('wrote', _OUT.value)


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
