"""Batch-1 speed of the Jacobi methods (SJD, GSD, CSD) against the window W (not a test).

  python bench/jacobi_window.py --out bench/results/jacobi_window.json

On the bundled Fashion-MNIST family, as the main command runs them (its
`build_methods` with configs/generate.py's hyperparameters and XLA options),
for each window in --windows: one image with CFG per class of --classes,
vanilla and each method timed in interleaved rounds (every round runs every
(window, method, class) once, the order rotated by one each round; each
keeps its best). speedup = vanilla / method from the same rounds. The main
command's `jacobi_window` is chosen from this.
--gumbel_scd adds 'scd_gumbel' (SCD with scd_coupling 'gumbel') beside 'scd';
--inits times each fresh-draft init (configs/generate.py's jacobi_init) in the
same rounds; --pac_trees adds SJD-PAC with other proactive trees ('sjd_pac_KxD');
--pac_walk_node_by_node adds 'sjd_pac_node_by_node', SJD-PAC whose verification walks
its main chain past the tree node by node (the code before e93b9da's tail test:
the same tokens, other kernels).
Prints a table and writes JSON.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # pylint: disable=g-import-not-at-top

from specdec_jax import jacobi_drafts  # pylint: disable=g-import-not-at-top
from specdec_jax import mode_pac  # pylint: disable=g-import-not-at-top
from specdec_jax import verify  # pylint: disable=g-import-not-at-top
from specdec_jax.app import generate as generate_app  # pylint: disable=g-import-not-at-top
from specdec_jax.app import methods as methods_lib  # pylint: disable=g-import-not-at-top
import resume  # pylint: disable=g-import-not-at-top  (bench/resume.py)
import timing  # pylint: disable=g-import-not-at-top  (bench/timing.py)

_OUT = flags.DEFINE_string('out', 'bench/results/jacobi_window.json', 'JSON results.')
_WINDOWS = flags.DEFINE_list('windows', ['4', '6', '8', '12', '16'], 'Jacobi windows W.')
_METHODS = flags.DEFINE_list('methods', ['sjd', 'gsd', 'csd'], 'Main-command Jacobi methods.')
_CLASSES = flags.DEFINE_list('classes', ['0', '3', '6', '9'], 'One image per class.')
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Timed rounds (best per call is kept).',
                               lower_bound=1)
_INITS = flags.DEFINE_list('inits', ['random'],
                          f'Fresh-draft inits of {jacobi_drafts.INITS}, each timed (default '
                          "'random', as the runs committed before jacobi_init became 'spatial').")
_GUMBEL_SCD = flags.DEFINE_bool('gumbel_scd', False,
                                "Add 'scd_gumbel' (SCD's Gumbel coupling) after 'scd'.")
_PAC_TREES = flags.DEFINE_list(
    'pac_trees', [], "More SJD-PAC proactive trees 'KxD' (K candidates at each of the first D "
    "drafts), timed after 'sjd_pac' as 'sjd_pac_KxD'.")


_NODE_BY_NODE = flags.DEFINE_bool(
    'pac_walk_node_by_node', False, "Add 'sjd_pac_node_by_node' after 'sjd_pac': its tree "
    "has no chain tail (verify._walk_tree then tests every level in turn).")


class _NodeByNodeTree(verify.StaticTree):
  """A static tree whose chain tail verification walks node by node."""

  @property
  def chain_tail(self):
    return np.zeros((0,), np.int32)


@dataclasses.dataclass(frozen=True)
class _NodeByNodePAC(mode_pac.JacobiPAC):

  @property
  def tree(self):
    return _NodeByNodeTree(super().tree.paths)


def with_node_by_node_pac(methods: list) -> list:
  """methods with 'sjd_pac_node_by_node' after 'sjd_pac' (the same mode otherwise)."""
  out = []
  for method in methods:
    out.append(method)
    if method.name == 'sjd_pac':
      mode = _NodeByNodePAC(**{f.name: getattr(method.mode, f.name)
                               for f in dataclasses.fields(method.mode)})
      out.append(dataclasses.replace(method, name='sjd_pac_node_by_node', mode=mode))
  return out


def with_gumbel_scd(methods: list, config, family) -> list:
  """methods with 'scd_gumbel' after 'scd' (the same config, scd_coupling 'gumbel')."""
  gumbel = dataclasses.replace(
      methods_lib.build_variant(config, family, 'scd', scd_coupling='gumbel'), name='scd_gumbel')
  out = []
  for method in methods:
    out += [method, gumbel] if method.name == 'scd' else [method]
  return out


def main(argv):
  del argv
  generate_app.use_single_thread_xla()
  from specdec_jax import logits  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import family as family_lib  # pylint: disable=g-import-not-at-top
  from specdec_jax.configs import generate as generate_config  # pylint: disable=g-import-not-at-top

  family = family_lib.load()
  classes = [int(c) for c in _CLASSES.value]
  calls = {}
  for init, window in [(i, int(w)) for i in _INITS.value for w in _WINDOWS.value]:
    config = generate_config.get_config()
    config.jacobi_window, config.jacobi_init = window, init
    config.methods = ('vanilla', *_METHODS.value)
    sampling = logits.Sampling(**config.sampling.to_dict())
    options = generate_app.compiler_options(config)
    methods = methods_lib.build_methods(config, family)
    if _GUMBEL_SCD.value:
      methods = with_gumbel_scd(methods, config, family)
    methods += methods_lib.pac_tree_variants(config, family, _PAC_TREES.value)
    if _NODE_BY_NODE.value:
      methods = with_node_by_node_pac(methods)
    for method in methods:
      if method.name == 'vanilla' and calls:
        continue  # one vanilla reference for every window
      for label in classes:
        setting = ('', 0) if method.name == 'vanilla' else (init, window)
        timed_call = generate_app._timed_call  # pylint: disable=protected-access
        calls[(*setting, method.name, label)] = timed_call(method, family, label, sampling,
                                                           config.seed, options)
  tokens_per_forward = {key: call()[0].metrics.summary()['tokens_per_target_forward']
                        for key, call in calls.items()}  # the first call compiles
  best = dict.fromkeys(calls, np.inf)
  for index in range(_ROUNDS.value):
    for key in timing.rotated(calls, index):
      best[key] = min(best[key], calls[key]()[1])
    print(f'round {index + 1}/{_ROUNDS.value}', flush=True)
  def mean(table, setting, name):
    return float(np.mean([table[(*setting, name, c)] for c in classes]))
  vanilla_s = mean(best, ('', 0), 'vanilla')
  rows = []
  print('| init | W | method | tokens / forward | ms per image | speedup |')
  print('|---|---|---|---|---|---|')
  names = [n for n in dict.fromkeys(key[2] for key in calls) if n != 'vanilla']
  for init, window in [(i, int(w)) for i in _INITS.value for w in _WINDOWS.value]:
    for name in names:
      seconds = mean(best, (init, window), name)
      row = dict(init=init, window=window, method=name, latency_s=seconds,
                 speedup=vanilla_s / seconds,
                 tokens_per_forward=mean(tokens_per_forward, (init, window), name))
      rows.append(row)
      print(f"| {init} | {window} | {name} | {row['tokens_per_forward']:.2f} | "
            f"{1e3 * seconds:.1f} | {row['speedup']:.2f}x |", flush=True)
  resume.write_json(
      _OUT.value,
      {'classes': classes, 'rounds': _ROUNDS.value, 'vanilla_s': vanilla_s,
       'rows': rows})
  print('wrote', _OUT.value)


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
