"""The Python examples of README.md and docs/*.md name the API as it is.

Each ```python block (tests/doc_snippets.py) must parse; its imports must
import; every attribute it reads off a library module, class or function
(`verify.StaticTree.from_paths`, `rules.CoolSD(...).for_window`, `sampling.probs`
after `sampling = logits.Sampling(...)`) must exist;
and every call it makes to one must bind: its keywords are parameters of the
callee, and it passes no more positional arguments than the callee takes (a
`...` argument stands for the rest). A block without imports reads the names
of the block before it in the same document (README's sharding line), or the
usual ones (`IMPLICIT`); a block with imports imports every library module it
uses (of those IMPLICIT holds). Negative controls: a misspelt keyword, attribute or import, and a missing
import, in a real block are reported.

The command lines of the ```bash blocks are checked the same way: a
`python -m specdec_jax...` module or a `bench/` script exists, a `--config`
file exists and every `--config.a.b=...` is a field of it, and every other
`--flag` is defined by the program (its module or a library module it
imports; absl's own flags aside).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import pathlib
import re

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from specdec_jax.configs import generate as generate_config
from tests import doc_snippets

# Names the examples use without importing them.
IMPLICIT = dict(jax=jax, jnp=jnp, dataclasses=dataclasses, P=PartitionSpec,
                **{name: importlib.import_module(f'specdec_jax.{name}') for name in (
                    'decode', 'logits', 'rules', 'verify', 'sharding', 'modes', 'mode_base')})
LIBRARY_MODULES = {name for name, value in IMPLICIT.items()
                   if getattr(value, '__name__', '').startswith('specdec_jax.')}
_UNKNOWN = object()


def _imports(tree: ast.Module) -> tuple[dict, list[str]]:
  """The block's imported names {name: object} and the imports that fail."""
  names, problems = {}, []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        try:
          names[alias.asname or alias.name.split('.')[0]] = importlib.import_module(
              alias.name if alias.asname else alias.name.split('.')[0])
        except ImportError as e:
          problems.append(f'import {alias.name}: {e}')
    elif isinstance(node, ast.ImportFrom):
      for alias in node.names:
        try:
          module = importlib.import_module(node.module)
          value = (getattr(module, alias.name) if hasattr(module, alias.name)
                   else importlib.import_module(f'{node.module}.{alias.name}'))
          names[alias.asname or alias.name] = value
        except ImportError as e:
          problems.append(f'from {node.module} import {alias.name}: {e}')
  return names, problems


def _resolve(node, namespace: dict):
  """The object an expression names, _UNKNOWN where it depends on the reader's data."""
  if isinstance(node, ast.Name):
    return namespace.get(node.id, _UNKNOWN)
  if isinstance(node, ast.Attribute):
    owner = _resolve(node.value, namespace)
    if owner is _UNKNOWN:
      return _UNKNOWN
    if not hasattr(owner, node.attr):
      raise AttributeError(f'{ast.unparse(node.value)} has no attribute {node.attr!r}')
    return getattr(owner, node.attr)
  if isinstance(node, ast.Call):
    callee = _resolve(node.func, namespace)
    return callee if inspect.isclass(callee) else _UNKNOWN  # an instance: its class's methods
  return _UNKNOWN


def _call_problem(node: ast.Call, callee) -> str | None:
  try:
    signature = inspect.signature(callee)
  except (TypeError, ValueError):
    return None  # a builtin without a signature
  params = signature.parameters.values()
  if any(p.kind == p.VAR_KEYWORD for p in params):
    keywords_ok = True
  else:
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = [k.arg for k in node.keywords if k.arg is not None and k.arg not in names]
    keywords_ok = not unknown
    if unknown:
      return f'{ast.unparse(node.func)}() has no parameter {", ".join(unknown)}'
  ellipsis = any(isinstance(a, ast.Constant) and a.value is Ellipsis for a in node.args)
  if keywords_ok and not ellipsis and not any(p.kind == p.VAR_POSITIONAL for p in params):
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(node.args) > len(positional):
      return (f'{ast.unparse(node.func)}() takes {len(positional)} positional arguments, '
              f'the example passes {len(node.args)}')
  return None


