"""Sampling an evaluation set (FID / CLIP) on every device of a TPU pod or GPU cluster.

  python -m specdec_jax.sample --config configs/sample_fashion.py
  python -m specdec_jax.sample --config configs/sample_llamagen_c2i.py \
      --config.model.checkpoint=ckpts/gpt_xl_c2i --config.model.vq=ckpts/vq

Legend: N images, G global batch (images per decode call), b local batch
(rows of one process), L image tokens, K draft slots.

Every process runs the same command on JAX's multi-controller runtime
(`jax.distributed`): one global mesh over all devices, images over 'data',
the target over 'model'. Chunks of consecutive indices are spread over the
processes (`sample_plan`); each process decodes, writes and commits its own
chunks (`sample_output`), process 0 logs progress, and after a barrier
process 0 merges every chunk into samples.npz, metrics.jsonl and
summary.json. A restarted job, with any number of processes, skips the
committed chunks, also when it asks for more images (`sample_folder`: the
set is extended). Launch lines: docs/sampling.md.
"""

from __future__ import annotations

import json
import os
import time

from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P
from ml_collections import config_flags
import numpy as np

from specdec_jax import decode
from specdec_jax import logits as logits_lib
from specdec_jax import sharding
from specdec_jax.app import cli
from specdec_jax.app import compile_cache
from specdec_jax.app import config_checks
from specdec_jax.app import files
from specdec_jax.app import generate
from specdec_jax.app import host as host_lib
from specdec_jax.app import sample_folder
from specdec_jax.app import sample_model
from specdec_jax.app import sample_output
from specdec_jax.app import sample_plan
from specdec_jax.app import sample_processes
from specdec_jax.configs import sample_fashion

# Fields that never change an image: they stay out of the folder's fingerprint.
NOT_IN_FINGERPRINT = ('out_dir', 'write_png', 'xla_cpu_single_thread', 'stop_after_chunks',
                      'break_lock', 'allow_code_change', 'compilation_cache')

CONFIG_CHECKS = dict(
    model=dict(kind=cli.one_of(*sample_model.KINDS), bundle_dir=cli.STRING,
               checkpoint=cli.STRING, vq=cli.STRING, eagle=cli.STRING, draft_model=cli.STRING,
               dtype=cli.one_of('auto', 'float32', 'bfloat16', 'float16'),
               scan_layers=cli.BOOL),
    method=cli.one_of(*sample_model.METHODS), hparams=config_checks.HYPERPARAMETERS,
    sampling=config_checks.SAMPLING, classes=cli.integers(0), prompts=cli.STRING,
    num_images=cli.integer(1), batch_per_device=cli.integer(1), attention_phases=cli.integer(1),
    model_parallel=cli.integer(1), seed=cli.integer(0, config_checks.MAX_KEY_SEED),
    out_dir=cli.NONEMPTY_STRING, chunk_size=cli.integer(1), write_png=cli.BOOL,
    xla_cpu_single_thread=cli.BOOL, fast_compile=cli.BOOL, stop_after_chunks=cli.integer(0),
    break_lock=cli.BOOL, allow_code_change=cli.BOOL, compilation_cache=cli.STRING)


def check_config(config) -> None:
  """Raises cli.ConfigError on values no run can use, before JAX starts."""
  cli.check_fields(config, CONFIG_CHECKS)
  config_checks.check_output_folder(config.out_dir, 'config.out_dir')
  sample_model.check_model_config(config.model)
  sample_model.check_method_drafter(config)


def settings(config) -> dict:
  """The config's fields that go into the fingerprint as they are."""
  return {k: v for k, v in config.to_dict().items()
          if k not in NOT_IN_FINGERPRINT + ('classes', 'prompts', 'model')}


