"""The command-line boundary of the entry points: configuration checks and how errors print.

A configuration no run can use raises `ConfigError` naming the field, the
bad value and the values it accepts, before any model is loaded or program
compiled. `run_command` runs an absl main so that such an error (and the
other refusals it is given, e.g. a locked output folder) prints its message
alone and exits with status 2, while a real crash keeps its traceback; an
unknown `--config.x` is refused the same way, with the fields there are.

A check table maps each field of a config to a `Check` (nested tables for
sub-configs); `check_fields` applies it and refuses fields the table does not
name, so a field added to a config without a check fails its tests.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
import sys
import threading
from typing import Any, Callable

from absl import app
from absl import flags
from absl import logging
import ml_collections

from specdec_jax.app import files

EXIT_CONFIG_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


class ConfigError(ValueError):
  """A configuration value no run can use; the message names it and what to set."""


@dataclasses.dataclass(frozen=True)
class Check:
  """A predicate on a field's value and the words for what it accepts."""

  ok: Callable[[Any], bool]
  accepted: str


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))


def _with_note(words: str, note: str) -> str:
  return f'{words} ({note})' if note else words


def integer(minimum: int | None = None, maximum: int | None = None, note: str = '') -> Check:
  bounds = [f'>= {minimum}'] * (minimum is not None) + [f'<= {maximum}'] * (maximum is not None)
  return Check(lambda v: _is_int(v) and (minimum is None or v >= minimum)
               and (maximum is None or v <= maximum),
               _with_note(' '.join(['an integer', ' and '.join(bounds)]).strip(), note))


def number(minimum: float | None = None, above: float | None = None,
           maximum: float | None = None, note: str = '') -> Check:
  """A finite int or float, >= minimum, > above, <= maximum (those given)."""
  bounds = [f'>= {minimum}'] * (minimum is not None) + [f'> {above}'] * (above is not None)
  bounds += [f'<= {maximum}'] * (maximum is not None)
  return Check(lambda v: _is_number(v) and (minimum is None or v >= minimum)
               and (above is None or v > above) and (maximum is None or v <= maximum),
               _with_note(' '.join(['a finite number', ' and '.join(bounds)]).strip(), note))


def one_of(*choices) -> Check:
  return Check(lambda v: v in choices, f'one of {choices}')


def integers(minimum: int = 0, nonempty: bool = False) -> Check:
  return Check(lambda v: isinstance(v, (tuple, list)) and (len(v) > 0 or not nonempty)
               and all(_is_int(x) and x >= minimum for x in v),
               f'a{" non-empty" * nonempty} tuple of integers >= {minimum}, e.g. (0, 3)')


BOOL = Check(lambda v: isinstance(v, bool), 'True or False')
STRING = Check(lambda v: isinstance(v, str), 'a string')
NONEMPTY_STRING = Check(lambda v: isinstance(v, str) and bool(v), 'a non-empty string')


def check_fields(config, checks: dict, where: str = 'config') -> None:
  """Raises ConfigError for the first field whose value its check refuses.

  Args:
    config: a ConfigDict (or dict).
    checks: field -> Check, or -> a nested table for a sub-config.
  """
  unknown = sorted(set(config.keys()) - set(checks))
  if unknown:  # e.g. a config file of another command
    raise ConfigError(f'{where} has fields this command does not read: {unknown}; its '
                      f'fields are {sorted(checks)}.')
  for field, check in checks.items():
    if field not in config:
      continue
    value = config[field]
    if isinstance(check, dict):
      if not isinstance(value, (dict, ml_collections.ConfigDict)):
        raise ConfigError(f'{where}.{field}={value!r}: must be a group of fields '
                          f'{sorted(check)}.')
      check_fields(value, check, f'{where}.{field}')
    elif not check.ok(value):
      raise ConfigError(f'{where}.{field}={value!r}: must be {check.accepted}.')


