"""The config a training run records in its workdir, and the check a resume passes.

`training.fit` records the trainer's config in `workdir/run_config.json` when a
run starts; a resume whose config differs in a field that shapes the training
(model, optimizer, data source, seed) is refused, naming each field, so a
resumed run is the run its manifest describes. The length (`num_steps`,
`train_minutes`) may change: a run can be extended, and the log says that the
schedule after the resume follows the new length.
"""

from __future__ import annotations

import json
import os

from absl import logging

from specdec_jax.app import cli
from specdec_jax.app import files


RUN_CONFIG_FILE = 'run_config.json'
# Config fields a resumed run may change: how often it logs and saves, evaluation
# settings, compile speed, and input paths (a moved workdir; what the files hold is
# not compared: the family trainer's stage fingerprints do that, and the manifests
# record their hashes).
RESUMABLE_FIELDS = frozenset({'log_every', 'save_every', 'eval_batch_size', 'eval_examples',
                              'fast_compile'})
LENGTH_FIELDS = frozenset({'num_steps', 'train_minutes'})  # may change: logged, re-recorded


def checkpoint_dir(workdir: str) -> str:
  """The Orbax checkpoint folder of a training workdir."""
  return os.path.abspath(os.path.join(workdir, 'checkpoints'))


def has_checkpoints(workdir: str) -> bool:
  """Whether `workdir` holds a finished checkpoint (a step folder; not a killed save's
  `N.orbax-checkpoint-tmp`)."""
  folder = checkpoint_dir(workdir)
  return os.path.isdir(folder) and any(n.isdigit() for n in os.listdir(folder))


def _compared_fields(config) -> dict:
  """{dotted field: JSON value} of a config (ConfigDict or dict), without the fields
  a resumed run may change (RESUMABLE_FIELDS, `*_path`, `*_dir`)."""
  fields = files.dotted_fields(config.to_dict() if hasattr(config, 'to_dict') else config)
  return {name: json.loads(json.dumps(value, default=str)) for name, value in fields.items()
          if not (name.split('.')[-1] in RESUMABLE_FIELDS or name.endswith(('_path', '_dir')))}


def _schedule_kind_changed(recorded, current, field: str) -> bool:
  """train_minutes 0 (step schedule) against > 0 (time budget): another schedule,
  not another length."""
  return field.split('.')[-1] == 'train_minutes' and (not recorded) != (not current)


def check_resume(workdir: str, config) -> None:
  """Raises cli.ConfigError when `workdir` holds checkpoints of a run whose recorded
  config (RUN_CONFIG_FILE) differs from `config` in a field that shapes the training.

  A resumed run continues the recorded one step for step, so another learning
  rate, batch size, seed, model shape or data source would make a run that
  neither config describes. LENGTH_FIELDS may change (`record` logs it), but not
  train_minutes between 0 and > 0 (the step and the time schedules). Nothing
  to check without checkpoints, or for a workdir from before such records
  (`record` logs that).
  """
  path = os.path.join(workdir, RUN_CONFIG_FILE)
  if config is None or not has_checkpoints(workdir) or not os.path.isfile(path):
    return
  with open(path) as f:
    recorded = json.load(f)
  current = _compared_fields(config)
  changed = sorted(k for k in set(recorded) | set(current) if recorded.get(k) != current.get(k)
                   and (k.split('.')[-1] not in LENGTH_FIELDS or _schedule_kind_changed(
                       recorded.get(k), current.get(k), k)))
  if changed:
    listed = ', '.join(f'config.{k}={current.get(k)!r} (the checkpoints\' run: '
                       f'{recorded.get(k)!r})' for k in changed)
    raise cli.ConfigError(
        f'{workdir!r} holds checkpoints of a run with another config: {listed}. Resume with '
        f'the recorded values ({path}), or use a new --workdir to train afresh.')


def record(workdir: str, config, name: str, resumed: bool) -> None:
  """Writes RUN_CONFIG_FILE for a new run, or for a resumed one whose length changed."""
  path = os.path.join(workdir, RUN_CONFIG_FILE)
  current = _compared_fields(config)
  if resumed:
    if not os.path.isfile(path):
      logging.warning('%s: %s has no %s (a workdir from before such records); the config '
                      'is not checked against its checkpoints', name, workdir, RUN_CONFIG_FILE)
      return
    with open(path) as f:
      recorded = json.load(f)
    if recorded == current:
      return
    logging.warning('%s: resumed with another length (%s); the learning-rate schedule from '
                    'here on follows it', name, ', '.join(
                        f'{k} {recorded.get(k)} -> {current.get(k)}' for k in sorted(current)
                        if recorded.get(k) != current.get(k)))
  files.write_atomic(path, json.dumps(current, indent=1, sort_keys=True).encode())