def fingerprint(config, identity: dict, conditions: sample_model.Conditions) -> dict:
  """What the images depend on; a restart into the folder must match it."""
  fields = settings(config)
  fields['model'] = identity  # checkpoint metadata hashes, not paths
  fields['conditions'] = conditions.identity  # the classes, or the prompt file's hash
  fields['platform'] = jax.default_backend()  # float results differ across backends
  fields['code'] = sample_folder.code_identity()  # another version may give other images
  return json.loads(json.dumps(fields, default=str))


def global_keys(indices: np.ndarray, seed: int, row_sharding: NamedSharding) -> jax.Array:
  """Per-image keys [G], fold_in(key(seed), i) (the engine's own per-image-key
  convention), as one array over the mesh's 'data' axis."""
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(seed), i))(jnp.asarray(indices))
  data = np.asarray(jax.random.key_data(keys))
  spec = P(sharding.DATA, *([None] * (data.ndim - 1)))
  return jax.random.wrap_key_data(jax.device_put(data, NamedSharding(row_sharding.mesh, spec)))


def rows_of(array: jax.Array, rows: list[int]) -> np.ndarray:
  """The given global rows of an array [G, ...], read from this process's shards."""
  found = {}
  for shard in array.addressable_shards:
    start = shard.index[0].start or 0
    for offset, row in enumerate(np.asarray(shard.data)):
      found.setdefault(start + offset, row)
  return np.asarray([found[r] for r in rows], array.dtype).reshape((len(rows),) + array.shape[1:])


def image_records(index: np.ndarray, conditions: sample_model.Conditions,
                  metrics: dict) -> list[dict]:
  """Per-image metric dicts (metrics.jsonl lines) from host metric arrays [n] or [n, K]."""
  values = conditions.values(sample_plan.StepPlan(index).condition_ids(conditions.count))
  # Committed tokens, as the main command counts: a last step's drafts accepted
  # past the image's last token are not tokens of the image.
  tokens_per_forward = metrics['committed_tokens'] / np.maximum(metrics['verify_steps'], 1)
  records = []
  for j, (i, value) in enumerate(zip(index, values)):
    records.append({
        'index': int(i), conditions.name: int(value),
        'tokens_per_forward': float(tokens_per_forward[j]),
        'target_forwards': int(metrics['target_forwards'][j]),
        'draft_forwards': int(metrics['draft_forwards'][j]),
        'verify_steps': int(metrics['verify_steps'][j]),
        'committed_tokens': int(metrics['committed_tokens'][j]),
        'accepted_per_position': metrics['accepted_per_position'][j].tolist()})
  return records


