"""The package's layers import only the layers below them, read from the source with `ast`.

  core        specdec_jax/*.py (rules, verify, decode, modes, kv_cache, ...)
  models      models/*.py       -> specdec_jax.models      imports core
  converters  converters/*.py   -> specdec_jax.converters  imports models, core
  app         specdec_jax/app/  -> specdec_jax.app         imports every layer
  configs     configs/*.py      -> specdec_jax.configs     imports other configs only

No module in specdec_jax/ or models/ re-exports another. The one exception to
the layering is the pair of documented command names at the top of the package
(ENTRY_POINTS): `python -m specdec_jax.generate` and `python -m
specdec_jax.sample` run their application module and import nothing from it.
"""

import ast
import os
import pathlib
import subprocess
import sys

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
# Core module -> the application module it runs as the program (and nothing else).
ENTRY_POINTS = {'specdec_jax.generate': 'specdec_jax.app.generate',
                'specdec_jax.sample': 'specdec_jax.app.sample'}
# Repository folders where no module may be a re-export of another (converters/ is
# left out: converters/common.py gathers its split parts for its callers).
NO_REEXPORT_FOLDERS = ('specdec_jax', 'models')
MAX_LINES = 400


def layer_of(module: str) -> str | None:
  """The layer of a dotted module name (None outside the package)."""
  parts = module.split('.')
  if parts[0] != 'specdec_jax':
    return None
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


def _string_call(node: ast.AST, names: tuple[str, ...]) -> str | None:
  """The string first argument of a call `x.name('...')` for a name in `names`."""
  if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
      and node.func.attr in names and node.args and isinstance(node.args[0], ast.Constant)
      and isinstance(node.args[0].value, str)):
    return node.args[0].value
  return None


