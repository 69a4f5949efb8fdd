"""Whether a run may write into an existing output folder: its fingerprint.

`config.json` (`sample_output.CONFIG`) holds the fingerprint of what the
folder's images depend on: the settings, the model's identity, the
conditions, the backend and the code (`code_identity`). A restart continues
the folder only under the same fingerprint (`check_folder`), with three
exceptions it logs and records in `config.json`: another version of the code
when the caller tolerates it, a setting a later version added, at its
default, and a larger `num_images` (`GROWABLE`: the set is extended; image i
depends only on i, so the committed chunks stay valid).
"""

from __future__ import annotations

import json
import pathlib
import subprocess

from absl import logging
import jax

import specdec_jax
from specdec_jax.app import cli
from specdec_jax.app import sample_output

# Top-level fingerprint keys that a restart may raise: the folder's set grows.
GROWABLE = ('num_images',)


class FolderMismatchError(cli.ConfigError):
  """The output folder was written by a configuration that gives other images."""


def git_commit() -> str | None:
  """The commit of the git checkout this package runs from (None if it runs from
  elsewhere, e.g. an installed wheel); '+' marks uncommitted changes."""
  root = pathlib.Path(specdec_jax.__file__).resolve().parents[1]
  git = lambda *args: subprocess.run(['git', '-C', str(root), *args], capture_output=True,
                                     text=True, timeout=30)
  try:
    top = git('rev-parse', '--show-toplevel')
    if top.returncode or pathlib.Path(top.stdout.strip()).resolve() != root:
      return None
    dirty = git('status', '--porcelain', '--untracked-files=no', '--', 'specdec_jax', 'models',
                'converters', 'configs').stdout.strip()
    return git('rev-parse', 'HEAD').stdout.strip() + ('+' if dirty else '')
  except (OSError, subprocess.SubprocessError):
    return None


def code_identity() -> dict:
  """The code the images come from: this package's version and commit, and JAX's."""
  return dict(specdec_jax=specdec_jax.__version__, git_commit=git_commit(),
              jax=jax.__version__, jaxlib=jax.lib.__version__)


def differences(old, new, prefix: str = '') -> list[str]:
  """'key: old -> new' for every leaf that differs between two nested dicts (a key
  only one of them has: 'not in the folder' or 'not in this run')."""
  if isinstance(old, dict) and isinstance(new, dict):
    out = []
    for key in sorted(set(old) | set(new)):
      if key not in old:
        out.append(f'{prefix}{key}: not in the folder -> {new[key]!r} (now)')
      elif key not in new:
        out.append(f'{prefix}{key}: {old[key]!r} (folder) -> not in this run')
      else:
        out += differences(old[key], new[key], f'{prefix}{key}.')
    return out
  return [] if old == new else [f'{prefix[:-1]}: {old!r} (folder) -> {new!r} (now)']


def settings_added_at_default(stored: dict, fingerprint: dict, defaults: dict,
                              prefix: str = '') -> tuple[dict, list[str]]:
  """The folder's fingerprint completed with the settings a later version added.

  A setting the folder's fingerprint lacks but this one has (a hyperparameter
  added since the folder was written) is taken as the folder's when this run
  holds it at its default: the library adds a setting with the default that
  keeps what the code did before it. At another value it stays missing, so it
  is reported as a difference.

  Args:
    stored: the folder's fingerprint; fingerprint: this run's; defaults: the
      settings of a default configuration (nested dicts, JSON values).
  Returns:
    (stored with those settings added, 'key: ...' lines naming them).
  """
  completed, added = dict(stored), []
  for key, value in fingerprint.items():
    default = defaults.get(key) if isinstance(defaults, dict) else None
    if key not in stored:
      if key in defaults and value == default:
        completed[key] = value
        added.append(f'{prefix}{key}: not in the folder -> {value!r} (now, its default)')
    elif isinstance(stored[key], dict) and isinstance(value, dict) and isinstance(default, dict):
      completed[key], more = settings_added_at_default(stored[key], value, default,
                                                       f'{prefix}{key}.')
      added += more
  return completed, added


