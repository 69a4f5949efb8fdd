"""Shared training loop: optax AdamW, resumable Orbax checkpoints, progress logs.

Used by the training entry points in `specdec_jax.app.train` (classifier, VQ,
target GPT, drafters). A training job is a pure `step(state, batch, key) ->
(state, metrics)` plus a batch iterator; `fit` runs it, logs progress, saves
every `save_every` steps and resumes from the latest checkpoint in `workdir`.

A run records its config in its workdir, and a resume with another one is
refused (`run_record`), so a resumed run is the run its manifest describes.

Two learning-rate schedules: by step count (linear warm-up, cosine decay to
5% over `total_steps`), or by wall time (`TimeBudget`: linear warm-up over
steps, constant, then linear decay to 5% over the last fifth of the time
budget), so a run on a busy machine still ends on time with a decayed rate.
"""

from __future__ import annotations

import dataclasses
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

from specdec_jax.app import cli
from specdec_jax.app import files
from specdec_jax.app import run_record


FINAL_LR_SCALE = 0.05  # both schedules end at 5% of the peak rate


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  elapsed_s: jax.Array  # float32 training seconds so far (carried across resumes)


@dataclasses.dataclass(frozen=True)
class TimeBudget:
  """A wall-time learning-rate schedule: warm-up by steps, constant, decay by time.

  Attributes:
    minutes: the training budget; `fit` stops when it is spent.
    peak_lr: the constant rate after warm-up.
    warmup_steps: linear warm-up from 0 over this many steps.
    decay_fraction: the last fraction of the budget decays linearly to
      FINAL_LR_SCALE * peak_lr.
  """

  minutes: float
  peak_lr: float
  warmup_steps: int = 0
  decay_fraction: float = 0.2

  def __post_init__(self):
    if not self.minutes > 0 or not self.peak_lr > 0 or self.warmup_steps < 0 or not (
        0 < self.decay_fraction <= 1):
      raise ValueError(f'TimeBudget: need minutes > 0, peak_lr > 0, warmup_steps >= 0 and '
                       f'0 < decay_fraction <= 1; got {self}.')

  @property
  def seconds(self) -> float:
    return 60.0 * self.minutes

  def learning_rate(self, step: int, elapsed_s: float) -> float:
    """The rate for `step` after `elapsed_s` seconds of training."""
    rate = self.peak_lr * min(1.0, (step + 1) / max(self.warmup_steps, 1))
    decay_start = (1.0 - self.decay_fraction) * self.seconds
    if elapsed_s > decay_start:
      progress = min(1.0, (elapsed_s - decay_start) / (self.seconds - decay_start))
      rate *= 1.0 - (1.0 - FINAL_LR_SCALE) * progress
    return rate


def time_budget_from(config) -> TimeBudget | None:
  """`TimeBudget` of a trainer config with `train_minutes` > 0, else None (step schedule)."""
  minutes = float(config.get('train_minutes', 0.0) or 0.0)
  if minutes < 0:
    raise ValueError(f'config.train_minutes must be >= 0 (0 = step-count schedule), got {minutes}.')
  if minutes == 0:
    return None
  return TimeBudget(minutes=minutes, peak_lr=config.learning_rate,
                    warmup_steps=config.get('warmup_steps', 0))


def decays(params):
  """Which leaves weight decay shrinks: matrices and kernels (ndim >= 2), not norm gains
  or biases (LlamaGen's recipe, from nanoGPT; decaying a norm's gain pulls it to 0)."""
  return jax.tree_util.tree_map(lambda leaf: np.ndim(leaf) >= 2, params)


def _adamw_chain(learning_rate, *, b1: float, b2: float, weight_decay: float,
                 clip_norm: float | None) -> optax.GradientTransformation:
  parts = [optax.clip_by_global_norm(clip_norm)] if clip_norm else []
  # No mask without decay: the optimizer state keeps the tree runs without decay saved.
  parts.append(optax.adamw(learning_rate, b1=b1, b2=b2, weight_decay=weight_decay,
                           mask=decays if weight_decay else None))
  return optax.chain(*parts)


def adamw(learning_rate: float, *, total_steps: int, warmup_steps: int = 0,
          weight_decay: float = 0.0, b1: float = 0.9, b2: float = 0.95,
          clip_norm: float | None = 1.0,
          time_budget: bool = False) -> optax.GradientTransformation:
  """AdamW, optionally clipping the global norm, with its rate an injected hyperparameter;
  weight decay applies to leaves with ndim >= 2 only (`decays`).

  time_budget=False: linear warm-up and cosine decay over `total_steps`.
  time_budget=True: the rate starts at 0 and `fit` sets it every step from a
  `TimeBudget` (`set_learning_rate`).
  """
  if total_steps < 1 or warmup_steps < 0 or learning_rate <= 0:
    raise ValueError(f'adamw: need learning_rate > 0, total_steps >= 1, warmup_steps >= 0; got '
                     f'{learning_rate}, {total_steps}, {warmup_steps}.')
  if time_budget:
    schedule = 0.0
  else:
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, learning_rate, max(warmup_steps, 1), max(total_steps, warmup_steps + 1),
        end_value=learning_rate * FINAL_LR_SCALE)
  return optax.inject_hyperparams(
      _adamw_chain, static_args=('b1', 'b2', 'weight_decay', 'clip_norm'))(
          learning_rate=schedule, b1=b1, b2=b2, weight_decay=weight_decay, clip_norm=clip_norm)


