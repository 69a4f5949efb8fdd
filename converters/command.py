"""How a converter runs as a command (`python -m specdec_jax.converters.<name>`).

A usage error (a missing or wrong flag) and a checkpoint that cannot be read
or does not fit its config (`CheckpointReadError`, `CheckpointMismatchError`:
a mistyped path, the wrong `--config`, a damaged file) print their message
alone, with no traceback, and exit with status 2, as the main command's
config errors do; anything else is a crash and keeps its traceback.

The Hugging Face folder converters (Chameleon / Lumina-mGPT, Janus-Pro) share
their flags and `main` (`define_folder_flags`, `folder_main`).
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Callable

from absl import app
from absl import flags

from specdec_jax.converters.checkpoint_keys import CheckpointMismatchError
from specdec_jax.converters.checkpoint_read import CheckpointReadError
from specdec_jax.converters.checkpoint_write import check_output_dir
from specdec_jax.converters.checkpoint_write import check_output_dtype
from specdec_jax.converters.checkpoint_write import OUTPUT_DTYPES
from specdec_jax.converters.checkpoint_write import STORED

EXIT_USAGE = 2
OVERWRITE_HELP = 'Replace an existing --output (a converted checkpoint or an empty folder).'


def _refuse(error: Exception) -> None:
  print(f'error: {error} (--help lists the flags)', file=sys.stderr, flush=True)
  sys.exit(EXIT_USAGE)


def _parse_flags(argv: list[str]) -> list[str]:
  """A bad flag (unknown, a mistyped value, a required one missing) is refused as
  one message too; absl's own parser exits with 1 after a usage hint. `--help`
  exits with status 0, where absl exits with 1."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as error:
    _refuse(error)
  except SystemExit as exit_:  # absl's help flags print the help, then exit with 1
    raise SystemExit(0 if exit_.code == 1 else exit_.code) from None


def run(main: Callable) -> None:
  """`app.run(main)`, with bad flags and the refusals above printed as one message."""

  def checked_main(argv):
    try:
      return main(argv)
    except (app.UsageError, CheckpointReadError, CheckpointMismatchError) as error:
      _refuse(error)

  app.run(checked_main, flags_parser=_parse_flags)


def list_in_help(names) -> None:
  """Makes flags defined outside the program's own module part of its `--help`
  (absl lists the main module's key flags only)."""
  for name in names:
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])


def define_folder_flags(checkpoint: str, presets: str) -> None:
  """--input_dir, --output, --config, --dtype, --overwrite of a converter reading
  a checkpoint folder; `checkpoint` names it, `presets` lists its presets."""
  flags.DEFINE_string('input_dir', None, f'Folder with the {checkpoint} checkpoint.',
                      required=True)
  flags.DEFINE_string('output', None, 'Output folder (created atomically).', required=True)
  flags.DEFINE_string('config', None, f'Preset ({presets}) or config.json path '
                      '(default: config.json in --input_dir).')
  flags.DEFINE_enum('dtype', STORED, list(OUTPUT_DTYPES), 'Param dtype: '
                    'stored (default) keeps the checkpoint\'s own (one dtype, or float32 for '
                    'a mix), float32 or bfloat16 casts.')
  flags.DEFINE_bool('overwrite', False, OVERWRITE_HELP)
  list_in_help(('input_dir', 'output', 'config', 'dtype', 'overwrite'))


def folder_main(resolve_config: Callable, convert: Callable) -> Callable:
  """The `main(argv)` of a folder converter: flag errors (output, dtype, input
  folder, config) as a usage message before the (slow) conversion, then
  `convert(input_dir, output, config=, dtype=, overwrite=)`."""

  def main(argv):
    del argv
    values = flags.FLAGS
    try:
      check_output_dir(values.output, values.overwrite)
      check_output_dtype(values.dtype)
      if not pathlib.Path(values.input_dir).is_dir():
        raise ValueError(f'--input_dir {values.input_dir!r} is not a folder: give the folder '
                         'that holds the checkpoint\'s config.json and weight files.')
      resolve_config(values.config, pathlib.Path(values.input_dir))
    except (ValueError, OSError) as e:
      raise app.UsageError(str(e)) from e
    convert(values.input_dir, values.output, config=values.config, dtype=values.dtype,
            overwrite=values.overwrite)

  return main
