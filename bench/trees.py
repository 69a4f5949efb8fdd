"""Importing this repository's package from another checkout of it (for before/after runs).

An editable install maps `specdec_jax`, `specdec_jax.models`, `.converters`
and `.configs` to the installed checkout's folders; `TreeFinder` maps them to
another checkout's instead, ahead of the installed copy. Used by
`bench/compare_trees.py` (several checkouts in one process) and
`bench/with_tree.py` (run any bench script on another checkout's code).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import subprocess
import sys

# The package's folders in a checkout (pyproject.toml [tool.setuptools.package-dir]).
PACKAGE_DIRS = {'specdec_jax': 'specdec_jax', 'specdec_jax.models': 'models',
                'specdec_jax.converters': 'converters', 'specdec_jax.configs': 'configs'}


class TreeFinder(importlib.abc.MetaPathFinder):
  """Finds the package's top folders in one checkout, ahead of the installed copy."""

  def __init__(self, tree: str):
    self.tree = os.path.abspath(tree)

  def find_spec(self, fullname, path, target=None):
    del path, target
    if fullname not in PACKAGE_DIRS:
      return None  # submodules: found on their parent package's __path__
    folder = os.path.join(self.tree, PACKAGE_DIRS[fullname])
    return importlib.util.spec_from_file_location(
        fullname, os.path.join(folder, '__init__.py'), submodule_search_locations=[folder])


def forget_package() -> None:
  """Drops every imported specdec_jax module (the next import reads the files again)."""
  for name in [m for m in sys.modules if m == 'specdec_jax' or m.startswith('specdec_jax.')]:
    del sys.modules[name]


def import_tree(tree: str, names) -> dict:
  """{name: module} of `specdec_jax.<name>` for each name, imported from `tree` (any
  earlier import forgotten); raises if a module came from elsewhere."""
  tree = os.path.abspath(tree)
  forget_package()
  finder = TreeFinder(tree)
  sys.meta_path.insert(0, finder)
  try:
    modules = {name: importlib.import_module(f'specdec_jax.{name}') for name in names}
    outside = [m.__file__ for name, m in sys.modules.items()
               if name.startswith('specdec_jax') and getattr(m, '__file__', None)
               and not os.path.abspath(m.__file__).startswith(tree + os.sep)]
  finally:
    sys.meta_path.remove(finder)
  if outside:
    raise RuntimeError(f'modules imported from outside {tree}: {outside[:3]}')
  return modules


def commit_of(tree: str) -> dict:
  """{'commit': HEAD of the checkout, 'local_changes': whether it has uncommitted ones}."""
  run = lambda *args: subprocess.run(['git', '-C', tree, *args], capture_output=True,
                                     text=True, check=False).stdout.strip()
  return dict(commit=run('rev-parse', 'HEAD'), local_changes=bool(run('status', '--porcelain')))
