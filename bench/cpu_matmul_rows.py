"""How fast XLA:CPU's matmul libraries read a model's weights at a decode's row counts (not a test).

  python bench/cpu_matmul_rows.py --out bench/results/cpu_matmul_rows.json

A decode forward at batch 1 with CFG multiplies M = 2 x T rows by every
weight matrix: M = 2 for vanilla and an EAGLE drafting step, 12 for a chain
verify of k = 5, 52 for a 26-node tree. At these M a float32 matmul should
be bound by reading its weights, so the figure is weight bytes per second.
The program is a stack of GPT-B-sized pairs (x @ W[768, 2048], tanh, then
@ W[2048, 768]; --layers pairs, 151 MB at 24), the shapes of a LlamaGen
GPT-B MLP, jitted with the main command's XLA options (`CPU_LATENCY_OPTIONS`)
and with each of the two dot paths XLA:CPU takes here:
  * ynn: the default (every dot a YNNPACK fusion);
  * eigen: YNNPACK off (`xla_cpu_experimental_ynn_fusion_type=''`), so dots
    run as XLA:CPU's own dot thunks (Eigen);
  * ynn_nk: the default path with every weight stored transposed, W[N, K]
    (PyTorch's `nn.Linear` layout), contracted on its minor dimension;
  * torch: PyTorch's `F.linear` on the same [N, K] weights, with
    torch.set_num_threads() given this process's CPU count (only if torch imports):
    the reference the PyTorch peer's forwards run on.
(With jax 0.10.2 the oneDNN and XNNPACK dot-fusion options, set with YNNPACK
off, compile to the same program as `eigen`: no library fusion appears.) The
JSON records the library fusion kinds found in each compiled program.
Interleaved rounds in one process; each variant's best of --repeats calls per
round, the best round reported with all rounds. Prints a table, writes JSON.
"""

from __future__ import annotations

import os
import re
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import resume  # pylint: disable=g-import-not-at-top  (bench/resume.py)
import timing  # pylint: disable=g-import-not-at-top  (bench/timing.py)

_OUT = flags.DEFINE_string('out', 'bench/results/cpu_matmul_rows.json', 'JSON results.')
_ROWS = flags.DEFINE_list('rows', ['1', '2', '6', '12', '52'], 'Row counts M.')
_LAYERS = flags.DEFINE_integer('layers', 24, 'Matmul pairs in the stack.')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Interleaved rounds.')
_REPEATS = flags.DEFINE_integer('repeats', 4, 'Calls per variant per round (best kept).')

WIDTH, FFN = 768, 2048


def variants() -> dict:
  from specdec_jax import decode  # pylint: disable=g-import-not-at-top
  base = dict(decode.CPU_LATENCY_OPTIONS)
  no_ynn = {**base, 'xla_cpu_experimental_ynn_fusion_type': ''}
  return {'ynn': base, 'eigen': no_ynn}


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  ups = [jnp.asarray(rng.standard_normal((WIDTH, FFN), np.float32) * 0.02)
         for _ in range(_LAYERS.value)]
  downs = [jnp.asarray(rng.standard_normal((FFN, WIDTH), np.float32) * 0.02)
           for _ in range(_LAYERS.value)]
  weight_bytes = 2 * _LAYERS.value * WIDTH * FFN * 4

  ups_nk = [jnp.asarray(np.ascontiguousarray(np.asarray(w).T)) for w in ups]  # [FFN, WIDTH]
  downs_nk = [jnp.asarray(np.ascontiguousarray(np.asarray(w).T)) for w in downs]

  def stack(x, ups, downs):  # x f32[M, WIDTH]; W[K, N]
    for up, down in zip(ups, downs):
      x = jnp.tanh(x @ up) @ down
    return x

  def stack_nk(x, ups, downs):  # x f32[M, WIDTH]; W[N, K]
    minor = (((1,), (1,)), ((), ()))
    for up, down in zip(ups, downs):
      x = jax.lax.dot_general(jnp.tanh(jax.lax.dot_general(x, up, minor)), down, minor)
    return x

  torch_stack, torch_version = _torch_stack(ups_nk, downs_nk, len(os.sched_getaffinity(0)))

  results = []
  names = [*variants(), 'ynn_nk'] + (['torch'] if torch_stack else [])
  print('| rows M | ' + ' | '.join(f'{name} GB/s' for name in names) + ' |')
  print('|---' * (1 + len(names)) + '|')
  for rows in (int(r) for r in _ROWS.value):
    x = jnp.ones((rows, WIDTH), jnp.float32)
    calls, fusion_kinds = {}, {}
    for name, options in variants().items():
      fn = jax.jit(stack, compiler_options=options)
      jax.block_until_ready(fn(x, ups, downs))
      text = fn.lower(x, ups, downs).compile().as_text()
      fusion_kinds[name] = sorted(set(re.findall(r'"kind":"(__\w+)"', text)))
      calls[name] = lambda fn=fn, x=x: fn(x, ups, downs)
    fn = jax.jit(stack_nk, compiler_options=variants()['ynn'])
    jax.block_until_ready(fn(x, ups_nk, downs_nk))
    calls['ynn_nk'] = lambda fn=fn, x=x: fn(x, ups_nk, downs_nk)
    if torch_stack:
      calls['torch'] = lambda x=np.ones((rows, WIDTH), np.float32): torch_stack(x)
    rounds = [timing.best_ms_interleaved(calls, _REPEATS.value) for _ in range(_ROUNDS.value)]
    gbps = {name: [weight_bytes / (r[name] * 1e-3) / 1e9 for r in rounds] for name in calls}
    results.append({'rows': rows, 'library_fusions': fusion_kinds,
                    'weight_gb_per_s_best': {k: max(v) for k, v in gbps.items()},
                    'weight_gb_per_s_rounds': gbps,
                    'gflop_per_s_best': {k: max(v) * rows * 2 / 4 for k, v in gbps.items()}})
    print(f'| {rows} | ' + ' | '.join(f'{max(v):.1f}' for v in gbps.values()) + ' |', flush=True)
  resume.write_json(
      _OUT.value,
      {'weight_bytes': weight_bytes, 'layers': _LAYERS.value, 'width': WIDTH,
       'ffn': FFN, 'dtype': 'float32', 'options': {k: str(v) for k, v in variants().items()},
       'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), 'host': timing.host(),
       'backend': jax.default_backend(), 'torch': torch_version,
       'results': results})
  print('wrote', _OUT.value)


def _torch_stack(ups_nk, downs_nk, threads: int):
  """(PyTorch's F.linear over the same [N, K] weights, its version), or (None, None)
  without torch."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None, None
  import numpy as np  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(threads)
  ups = [torch.from_numpy(np.array(w)) for w in ups_nk]
  downs = [torch.from_numpy(np.array(w)) for w in downs_nk]

  def stack(x):  # x f32[M, WIDTH] (numpy); returns a torch tensor (computed eagerly)
    with torch.no_grad():
      h = torch.from_numpy(x)
      for up, down in zip(ups, downs):
        h = torch.nn.functional.linear(torch.tanh(torch.nn.functional.linear(h, up)), down)
    return h
  return stack, f'{torch.__version__} (threads {torch.get_num_threads()})'


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
