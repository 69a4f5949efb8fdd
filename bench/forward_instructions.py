"""Instructions, not seconds: the bundled family's forwards and decodes under callgrind (not a test).

  python bench/forward_instructions.py --out bench/results/forward_instructions.json

Wall-clock ratios on the project's shared 2-core hosts move by tens of
percent with the load; valgrind's callgrind counts the instructions a
program executes, the same for the same binary and inputs whatever else
runs. For each piece below a child process (this script with --piece)
runs under `valgrind --tool=callgrind --instr-atstart=no`: it compiles the
piece and runs it once uninstrumented, then switches instrumentation on
with `callgrind_control`, runs it again and switches it off. The pieces, at
batch 1 with CFG (2 cache rows) and the main command's XLA options:
  * target_t1, target_t5: --iters target forwards of 1 and k + 1 = 5 tokens
    at cache length 100 (a jitted fori_loop, as bench/iteration_cost.py);
  * vanilla, chain: a whole 196-token decode, vanilla and the EAGLE-1 chain
    (k 4) with UniformRelaxed(omega 2), class 3, key 0.
Reported: instructions per forward or per token, also without those of the
thread pool's idle workers (`THREAD_POOL`: their search for work runs
while the program runs and depends on timing), the decodes' ratio of the
latter (vanilla / chain: the speedup if every instruction cost the same
time) and each piece's five heaviest other functions. The children run
--parallel at a time; each takes a few minutes (compilation under
valgrind). Prints a table and writes JSON. Needs valgrind (Debian's
`valgrind` package). Valgrind does not emulate AVX-512, so on any x86 host
the counts are those of XLA's and YNNPACK's AVX2 code paths.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bundle_pieces  # pylint: disable=g-import-not-at-top  (bench/bundle_pieces.py)
import resume  # pylint: disable=g-import-not-at-top  (bench/resume.py)

_OUT = flags.DEFINE_string('out', 'bench/results/forward_instructions.json', 'JSON results.')
_PIECE = flags.DEFINE_string('piece', None, 'Internal: the piece a child process runs.')
_PIECES = flags.DEFINE_list('pieces', ['target_t1', 'target_t5', 'vanilla', 'chain'],
                            'Pieces to count.')
_ITERS = flags.DEFINE_integer('iters', 20, 'Forwards per counted call (target_t1/target_t5).')
_PARALLEL = flags.DEFINE_integer('parallel', 2, 'Children under valgrind at a time.')
K = bundle_pieces.K
NUM_TOKENS = bundle_pieces.NUM_TOKENS
# Idle workers of XLA:CPU's thread pool looking for tasks (GlobalSteal, PopBack,
# ...): instructions that depend on timing, not on the program's work.
THREAD_POOL = re.compile(r'Eigen::(ThreadPoolTempl|RunQueue|EventCount)|EigenEnvironment')


def build_piece(name: str):
  """(call, units, unit): a no-argument callable and how many forwards or tokens it runs."""
  from specdec_jax.app import generate as generate_app  # pylint: disable=g-import-not-at-top
  generate_app.use_single_thread_xla()
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import family as family_lib  # pylint: disable=g-import-not-at-top
  from specdec_jax.configs import generate as generate_config  # pylint: disable=g-import-not-at-top

  family = family_lib.load()
  target = family.target
  options = generate_app.compiler_options(generate_config.get_config())
  cond = target.cfg_cond(family.target_params, jnp.array([3]))
  if name in ('target_t1', 'target_t5'):
    num_new = 1 if name == 'target_t1' else K + 1
    cache, _ = bundle_pieces.forward_caches(family, cond)
    tokens = jnp.zeros((2, num_new), jnp.int32)
    forward = lambda cache, tokens, _: target.forward(family.target_params, cache, tokens)
    run = bundle_pieces.forward_loop(forward, _ITERS.value, options)
    return (lambda: run((cache, tokens, None))), _ITERS.value, 'forward'
  if name in ('vanilla', 'chain'):
    return bundle_pieces.decode_call(family, cond, options, name), NUM_TOKENS, 'token'
  raise ValueError(f'unknown piece {name!r}; use target_t1, target_t5, vanilla or chain.')


def run_child(name: str) -> None:
  """Runs one piece under an already running callgrind, counting only its second call."""
  import jax  # pylint: disable=g-import-not-at-top
  call, units, unit = build_piece(name)
  result = jax.block_until_ready(call())
  pid = str(os.getpid())
  subprocess.run(['callgrind_control', '-i', 'on', pid], check=True, capture_output=True)
  result = jax.block_until_ready(call())
  subprocess.run(['callgrind_control', '-i', 'off', pid], check=True, capture_output=True)
  steps = getattr(getattr(result, 'metrics', None), 'verify_steps', None)
  print(json.dumps({'piece': name, 'units': units, 'unit': unit,
                    'verify_steps': None if steps is None else int(steps[0])}), flush=True)


def count_piece(name: str, folder: str) -> dict:
  """Runs the child for one piece under callgrind and reads its counts."""
  out_file = os.path.join(folder, f'{name}.callgrind')
  command = ['valgrind', '--tool=callgrind', '--instr-atstart=no',
             f'--callgrind-out-file={out_file}', sys.executable, os.path.abspath(__file__),
             f'--piece={name}', f'--iters={_ITERS.value}']
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  lines = [l for l in done.stdout.splitlines() if l.startswith('{"piece"')]
  if done.returncode != 0 or not lines:
    raise RuntimeError(f'{name}: the callgrind child failed (exit {done.returncode}): '
                       f'{done.stderr[-2000:]}')
  row = json.loads(lines[-1])
  with open(out_file) as f:
    totals = re.search(r'^totals:\s+(\d+)', f.read(), re.MULTILINE)
  row['instructions'] = int(totals.group(1))
  annotated = subprocess.run(['callgrind_annotate', '--threshold=100', out_file],
                             capture_output=True, text=True, check=False).stdout
  heavy, pool = [], 0
  for line in annotated.splitlines():
    match = re.match(r'\s*([\d,]+) \(\s*([\d.]+)%\)\s+(.*)$', line)
    if not match or 'PROGRAM TOTALS' in line:
      continue
    function = match.group(3).split(':', 1)[-1].split('(')[0].strip()
    if THREAD_POOL.search(function):
      pool += int(match.group(1).replace(',', ''))
    elif len(heavy) < 5:
      heavy.append({'function': function[:120], 'share': float(match.group(2)) / 100})
  row['heaviest_functions'] = heavy
  row['thread_pool_instructions'] = pool
  row['work_instructions'] = row['instructions'] - pool
  row['instructions_per_unit'] = row['instructions'] / row['units']
  row['work_instructions_per_unit'] = row['work_instructions'] / row['units']
  return row


def main(argv):
  del argv
  if _PIECE.value:
    run_child(_PIECE.value)
    return
  for tool in ('valgrind', 'callgrind_control', 'callgrind_annotate'):
    if shutil.which(tool) is None:
      raise SystemExit(f'{tool} is not on PATH: install valgrind (apt-get install valgrind).')
  with tempfile.TemporaryDirectory() as folder:
    with concurrent.futures.ThreadPoolExecutor(_PARALLEL.value) as pool:
      rows = list(pool.map(lambda name: count_piece(name, folder), _PIECES.value))
  by_name = {row['piece']: row for row in rows}
  result = {'k': K, 'rows': 2, 'num_tokens': NUM_TOKENS, 'iters': _ITERS.value,
            'pieces': rows}
  print('| piece | instructions | of which thread-pool idling | work per forward or token '
        '| five heaviest other functions |')
  print('|---|---|---|---|---|')
  for row in rows:
    names = ', '.join(f"{h['function'][:40]} {100 * h['share']:.0f}%"
                      for h in row['heaviest_functions'])
    print(f"| {row['piece']} | {row['instructions'] / 1e6:.1f} M | "
          f"{row['thread_pool_instructions'] / row['instructions']:.0%} | "
          f"{row['work_instructions_per_unit'] / 1e6:.2f} M per {row['unit']} | {names} |")
  if 'target_t1' in by_name and 'target_t5' in by_name:
    result['t5_over_t1'] = (by_name['target_t5']['work_instructions_per_unit']
                            / by_name['target_t1']['work_instructions_per_unit'])
    print(f"5-token forward / 1-token forward: {result['t5_over_t1']:.2f}x work instructions")
  if 'vanilla' in by_name and 'chain' in by_name:
    result['vanilla_over_chain'] = (by_name['vanilla']['work_instructions']
                                    / by_name['chain']['work_instructions'])
    print(f"vanilla / chain decode: {result['vanilla_over_chain']:.2f}x work instructions "
          f"({by_name['chain']['verify_steps']} verify steps)")
  resume.write_json(_OUT.value, result)
  print('wrote', _OUT.value)


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
