"""The package's layers import only the layers below them, read from the source with `ast`.

  core        specdec_jax/*.py (rules, verify, decode, modes, kv_cache, ...)
  models      models/*.py       -> specdec_jax.models      imports core
  converters  converters/*.py   -> specdec_jax.converters  imports models, core
  app         specdec_jax/app/  -> specdec_jax.app         imports every layer
  configs     configs/*.py      -> specdec_jax.configs     imports other configs only

Shims kept at the old paths of moved modules (a module-level `_SHIM_FOR` naming
the new module) are the one exception, and nothing in the repository may import
them: they are for code outside it.
"""

import ast
import os
import pathlib
import subprocess
import sys
import textwrap

from absl.testing import absltest

REPO = pathlib.Path(__file__).resolve().parents[1]
# Repository folder -> installed package name (pyproject's package-dir).
ROOTS = {'specdec_jax': 'specdec_jax', 'models': 'specdec_jax.models',
         'converters': 'specdec_jax.converters', 'configs': 'specdec_jax.configs'}
ALLOWED = {
    'core': {'core'},
    'models': {'core', 'models'},
    'converters': {'core', 'models', 'converters'},
    'app': {'core', 'models', 'converters', 'app', 'configs'},
    'configs': {'configs'},
}


RANK = {'core': 0, 'models': 1, 'converters': 2, 'app': 3, 'configs': 3}


def layer_of(module: str, shims: dict[str, tuple[str, ...]] | None = None) -> str | None:
  """The layer of a dotted module name (a shim's: the highest of its targets)."""
  parts = module.split('.')
  if parts[0] != 'specdec_jax':
    return None
  for shim, targets in (shims or {}).items():
    if module == shim or module.startswith(shim + '.'):
      return max((layer_of(t) for t in targets), key=RANK.get)
  if len(parts) > 1 and parts[1] in ('models', 'converters', 'configs', 'app'):
    return parts[1]
  return 'core'


def module_files() -> dict[str, pathlib.Path]:
  """Dotted module name -> source file, for every module of the package."""
  modules = {}
  for folder, package in ROOTS.items():
    for path in sorted((REPO / folder).rglob('*.py')):
      relative = path.relative_to(REPO / folder)
      if 'assets' in relative.parts or '__pycache__' in relative.parts:
        continue
      parts = list(relative.with_suffix('').parts)
      if parts[-1] == '__init__':
        parts.pop()
      modules['.'.join([package] + parts)] = path
  return modules


def shim_target(tree: ast.Module) -> tuple[str, ...] | None:
  """The module(s) a shim stands for (its module-level `_SHIM_FOR`), or None."""
  for node in tree.body:
    if (isinstance(node, ast.Assign) and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name) and node.targets[0].id == '_SHIM_FOR'):
      value = ast.literal_eval(node.value)
      return (value,) if isinstance(value, str) else tuple(value)
  return None


