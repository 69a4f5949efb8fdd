"""How the sampler's processes act together (JAX's multi-controller runtime).

Every process of a job runs the same program, and the collectives of a
decode, a barrier or a broadcast wait for all of them. A step that fails on
some processes only (process 0's merge on a full disk, one host's model
file missing) must therefore stop every process, with the error, instead of
leaving the others waiting at the next collective until the runtime's
heartbeat times out and aborts the job (minutes, and a core dump instead of
the message). `agreed` runs such a step and makes its outcome every
process's; `lock_folder` takes the output folder's lock on process 0 for the
whole job; `check_same_settings` stops a job whose processes were given
different settings (each would decode its own chunks under its own).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
from typing import Callable, TypeVar

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np

from specdec_jax.app import cli
from specdec_jax.app import files

T = TypeVar('T')


class ProcessFailedError(RuntimeError):
  """Another process of the job failed a step that every process must complete."""


def agreed(what: str, step: Callable[[], T], *, process_0_only: bool = False) -> T | None:
  """Runs step() on every process (or on process 0 only) and stops every process
  if it failed on any.

  Args:
    what: the step, for the message ('merge the chunks').
    step: the work; its exception (an Exception) is re-raised on its own process.
    process_0_only: run it on process 0; the others return None.
  Returns:
    step()'s result (None where it did not run).
  Raises:
    ProcessFailedError on the processes where it succeeded, when it failed on
    another: naming the processes whose logs hold the error.
  """
  result, error = None, None
  if not process_0_only or jax.process_index() == 0:
    try:
      result = step()
    except Exception as e:  # pylint: disable=broad-except  (re-raised below)
      error = e
  failed = np.asarray(multihost_utils.process_allgather(np.int32(error is not None)))
  if error is not None:
    raise error
  failed = np.flatnonzero(failed.reshape(-1))
  if failed.size:
    raise ProcessFailedError(
        f'process {", ".join(map(str, failed))} could not {what} (its log holds the error); '
        f'process {jax.process_index()} stops too.')
  return result


def _digest(text: str) -> np.ndarray:
  return np.frombuffer(hashlib.sha256(text.encode()).digest(), np.uint8)


def check_same_settings(fields: dict) -> None:
  """Raises cli.ConfigError on every process when the processes' `fields` (the job's
  fingerprint: settings, model identity, conditions) differ, naming the fields.

  Without it each process decodes its own chunks under its own settings (another
  cfg_scale: a mixed set, recorded as process 0's), or the processes meet in
  mismatched collectives and abort (another method or num_images).
  """
  if jax.process_count() == 1:
    return
  flat = {name: json.dumps(value, sort_keys=True, default=str)
          for name, value in files.dotted_fields(fields).items()}
  names = sorted(flat)
  same_names = np.asarray(multihost_utils.process_allgather(_digest(json.dumps(names))))
  if (same_names != same_names[0]).any():
    raise cli.ConfigError('the processes were given configs with different fields (another '
                          'model kind or config file); give every process the same config.')
  digests = np.stack([_digest(flat[name]) for name in names])
  every = np.asarray(multihost_utils.process_allgather(digests))  # [processes, fields, 32]
  differ = [name for j, name in enumerate(names) if (every[:, j] != every[0, j]).any()]
  if differ:
    raise cli.ConfigError(f'the processes were given different settings: {", ".join(differ)} '
                          'differ between them; give every process the same config, flags and '
                          'model files.')


def initialize_distributed(mode: str, coordinator_address, num_processes, process_id) -> None:
  """jax.distributed.initialize(), unless this is a single process.

  mode 'auto' initializes when any of the three is given (or
  JAX_COORDINATOR_ADDRESS) or SLURM runs several tasks; 'true' always (JAX
  then detects Cloud TPU pods and SLURM itself); 'false' never.

  Raises cli.ConfigError for settings jax.distributed refuses (it raised a
  ValueError traceback): num_processes < 1, process_id outside [0,
  num_processes), no coordinator address where no cluster is detected.
  """
  if num_processes is not None and num_processes < 1:
    raise cli.ConfigError(f'--num_processes={num_processes}: must be at least 1.')
  if process_id is not None and not 0 <= process_id < (num_processes or process_id + 1):
    raise cli.ConfigError(f'--process_id={process_id}: must be in [0, {num_processes}) '
                          '(--num_processes).' if num_processes else
                          f'--process_id={process_id}: must be at least 0.')
  explicit = (coordinator_address or os.environ.get('JAX_COORDINATOR_ADDRESS')
              or num_processes is not None or process_id is not None)
  slurm = int(os.environ.get('SLURM_NTASKS', '1')) > 1
  if mode == 'false' or (mode == 'auto' and not (explicit or slurm)):
    return
  try:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
  except ValueError as e:  # e.g. no coordinator and no cluster to detect it from
    raise cli.ConfigError(f'jax.distributed.initialize refused the settings: {e} '
                          '(--coordinator_address, --num_processes, --process_id; '
                          'docs/sampling.md, "Multi-host launch").') from e


_STOPPED_BY: list[int] = []  # the signal that asked the job to stop, once one did


def exit_on_sigterm() -> None:
  """Makes SIGTERM (scancel, preemption, `timeout`) raise SystemExit(143) in the
  main thread, so `finally` blocks run: the folder's lock is released and
  temporary files removed (Python's default ends the process at once, leaving the
  lock to refuse a requeued job on another host). The handler runs between Python
  steps, so a decode inside XLA finishes first; SIGKILL still leaves the lock.
  Where the handler runs inside a callback that drops exceptions (JAX's garbage
  collector callback prints and drops them), `exit_if_stopped` raises it again."""

  def handler(signum, frame):
    del frame
    _STOPPED_BY.append(signum)
    raise SystemExit(128 + signum)

  signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def sigterm_stops_the_job():
  """`exit_on_sigterm` for the block; an error SIGTERM's SystemExit turned into (raised
  inside a C extension's import, it became `ImportError: initialization failed` and
  exit 1) also ends the job with SystemExit(128 + signal)."""
  exit_on_sigterm()
  try:
    yield
  except Exception:
    exit_if_stopped()
    raise


def exit_if_stopped() -> None:
  """Raises SystemExit(128 + signal) when SIGTERM arrived (`exit_on_sigterm`), in case
  its first SystemExit was dropped: the sampler calls this before each decode step."""
  if _STOPPED_BY:
    raise SystemExit(128 + _STOPPED_BY[0])


def stop_if_preempted(round_index: int) -> None:
  """Once a process of a `jax.distributed` job got SIGTERM, raises SystemExit(143) on
  every process after the same round (call it after each round, numbered from 0).

  jax.distributed.initialize starts JAX's preemption service (one process or many),
  whose SIGTERM handler replaces `exit_on_sigterm`'s: it tells every process, and
  `multihost_utils.reached_preemption_sync_point` names a round boundary (the next
  one after those any process has passed) at which all stop together; a process
  stopping alone would leave the others waiting in a collective. A SIGTERM during
  the last round lets the job finish. Without jax.distributed, or with the service
  off (`jax_enable_preemption_service`), `exit_on_sigterm` stops the process at once.
  """
  if not (jax.distributed.is_initialized() and jax.config.jax_enable_preemption_service):
    return
  if multihost_utils.reached_preemption_sync_point(round_index):
    logging.warning('stopping after round %d: a process received SIGTERM (scancel, '
                    'preemption or `timeout`); rerun to finish.', round_index + 1)
    raise SystemExit(128 + signal.SIGTERM)


def lock_folder(out_dir: str, break_lock: bool) -> files.FolderLock | None:
  """Process 0 takes the output folder's lock for the whole job (every process
  raises FolderLockedError if it is held); returns it on process 0."""
  lock, error = None, None
  if jax.process_index() == 0:
    lock = files.FolderLock(out_dir)
    try:
      taken_over = lock.acquire(break_lock)
      if taken_over:
        logging.warning('took over the lock %s: %s', lock.path, taken_over)
    except Exception as e:  # pylint: disable=broad-except  (re-raised below)
      error = e
  # 0: held; 1: held by another job; 2: another error (an unwritable folder).
  outcome = (0 if error is None else 1 if isinstance(error, files.FolderLockedError) else 2)
  outcome = int(multihost_utils.broadcast_one_to_all(np.int32(outcome)))
  if error is not None:
    raise error
  if outcome == 1:
    raise files.FolderLockedError(f'{out_dir} is in use by another job: process 0 '
                                  'could not take its lock (its log names the holder).')
  if outcome == 2:
    raise ProcessFailedError(f'process 0 could not take the lock of {out_dir} (its log holds '
                             f'the error); process {jax.process_index()} stops too.')
  return lock
