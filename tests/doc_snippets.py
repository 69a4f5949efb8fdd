"""The Python examples in README.md and docs/*.md, for the tests that keep them true.

A fenced ```python block is an example of the public API; most call it on a
checkpoint or arrays the reader has (`...` stands for arguments), so they are
checked statically (tests/test_doc_snippets.py), and the one that defines a
whole class (docs/engine.md's plugged-in mode) is executed by the decode tests.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = ('README.md', 'docs/engine.md', 'docs/sharding.md', 'docs/sampling.md',
             'docs/tpu.md', 'docs/results.md')
_BLOCK = re.compile(r'^```python\n(.*?)^```', re.MULTILINE | re.DOTALL)


@dataclasses.dataclass(frozen=True)
class Snippet:
  document: str  # path relative to the repository
  line: int  # the line of its opening fence
  source: str

  @property
  def name(self) -> str:
    return f'{self.document}:{self.line}'


def snippets() -> list[Snippet]:
  """Every ```python block of DOCUMENTS, in order."""
  found = []
  for document in DOCUMENTS:
    text = (REPO / document).read_text()
    for match in _BLOCK.finditer(text):
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