class Sampler:
  """One process's share of the job: the model, the method, the mesh and the plan."""

  def __init__(self, config):
    self.config = config
    self.family, identity = sample_model.load(config.model)
    config_checks.check_for_family(config.hparams, self.family, 'config.hparams',
                                   (config.method,))
    self.method = sample_model.build_method(config, self.family)
    self.conditions = sample_model.conditions(config, self.family)
    self.fingerprint = fingerprint(config, identity, self.conditions)
    # A folder sampled before the identity left out conversion dates and paths.
    self.older_model = sample_model.identity(config.model, identity.get('dtype'), True)
    self.sampling = logits_lib.Sampling(**config.sampling.to_dict())
    if jax.device_count() % config.model_parallel:
      raise cli.ConfigError(f'config.model_parallel={config.model_parallel} does not divide '
                            f'the {jax.device_count()} devices.')
    data = jax.device_count() // config.model_parallel
    self.mesh = sharding.make_mesh(data=data, model=config.model_parallel)
    self.global_batch = config.batch_per_device * data
    self.row_sharding = NamedSharding(self.mesh, P(sharding.DATA))
    self.rows = sample_plan.rows_by_process(
        self.row_sharding.devices_indices_map((self.global_batch,)), self.global_batch)
    self.my_rows = self.rows[jax.process_index()]
    self.writers = [p for p, rows in enumerate(self.rows) if rows]
    self.local_batch = len(self.rows[self.writers[0]])
    self.decode_images = sample_model.image_decoder(self.family, config.batch_per_device)
    self.options = decode.FAST_COMPILE if config.fast_compile else None
    # Rule leaves (neighbour tables, embeddings) as host arrays: a process-local
    # device array cannot enter a program over every process's devices.
    self.rule = jax.tree.map(np.asarray, self.method.rule)
    self.placed = None  # (target, drafter) parameters on the mesh: `placed_params`

  def placed_params(self, draft_params) -> tuple:
    """(target, drafter or None) parameters on the mesh, placed once, at the first step
    (draft_params: the method's drafter's, the same every step): `decode.generate`
    copies host and single-device leaves onto the mesh on every call. Not in
    __init__: the placement is a collective over the processes, and `agreed`'s load
    step must hold none (a process that failed to load skips it)."""
    if self.placed is None:
      self.placed = (sharding.shard_params(self.family.target_params, self.mesh),
                     None if draft_params is None
                     else sharding.shard_params(draft_params, self.mesh))
    return self.placed

  def decode_step(self, step: sample_plan.StepPlan):
    """One global decode call; this process's rows: (tokens int32[b, L], metrics)."""
    cond = self.conditions.cond(step.condition_ids(self.conditions.count))
    kwargs = generate.decode_kwargs(self.method, self.family, cond, self.sampling, self.options)
    kwargs['rule'] = self.rule
    target_params, draft_params = self.placed_params(kwargs.get('draft_params'))
    if draft_params is not None:
      kwargs['draft_params'] = draft_params
    if 'draft_cond' in kwargs:
      kwargs['draft_cond'] = jax.tree.map(np.asarray, kwargs['draft_cond'])
    # Host arrays: decode.generate places them on the global mesh.
    rows = jax.tree.map(np.asarray, generate.cond_rows(self.family.target,
                                                       self.family.target_params, cond,
                                                       self.sampling))
    result = decode.generate(
        self.family.target, target_params, rows, mesh=self.mesh,
        key=global_keys(step.key_indices(), self.config.seed, self.row_sharding),
        attention_phases=self.config.attention_phases, **kwargs)
    metrics = result.metrics.replace(counts=rows_of(result.metrics.counts, self.my_rows)).by_name()
    return rows_of(result.tokens, self.my_rows), metrics, result.compile_seconds

  def run_round(self, chunks: list) -> float:
    """Decodes one round (every process its chunk) and commits this process's chunk.

    Returns:
      compile seconds spent in this round.
    """
    config, compile_s = self.config, 0.0
    steps = sample_plan.steps_per_chunk(config.chunk_size, self.local_batch)
    tokens, metrics, index = [], [], []
    for s in range(steps):
      sample_processes.exit_if_stopped()  # a SIGTERM whose SystemExit a callback dropped
      step = sample_plan.step_plan(chunks, s, self.rows, config.num_images, config.chunk_size)
      step_tokens, step_metrics, seconds = self.decode_step(step)
      compile_s += seconds
      real = step.index[self.my_rows] >= 0
      tokens.append(step_tokens[real])
      metrics.append({k: v[real] for k, v in step_metrics.items()})
      index.append(step.index[self.my_rows][real])
    chunk = chunks[jax.process_index()]

    def commit():
      if chunk is not None:
        index_ = np.concatenate(index)
        metrics_ = {k: np.concatenate([m[k] for m in metrics]) for k in metrics[0]}
        sample_output.commit_chunk(config.out_dir, chunk, index_,
                                   self.decode_images(np.concatenate(tokens)),
                                   image_records(index_, self.conditions, metrics_),
                                   jax.process_index(), config.write_png)

    sample_processes.agreed('commit its chunk', commit)
    return compile_s