def _load_config_file(spec: str):
  """The ConfigDict of 'path.py' or 'path.py:argument', as config_flags loads it."""
  path, _, argument = spec.partition(':')
  module_spec = importlib.util.spec_from_file_location('_checked_config', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(argument) if argument else module.get_config()


def _config_file_and_overrides(argv: list[str], default_config_file: str,
                               name: str) -> tuple[str, list[str]]:
  """The config file `--{name}` names (else the default) and the overridden fields."""
  config_file, overrides = default_config_file, []
  for index, arg in enumerate(argv[1:], start=1):
    given = re.match(rf'^--?{name}(=(.*))?$', arg)
    if given:
      config_file = given.group(2) if given.group(1) else (argv[index + 1:] or [''])[0]
    override = re.match(rf'^--?(?:no)?{name}\.([^=]+)', arg)
    if override:
      overrides.append(override.group(1))
  return config_file, overrides


def config_fields_help(argv: list[str], default_config_file: str, name: str = 'config') -> str:
  """The config's fields with their values, for --help (absl lists only --config)."""
  config_file, _ = _config_file_and_overrides(argv, default_config_file, name)
  try:
    config = _load_config_file(config_file)
  except Exception:  # pylint: disable=broad-except  (the run reports it in its own words)
    return ''
  fields = files.dotted_fields(config.to_dict())
  return (f'\n{name} fields ({config_file}; set one with --{name}.<field>=<value>):\n'
          + ''.join(f'  {field} = {value!r}\n' for field, value in fields.items()))


def check_overrides(argv: list[str], default_config_file: str, name: str = 'config') -> None:
  """Raises ConfigError for a `--config` file that does not exist, or a
  `--config.x=...` whose field the config does not have.

  ml_collections would fail with a traceback (OSError, AttributeError or
  KeyError) when the flag is defined; this names the flag instead, and the
  fields there are.
  """
  config_file, overrides = _config_file_and_overrides(argv, default_config_file, name)
  path = config_file.partition(':')[0]
  if not os.path.isfile(path):
    raise ConfigError(f'--{name} {config_file!r}: {path!r} is not a file. Give the path of a '
                      f'config file, or leave --{name} out for the packaged default '
                      f'({default_config_file}).')
  if not overrides:
    return
  try:
    config = _load_config_file(config_file)
  except Exception:  # pylint: disable=broad-except
    return  # config_flags reports a config file it cannot load in its own words
  for path in overrides:
    node, walked = config, name
    for key in path.split('.'):
      if not isinstance(node, ml_collections.ConfigDict) or key not in node:
        fields = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
        raise ConfigError(f'--{name}.{path}: {walked} has no field {key!r}'
                          + (f'; its fields are {", ".join(fields)}.' if fields else '.'))
      node, walked = node[key], f'{walked}.{key}'


def exit_with(error: BaseException) -> None:
  """Prints `error`'s message alone (no traceback) and exits with EXIT_CONFIG_ERROR."""
  print(f'error: {error}', file=sys.stderr, flush=True)
  sys.exit(EXIT_CONFIG_ERROR)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing for `app.run`, with a bad flag (unknown, mistyped value,
  a required one missing) printed as one line with exit status 2; absl's own
  parser exits with 1 after a usage hint. `--help` (and `--helpfull`) list the
  flags and exit with status 0, where absl exits with 1."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as error:
    exit_with(ConfigError(f'{error} (--help lists the flags)'))
  except SystemExit as exit_:
    raise SystemExit(help_exit_status(exit_)) from None


def help_exit_status(exit_: SystemExit) -> int:
  """0 for absl's help flags, which print the help and exit with 1 while the
  flags are parsed (a bad flag raises `flags.Error` instead); else the status."""
  return 0 if exit_.code == 1 else exit_.code


# Names of the threads whose work an interrupted command drops (`generate.in_threads`).
DROPPED_ON_INTERRUPT = 'specdec-untimed'


def exit_now_if_threads_are_busy(status: int) -> None:
  """Ends the process at once (os._exit) while a DROPPED_ON_INTERRUPT thread still
  runs, e.g. a compiled XLA call, which no signal stops and which sys.exit would
  wait for; otherwise returns (other threads, such as Orbax's checkpoint commits,
  are waited for as before)."""
  if any(t.is_alive() and t.name.startswith(DROPPED_ON_INTERRUPT)
         for t in threading.enumerate()):
    logging.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # pylint: disable=protected-access


def run_command(main: Callable, define_flags: Callable, default_config_file: str,
                refusals: tuple = ()) -> None:
  """`app.run(main)` for an entry point with a `--config` flag.

  Unknown `--config.x` or other bad flags (`parse_flags`), an argument that is
  not a flag, and ConfigError or any of `refusals` raised by main, print their
  message alone and exit with status 2; Ctrl-C prints one line and exits with
  EXIT_INTERRUPTED; other errors are crashes and keep their traceback.
  """
  try:
    check_overrides(sys.argv, default_config_file)
  except ConfigError as error:
    exit_with(error)
  define_flags()

  def checked_main(argv):
    try:
      if len(argv) > 1:  # absl passes what is not a flag; a mistyped `--out` would be lost
        raise ConfigError(f'unexpected argument(s) {argv[1:]}: this command takes flags only '
                          '(e.g. --out=DIR or --workdir=DIR; --help lists them).')
      return main(argv)
    except (ConfigError, *refusals) as error:
      exit_with(error)
    except KeyboardInterrupt:
      print('interrupted (Ctrl-C)', file=sys.stderr, flush=True)
      exit_now_if_threads_are_busy(EXIT_INTERRUPTED)
      sys.exit(EXIT_INTERRUPTED)

  def parse_and_list_fields(argv):
    try:
      return parse_flags(argv)
    except SystemExit as exit_:
      if exit_.code == 0:  # a help flag: absl printed the flags
        print(config_fields_help(argv, default_config_file), flush=True)
      raise

  app.run(checked_main, flags_parser=parse_and_list_fields)