def problems(source: str, namespace: dict) -> list[str]:
  """What in the example does not match the API (empty: it names the API as it is)."""
  tree = ast.parse(source)
  imported, found = _imports(tree)
  if imported:  # a block with imports is copied whole: it imports the modules it uses
    names = [node for node in ast.walk(tree) if isinstance(node, ast.Name)]
    used = {node.id for node in names if isinstance(node.ctx, ast.Load)}
    bound = {node.id for node in names if isinstance(node.ctx, ast.Store)}
    found += [f'uses {name} without importing it' for name in sorted(used - bound - set(imported))
              if name in LIBRARY_MODULES]
  namespace = dict(namespace, **imported)
  for statement in tree.body:  # `sampling = logits.Sampling(...)`: sampling.probs is checked
    if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
        and isinstance(statement.targets[0], ast.Name)
        and isinstance(statement.value, ast.Call)):
      try:
        made = _resolve(statement.value, namespace)
      except AttributeError:
        continue  # reported below
      if made is not _UNKNOWN:
        namespace[statement.targets[0].id] = made
  for node in ast.walk(tree):
    if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
      namespace.pop(node.name, None)  # defined by the example itself
    if not isinstance(node, (ast.Attribute, ast.Call)):
      continue
    try:
      target = _resolve(node.func if isinstance(node, ast.Call) else node, namespace)
    except AttributeError as e:
      found.append(str(e))
      continue
    if isinstance(node, ast.Call) and target is not _UNKNOWN and callable(target):
      problem = _call_problem(node, target)
      if problem:
        found.append(problem)
  return sorted(set(found))


def _namespaces() -> list[tuple[doc_snippets.Snippet, dict]]:
  """Every example with the names it may use: IMPLICIT, and a block without imports
  also those of the blocks before it in its document."""
  out, previous = [], {}
  for snippet in doc_snippets.snippets():
    imported, _ = _imports(ast.parse(snippet.source))
    namespace = dict(IMPLICIT, **previous.get(snippet.document, {}))
    out.append((snippet, namespace))
    previous[snippet.document] = dict(previous.get(snippet.document, {}), **imported)
  return out

ABSL_FLAGS = ('help', 'helpfull', 'helpshort', 'flagfile', 'verbosity', 'v', 'logtostderr',
              'alsologtostderr')


def _program_sources(command: list[str]) -> list[pathlib.Path] | None:
  """The source files that define a command's flags (None: not this project's
  program, e.g. `-m pytest`); raises LookupError when the program does not exist."""
  if command[0] == '-m':
    if not command[1].startswith('specdec_jax'):
      return None
    spec = importlib.util.find_spec(command[1])
    if spec is None:
      raise LookupError(f'no module {command[1]}')
    sources = [pathlib.Path(spec.origin)]
    run = re.search(r"run_module\('([\w.]+)'", sources[0].read_text())
    if run:  # a documented command name that runs an application module
      sources.append(pathlib.Path(importlib.util.find_spec(run.group(1)).origin))
  else:
    script = doc_snippets.REPO / command[0]
    if not script.is_file():
      raise LookupError(f'no script {command[0]}')
    sources = [script]
  for source in list(sources):  # and the library modules they import
    for node in ast.walk(ast.parse(source.read_text())):
      if isinstance(node, ast.ImportFrom) and (node.module or '').startswith('specdec_jax'):
        for alias in node.names:
          spec = (importlib.util.find_spec(f'{node.module}.{alias.name}')
                  if importlib.util.find_spec(node.module).submodule_search_locations
                  else importlib.util.find_spec(node.module))
          if spec is not None and spec.origin:
            sources.append(pathlib.Path(spec.origin))
  return sources


