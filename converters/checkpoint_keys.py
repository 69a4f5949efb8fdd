"""Validating a checkpoint's keys and shapes against the config a converter assumes.

`validate_keys` reports every missing, unexpected and mis-shaped key at once,
with the config assumed and a hint, so a wrong flag is found in one run. Part
of `specdec_jax.converters.common`, which re-exports every public name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np


class CheckpointMismatchError(ValueError):
  """The checkpoint's keys or shapes do not match the config assumed."""


def shapes_of(state: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
  """`{name: shape}` of a state dict."""
  return {k: tuple(int(d) for d in np.shape(v)) for k, v in state.items()}


def _listing(items: list[str], limit: int = 25) -> str:
  shown = '\n'.join(f'    {item}' for item in items[:limit])
  if len(items) > limit:
    shown += f'\n    ... and {len(items) - limit} more'
  return shown


def validate_keys(
    found: Mapping[str, Sequence[int]],
    expected: Mapping[str, Sequence[int]],
    *,
    what: str,
    hint: str = '',
) -> None:
  """Checks that a checkpoint has exactly the expected keys and shapes.

  Args:
    found: `{name: shape}` of the checkpoint (after dropping buffers).
    expected: `{name: shape}` the assumed config needs.
    what: the config assumed, e.g. "LlamaGen GPT-B c2i, 256 tokens".
    hint: appended to the message (e.g. which flag to change).
  Raises:
    CheckpointMismatchError: listing missing keys, unexpected keys and
      mis-shaped keys (expected vs found).
  """
  found = {k: tuple(v) for k, v in found.items()}
  expected = {k: tuple(v) for k, v in expected.items()}
  missing = sorted(set(expected) - set(found))
  unexpected = sorted(set(found) - set(expected))
  misshaped = sorted(k for k in set(found) & set(expected) if found[k] != expected[k])
  if not (missing or unexpected or misshaped):
    return
  parts = [f'Checkpoint does not match {what}: {len(missing)} missing, '
           f'{len(unexpected)} unexpected, {len(misshaped)} mis-shaped key(s) '
           f'(checkpoint has {len(found)} keys, the config expects '
           f'{len(expected)}).']
  if missing:
    parts.append('  missing keys:\n' + _listing(
        [f'{k} (expected shape {expected[k]})' for k in missing]))
  if unexpected:
    parts.append('  unexpected keys:\n' + _listing(
        [f'{k} (shape {found[k]})' for k in unexpected]))
  if misshaped:
    parts.append('  mis-shaped keys:\n' + _listing(
        [f'{k}: expected {expected[k]}, found {found[k]}' for k in misshaped]))
  if hint:
    parts.append(hint)
  raise CheckpointMismatchError('\n'.join(parts))


def tree_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """`{'a/b/kernel': shape}` of a nested parameter tree (arrays or abstract leaves)."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {'/'.join(str(getattr(k, 'key', getattr(k, 'idx', k))) for k in path):
          tuple(int(d) for d in np.shape(leaf)) for path, leaf in flat}


def check_loaded_params(params: Any, expected: Any, *, what: str, where: Any) -> None:
  """A converted folder's params against the tree its recorded config builds.

  Args:
    params: the params read from the folder.
    expected: the model's own tree for that config (e.g. `jax.eval_shape` of
      its `init_params`), abstract leaves are enough.
    what: the model and config, for the message.
    where: the folder, for the message.
  Raises:
    CheckpointMismatchError: a missing, extra or mis-shaped parameter (a model
      that would run on part of its layers, or fail deep inside Flax).
  """
  validate_keys(tree_shapes(params), tree_shapes(expected), what=what,
                hint=f'The folder {str(where)!r} does not hold the parameters its '
                'specdec_meta.json config describes (edited, or written by another '
                'version): convert the original checkpoint again.')
