"""The config a training run records in its workdir, and the check a resume passes.

`training.fit` records the trainer's config in `workdir/run_config.json` when a
run starts; a resume whose config differs in a field that shapes the training
(model, optimizer, data source, seed) is refused, naming each field, so a
resumed run is the run its manifest describes. So is what the run reads
(`inputs`: `files.tree_sha256` of the arrays it trains on and, for an EAGLE
head, of the target's weights; not the files' sha256 the manifests record),
compared where the record holds them. The length (`num_steps`,
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
# compared through the trainers' `inputs` hashes).
RESUMABLE_FIELDS = frozenset({'log_every', 'save_every', 'eval_batch_size', 'eval_examples',
                              'fast_compile'})
LENGTH_FIELDS = frozenset({'num_steps', 'train_minutes'})  # may change: logged, re-recorded
INPUTS_PREFIX = 'inputs:'  # the record's keys of the inputs' hashes


def checkpoint_dir(workdir: str) -> str:
  """The Orbax checkpoint folder of a training workdir."""
  return os.path.abspath(os.path.join(workdir, 'checkpoints'))


def has_checkpoints(workdir: str) -> bool:
  """Whether `workdir` holds a finished checkpoint (a step folder; not a killed save's
  `N.orbax-checkpoint-tmp`)."""
  folder = checkpoint_dir(workdir)
  return os.path.isdir(folder) and any(n.isdigit() for n in os.listdir(folder))


def _compared_fields(config, inputs: dict | None = None) -> dict:
  """{dotted field: JSON value} of a config (ConfigDict or dict), without the fields
  a resumed run may change (RESUMABLE_FIELDS, `*_path`, `*_dir`), and of `inputs`
  under INPUTS_PREFIX."""
  fields = files.dotted_fields(config.to_dict() if hasattr(config, 'to_dict') else config)
  fields = {name: value for name, value in fields.items()
            if not (name.split('.')[-1] in RESUMABLE_FIELDS or name.endswith(('_path', '_dir')))}
  fields.update(files.dotted_fields(inputs or {}, INPUTS_PREFIX))
  return {name: json.loads(json.dumps(value, default=str)) for name, value in fields.items()}


def _described(field: str, value) -> str:
  if field.startswith(INPUTS_PREFIX):
    return f'input {field[len(INPUTS_PREFIX):]} {value!r}'
  return f'config.{field}={value!r}'


def _schedule_kind_changed(recorded, current, field: str) -> bool:
  """train_minutes 0 (step schedule) against > 0 (time budget): another schedule,
  not another length."""
  return field.split('.')[-1] == 'train_minutes' and (not recorded) != (not current)


def check_resume(workdir: str, config, inputs: dict | None = None) -> None:
  """Raises cli.ConfigError when `workdir` holds checkpoints of a run whose recorded
  config (RUN_CONFIG_FILE) differs from `config` in a field that shapes the training,
  or whose recorded `inputs` ({name: hash of arrays the run reads}) differ.

  A resumed run continues the recorded one step for step, so another learning
  rate, batch size, seed, model shape or data source would make a run that
  neither config describes. LENGTH_FIELDS may change (`record` logs it), but not
  train_minutes between 0 and > 0 (the step and the time schedules). Nothing
  to check without checkpoints, or for a workdir from before such records
  (`record` logs that); inputs a record does not hold are not compared.
  """
  path = os.path.join(workdir, RUN_CONFIG_FILE)
  if config is None or not has_checkpoints(workdir) or not os.path.isfile(path):
    return
  with open(path) as f:
    recorded = json.load(f)
  current = _compared_fields(config, inputs)
  compared = {k for k in set(recorded) | set(current)  # inputs: where both sides know them
              if not k.startswith(INPUTS_PREFIX) or (k in recorded and k in current)}
  changed = sorted(k for k in compared if recorded.get(k) != current.get(k)
                   and (k.split('.')[-1] not in LENGTH_FIELDS or _schedule_kind_changed(
                       recorded.get(k), current.get(k), k)))
  if changed:
    listed = ', '.join(f'{_described(k, current.get(k))} (the checkpoints\' run: '
                       f'{recorded.get(k)!r})' for k in changed)
    raise cli.ConfigError(
        f'{workdir!r} holds checkpoints of a run with another config or input files: {listed}. '
        f'Resume with the recorded values and files ({path}), or use a new --workdir to train '
        'afresh.')


def record(workdir: str, config, name: str, resumed: bool, inputs: dict | None = None) -> None:
  """Writes RUN_CONFIG_FILE (config and `inputs`) for a new run, or for a resumed one
  whose length changed or whose record lacked inputs."""
  path = os.path.join(workdir, RUN_CONFIG_FILE)
  current = _compared_fields(config, inputs)
  if resumed:
    if not os.path.isfile(path):
      logging.warning('%s: %s has no %s (a workdir from before such records); the config '
                      'is not checked against its checkpoints', name, workdir, RUN_CONFIG_FILE)
      return
    with open(path) as f:
      recorded = json.load(f)
    current.update({k: v for k, v in recorded.items()  # inputs this caller did not pass
                    if k.startswith(INPUTS_PREFIX) and k not in current})
    if recorded == current:
      return
    lengths = [f'{k} {recorded.get(k)} -> {current.get(k)}' for k in sorted(current)
               if recorded.get(k) != current.get(k) and not k.startswith(INPUTS_PREFIX)]
    if lengths:
      logging.warning('%s: resumed with another length (%s); the learning-rate schedule from '
                      'here on follows it', name, ', '.join(lengths))
  files.write_atomic(path, json.dumps(current, indent=1, sort_keys=True).encode())
