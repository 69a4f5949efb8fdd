"""Where a batch-1 decode iteration's time and kernels go, per piece of the loop (not a test).

  python bench/loop_profile.py --out bench/results/loop_profile.json

On the bundled Fashion-MNIST family, one image with CFG (2 cache rows), the
main command's XLA options (per mode, as it compiles them), for the modes
vanilla, chain (the EAGLE-1 chain, UniformRelaxed(2), k = 4), tree (an
EAGLE-1 static tree), jacobi (SJD, window --jacobi_window), and the main
command's eagle2 and sjd_pac (configs/generate.py; sjd_pac_KxD for another tree) (--modes;
default the first four).
For each mode, in one process:
  * kernels per iteration from the compiled program (`hlo_kernels`), by the
    loop's named pieces (window, target_forward, target_probs, verify,
    commit, draft, draft/forward, metrics) and by kind (fusion, copy, nested
    while, scatter, ...);
  * time per iteration: best of --repeats untraced calls, and its split
    over the same pieces from a `jax.profiler` trace of --trace_calls calls
    (self time of every kernel, attributed through the program's op names).
    Tracing slows each kernel by a roughly constant amount, so the split is
    reported as shares of the traced time, applied to the untraced time: the
    time between kernels, and that of the kernels outside the loop
    (`outside_loop_share` of the traced time), lands on the pieces pro rata,
    so a piece's ms is not its kernels' own time (`traced_us_per_iteration`).
Prints a table per mode and writes JSON.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import sys
import tempfile

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hlo_kernels  # pylint: disable=g-import-not-at-top  (bench/hlo_kernels.py)
import resume  # pylint: disable=g-import-not-at-top  (bench/resume.py)
import timing  # pylint: disable=g-import-not-at-top  (bench/timing.py)
from specdec_jax import jacobi_drafts  # pylint: disable=g-import-not-at-top
from specdec_jax.app import generate as generate_app  # pylint: disable=g-import-not-at-top
from specdec_jax.app import methods as methods_lib  # pylint: disable=g-import-not-at-top
from specdec_jax.configs import generate as generate_config  # pylint: disable=g-import-not-at-top

_OUT = flags.DEFINE_string('out', 'bench/results/loop_profile.json', 'JSON results.')
_MODES = flags.DEFINE_list('modes', ['vanilla', 'chain', 'tree', 'jacobi'], 'Modes to profile.')
_REPEATS = flags.DEFINE_integer('repeats', 10, 'Untimed-trace calls per mode (best is kept).')
_TRACE_CALLS = flags.DEFINE_integer('trace_calls', 3, 'Traced calls per mode.')
_CLASS = flags.DEFINE_integer('label', 3, 'Class of the decoded image.')
_JACOBI_WINDOW = flags.DEFINE_integer('jacobi_window', 8, 'Window W of jacobi and sjd_pac '
                                      '(the committed runs: 8; the main command now runs 4).')
_JACOBI_INIT = flags.DEFINE_enum('jacobi_init', 'random', list(jacobi_drafts.INITS),
                                 'Fresh drafts of jacobi and sjd_pac (the committed runs: '
                                 "'random'; the main command now uses 'spatial').")

# A small EAGLE-1 tree for the bundle: two candidates at each of the first two
# depths, then a chain (13 nodes, depth 5).
BUNDLE_TREE = ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0),
               (0, 0, 0, 0), (0, 0, 1, 0), (0, 0, 0, 0, 0), (1, 0, 0))
_SKIPPED_EVENTS = ('ThunkExecutor', 'PjitFunction', 'PjRt', 'MutexLock')


def mode_kwargs(name: str, family) -> dict:
  """generate() keyword arguments of one profiled mode."""
  from specdec_jax import decode, rules, verify  # pylint: disable=g-import-not-at-top
  eagle = dict(draft=family.eagle, draft_params=family.eagle_params)
  if name == 'vanilla':
    return dict(mode=decode.Vanilla())
  if name == 'chain':
    return dict(mode=decode.ChainDraft(k=4, drafter='eagle'), rule=rules.UniformRelaxed(2.0),
                **eagle)
  if name == 'tree':
    return dict(mode=decode.TreeDraft(verify.StaticTree.from_paths(BUNDLE_TREE), 'eagle'),
                rule=rules.UniformRelaxed(2.0), **eagle)
  window, init = _JACOBI_WINDOW.value, _JACOBI_INIT.value
  if name == 'jacobi':
    return dict(mode=decode.Jacobi(window, init=init), rule=rules.Lossless())
  config = generate_config.get_config()  # the main command's eagle2 and sjd_pac settings
  if name == 'eagle2':
    return dict(mode=decode.DynamicTreeDraft(total_tokens=config.eagle2_total_tokens,
                                             depth=config.eagle2_depth, top_k=config.eagle2_top_k,
                                             drafts=config.eagle2_drafts),
                rule=rules.Lossless(), **eagle)
  if name == 'sjd_pac' or name.startswith('sjd_pac_'):  # the main command's tree, or 'KxD'
    tree = name[len('sjd_pac_'):] or f'{config.pac_branches}x{config.pac_depth}'
    branches, depth = methods_lib.parse_pac_tree(tree)
    return dict(mode=decode.JacobiPAC(window=window, branches=branches, depth=depth, init=init),
                rule=rules.Lossless())
  raise ValueError(f'unknown mode {name!r}; use vanilla, chain, tree, jacobi, eagle2, '
                   "sjd_pac or sjd_pac_KxD (K candidates at each of the first D drafts).")


def self_times(trace_file: str) -> dict:
  """{event name: (count, self time in us)} of a Perfetto trace (nested events on a
  thread: a parent's self time excludes its children's)."""
  events = json.load(gzip.open(trace_file))['traceEvents']
  threads = collections.defaultdict(list)
  for event in events:
    if event.get('ph') == 'X' and 'dur' in event:
      threads[(event['pid'], event['tid'])].append(event)
  out = collections.defaultdict(lambda: [0, 0.0])
  for thread in threads.values():
    thread.sort(key=lambda e: (e['ts'], -e['dur']))
    stack = []  # [end, name, children's time, duration]

    def pop():
      _, name, children, duration = stack.pop()
      out[name][0] += 1
      out[name][1] += duration - children
      if stack:
        stack[-1][2] += duration

    for event in thread:
      while stack and stack[-1][0] <= event['ts']:
        pop()
      stack.append([event['ts'] + event['dur'], event['name'], 0.0, event['dur']])
    while stack:
      pop()
  return dict(out)


def traced_split(call, instructions: dict, calls: int) -> dict:
  """Traced self time (us per call) of the loop's kernels by piece, plus 'outside loop'."""
  import jax  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as folder:
    jax.profiler.start_trace(folder, create_perfetto_trace=True)
    for _ in range(calls):
      jax.block_until_ready(call())
    jax.profiler.stop_trace()
    trace = sorted(glob.glob(os.path.join(folder, '**', '*.trace.json.gz'), recursive=True))
    times = self_times(trace[-1])
  split = collections.Counter()
  for name, (_, micros) in times.items():
    if name.startswith('$') or any(s in name for s in _SKIPPED_EVENTS):
      continue
    # A kernel's trace events are named after its instruction, some with an 'end: ' prefix.
    split[instructions.get(name.removeprefix('end: '), 'outside loop')] += micros / calls
  return dict(split)