def imported_modules(tree: ast.Module, module: str, is_package: bool,
                     known: set[str]) -> list[tuple[int, str]]:
  """(line, dotted module) of every import in the tree, nested ones included.

  `from a import b` counts as importing `a.b` when that is a module, else `a`;
  relative imports are resolved against `module`.
  """
  package = module if is_package else module.rpartition('.')[0]
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found.extend((node.lineno, alias.name) for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        anchor = package.split('.')[:len(package.split('.')) - node.level + 1]
        base = '.'.join(anchor + ([base] if base else []))
      for alias in node.names:
        full = f'{base}.{alias.name}'
        found.append((node.lineno, full if full in known else base))
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr == 'import_module' and node.args
          and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
      found.append((node.lineno, node.args[0].value))
  return found


def is_shim_path(module: str, shims) -> bool:
  return any(module == shim or module.startswith(shim + '.') for shim in shims)


def violations(source: str, module: str, known: set[str], shims: dict[str, tuple[str, ...]],
               is_package: bool = False) -> list[str]:
  """Why `source`, the text of `module`, breaks the layering (empty when it does not)."""
  tree = ast.parse(source)
  if shim_target(tree) is not None:
    return []
  own = layer_of(module)
  problems = []
  for line, imported in imported_modules(tree, module, is_package, known):
    layer = layer_of(imported, shims)
    if layer is None:
      continue
    if layer not in ALLOWED[own]:
      problems.append(f'{module}:{line} ({own}) imports {imported} ({layer})')
    elif is_shim_path(imported, shims):
      problems.append(f'{module}:{line} imports the shim {imported}; import its new path')
  return problems


class LayersTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.files = module_files()
    self.trees = {m: ast.parse(p.read_text(), str(p)) for m, p in self.files.items()}
    self.shims = {m: shim_target(tree) for m, tree in self.trees.items()
                  if shim_target(tree) is not None}
    self.known = set(self.files)

  def test_every_layer_imports_only_layers_below_it(self):
    problems = []
    for module, path in self.files.items():
      problems += violations(path.read_text(), module, self.known, self.shims,
                             is_package=path.name == '__init__.py')
    self.assertEmpty(problems, '\n'.join(problems))

  def test_all_layers_are_scanned(self):
    counts = {}
    for module in self.files:
      if module not in self.shims:
        counts[layer_of(module)] = counts.get(layer_of(module), 0) + 1
    self.assertEqual(set(counts), set(ALLOWED))
    for module in ('specdec_jax.decode', 'specdec_jax.toy', 'specdec_jax.models.llamagen',
                   'specdec_jax.converters.vq', 'specdec_jax.app.generate',
                   'specdec_jax.app.train.family', 'specdec_jax.configs.family'):
      self.assertIn(module, self.files)
      self.assertNotIn(module, self.shims)

  def test_modules_outside_the_layer_folders_are_shims_of_existing_modules(self):
    for module, tree in self.trees.items():
      if module.startswith('specdec_jax.train'):
        self.assertIn(module, self.shims, f'{module} is not in a layer folder: move it to app/')
    for module, targets in self.shims.items():
      for target in targets:
        self.assertIn(target, self.files, f'shim {module} names a missing module {target}')

  def test_tests_and_benchmarks_do_not_import_shims(self):
    problems = []
    for path in sorted([*(REPO / 'tests').glob('*.py'), *(REPO / 'bench').glob('*.py')]):
      tree = ast.parse(path.read_text(), str(path))
      for line, imported in imported_modules(tree, 'tests.x', False, self.known):
        if is_shim_path(imported, self.shims):
          problems.append(f'{path.relative_to(REPO)}:{line} imports the shim {imported}')
    self.assertEmpty(problems, '\n'.join(problems))

  def test_checker_reports_upward_imports(self):
    """Negative control: synthetic modules with upward imports are reported."""
    known = self.known | {'specdec_jax.models.llamagen', 'specdec_jax.app.family'}
    shims = {'specdec_jax.family': ('specdec_jax.app.family',)}
    cases = {
        ('specdec_jax.decode', 'from specdec_jax.models import llamagen\n'):
            'specdec_jax.models.llamagen (models)',
        ('specdec_jax.rules', 'def f():\n  from specdec_jax import converters\n'):
            'specdec_jax.converters (converters)',
        ('specdec_jax.verify', 'from specdec_jax import family\n'): 'specdec_jax.family (app)',
        ('specdec_jax.models.eagle', 'import specdec_jax.app.family\n'):
            'specdec_jax.app.family (app)',
        ('specdec_jax.models.eagle', 'from ..converters import common\n'):
            'specdec_jax.converters.common (converters)',
        ('specdec_jax.converters.vq', 'from specdec_jax.app import family\n'):
            'specdec_jax.app.family (app)',
        ('specdec_jax.configs.family', 'from specdec_jax.models import llamagen\n'):
            'specdec_jax.models.llamagen (models)',
        ('specdec_jax.app.demo', 'from specdec_jax import family\n'): 'the shim specdec_jax.family',
    }
    for (module, source), expected in cases.items():
      problems = violations(source, module, known, shims)
      self.assertLen(problems, 1, (module, source))
      self.assertIn(module, problems[0])
      self.assertIn(expected, problems[0])
    # Imports downwards, and shims, are not reported.
    self.assertEmpty(violations('from specdec_jax import kv_cache\n', 'specdec_jax.models.x',
                                known, shims))
    self.assertEmpty(violations("_SHIM_FOR = 'specdec_jax.app.family'\n"
                                'from specdec_jax.app import family\n', 'specdec_jax.family',
                                known, shims))


class ShimsTest(absltest.TestCase):
  """The old paths still import (warning, naming the new path) and still run."""

  def _python(self, *args):
    env = dict(os.environ, JAX_PLATFORMS='cpu')
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)

  def test_old_import_paths_alias_the_new_modules_and_warn(self):
    code = textwrap.dedent("""
        import importlib, sys, warnings
        pairs = [('specdec_jax.' + n, 'specdec_jax.app.' + n) for n in (
            'demo', 'evaluation', 'family', 'fashion_mnist', 'generate', 'images', 'training')]
        pairs += [('specdec_jax.train.' + n, 'specdec_jax.app.train.' + n) for n in (
            'classifier', 'drafter', 'family', 'gpt', 'kmeans_tokenizer', 'vq')]
        for old, new in pairs:
          with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            module = importlib.import_module(old)
          assert module is importlib.import_module(new) is sys.modules[old], old
          assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message)
                     for w in caught), (old, [str(w.message) for w in caught])
        with warnings.catch_warnings(record=True) as caught:
          warnings.simplefilter('always')
          from specdec_jax.models import toy
        from specdec_jax import toy as core_toy
        from specdec_jax.models import tiny
        assert toy.MarkovToy is core_toy.MarkovToy and toy.TinyTransformer is tiny.TinyTransformer
        assert any('specdec_jax.toy' in str(w.message) for w in caught)
        import specdec_jax.family, specdec_jax.app.family as family
        assert specdec_jax.family is family
        print(family.BUNDLE_DIR)
        """)
    out = self._python('-c', code)
    self.assertEqual(out.returncode, 0, out.stderr)
    self.assertEqual(out.stdout.strip(),
                     str(REPO / 'specdec_jax' / 'assets' / 'fashion_mnist'))

  def test_old_command_paths_run_the_new_entry_points(self):
    for command, flag in (('specdec_jax.generate', '--out'),
                          ('specdec_jax.train.gpt', '--workdir')):
      out = self._python('-m', command, '--helpfull')  # absl prints usage, exits with 1
      self.assertIn(out.returncode, (0, 1), out.stderr)
      self.assertNotIn('Traceback', out.stderr, command)
      self.assertIn(f'python -m {command}', out.stdout, command)  # the module's usage text
      self.assertIn(f'{flag}:', out.stdout, command)  # its flags, defined once

if __name__ == '__main__':
  absltest.main()
