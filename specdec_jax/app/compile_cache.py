"""JAX's persistent compilation cache for the command-line entry points.

Compiling a decode loop takes seconds on a GPU and up to minutes on XLA:CPU
or for a deep model; the executable depends only on the program, its shapes
and the compiler, so a later run with the same programs reads it from disk.
The main command, the sampler and the bench scripts call `enable` at start
with their `compilation_cache` setting:

  ''        the folder JAX_COMPILATION_CACHE_DIR names if set, else
            $XDG_CACHE_HOME/specdec_jax (default ~/.cache/specdec_jax)
  'off'     no persistent cache
  a folder  that folder

Programs that compile in under MIN_COMPILE_SECONDS are not stored (eager
one-op programs would fill the folder); every decode loop and image decoder
takes longer. Library code never calls this: importing specdec_jax changes no
JAX setting.
"""

from __future__ import annotations

import os
import pathlib

from absl import logging
import jax

from specdec_jax.app import cli
from specdec_jax.app import files

OFF = 'off'
MIN_COMPILE_SECONDS = 0.1


def default_folder() -> pathlib.Path:
  """$XDG_CACHE_HOME/specdec_jax, or ~/.cache/specdec_jax when XDG_CACHE_HOME is unset."""
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return pathlib.Path(base) / 'specdec_jax'


def folder_for(setting: str) -> pathlib.Path | None:
  """The cache folder of a `compilation_cache` setting ('', 'off' or a folder); None = off."""
  if setting == OFF:
    return None
  if setting:
    return pathlib.Path(setting).expanduser()
  from_jax = jax.config.jax_compilation_cache_dir  # JAX_COMPILATION_CACHE_DIR
  return pathlib.Path(from_jax) if from_jax else default_folder()


def enable(setting: str = '') -> pathlib.Path | None:
  """Points JAX's persistent compilation cache at the setting's folder (or turns it
  off) and logs it; returns the folder (None when off). Call before compiling.

  Raises cli.ConfigError when a named folder cannot be made or written (it, or
  a folder above it, is a file; read-only). The default folder (the setting
  '') in a read-only home, common in containers, turns the cache off with a
  warning instead: the cache only saves time.
  """
  folder = folder_for(setting)
  problem = folder and files.folder_problem(folder)
  if problem and not setting:
    logging.warning('persistent compilation cache off: %s (name a writable folder with '
                    'compilation_cache, or set JAX_COMPILATION_CACHE_DIR)', problem)
    folder = None
  if folder is None:
    jax.config.update('jax_enable_compilation_cache', False)
    logging.info('persistent compilation cache: off')
    return None
  if problem:
    raise cli.ConfigError(f'config.compilation_cache={setting!r}: {problem}. Name a folder '
                          f'for the cache, \'\' for the default, or {OFF!r}.')
  folder.mkdir(parents=True, exist_ok=True)
  jax.config.update('jax_enable_compilation_cache', True)
  jax.config.update('jax_compilation_cache_dir', str(folder))
  jax.config.update('jax_persistent_cache_min_compile_time_secs', MIN_COMPILE_SECONDS)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
  logging.info('persistent compilation cache: %s (%d entries; compilation_cache=off turns it '
               'off)', folder, sum(1 for _ in folder.iterdir()))
  return folder
