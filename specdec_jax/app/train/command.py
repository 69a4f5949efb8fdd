"""How a trainer runs as a program (`python -m specdec_jax.app.train.<name>`).

`run(main, default_config_file)` defines `--config` (default: the trainer's
config file under configs/) and `--workdir` as the program's own flags, so
`--help` lists them; checks the config's counts, rates and probabilities
(`check_train_config`) before any work; holds the workdir's lock for the
whole run (`locked_workdir`: a second run on the same workdir is refused,
naming the holder) and removes the folders it made when nothing was written
in them; and prints a config error, a missing or corrupt input file, a locked
workdir or an unreadable checkpoint as one message (exit status 2, `REFUSALS`),
the way the main command does. The family trainer checks each stage's config
with `check_train_config` too, and takes its workdir's lock once for all stages.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
from collections.abc import Callable

from absl import flags

from specdec_jax.app import cli
from specdec_jax.app import fashion_mnist
from specdec_jax.app import files
from specdec_jax.converters import command as converter_command
from specdec_jax.converters import common as converters_common


_STEPS = cli.integer(1)
_PROBABILITY = cli.number(minimum=0.0, maximum=1.0, note='a probability')

# The fields trainers share, checked wherever a trainer's config has them.
TRAIN_CHECKS = dict(
    train_minutes=cli.number(minimum=0.0, note='0 = no time budget'), num_steps=_STEPS,
    log_every=_STEPS, save_every=_STEPS, batch_size=_STEPS, eval_batch_size=_STEPS,
    eval_examples=_STEPS, sample_batch_size=_STEPS, num_target_samples=_STEPS,
    class_dropout=_PROBABILITY, uncond_prob=_PROBABILITY,
    learning_rate=cli.number(above=0.0), warmup_steps=cli.integer(0),
    weight_decay=cli.number(minimum=0.0), clip_norm=cli.number(minimum=0.0, note='0 disables'),
    iterations=_STEPS, codebook_size=_STEPS, patch_size=_STEPS, num_patches=_STEPS,
    max_examples=cli.integer(0, note='0 = the full splits'))


def check_train_config(config, where: str = 'config') -> None:
  """Raises cli.ConfigError for a field of TRAIN_CHECKS that no run can use."""
  for field, check in TRAIN_CHECKS.items():
    if field in config and not check.ok(config[field]):
      raise cli.ConfigError(f'{where}.{field}={config[field]!r}: must be {check.accepted}.')


# What a trainer refuses in one line (exit 2) besides cli.ConfigError.
REFUSALS = (FileNotFoundError, fashion_mnist.DataFileError, files.FolderLockedError,
            converters_common.CheckpointReadError)


def check_workdir(workdir: str) -> None:
  """Raises cli.ConfigError when --workdir is empty or cannot be a folder (a file is
  in the way)."""
  if not workdir:
    raise cli.ConfigError(f'--workdir={workdir!r}: must name the output folder, e.g. '
                          '--workdir=runs/my_run.')
  problem = files.folder_problem(os.path.abspath(workdir))
  if problem:
    raise cli.ConfigError(f'--workdir={workdir!r}: {problem}.')


@contextlib.contextmanager
def locked_workdir(workdir: str):
  """Holds `workdir`'s lock (files.FolderLock; FolderLockedError, naming the holder,
  if another job holds it or the folder above it) until the block ends; then removes the
  folders that taking it created if nothing else was written in them (a refused run)."""
  created = files.missing_folders(os.path.abspath(workdir))
  try:
    with files.FolderLock(workdir, break_flag=None) as lock:
      # A family run locks its workdir, not its stage folders (its direct subfolders):
      # checked after taking this lock, so a family starting meanwhile sees it.
      parent = pathlib.Path(os.path.realpath(workdir)).parent
      try:
        files.FolderLock(parent, break_flag=None).refuse_if_held()
      except files.FolderLockedError as error:
        raise files.FolderLockedError(f'--workdir={workdir} lies in {parent}: {error}') from None
      yield lock
  finally:
    files.remove_empty(created)


def run(main: Callable, default_config_file: str) -> None:
  """Runs a trainer's `main(argv)` (reading flags.FLAGS.config and .workdir)."""

  def define_flags():
    from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
    config_flags.DEFINE_config_file('config', default_config_file, 'Training configuration.')
    flags.DEFINE_string('workdir', None, 'Output folder (checkpoints, metrics, the model).')
    flags.mark_flag_as_required('workdir')
    converter_command.list_in_help(('config', 'workdir'))

  def checked_main(argv):
    check_train_config(flags.FLAGS.config)
    check_workdir(flags.FLAGS.workdir)
    with locked_workdir(flags.FLAGS.workdir):
      return main(argv)

  cli.run_command(checked_main, define_flags, default_config_file, refusals=REFUSALS)