def _config_of(path: str):
  """The ml_collections config of a configs/ file (as `--config` loads it)."""
  file = doc_snippets.REPO / path
  if not file.is_file():
    raise LookupError(f'no config file {path}')
  return importlib.import_module(f'specdec_jax.configs.{file.stem}').get_config()


def command_problems(command: list[str]) -> list[str]:
  """What in a command line (arguments after `python`) the program does not accept."""
  try:
    sources = _program_sources(command)
  except LookupError as e:
    return [str(e)]
  if sources is None:
    return []
  texts = '\n'.join(source.read_text() for source in sources)
  found, config, args = [], None, command[2:] if command[0] == '-m' else command[1:]
  for i, arg in enumerate(args):
    if not arg.startswith('--'):
      continue
    name, has_value, value = arg[2:].partition('=')
    if name == 'config':
      try:
        config = _config_of(value if has_value else args[i + 1])
      except LookupError as e:
        found.append(str(e))
    elif name.startswith('config.'):
      node = config
      for key in name.split('.')[1:]:
        if node is None:
          break
        if key not in node:
          found.append(f'--{name}: the config has no field {key!r}')
          break
        node = node[key]
    elif name not in ABSL_FLAGS and not re.search(
        rf"DEFINE_\w+\(\s*'{name}'|add_argument\(\s*'--{name}'", texts):
      found.append(f'--{name}: not a flag of {" ".join(command[:2])}')
  return found


def _commands() -> list[tuple[str, list[str]]]:
  return [(snippet.name, command) for snippet in doc_snippets.shell_snippets()
          for command in doc_snippets.python_commands(snippet.source)]


class DocCommandsTest(parameterized.TestCase):

  def test_the_documents_hold_commands(self):
    programs = {' '.join(command[:2]) for _, command in _commands()}
    self.assertContainsSubset({'-m specdec_jax.generate', '-m specdec_jax.sample',
                               '-m specdec_jax.app.train.family'}, programs)

  def test_every_command_line_names_what_its_program_takes(self):
    for name, command in _commands():
      with self.subTest(name, command=' '.join(command[:2])):
        self.assertEqual(command_problems(command), [], command)

  @parameterized.named_parameters(
      ('config_field', '--config.num_images=10000', '--config.num_imagez=10000',
       "the config has no field 'num_imagez'"),
      ('nested_config_field', '--config.method=coolsd', '--config.hparams.deltaa=2',
       "the config has no field 'deltaa'"),
      ('config_file', 'configs/sample_fashion.py', 'configs/sample_fashon.py',
       'no config file configs/sample_fashon.py'),
      ('flag', '--config.method=coolsd', '--coordinator_adress=x', '--coordinator_adress: not a'),
      ('module', 'specdec_jax.sample', 'specdec_jax.sampler', 'no module specdec_jax.sampler'),
  )
  def test_a_broken_command_is_reported(self, old, new, message):
    """Negative controls on docs/sampling.md's first command line."""
    name, command = next((n, c) for n, c in _commands() if '--config.num_images=10000' in c)
    self.assertEqual(command_problems(command), [], name)
    broken = [new if word == old else word for word in command]
    self.assertNotEqual(broken, command)
    found = command_problems(broken)
    self.assertTrue(any(message in problem for problem in found), found)