def profile_mode(name: str, family, options, repeats: int, trace_calls: int,
                 label: int) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specdec_jax import decode, logits  # pylint: disable=g-import-not-at-top
  cond = family.target.cfg_cond(family.target_params, jnp.array([label]))
  kwargs = mode_kwargs(name, family)
  decode.clear_compile_cache()
  # As the main command compiles the mode (checkouts before per-mode options used one set).
  per_mode = getattr(generate_app, 'mode_compiler_options', lambda mode, options: options)
  options = per_mode(kwargs['mode'], options)
  call = lambda: decode.generate(family.target, family.target_params, cond, num_tokens=196,
                                 key=jax.random.key(0), sampling=logits.Sampling(cfg_scale=2.0),
                                 compiler_options=options, **kwargs)
  result = call()
  compiled = list(decode._COMPILED.values())[-1]  # pylint: disable=protected-access
  counts = hlo_kernels.loop_kernels(compiled.as_text())
  iterations = int(result.metrics.verify_steps[0])
  ms = timing.best_ms(call, repeats)
  split = traced_split(call, counts['instructions'], trace_calls)
  outside = split.pop('outside loop', 0.0)
  loop_traced = sum(split.values())
  per_iteration_ms = ms / iterations
  # ms_per_iteration shares the untraced wall time out in proportion to the pieces'
  # traced kernel times, so the time between kernels (and the kernels outside the
  # loop, `outside_loop_share` of the traced time) lands on the pieces pro rata.
  pieces = {piece: {'traced_us_per_iteration': micros / iterations,
                    'share': micros / loop_traced,
                    'ms_per_iteration': per_iteration_ms * micros / loop_traced}
            for piece, micros in sorted(split.items(), key=lambda kv: -kv[1])}
  return {'mode': name, 'compiler_options': options, 'ms': ms, 'iterations': iterations,
          'tokens_per_iteration': float(result.metrics.summary()['tokens_per_target_forward']),
          'ms_per_iteration': per_iteration_ms, 'ms_per_token': ms / 196, 'pieces': pieces,
          'outside_loop_share': outside / (outside + loop_traced),
          'kernels': hlo_kernels.summary_row(counts),
          'kernels_by_scope_and_kind': counts['by_scope'],
          'nested_loops': counts['nested_loops']}