def prepare_folder(config, fingerprint_: dict, older_model: dict | None = None) -> list[int]:
  """Checks/creates the output folder (the caller holds its lock); returns the chunks
  still to do (all processes get process 0's list). older_model: the model identity
  in the form older folders recorded (`sample_model.identity`'s whole_files).

  Process 0 verifies every committed chunk (`sample_output.chunk_problem`):
  one whose manifest or files are damaged or missing, or whose images do not
  fill its range now, is logged and redone; with write_png, a whole chunk's
  missing or damaged PNGs are written from its .npz.
  """
  out_dir, first = config.out_dir, jax.process_index() == 0
  tolerated = ('code',) if config.allow_code_change else ()
  # With another version's folder, a setting added since is accepted at its default.
  restart = sample_processes.agreed('check the output folder', lambda: sample_folder.check_folder(
      out_dir, fingerprint_, tolerated, record=first,
      defaults=settings(sample_fashion.get_config()), older_forms=dict(model=older_model)))
  ranges = chunk_ranges(config)

  def committed_chunks() -> np.ndarray:
    sample_output.remove_temporaries(out_dir)
    if not restart:
      sample_output.write_json(os.path.join(out_dir, sample_output.CONFIG), dict(
          fingerprint=fingerprint_, config=config.to_dict(), jax_version=jax.__version__))
    done, pngs = np.zeros((len(ranges),), bool), 0
    for chunk, expected in enumerate(ranges):
      problem = sample_output.chunk_problem(out_dir, chunk, expected)
      if problem not in (None, sample_output.NOT_WRITTEN):
        logging.warning('chunk %d (images %d..%d) will be redone: %s', chunk, expected.start,
                        expected.stop - 1, problem)
        sample_output.chunk_stem(out_dir, chunk).with_suffix('.json').unlink(missing_ok=True)
      done[chunk] = problem is None
      if done[chunk] and config.write_png:
        pngs += sample_output.repair_pngs(out_dir, chunk)
    if pngs:
      logging.info('wrote %d missing or damaged PNGs of committed chunks', pngs)
    if not done.all():  # an earlier set's merged files are stale until this run merges
      sample_output.remove_merged(out_dir)
    return done

  done = sample_processes.agreed('check the committed chunks', committed_chunks,
                                 process_0_only=True)
  done = np.asarray(multihost_utils.broadcast_one_to_all(
      done if first else np.zeros((len(ranges),), bool)))
  return [c for c in range(len(ranges)) if not done[c]]


def chunk_ranges(config) -> list[range]:
  return [sample_plan.chunk_range(c, config.num_images, config.chunk_size)
          for c in range(sample_plan.num_chunks(config.num_images, config.chunk_size))]


def run(config) -> dict | None:
  """Samples (the rest of) the set and merges it; returns the summary (process 0,
  None elsewhere, or when stopped early by config.stop_after_chunks)."""
  started = time.perf_counter()
  check_config(config)
  created = files.missing_folders(config.out_dir)
  lock = sample_processes.lock_folder(config.out_dir, config.break_lock)  # a second job stops
  try:
    return _run_locked(config, started)
  finally:
    if lock is not None:
      lock.release()
      files.remove_empty(created)  # refused before writing (e.g. a class the model lacks)