class DocSnippetsTest(parameterized.TestCase):

  def test_the_documents_hold_examples(self):
    names = [snippet.name for snippet in doc_snippets.snippets()]
    self.assertGreaterEqual(len(names), 6, names)
    self.assertTrue(any(name.startswith('README.md') for name in names), names)

  def test_every_example_names_the_api_as_it_is(self):
    for snippet, namespace in _namespaces():
      with self.subTest(snippet.name):
        self.assertEqual(problems(snippet.source, namespace), [], snippet.source)

  @parameterized.named_parameters(
      ('keyword', 'num_tokens=576', 'num_token=576', 'has no parameter num_token'),
      ('attribute', 'decode.ChainDraft(', 'decode.ChainDrafts(', "no attribute 'ChainDrafts'"),
      ('nested_attribute', 'rules.CoolSD(delta=1.1)', 'rules.CoolSD(delta=1.1).missing',
       "no attribute 'missing'"),
      ('instance_attribute', 'rule=rules.CoolSD(delta=1.1),',
       'rule=rules.CoolSD(delta=1.1),\n    other=logits.Sampling().probz(1),',
       "no attribute 'probz'"),
      ('import', 'from specdec_jax import decode, logits, rules',
       'from specdec_jax import decode, logits, rulez', 'import rulez'),
      ('missing_import', 'from specdec_jax import decode, logits, rules',
       'from specdec_jax import decode, logits', 'uses rules without importing it'),
      ('positional', 'mode=decode.ChainDraft(k=4, drafter=\'eagle\')',
       'mode=decode.ChainDraft(4, \'eagle\', 1, 2, 3, 4, 5, 6, 7, 8, 9)',
       'ChainDraft() takes'),
  )
  def test_a_broken_example_is_reported(self, old, new, message):
    """Negative controls on README's first example (README "Using the API")."""
    snippet, namespace = _namespaces()[0]
    self.assertEqual(snippet.document, 'README.md')
    self.assertIn(old, snippet.source)
    found = problems(snippet.source.replace(old, new, 1), namespace)
    self.assertTrue(any(message in problem for problem in found), found)

  def test_a_method_of_an_assigned_instance_is_checked(self):
    """Negative control on README's lower-level example: `sampling = logits.Sampling(...)`
    then a misspelt `sampling.probz(...)`."""
    snippet, namespace = next((s, n) for s, n in _namespaces() if 'sampling.probs(' in s.source)
    self.assertEqual(problems(snippet.source, namespace), [])
    found = problems(snippet.source.replace('sampling.probs(', 'sampling.probz('), namespace)
    self.assertIn("sampling has no attribute 'probz'", found)


class ReadmeTableTest(absltest.TestCase):
  """configs/generate.py's hyperparameters are "the defaults the README's table was
  measured with": the values the table's method labels name are the config's."""

  def test_the_main_table_names_the_default_hyperparameters(self):
    config = generate_config.get_config()
    readme = (pathlib.Path(__file__).resolve().parents[1] / 'README.md').read_text()
    labels = '\n'.join(line.split('|')[1] for line in readme.splitlines()
                       if line.startswith('| ') and ' ms | ' in line)
    named = (
        (r'EAGLE-1 head, lossless \(k (\d+)\)', ('draft_length',)),
        (r'LANTERN\+\+ \(lambda (\S+), (\d+) neighbours', ('lantern_lam', 'lantern_k')),
        (r'UniformRelaxed \(omega (\S+)\)', ('uniform_omega',)),
        (r'COOL-SD \(delta (\S+), floored\)', ('coolsd_delta',)),
        (r'EAGLE-2 tree, sampled, lossless \((\d+) tokens, depth (\d+), top-k (\d+)\)',
         ('eagle2_total_tokens', 'eagle2_depth', 'eagle2_top_k')),
        (r'SJD \(Jacobi, window (\d+)\)', ('jacobi_window',)),
        (r'SJD-PAC \(window \d+, K (\d+), D (\d+)\)', ('pac_branches', 'pac_depth')),
        (r'CSD \(lambda (\S+) nats', ('csd_lam',)))
    for pattern, fields in named:
      found = re.search(pattern, labels)
      self.assertIsNotNone(found, pattern)
      for field, text in zip(fields, found.groups()):
        self.assertEqual(float(text), config[field], field)
    self.assertIn('SCD (window 4, maximal coupling)', labels)
    self.assertEqual((config.scd_coupling, config.eagle2_drafts), ('maximal', 'sampled'))


if __name__ == '__main__':
  absltest.main()
