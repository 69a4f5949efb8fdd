"""Batch-1 decode times of two checkouts of this repository, in one process (not a test).

  git worktree add /tmp/before <commit>
  python bench/compare_trees.py --trees /tmp/before,. --out bench/results/compare_trees.json

Speed changes of a few percent are below this machine's run-to-run noise
(10-30% between processes). This imports the `specdec_jax` package of each
tree in turn into one process (each with its own bundled family), then
times their decodes interleaved (`timing.best_ms_interleaved`): every round
runs each (tree, method, class) once, in an order rotated by one each
round, and each keeps its best. Methods (--methods, vanilla first;
default vanilla, UniformRelaxed and COOL-SD) as each tree's main command
defines them (its `build_methods`, `decode_kwargs`, XLA options and
configs/generate.py); one image with CFG per class of
the first tree's `latency_classes`, as the main command's latency pass,
with the same key per class in every tree. speedup = the
tree's vanilla / the method, both from the same rounds. Prints a table and
writes JSON (with each tree's git commit and whether it had local changes).
"""

from __future__ import annotations

import functools
import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import resume  # pylint: disable=g-import-not-at-top  (bench/resume.py)
import timing  # pylint: disable=g-import-not-at-top  (bench/timing.py)
import trees as trees_lib  # pylint: disable=g-import-not-at-top  (bench/trees.py)

_TREES = flags.DEFINE_list('trees', None, 'Two or more repository checkouts.', required=True)
_OUT = flags.DEFINE_string('out', 'bench/results/compare_trees.json', 'JSON results.')
_ROUNDS = flags.DEFINE_integer('rounds', 15, 'Timed rounds (best per call is kept).')
_METHODS = flags.DEFINE_list('methods', ['vanilla', 'uniform', 'coolsd'],
                             'Main-command method names (vanilla first).')
_LABELS = flags.DEFINE_list('labels', None, 'A description of each tree (stored in the JSON).')


def _decode(decode, family, cond, key, kwargs):
  """One batch-1 decode with one tree's modules and family (kwargs: `decode_kwargs`)."""
  return decode.generate(family.target, family.target_params, cond, key=key, **kwargs)


def main(argv):
  del argv
  from specdec_jax.app import generate as generate_app  # pylint: disable=g-import-not-at-top
  generate_app.use_single_thread_xla()  # before JAX starts; each tree is imported afresh below
  from specdec_jax.app import compile_cache  # pylint: disable=g-import-not-at-top
  compile_cache.enable()
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  trees = [os.path.abspath(t) for t in _TREES.value]
  if _LABELS.value and len(_LABELS.value) != len(trees):
    raise ValueError(f'--labels: {len(_LABELS.value)} labels for {len(trees)} trees.')
  calls, classes = {}, None
  for tree in trees:
    m = trees_lib.import_tree(tree, ('decode', 'logits', 'app.family', 'app.generate',
                                     'app.methods', 'configs.generate'))
    config = m['configs.generate'].get_config()
    if classes is None:  # the same images for every tree: the first tree's classes
      classes = tuple(int(c) for c in config.latency_classes)
    family = m['app.family'].load()
    sampling = m['logits'].Sampling(**config.sampling.to_dict())
    # The main command's own method definitions, in each tree's version.
    config.methods = tuple(_METHODS.value)
    methods = m['app.methods'].build_methods(config, family)
    # ... and its XLA options, in trees that have them.
    options = getattr(m['app.generate'], 'compiler_options', lambda _: None)(config)
    extra = () if options is None else (options,)
    for label in classes:
      cond = family.target.cfg_cond(family.target_params, jax.numpy.asarray([label]))
      for method in methods:
        kwargs = m['app.generate'].decode_kwargs(method, family, [label], sampling, *extra)
        calls[(tree, method.name, label)] = functools.partial(
            _decode, m['decode'], family, cond, jax.random.key(label), kwargs)
  tokens_per_forward = {}
  for key, call in calls.items():  # compile
    tokens_per_forward[key] = call().metrics.summary()['tokens_per_target_forward']
  best = {key: ms / 1e3 for key, ms in timing.best_ms_interleaved(
      {key: (lambda call=call: call().tokens) for key, call in calls.items()},
      _ROUNDS.value, progress=True).items()}

  mean = lambda tree, name, table: float(np.mean([table[(tree, name, c)] for c in classes]))
  rows = []
  print('| tree | method | tokens / forward | ms per image | speedup |')
  print('|---|---|---|---|---|')
  for tree in trees:
    vanilla_s = mean(tree, 'vanilla', best)
    for name in _METHODS.value:
      seconds = mean(tree, name, best)
      label = _LABELS.value[trees.index(tree)] if _LABELS.value else ''
      row = dict(tree=tree, label=label, **trees_lib.commit_of(tree), method=name,
                 latency_s=seconds,
                 speedup=vanilla_s / seconds,
                 tokens_per_forward=mean(tree, name, tokens_per_forward))
      rows.append(row)
      print(f"| {tree} | {name} | {row['tokens_per_forward']:.2f} | {1e3 * seconds:.1f} "
            f"| {row['speedup']:.2f}x |")
  resume.write_json(_OUT.value, {'classes': list(classes), 'rounds': _ROUNDS.value, 'rows': rows})
  print('wrote', _OUT.value)


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