def _run_locked(config, started: float) -> dict | None:
  sampler = sample_processes.agreed('load the model and the method', lambda: Sampler(config))
  # The fingerprint, and where the job stops (a process stopping alone waits for ever).
  sample_processes.check_same_settings(
      dict(sampler.fingerprint, stop_after_chunks=config.stop_after_chunks))
  pending = prepare_folder(config, sampler.fingerprint, sampler.older_model)
  ranges, process_count = chunk_ranges(config), jax.process_count()
  schedule = sample_plan.rounds(pending, sampler.writers, process_count)
  if jax.process_index() == 0:
    logging.info('%d images, %d chunks of %d (%d to do) over %d processes, %d devices; '
                 'global batch %d; method %s', config.num_images, len(ranges),
                 config.chunk_size, len(pending), process_count, jax.device_count(),
                 sampler.global_batch, config.method)
  loop_start, compile_s, done_now, chunks_now = time.perf_counter(), 0.0, 0, 0
  remaining = sum(len(ranges[c]) for c in pending)
  for number, chunks in enumerate(schedule):
    compile_s += sampler.run_round(chunks)
    sample_processes.stop_if_preempted(number)  # SIGTERM: all processes stop after this round
    done_now += sum(len(ranges[c]) for c in chunks if c is not None)
    chunks_now += sum(c is not None for c in chunks)
    elapsed = time.perf_counter() - loop_start
    rate = done_now / max(elapsed - compile_s, 1e-9)
    if jax.process_index() == 0:
      logging.info('round %d/%d: %d/%d images done (%d this run), %.2f images/s, ETA %.0f s',
                   number + 1, len(schedule), config.num_images - remaining + done_now,
                   config.num_images, done_now, rate, (remaining - done_now) / rate)
    if config.stop_after_chunks and chunks_now >= config.stop_after_chunks:
      logging.info('stopping after %d chunks (config.stop_after_chunks); rerun to finish.',
                   chunks_now)
      multihost_utils.sync_global_devices('sample: stopped')
      return None
  loop_s = time.perf_counter() - loop_start
  multihost_utils.sync_global_devices('sample: every chunk committed')

  def merged() -> dict:
    records = sample_output.merge(config.out_dir, ranges)
    summary = dict(
        num_images=config.num_images, images_this_run=done_now,
        images_per_s=done_now / max(loop_s - compile_s, 1e-9),
        tokens_per_s=done_now * sampler.family.num_tokens / max(loop_s - compile_s, 1e-9),
        mean_tokens_per_forward=float(np.mean([r['tokens_per_forward'] for r in records])),
        mean_target_forwards=float(np.mean([r['target_forwards'] for r in records])),
        wall_s=time.perf_counter() - started, decode_loop_s=loop_s, compile_s=compile_s,
        processes=process_count, devices=jax.device_count(), backend=jax.default_backend(),
        host=host_lib.describe(),
        global_batch=sampler.global_batch, config=config.to_dict(),
        code=sampler.fingerprint['code'],
        samples_sha256=files.sha256(os.path.join(config.out_dir, sample_output.SAMPLES)))
    sample_output.write_summary(config.out_dir, summary)
    rate = summary['images_per_s']
    logging.info('wrote %s: %d images, %s images/s, %.2f tokens per target forward',
                 config.out_dir, config.num_images, 'unmeasured' if rate is None else
                 f'{rate:.2f}', summary['mean_tokens_per_forward'])
    return summary

  return sample_processes.agreed('merge the chunks', merged, process_0_only=True)


def define_flags() -> None:
  """Defines the flags (only when run as a program)."""
  config_flags.DEFINE_config_file('config', os.path.abspath(sample_fashion.__file__),
                                  'Sampling configuration (configs/sample_*.py).')
  flags.DEFINE_enum('distributed', 'auto', ['auto', 'true', 'false'],
                    'Call jax.distributed.initialize(): auto = when a coordinator is given or '
                    'SLURM runs several tasks; true = always (Cloud TPU pods: JAX detects '
                    'the rest); false = never.')
  flags.DEFINE_string('coordinator_address', None, 'host:port of process 0 (no auto-detection).')
  flags.DEFINE_integer('num_processes', None, 'Number of processes (no auto-detection).')
  flags.DEFINE_integer('process_id', None, 'This process, 0 .. num_processes - 1.')


def main(argv):
  del argv
  with sample_processes.sigterm_stops_the_job():  # a stopped job releases its folder's lock
    config, values = flags.FLAGS.config, flags.FLAGS
    check_config(config)  # before the coordinator waits for the other processes
    if config.xla_cpu_single_thread and not generate.use_single_thread_xla():
      logging.warning('JAX already started; xla_cpu_single_thread has no effect.')
    compile_cache.enable(config.compilation_cache)
    sample_processes.initialize_distributed(values.distributed, values.coordinator_address,
                                            values.num_processes, values.process_id)
    run(config)


if __name__ == '__main__':
  cli.run_command(main, define_flags, os.path.abspath(sample_fashion.__file__),
                  refusals=(files.FolderLockedError, sample_processes.ProcessFailedError))