def _is_injected(node) -> bool:
  # optax.inject_hyperparams' state (InjectStatefulHyperparamsState in current optax).
  return isinstance(node, tuple) and hasattr(node, 'hyperparams') and hasattr(node, 'inner_state')


def set_learning_rate(state: TrainState, rate: float) -> TrainState:
  """Sets the injected rate of every `adamw` inside the state's optimizer state."""
  value = jax.device_put(np.float32(rate), jax.devices()[0])

  def replace(node):
    if _is_injected(node):
      return node._replace(hyperparams=dict(node.hyperparams, learning_rate=value))
    return node

  opt_state = jax.tree_util.tree_map(
      replace, state.opt_state, is_leaf=_is_injected)
  return state.replace(opt_state=opt_state)


def learning_rate_of(state: TrainState) -> float:
  """The current injected rate (of the first `adamw` in the optimizer state)."""
  found = [n for n in jax.tree_util.tree_leaves(state.opt_state, is_leaf=_is_injected)
           if _is_injected(n)]
  if not found:
    raise ValueError('the optimizer state holds no injected learning rate (use training.adamw).')
  return float(found[0].hyperparams['learning_rate'])


def init_state(params, optimizer: optax.GradientTransformation) -> TrainState:
  """A fresh state with every array committed to the default device.

  Restored checkpoints come back committed; a fresh state must be too, or
  the compiled step is not reused after a resume in the same process (jit
  caches on committedness).
  """
  state = TrainState(step=jax.numpy.zeros((), jax.numpy.int32), params=params,
                     opt_state=optimizer.init(params),
                     elapsed_s=jax.numpy.zeros((), jax.numpy.float32))
  return jax.device_put(state, jax.devices()[0])


def fit(step_fn: Callable, state: TrainState, batches: Callable[[int], Iterator], *,
        num_steps: int, workdir: str, key: jax.Array, log_every: int = 50,
        save_every: int = 500, name: str = 'train',
        budget: TimeBudget | None = None, config=None,
        inputs: dict | None = None) -> tuple[TrainState, list[dict]]:
  """Runs step_fn until `num_steps` (or the time budget), resuming from `workdir`.

  Args:
    step_fn: jitted (state, batch, key) -> (state, metrics dict of scalars).
    state: the freshly initialised state (its structure is the restore target).
    batches: start_step -> iterator of batches (so a resumed run continues the
      data order deterministically).
    num_steps: total steps of the run.
    workdir: checkpoint folder (Orbax CheckpointManager, last 2 kept).
    key: base PRNG key; step i uses fold_in(key, i).
    budget: a wall-time schedule (the optimizer must be `adamw(...,
      time_budget=True)`); training stops when `budget.minutes` of training
      time (summed over resumes) are spent, or at `num_steps`.
    config: the trainer's config, recorded in `workdir` when the run starts and
      checked against the record when it resumes (`run_record.check_resume`).
    inputs: {name: hash} of the arrays the run reads (`files.tree_sha256` of the
      training data, the target's weights), recorded and checked with the config.
  Returns:
    (final state, history of logged metrics). The history is also written to
    `{name}_history.json` with every checkpoint; a resumed run keeps the entries
    up to the step it resumed from and appends to them.
  Raises:
    ValueError: log_every or save_every below 1.
    cli.ConfigError: the checkpoints come from a run with another config, or do
      not fit `state` (another model shape or optimizer).
  """
  _check_every(log_every=log_every, save_every=save_every)
  run_record.check_resume(workdir, config, inputs)
  os.makedirs(workdir, exist_ok=True)
  manager = ocp.CheckpointManager(run_record.checkpoint_dir(workdir),
                                  options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True))
  latest = manager.latest_step()
  if latest is not None and latest > num_steps:
    manager.close()
    raise cli.ConfigError(f'{name}: {workdir!r} holds a checkpoint of step {latest}, past '
                          f'config.num_steps={num_steps}; set num_steps to {latest} or more, '
                          'or use a new --workdir to train afresh.')
  if config is not None:
    run_record.record(workdir, config, name, resumed=latest is not None, inputs=inputs)
  if latest is not None:
    try:
      state = manager.restore(latest, args=ocp.args.StandardRestore(state))
    except ValueError as error:  # orbax: a stored shape or tree that the state does not have
      manager.close()
      lines = [line.strip() for line in str(error).splitlines() if line.strip()]
      reason = ' '.join(lines[:4])[:400] or type(error).__name__
      raise cli.ConfigError(
          f'{name}: the checkpoint of step {latest} in {run_record.checkpoint_dir(workdir)} does '
          f'not fit this run\'s model or optimizer ({reason}); resume with the config and the '
          'library version it was trained with (a run with weight decay saved before decay '
          'spared 1-D leaves has another optimizer state), or use a new --workdir to train '
          'afresh.') from error
    logging.info('%s: resumed from step %d in %s', name, latest, workdir)
  start = int(state.step)
  elapsed_before, began = float(state.elapsed_s), time.time()

  def elapsed() -> float:  # training seconds, including those before a resume
    return elapsed_before + time.time() - began

  history = _resumed_history(workdir, name, start) if latest is not None else []
  window, tick = [], time.time()

  def log_window(step: int) -> None:  # logs the steps since the last log, up to `step`
    nonlocal window, tick
    entry = _log_entry(name, window, step, num_steps, elapsed(), time.time() - tick, budget,
                       state)
    history.append(entry)
    window, tick = [], time.time()

  def save(step: int, **kw) -> None:  # a checkpoint and the history up to it
    manager.save(step, args=ocp.args.StandardSave(state.replace(
        elapsed_s=np.float32(elapsed()))), **kw)
    _write_history(workdir, name, history)

  for batch in batches(start):
    step = int(state.step)
    now = elapsed()
    out_of_time = budget is not None and now >= budget.seconds
    if step >= num_steps or out_of_time:
      if window:  # the steps since the last log (a time budget ends between logs)
        log_window(step)
      if out_of_time and step > start and manager.latest_step() != step:
        logging.info('%s: time budget of %.1f min spent at step %d', name, budget.minutes, step)
        save(step, force=True)
      break
    if budget is not None:
      state = set_learning_rate(state, budget.learning_rate(step, now))
    state, metrics = step_fn(state, batch, jax.random.fold_in(key, step))
    window.append(metrics)
    if (step + 1) % log_every == 0 or step + 1 == num_steps:
      log_window(step + 1)
    if (step + 1) % save_every == 0 or step + 1 == num_steps:
      save(step + 1)
  if window:  # the batches ran out between two logs
    log_window(int(state.step))
  state = state.replace(elapsed_s=np.float32(elapsed()))
  manager.wait_until_finished()
  _write_history(workdir, name, history)
  return state, history


