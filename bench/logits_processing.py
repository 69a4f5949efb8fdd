"""Micro-benchmark of logits processing (not a test): top-k / top-p masks at large V.

Usage:
  python bench/logits_processing.py --out=/tmp/logits_processing.json

Legend: B rows, T window positions, V vocabulary.

Times one jitted processing of float32 logits [B, T, V] (default B=2, T=5:
one image with CFG after the combine is B=1, a chain k=4 window is T=5) at
V = 16384 (LlamaGen) and 65536 (Lumina-mGPT), top_k 2000, top_p 0.9:

  * previous: the implementation before the single-sort path
    (`tests/logits_reference.py`: lax.top_k, then argsort + gather +
    inverse argsort for top-p);
  * exact: `logits.filter_logits` (one descending sort for top-k and/or
    top-p, thresholds compared with the unsorted logits);
  * approx: `topk_method='approx'` (`lax.approx_max_k`; exact on CPU/GPU,
    where it falls back to a sort-based top-k).

Reports the median of --repeats timings of --iters calls each (ms per call)
and the ratio to the previous implementation. Prints a table and writes JSON.
"""

from __future__ import annotations

import os
import sys
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import resume  # pylint: disable=g-import-not-at-top  (bench/resume.py)

from specdec_jax import logits  # pylint: disable=g-import-not-at-top
from specdec_jax.app import compile_cache  # pylint: disable=g-import-not-at-top
from tests import logits_reference  # pylint: disable=g-import-not-at-top

_OUT = flags.DEFINE_string('out', None, 'Where to write the JSON results.')
_VOCABS = flags.DEFINE_list('vocabs', ['16384', '65536'], 'Vocabulary sizes.')
_BATCH = flags.DEFINE_integer('batch', 2, 'Rows B.')
_WINDOW = flags.DEFINE_integer('window', 5, 'Window positions T.')
_TOP_K = flags.DEFINE_integer('top_k', 2000, 'top-k.')
_TOP_P = flags.DEFINE_float('top_p', 0.9, 'top-p.')
_ITERS = flags.DEFINE_integer('iters', 20, 'Calls per timing.')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timings (median reported).')


def previous(x, top_k, top_p):
  x = logits_reference.top_k_mask(x, top_k)
  return x if top_p >= 1 else logits_reference.top_p_mask(x, top_p)


def variants(top_k: int, top_p: float) -> dict:
  """name -> function of the logits, for one (top_k, top_p) setting."""
  nucleus = top_p < 1
  return {
      'previous': lambda x: previous(x, top_k, top_p),
      'exact': lambda x: logits.filter_logits(x, top_k=top_k, top_p=top_p, nucleus=nucleus),
      'approx': lambda x: logits.filter_logits(x, top_k=top_k, top_p=top_p, nucleus=nucleus,
                                               topk_method='approx'),
  }


def time_ms(fn, x, iters: int, repeats: int) -> float:
  """ms per call: a jitted fori_loop of `iters` calls on perturbed inputs."""

  @jax.jit
  def run(x):
    def body(i, total):
      out = fn(x + i.astype(x.dtype) * 1e-6)
      return total + jnp.where(jnp.isfinite(out), out, 0.0).sum()
    return jax.lax.fori_loop(0, iters, body, jnp.float32(0))

  jax.block_until_ready(run(x))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(run(x))
    times.append(time.perf_counter() - start)
  return 1e3 * float(np.median(times)) / iters


def main(argv):
  del argv
  compile_cache.enable()
  settings = (('top-k', _TOP_K.value, 1.0), ('top-p', 0, _TOP_P.value),
              ('top-k + top-p', _TOP_K.value, _TOP_P.value))
  results = {'device': str(jax.devices()[0]), 'batch': _BATCH.value, 'window': _WINDOW.value,
             'top_k': _TOP_K.value, 'top_p': _TOP_P.value, 'iters': _ITERS.value,
             'repeats': _REPEATS.value, 'rows': []}
  print(f'{"V":>6}  {"setting":<14}{"previous ms":>12}{"exact ms":>10}{"approx ms":>10}'
        f'{"exact/prev":>11}{"approx/prev":>12}')
  for vocab in map(int, _VOCABS.value):
    x = jax.random.normal(jax.random.key(0), (_BATCH.value, _WINDOW.value, vocab)) * 3
    for name, top_k, top_p in settings:
      row = {'vocab': vocab, 'setting': name, 'top_k': top_k, 'top_p': top_p}
      fns = variants(top_k, top_p)
      reference = np.asarray(jax.jit(fns['previous'])(x))
      for variant, fn in fns.items():
        np.testing.assert_array_equal(np.asarray(jax.jit(fn)(x)), reference, err_msg=variant)
        row[f'{variant}_ms'] = time_ms(fn, x, _ITERS.value, _REPEATS.value)
      for variant in ('exact', 'approx'):
        row[f'{variant}_over_previous'] = row[f'{variant}_ms'] / row['previous_ms']
      results['rows'].append(row)
      print(f'{vocab:>6}  {name:<14}{row["previous_ms"]:>12.3f}{row["exact_ms"]:>10.3f}'
            f'{row["approx_ms"]:>10.3f}{row["exact_over_previous"]:>11.2f}'
            f'{row["approx_over_previous"]:>12.2f}', flush=True)
  if _OUT.value:
    resume.write_json(_OUT.value, results)


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