def imported_modules(tree: ast.Module, module: str, is_package: bool,
                     known: set[str]) -> list[tuple[int, str]]:
  """(line, dotted module) of every import in the tree, nested ones included.

  `from a import b` counts as importing `a.b` when that is a module, else `a`;
  relative imports are resolved against `module`; `importlib.import_module('m')`
  and `runpy.run_module('m')` count as importing `m`.
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
    elif _string_call(node, ('import_module', 'run_module')) is not None:
      found.append((node.lineno, _string_call(node, ('import_module', 'run_module'))))
  return found


def violations(source: str, module: str, known: set[str], is_package: bool = False,
               entry_points: dict[str, str] | None = None) -> list[str]:
  """Why `source`, the text of `module`, breaks the layering (empty when it does not).

  An entry point (a key of `entry_points`) may run its own target, nothing else above it.
  """
  entry_points = ENTRY_POINTS if entry_points is None else entry_points
  tree = ast.parse(source)
  own = layer_of(module)
  problems = []
  for line, imported in imported_modules(tree, module, is_package, known):
    layer = layer_of(imported)
    if layer is None or layer in ALLOWED[own] or entry_points.get(module) == imported:
      continue
    problems.append(f'{module}:{line} ({own}) imports {imported} ({layer})')
  return problems


def reexports(source: str) -> list[str]:
  """Why `source` is a re-export module (an old path kept for a moved one); empty if not.

  Flags an alias (`sys.modules[...] = ...`, a `_SHIM_FOR` marker) and a module
  of nothing but imports. (Modules split in parts, such as `rules` or
  `converters.common`, still import their parts' public names for their
  callers; that is their API, not a leftover path.)
  """
  tree = ast.parse(source)
  body = [n for n in tree.body
          if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
  problems = []
  for node in ast.walk(tree):
    for target in getattr(node, 'targets', []):
      if isinstance(target, ast.Name) and target.id == '_SHIM_FOR':
        problems.append(f'line {node.lineno}: _SHIM_FOR')
      if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute)
          and target.value.attr == 'modules'):
        problems.append(f'line {node.lineno}: assigns into sys.modules')
  if body and all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in body):
    problems.append('nothing but imports')
  return problems


def _python(*args):
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=600)


class LayersTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.files = module_files()
    self.known = set(self.files)

  def test_every_layer_imports_only_layers_below_it(self):
    problems = []
    for module, path in self.files.items():
      problems += violations(path.read_text(), module, self.known,
                             is_package=path.name == '__init__.py')
    self.assertEmpty(problems, '\n'.join(problems))

  def test_all_layers_are_scanned(self):
    counts = {}
    for module in self.files:
      counts[layer_of(module)] = counts.get(layer_of(module), 0) + 1
    self.assertEqual(set(counts), set(ALLOWED))
    for module in ('specdec_jax.decode', 'specdec_jax.testing', 'specdec_jax.models.llamagen',
                   'specdec_jax.models.tiny', 'specdec_jax.converters.vq',
                   'specdec_jax.app.generate', 'specdec_jax.app.toy',
                   'specdec_jax.app.train.family', 'specdec_jax.configs.family'):
      self.assertIn(module, self.files)

  def test_no_module_reexports_another(self):
    problems = []
    for module, path in self.files.items():
      if path.relative_to(REPO).parts[0] in NO_REEXPORT_FOLDERS:
        problems += [f'{module}: {p}' for p in reexports(path.read_text())]
    self.assertEmpty(problems, '\n'.join(problems))

  def test_old_paths_are_gone(self):
    """The shims of the application's old paths and the core's toy models left the core."""
    old = [f'specdec_jax.{name}' for name in ('demo', 'evaluation', 'family', 'fashion_mnist',
                                              'images', 'training', 'toy', '_moved', 'train')]
    old += ['specdec_jax.models.toy']
    self.assertEmpty([m for m in self.files if m in old or m.startswith('specdec_jax.train.')])
    core = [m for m in self.files if layer_of(m) == 'core' and m != 'specdec_jax']
    self.assertContainsSubset(ENTRY_POINTS, core)

  def test_entry_points_only_run_their_application_module(self):
    for module, target in ENTRY_POINTS.items():
      tree = ast.parse(self.files[module].read_text())
      self.assertIn(target, self.files)
      statements = [n for n in tree.body if not isinstance(n, ast.Expr)]
      self.assertLen(statements, 2, module)  # `import runpy` and `if __name__ == '__main__':`
      self.assertEqual(ast.unparse(statements[0]), 'import runpy')
      self.assertEqual(ast.unparse(statements[1]),
                       f"if __name__ == '__main__':\n"
                       f"    runpy.run_module({target!r}, run_name='__main__', alter_sys=True)")

  def test_no_module_over_400_lines(self):
    long = {m: n for m, p in self.files.items()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    self.assertEmpty(long)

  def test_checker_reports_upward_imports_and_reexports(self):
    """Negative control: synthetic modules with upward imports or re-exports are reported."""
    known = self.known | {'specdec_jax.models.llamagen', 'specdec_jax.app.family'}
    cases = {
        ('specdec_jax.decode', 'from specdec_jax.models import llamagen\n'):
            'specdec_jax.models.llamagen (models)',
        ('specdec_jax.rules', 'def f():\n  from specdec_jax import converters\n'):
            'specdec_jax.converters (converters)',
        ('specdec_jax.verify', "import runpy\nrunpy.run_module('specdec_jax.app.family')\n"):
            'specdec_jax.app.family (app)',
        ('specdec_jax.generate', "import runpy\nrunpy.run_module('specdec_jax.app.family')\n"):
            'specdec_jax.app.family (app)',  # an entry point runs its own target only
        ('specdec_jax.models.eagle', 'import specdec_jax.app.family\n'):
            'specdec_jax.app.family (app)',
        ('specdec_jax.models.eagle', 'from ..converters import common\n'):
            'specdec_jax.converters.common (converters)',
        ('specdec_jax.converters.vq', 'from specdec_jax.app import family\n'):
            'specdec_jax.app.family (app)',
        ('specdec_jax.configs.family', 'from specdec_jax.models import llamagen\n'):
            'specdec_jax.models.llamagen (models)',
    }
    for (module, source), expected in cases.items():
      problems = violations(source, module, known)
      self.assertLen(problems, 1, (module, source))
      self.assertIn(module, problems[0])
      self.assertIn(expected, problems[0])
    # Imports downwards, and an entry point running its target, are not reported.
    self.assertEmpty(violations('from specdec_jax import kv_cache\n', 'specdec_jax.models.x',
                                known))
    self.assertEmpty(violations("import runpy\nrunpy.run_module('specdec_jax.app.generate')\n",
                                'specdec_jax.generate', known))
    shims = {
        '"""Moved."""\nfrom specdec_jax import _moved\n_SHIM_FOR = "specdec_jax.app.demo"\n':
            '_SHIM_FOR',
        'import sys\nfrom specdec_jax.app import demo\nsys.modules[__name__] = demo\n':
            'sys.modules',
        '"""Old path."""\nfrom specdec_jax.app.toy import MarkovToy\n': 'nothing but imports',
    }
    for source, expected in shims.items():
      problems = reexports(source)
      self.assertTrue(any(expected in p for p in problems), (source, problems))
    self.assertEmpty(reexports('"""Doc."""\n__version__ = "1"\n'))
    self.assertEmpty(reexports('from specdec_jax import kv_cache as kv\nx = kv.init_cache\n'))


class CommandsTest(absltest.TestCase):
  """The documented commands run, and importing the core loads no application module."""

  def test_documented_commands_print_their_usage(self):
    for command, flag in (('specdec_jax.generate', '--out'), ('specdec_jax.sample', '--config'),
                          ('specdec_jax.app.train.family', '--workdir')):
      out = _python('-m', command, '--helpfull')  # absl prints usage, exits with 1
      self.assertIn(out.returncode, (0, 1), out.stderr)
      self.assertNotIn('Traceback', out.stderr, command)
      self.assertIn(f'python -m {command}', out.stdout, command)  # the module's usage text
      self.assertIn(f'{flag}:', out.stdout, command)  # its flags, defined once

  def test_core_imports_no_application_module(self):
    core = sorted(m for m in module_files() if layer_of(m) == 'core')
    out = _python('-c', f'import sys; import {", ".join(core)}; '
                        "print(sorted(m for m in sys.modules if m.startswith('specdec_jax.')"
                        " and m.split('.')[1] in ('app', 'models', 'converters', 'configs')))")
    self.assertEqual(out.returncode, 0, out.stderr)
    self.assertEqual(out.stdout.strip(), '[]')


if __name__ == '__main__':
  absltest.main()