def _check_every(**values) -> None:
  for field, value in values.items():
    if not (isinstance(value, (int, np.integer)) and value >= 1):
      raise ValueError(f'{field}={value!r}: must be an integer >= 1 (a number of steps); set '
                       f'config.{field} to 1 or more.')


def _history_path(workdir: str, name: str) -> str:
  return os.path.join(workdir, f'{name}_history.json')


def _write_history(workdir: str, name: str, history: list[dict]) -> None:
  files.write_atomic(_history_path(workdir, name), json.dumps(history, indent=1).encode())


def _resumed_history(workdir: str, name: str, step: int) -> list[dict]:
  """The logged entries of the earlier run up to the checkpoint resumed from (step)."""
  path = _history_path(workdir, name)
  if not os.path.isfile(path):
    return []
  with open(path) as f:
    return [entry for entry in json.load(f) if entry['step'] <= step]


def _log_entry(name: str, window: list, step: int, num_steps: int, now: float,
               seconds: float, budget: TimeBudget | None, state: TrainState) -> dict:
  """Logs the mean metrics of the steps in `window` (the last one is `step`)."""
  means = {k: float(np.mean([float(m[k]) for m in window])) for k in window[0]}
  rate = len(window) / max(seconds, 1e-9)
  if budget is not None:
    progress = (f'{now / 60:.1f}/{budget.minutes:.1f} min, '
                f'ETA {max(budget.seconds - now, 0) / 60:.1f} min, '
                f'lr {learning_rate_of(state):.2e}')
  else:
    progress = (f'{100 * step / num_steps:.1f}%, '
                f'ETA {(num_steps - step) / max(rate, 1e-9) / 60:.1f} min')
  logging.info('%s: step %d/%d (%s) %s  %.2f steps/s', name, step, num_steps, progress,
               ' '.join(f'{k}={v:.4f}' for k, v in means.items()), rate)
  return dict(step=step, elapsed_s=now, **means)


def epoch_batches(arrays: tuple, batch_size: int, seed: int) -> Callable[[int], Iterator]:
  """Shuffled minibatches of arrays (same first dim), reproducible from any step."""
  _check_every(batch_size=batch_size)
  num = arrays[0].shape[0]
  per_epoch = num // batch_size
  if per_epoch < 1:
    raise cli.ConfigError(f'config.batch_size={batch_size} exceeds the {num} training examples; '
                          f'set config.batch_size to at most {num}.')

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
