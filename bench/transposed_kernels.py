"""Where reading kernels transposed pays in a model's forward on CPU (not a test).

  python bench/transposed_kernels.py --out bench/results/transposed_kernels.json

`models.dense_dot.weight_dot` multiplies a dense kernel [K, N] by a transposed
copy [N, K] on XLA:CPU when at least TRANSPOSE_MIN_ROWS rows multiply a kernel
of at least TRANSPOSE_MIN_BYTES. This bench times a random-weight LlamaGen
c2i GPT's forward of T tokens with CFG (2 rows each, at a cache of
--cache_length, moving one position per forward as in a decode) at several
widths, each compiled three ways:
  * stored: every kernel as stored (TRANSPOSE_MIN_BYTES = inf);
  * floor: the library's rule (TRANSPOSE_MIN_BYTES as shipped, 1 MiB);
  * all: every kernel multiplied by >= TRANSPOSE_MIN_ROWS rows transposed
    (TRANSPOSE_MIN_BYTES = 0).
At width d the attention kernels are d x d x 4 bytes and the MLP's d x F x 4
(F = 8d/3 rounded up to 256), the LM head d x V x 4: the widths straddle the
floor. Interleaved rounds in one process (`timing.best_ms_interleaved`), ms
per forward; prints a table, writes JSON. Where two variants lower to the
same program (`same_program_as`; e.g. floor and all once every kernel is over
the floor), the gap between their times is this bench's noise.
"""

from __future__ import annotations

import os
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bundle_pieces  # pylint: disable=g-import-not-at-top  (bench/bundle_pieces.py)
import resume  # pylint: disable=g-import-not-at-top  (bench/resume.py)
import timing  # pylint: disable=g-import-not-at-top  (bench/timing.py)

_OUT = flags.DEFINE_string('out', 'bench/results/transposed_kernels.json', 'JSON results.')
_WIDTHS = flags.DEFINE_list('widths', ['256', '384', '512', '640', '768'], 'Model widths d.')
_TOKENS = flags.DEFINE_list('tokens', ['5', '25'], 'Tokens T per forward (2T rows with CFG).')
_LAYERS = flags.DEFINE_integer('layers', 12, 'Decoder layers.')
_VOCAB = flags.DEFINE_integer('vocab', 16384, 'Vocabulary (LM head width).')
_CACHE_LENGTH = flags.DEFINE_integer('cache_length', 100, 'Cache length the forwards write at.')
_ITERS = flags.DEFINE_integer('iters', 8, 'Forwards per timed call.')
_ROUNDS = flags.DEFINE_integer('rounds', 4, 'Interleaved rounds.')

VARIANTS = {'stored': 1 << 62, 'floor': None, 'all': 0}  # TRANSPOSE_MIN_BYTES; None: as shipped


def _compiled_loops(model, params, cache, tokens_per_forward: int):
  """({variant: no-argument call of a compiled loop of --iters forwards},
  {variant: the first variant whose program (StableHLO text) it equals})."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specdec_jax import decode  # pylint: disable=g-import-not-at-top
  from specdec_jax.models import dense_dot  # pylint: disable=g-import-not-at-top
  shipped = dense_dot.TRANSPOSE_MIN_BYTES
  carry = (cache, jnp.zeros((2, tokens_per_forward), jnp.int32), None)
  calls, programs = {}, {}
  for name, floor in VARIANTS.items():
    dense_dot.TRANSPOSE_MIN_BYTES = shipped if floor is None else floor
    try:  # a fresh function per variant, traced under its floor
      loop = bundle_pieces.forward_loop(
          lambda c, t, f: model.forward(params, c, t), _ITERS.value,
          decode.CPU_LATENCY_OPTIONS, moving_positions=True)
      lowered = loop.lower(carry)
      compiled = lowered.compile()
    finally:
      dense_dot.TRANSPOSE_MIN_BYTES = shipped
    calls[name] = lambda compiled=compiled: compiled(carry)
    programs[name] = lowered.as_text()
  same_as = {name: next(other for other in programs if programs[other] == text)
             for name, text in programs.items()}
  return calls, same_as


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specdec_jax import kv_cache as kv  # pylint: disable=g-import-not-at-top
  from specdec_jax.models import dense_dot  # pylint: disable=g-import-not-at-top
  from specdec_jax.models import llamagen  # pylint: disable=g-import-not-at-top

  if not dense_dot.ENABLED:
    raise SystemExit(f'{dense_dot.ENVIRONMENT_VARIABLE}=0 is set: unset it to compare layouts.')
  results = []
  print('| width | attention / MLP / head kernel MB | T | stored ms | floor ms | all ms | '
        'stored / floor | stored / all |')
  print('|---|---|---|---|---|---|---|---|')
  slots = _CACHE_LENGTH.value + max(int(t) for t in _TOKENS.value) + 2
  for width in (int(w) for w in _WIDTHS.value):
    config = llamagen.GPTConfig(n_layer=_LAYERS.value, n_head=width // 64, dim=width,
                                vocab_size=_VOCAB.value, num_classes=10, block_size=256)
    model = llamagen.LlamaGenGPT(config)
    params = model.init_params(jax.random.key(0))
    cond = model.cfg_cond(params, jnp.array([0]))
    cache = model.prefill(params, model.init_cache(2, slots), cond).cache
    cache = kv.set_lengths(cache, jnp.full((2,), _CACHE_LENGTH.value, jnp.int32))
    kernel_mb = [round(n * 4 / 2**20, 2) for n in
                 (width * width, width * config.ffn_dim, width * _VOCAB.value)]
    for tokens in (int(t) for t in _TOKENS.value):
      calls, same_as = _compiled_loops(model, params, cache, tokens)
      rounds = [timing.best_ms_interleaved(calls, 1) for _ in range(_ROUNDS.value)]
      best = {name: min(r[name] for r in rounds) / _ITERS.value for name in calls}
      results.append({'width': width, 'ffn': config.ffn_dim, 'tokens': tokens,
                      'rows': 2 * tokens, 'kernel_mb_attention_mlp_head': kernel_mb,
                      'same_program_as': same_as,
                      'ms_per_forward_best': best,
                      'ms_per_forward_rounds': {name: [r[name] / _ITERS.value for r in rounds]
                                                for name in calls}})
      print(f'| {width} | {" / ".join(map(str, kernel_mb))} | {tokens} | {best["stored"]:.2f} | '
            f'{best["floor"]:.2f} | {best["all"]:.2f} | {best["stored"] / best["floor"]:.2f} | '
            f'{best["stored"] / best["all"]:.2f} |' + ('' if same_as['all'] == 'all' else
                                                      ' (floor, all: one program)'), flush=True)
  resume.write_json(
      _OUT.value,
      {'layers': _LAYERS.value, 'vocab': _VOCAB.value, 'iters': _ITERS.value,
       'rounds': _ROUNDS.value, 'cache_length': _CACHE_LENGTH.value,
       'transpose_min_rows': dense_dot.TRANSPOSE_MIN_ROWS,
       'transpose_min_bytes': dense_dot.TRANSPOSE_MIN_BYTES, 'dtype': 'float32',
       'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), 'host': timing.host(),
       'backend': jax.default_backend(), 'results': results})
  print('wrote', _OUT.value)


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
