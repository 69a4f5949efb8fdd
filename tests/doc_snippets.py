"""The Python examples in README.md and docs/*.md, for the tests that keep them true.

A fenced ```python block is an example of the public API; most call it on a
checkpoint or arrays the reader has (`...` stands for arguments), so they are
checked statically (tests/test_doc_snippets.py), and the one that defines a
whole class (docs/engine.md's plugged-in mode) is executed by the decode tests.
A ```bash block holds command lines (`shell_snippets`, `python_commands`).
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re
import shlex

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = ('README.md', 'docs/engine.md', 'docs/sharding.md', 'docs/sampling.md',
             'docs/tpu.md', 'docs/results.md')
_BLOCK = re.compile(r'^```python\n(.*?)^```', re.MULTILINE | re.DOTALL)
_SHELL_BLOCK = re.compile(r'^```(?:bash|sh)\n(.*?)^```', re.MULTILINE | re.DOTALL)


@dataclasses.dataclass(frozen=True)
class Snippet:
  document: str  # path relative to the repository
  line: int  # the line of its opening fence
  source: str

  @property
  def name(self) -> str:
    return f'{self.document}:{self.line}'


def snippets(pattern: re.Pattern = _BLOCK) -> list[Snippet]:
  """Every ```python block of DOCUMENTS (or ```bash with pattern=_SHELL_BLOCK), in order."""
  found = []
  for document in DOCUMENTS:
    text = (REPO / document).read_text()
    for match in pattern.finditer(text):
      found.append(Snippet(document, text.count('\n', 0, match.start()) + 1, match.group(1)))
  return found


def class_from(document: str, class_name: str, namespace: dict) -> type:
  """Executes the class definition `class_name` of the document's Python blocks
  in `namespace` (the names the block uses without importing them) and returns it."""
  for snippet in snippets():
    if snippet.document != document:
      continue
    for node in ast.parse(snippet.source).body:
      if isinstance(node, ast.ClassDef) and node.name == class_name:
        module = ast.Module(body=[node], type_ignores=[])
        exec(compile(module, snippet.name, 'exec'), namespace)  # pylint: disable=exec-used
        return namespace[class_name]
  raise AssertionError(f'{document} has no Python block defining {class_name}')


def shell_snippets() -> list[Snippet]:
  return snippets(_SHELL_BLOCK)


def python_commands(source: str) -> list[list[str]]:
  """The Python command lines of a shell block, as argument lists starting after
  `python` (`['-m', 'specdec_jax.sample', '--config', ...]`, `['bench/x.py', ...]`),
  also those quoted inside another command (`gcloud ... --command='...'`)."""
  text = re.sub(r'\\\n', ' ', source)
  found, pending = [], ''
  for line in text.splitlines():
    try:
      words = shlex.split(pending + line, comments=True)
      pending = ''
    except ValueError:  # a quote that a later line closes
      pending += line + '\n'
      continue
    for i, word in enumerate(words):
      if ' ' in word:  # a quoted command line
        found += python_commands(word.split('=', 1)[-1] if word.startswith('--') else word)
      elif re.fullmatch(r'(.*/)?python3?', word):
        rest = words[i + 1:]
        end = next((j for j, w in enumerate(rest) if w in ('&&', ';', '|', '||')), len(rest))
        found.append(rest[:end])
  return found
