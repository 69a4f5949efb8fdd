"""Shared training loop: optax AdamW, resumable Orbax checkpoints, progress logs.

Used by the training entry points in `specdec_jax.train` (classifier, VQ,
target GPT, drafters). A training job is a pure `step(state, batch, key) ->
(state, metrics)` plus a batch iterator; `fit` runs it, logs progress, saves
every `save_every` steps and resumes from the latest checkpoint in `workdir`.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Iterator

from absl import logging
import flax.struct
import jax
import numpy as np
import optax
import orbax.checkpoint as ocp


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


def adamw(learning_rate: float, *, total_steps: int, warmup_steps: int = 0,
          weight_decay: float = 0.0, b1: float = 0.9, b2: float = 0.95,
          clip_norm: float | None = 1.0) -> optax.GradientTransformation:
  """AdamW with linear warm-up and cosine decay, optionally clipping the global norm."""
  if total_steps < 1 or warmup_steps < 0 or learning_rate <= 0:
    raise ValueError(f'adamw: need learning_rate > 0, total_steps >= 1, warmup_steps >= 0; got '
                     f'{learning_rate}, {total_steps}, {warmup_steps}.')
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, learning_rate, max(warmup_steps, 1), max(total_steps, warmup_steps + 1),
      end_value=learning_rate * 0.05)
  parts = [optax.clip_by_global_norm(clip_norm)] if clip_norm else []
  parts.append(optax.adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay))
  return optax.chain(*parts)


def init_state(params, optimizer: optax.GradientTransformation) -> TrainState:
  """A fresh state with every array committed to the default device.

  Restored checkpoints come back committed; a fresh state must be too, or
  the compiled step is not reused after a resume in the same process (jit
  caches on committedness).
  """
  state = TrainState(step=jax.numpy.zeros((), jax.numpy.int32), params=params,
                     opt_state=optimizer.init(params))
  return jax.device_put(state, jax.devices()[0])


def define_train_flags() -> None:
  """--config and --workdir of a training entry point (defined only when run as a
  program, so importing several trainers in one process does not clash)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file('config', None, 'Training configuration.')
  flags.DEFINE_string('workdir', None, 'Output folder.')
  flags.mark_flags_as_required(['config', 'workdir'])


def fit(step_fn: Callable, state: TrainState, batches: Callable[[int], Iterator], *,
        num_steps: int, workdir: str, key: jax.Array, log_every: int = 50,
        save_every: int = 500, name: str = 'train') -> tuple[TrainState, list[dict]]:
  """Runs step_fn until `num_steps`, resuming from `workdir` if it has a checkpoint.

  Args:
    step_fn: jitted (state, batch, key) -> (state, metrics dict of scalars).
    state: the freshly initialised state (its structure is the restore target).
    batches: start_step -> iterator of batches (so a resumed run continues the
      data order deterministically).
    num_steps: total steps of the run.
    workdir: checkpoint folder (Orbax CheckpointManager, last 2 kept).
    key: base PRNG key; step i uses fold_in(key, i).
  Returns:
    (final state, history of logged metrics).
  """
  os.makedirs(workdir, exist_ok=True)
  manager = ocp.CheckpointManager(
      os.path.abspath(os.path.join(workdir, 'checkpoints')),
      options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True))
  latest = manager.latest_step()
  if latest is not None:
    state = manager.restore(latest, args=ocp.args.StandardRestore(state))
    logging.info('%s: resumed from step %d in %s', name, latest, workdir)
  start = int(state.step)
  history = []
  window, tick = [], time.time()
  for batch in batches(start):
    step = int(state.step)
    if step >= num_steps:
      break
    state, metrics = step_fn(state, batch, jax.random.fold_in(key, step))
    window.append(metrics)
    if (step + 1) % log_every == 0 or step + 1 == num_steps:
      means = {k: float(np.mean([float(m[k]) for m in window])) for k in window[0]}
      rate = len(window) / max(time.time() - tick, 1e-9)
      logging.info('%s: step %d/%d (%.1f%%) %s  %.2f steps/s', name, step + 1, num_steps,
                   100 * (step + 1) / num_steps,
                   ' '.join(f'{k}={v:.4f}' for k, v in means.items()), rate)
      history.append(dict(step=step + 1, **means))
      window, tick = [], time.time()
    if (step + 1) % save_every == 0 or step + 1 == num_steps:
      manager.save(step + 1, args=ocp.args.StandardSave(state))
  manager.wait_until_finished()
  with open(os.path.join(workdir, f'{name}_history.json'), 'w') as f:
    json.dump(history, f, indent=1)
  return state, history


def epoch_batches(arrays: tuple, batch_size: int, seed: int) -> Callable[[int], Iterator]:
  """Shuffled minibatches of arrays (same first dim), reproducible from any step."""
  num = arrays[0].shape[0]
  per_epoch = num // batch_size
  if per_epoch < 1:
    raise ValueError(f'batch_size {batch_size} exceeds the {num} examples.')

  def iterate(start_step: int):
    step = start_step
    while True:
      epoch, offset = divmod(step, per_epoch)
      order = np.random.default_rng(seed + epoch).permutation(num)
      for i in range(offset, per_epoch):
        index = order[i * batch_size:(i + 1) * batch_size]
        yield tuple(a[index] for a in arrays)
        step += 1

  return iterate