def check_folder(out_dir, fingerprint: dict, tolerated: tuple[str, ...] = (),
                 record: bool = False, defaults: dict | None = None,
                 older_forms: dict | None = None) -> bool:
  """Raises FolderMismatchError unless the folder is new or has this fingerprint.

  Args:
    tolerated: top-level fingerprint keys whose differences are logged instead
      of refused.
    record: append those differences to config.json's `accepted_changes`
      (one process does).
    defaults: the fingerprint's settings in a default configuration. With
      'code' tolerated, settings the folder lacks are accepted at these
      defaults (`settings_added_at_default`), logged and recorded with the
      code's change.
    older_forms: {key: value}: a folder holding `value` at a top-level key holds
      this fingerprint's value in the form an older version recorded (the same
      model's identity, hashed another way): accepted as equal, and logged.
  A key of GROWABLE that is larger now than in the folder extends the set:
  logged, and with `record` written into config.json (its fingerprint and
  config take the new value; `extended` lists each growth). A smaller one is
  refused like any other change.
  Returns:
    True when the folder holds a config.json of this configuration (a
    restart); False when it is new (a folder with images but no config.json
    is refused), or when its config.json describes another
    configuration but no image was written (a run stopped by an error before
    its first chunk): the caller then writes config.json anew.
  """
  path = pathlib.Path(out_dir) / sample_output.CONFIG
  if not path.exists() and sample_output.holds_images(out_dir):
    raise FolderMismatchError(
        f'{out_dir} holds images but no {sample_output.CONFIG}: they come from an unknown '
        'configuration. Remove the folder or choose another --config.out_dir.')
  if not path.exists():
    return False
  try:
    stored_config = json.loads(path.read_text())
    stored = stored_config['fingerprint']
  except (ValueError, KeyError) as e:
    raise FolderMismatchError(f'{path} is unreadable ({e!r}): not written by a whole run of '
                              'this job. Delete it or write to a new --config.out_dir.') from None
  # A JSON round trip turns tuples into lists, so compare like with like.
  fingerprint = json.loads(json.dumps(fingerprint, default=str))
  for key, older in (older_forms or {}).items():
    if older is not None and stored.get(key) == json.loads(json.dumps(older, default=str)):
      logging.info('%s records %s in an older form (%s); it is this run\'s.', out_dir, key, older)
      stored = dict(stored, **{key: fingerprint[key]})
  added = []
  if 'code' in tolerated and defaults is not None:
    stored, added = settings_added_at_default(
        stored, fingerprint, json.loads(json.dumps(defaults, default=str)))
  grown = [key for key in GROWABLE if isinstance(stored.get(key), int)
           and isinstance(fingerprint.get(key), int) and fingerprint[key] > stored[key]]
  part = lambda d, keep: {k: v for k, v in d.items()
                          if (k in tolerated) == keep and k not in grown}
  changed = differences(part(stored, False), part(fingerprint, False))
  if changed and not sample_output.holds_images(out_dir):
    logging.warning('%s: its %s is from a run that wrote no image (%s); starting over with '
                    'this configuration.', out_dir, sample_output.CONFIG, '; '.join(changed))
    return False
  if changed:
    raise FolderMismatchError(
        f'{out_dir} holds images of another configuration; what differs:\n  '
        + '\n  '.join(changed)
        + '\nWrite to a new --config.out_dir, rerun with the folder\'s values '
        f'(see {path}), or delete the folder to start over.'
        + ''.join(f' (A larger {key} than the folder\'s extends its set.)' for key in GROWABLE
                  if any(line.startswith(f'{key}:') for line in changed)))
  accepted = differences(part(stored, True), part(fingerprint, True)) + added
  if accepted:
    logging.warning('%s: continuing a set made by other code (%s); its images may differ '
                    'from what this code gives.', out_dir, '; '.join(accepted))
  extended = [f'{key}: {stored[key]} -> {fingerprint[key]}' for key in grown]
  if extended:
    logging.info('%s: extending the set (%s); its committed chunks are kept.', out_dir,
                 '; '.join(extended))
  if record and (accepted or extended):
    if accepted:
      stored_config.setdefault('accepted_changes', []).append(accepted)
    if extended:
      stored_config.setdefault('extended', []).append(extended)
    for key in grown:
      stored_config['fingerprint'][key] = fingerprint[key]
      if isinstance(stored_config.get('config'), dict):
        stored_config['config'][key] = fingerprint[key]
    sample_output.write_json(path, stored_config)
  return True