def print_mode(row: dict) -> None:
  print(f"\n{row['mode']}: {row['ms']:.1f} ms per image, {row['iterations']} iterations, "
        f"{row['ms_per_iteration']:.3f} ms per iteration; kernels per iteration "
        f"{row['kernels']['total']} ({row['kernels']['outside_forwards']} outside the "
        f"forwards, {row['kernels']['nested_loops']} nested loops)")
  print('| piece | ms / iteration | share | kernels / iteration |')
  print('|---|---|---|---|')
  scopes = row['kernels']['by_scope']
  for piece, values in row['pieces'].items():
    print(f"| {piece} | {values['ms_per_iteration']:.3f} | {100 * values['share']:.0f}% "
          f"| {scopes.get(piece, 0)} |")
  print(f"(traced time outside the loop's kernels: {100 * row['outside_loop_share']:.0f}%; the "
        'ms column shares out the whole time, between kernels included, pro rata)')


def main(argv):
  del argv
  generate_app.use_single_thread_xla()
  import jax  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import family as family_lib  # pylint: disable=g-import-not-at-top
  from specdec_jax.configs import generate as generate_config  # pylint: disable=g-import-not-at-top
  options = generate_app.compiler_options(generate_config.get_config())
  family = family_lib.load()
  rows = []
  for name in _MODES.value:
    row = profile_mode(name, family, options, _REPEATS.value, _TRACE_CALLS.value, _CLASS.value)
    print_mode(row)
    rows.append(row)
  # compiler_options: the main command's; each row has the options its mode compiled with
  # (`generate.mode_compiler_options`: the tree-verified modes drop them).
  resume.write_json(
      _OUT.value,
      {'backend': jax.default_backend(), 'compiler_options': options, 'rows': rows,
       'flags': timing.flag_values(), 'host': timing.host(),
       'label': _CLASS.value, 'tree': BUNDLE_TREE, 'jacobi_window': _JACOBI_WINDOW.value,
       'jacobi_init': _JACOBI_INIT.value})
  print('wrote', _OUT.value)


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
