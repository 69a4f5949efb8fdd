"""How a converter runs as a command (`python -m specdec_jax.converters.<name>`).

A usage error (a missing or wrong flag) and a checkpoint that cannot be read
or does not fit its config (`CheckpointReadError`, `CheckpointMismatchError`:
a mistyped path, the wrong `--config`, a damaged file) print their message
alone, with no traceback, and exit with status 2, as the main command's
config errors do; anything else is a crash and keeps its traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from absl import app

from specdec_jax.converters.checkpoint_keys import CheckpointMismatchError
from specdec_jax.converters.checkpoint_read import CheckpointReadError

EXIT_USAGE = 2


def run(main: Callable) -> None:
  """`app.run(main)`, with the refusals above printed as one message."""

  def checked_main(argv):
    try:
      return main(argv)
    except (app.UsageError, CheckpointReadError, CheckpointMismatchError) as error:
      print(f'error: {error}\n(--help lists the flags)', file=sys.stderr, flush=True)
      sys.exit(EXIT_USAGE)

  app.run(checked_main)
