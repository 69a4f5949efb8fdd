"""Trains the whole bundled Fashion-MNIST family in one resumable command.

  python -m specdec_jax.app.train.family --workdir runs/family
  python -m specdec_jax.app.train.family --workdir runs/family --config.target.train_minutes=20

Stages (configs/family.py), run in this order whatever the order of
`config.stages`, each in its own sub-folder of --workdir and skipped when its
outputs exist and were made from the current outputs of the stages it reads
(`DEPENDS_ON`), so an interrupted run continues where it stopped (a stage
interrupted mid-training resumes from its checkpoints):

  tokenizer   patch k-means tokenizer and the token grids of both splits
  classifier  evaluation CNN (class accuracy, Frechet features)
  target      LlamaGen c2i target GPT
  draft_gpt   small LlamaGen GPT (independent draft model)
  eagle       EAGLE-1 head on the target's features
  bundle      assembles specdec_jax/assets/fashion_mnist (or --config.bundle_dir)

A stage that reads others records their fingerprints (`INPUTS_FILE` in its
folder) when it starts. Retraining a stage (its folder removed) therefore
retrains the stages that read it: their folders are removed first, and the
log says why. A stage folder without that record (a workdir from before such
records) is treated the same way, as stale: nothing tells which outputs it was
trained on, and a head paired with the wrong target fails only at sampling.

The run holds the lock of --workdir (`command.locked_workdir`) for all its
stages: a second run on the same workdir is refused, naming the holder. So is a
stage folder in use by a trainer run on its own, and that trainer while this runs.

Logs each stage's progress and the whole run's elapsed time and ETA (the
remaining stages' time budgets), and writes `family_manifest.json`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time

from absl import flags
from absl import logging
import numpy as np

from specdec_jax.app import cli
from specdec_jax.app import family as family_lib
from specdec_jax.app import files
from specdec_jax.app.train import classifier as train_classifier
from specdec_jax.app.train import command
from specdec_jax.app.train import drafter as train_drafter
from specdec_jax.app.train import gpt as train_gpt
from specdec_jax.app.train import kmeans_tokenizer
from specdec_jax.app.train import vq as train_vq
from specdec_jax.configs import family as family_config
from specdec_jax.converters import common
from specdec_jax.converters import lantern_drafter
from specdec_jax.converters import llamagen as llamagen_converter
from specdec_jax.converters import vq as vq_converter

STAGES = family_config.STAGES
MANIFEST = 'family_manifest.json'
INPUTS_FILE = 'stage_inputs.json'  # in a stage's folder: fingerprints of the stages it read
# The training stages each one reads (the bundle reads them all, through its manifest's
# `stage_fingerprints`); the classifier trains on the images alone.
DEPENDS_ON = {'target': ('tokenizer',), 'draft_gpt': ('tokenizer',),
              'eagle': ('tokenizer', 'target')}
OVERHEAD_MINUTES = {'tokenizer': 1.0, 'classifier': 0.5, 'target': 1.5, 'draft_gpt': 1.0,
                    'eagle': 1.5, 'bundle': 0.5}  # encoding, evaluation, compilation


def stage_dirs(workdir: str) -> dict:
  return {name: os.path.join(workdir, name) for name in STAGES if name != 'bundle'}


def stage_outputs(name: str, workdir: str) -> list:
  """The files whose presence marks a training stage finished."""
  d = stage_dirs(workdir)
  meta = common.META_FILENAME
  if name == 'tokenizer':
    return [os.path.join(d[name], train_vq.TOKENS_FILE),
            os.path.join(d[name], train_vq.TOKENIZER_DIR, meta)]
  if name == 'classifier':
    return [os.path.join(d[name], 'classifier', meta)]
  if name in ('target', 'draft_gpt'):
    return [os.path.join(d[name], train_gpt.MODEL_DIR, meta)]
  if name == 'eagle':
    return [os.path.join(d[name], train_drafter.DRAFTER_DIR, meta)]
  raise ValueError(f'unknown stage {name!r}; stages are {STAGES}.')


def stage_fingerprint(name: str, workdir: str) -> str | None:
  """sha256 of a training stage's output files; None when one is missing."""
  digest = hashlib.sha256()
  for path in stage_outputs(name, workdir):
    if not os.path.isfile(path):
      return None
    with open(path, 'rb') as f:
      for block in iter(lambda: f.read(1 << 20), b''):
        digest.update(block)
  return digest.hexdigest()


def stage_fingerprints(workdir: str) -> dict:
  """{stage: sha256 of its output files} for the training stages; None where missing.

  The bundle records these, so a retrained stage makes the bundle stale.
  """
  return {name: stage_fingerprint(name, workdir) for name in stage_dirs(workdir)}


def input_fingerprints(name: str, workdir: str) -> dict:
  """{stage read by `name`: its current fingerprint}."""
  return {dep: stage_fingerprint(dep, workdir) for dep in DEPENDS_ON.get(name, ())}


def record_inputs(name: str, workdir: str) -> None:
  """Writes the fingerprints of the stages `name` reads into its folder."""
  if not DEPENDS_ON.get(name):
    return
  folder = stage_dirs(workdir)[name]
  os.makedirs(folder, exist_ok=True)
  files.write_atomic(os.path.join(folder, INPUTS_FILE), json.dumps(
      {'inputs': input_fingerprints(name, workdir)}, indent=1).encode())


def stale_reason(name: str, workdir: str) -> str | None:
  """Why a training stage's folder no longer fits its inputs, or None when it does."""
  if not DEPENDS_ON.get(name):
    return None
  path = os.path.join(stage_dirs(workdir)[name], INPUTS_FILE)
  if not os.path.isfile(path):
    return (f'it has no record of the {list(DEPENDS_ON[name])} outputs it was trained on '
            f'({INPUTS_FILE}; a workdir from before such records)')
  recorded = read_json(path).get('inputs', {})
  changed = [dep for dep, digest in input_fingerprints(name, workdir).items()
             if recorded.get(dep) != digest]
  if changed:
    return f'{changed} changed (retrained) since it was trained'
  return None


def stage_done(name: str, workdir: str, bundle_dir: str) -> bool:
  """Whether a stage's final outputs exist, made from its current inputs (then it is skipped).

  The bundle is done when it was assembled from this workdir's current stage
  outputs (its manifest's `stage_fingerprints`); retraining any stage, or a
  bundle from another workdir, makes it run again.
  """
  if name == 'bundle':
    manifest = os.path.join(bundle_dir, 'manifest.json')
    if not (family_lib.bundle_available(bundle_dir) and os.path.isfile(manifest)):
      return False
    recorded = read_json(manifest)
    return (recorded.get('workdir') == os.path.abspath(workdir)
            and recorded.get('stage_fingerprints') == stage_fingerprints(workdir))
  return (all(os.path.isfile(path) for path in stage_outputs(name, workdir))
          and stale_reason(name, workdir) is None)


def planned_minutes(config, name: str) -> float:
  sub = config.get(name)
  minutes = float(sub.get('train_minutes', 0.0)) if sub is not None and hasattr(sub, 'get') else 0
  return minutes + OVERHEAD_MINUTES[name]


def run_stage(name: str, config, workdir: str, bundle_dir: str, splits) -> None:
  d = stage_dirs(workdir)
  tokens_path = os.path.join(d['tokenizer'], train_vq.TOKENS_FILE)
  if name == 'tokenizer':
    kmeans_tokenizer.train(config.tokenizer, d[name], *splits)
  elif name == 'classifier':
    (train_images, train_labels), (test_images, test_labels), _ = splits
    train_classifier.train(config.classifier, d[name], (train_images, train_labels),
                           (test_images, test_labels))
  elif name in ('target', 'draft_gpt'):
    sub = config[name]
    with sub.unlocked():
      sub.tokens_path = tokens_path
    train_gpt.train(sub, d[name], train_gpt.load_tokens(tokens_path))
  elif name == 'eagle':
    sub = config.eagle
    target_dir = os.path.join(d['target'], train_gpt.MODEL_DIR)
    with sub.unlocked():
      sub.tokens_path, sub.target_dir = tokens_path, target_dir
    target, target_params = llamagen_converter.load_llamagen(target_dir, dtype='float32')
    train_drafter.train(sub, d[name], target, target_params, train_gpt.load_tokens(tokens_path))
  elif name == 'bundle':
    assemble_bundle(config, workdir, bundle_dir)


def read_json(path: str) -> dict:
  with open(path) as f:
    return json.load(f)


def assemble_bundle(config, workdir: str, bundle_dir: str) -> str:
  """Writes the bundle from the stages' outputs, with a manifest of the whole run."""
  d = stage_dirs(workdir)
  tokenizer, tokenizer_params = vq_converter.load_tokenizer(
      os.path.join(d['tokenizer'], train_vq.TOKENIZER_DIR))
  target, target_params = llamagen_converter.load_llamagen(
      os.path.join(d['target'], train_gpt.MODEL_DIR), dtype='float32')
  draft_gpt, draft_gpt_params = llamagen_converter.load_llamagen(
      os.path.join(d['draft_gpt'], train_gpt.MODEL_DIR), dtype='float32')
  eagle, eagle_params = lantern_drafter.load_drafter(
      os.path.join(d['eagle'], train_drafter.DRAFTER_DIR), target_params['output']['kernel'])
  classifier_params, classifier_meta = common.load_params(os.path.join(d['classifier'],
                                                                       'classifier'))
  reference = np.load(os.path.join(d['classifier'], 'test_features.npz'))
  manifest = {
      'command': 'python -m specdec_jax.app.train.family ' + ' '.join(sys.argv[1:]),
      'workdir': os.path.abspath(workdir),
      'stage_fingerprints': stage_fingerprints(workdir),
      'data': read_json(os.path.join(d['tokenizer'], 'manifest.json')).get('data'),
  }
  for name in ('tokenizer', 'classifier', 'target', 'draft_gpt', 'eagle'):
    path = os.path.join(d[name], 'manifest.json')
    part = read_json(path) if os.path.isfile(path) else {}
    manifest[name] = {k: part.get(k) for k in ('config', 'steps', 'metrics', 'num_params',
                                               'date', 'training_sequences', 'wall_seconds')}
    manifest[name]['final_metrics'] = part.get('metrics')
  manifest['classifier']['final_metrics'] = read_json(
      os.path.join(d['classifier'], 'classifier_eval.json'))
  run_log = os.path.join(workdir, MANIFEST)
  if os.path.isfile(run_log):
    manifest['stage_wall_seconds'] = read_json(run_log).get('stage_wall_seconds')
  out = family_lib.write_bundle(
      bundle_dir, tokenizer=tokenizer, tokenizer_params=tokenizer_params, target=target,
      target_params=target_params, eagle=eagle, eagle_params=eagle_params,
      draft_gpt=draft_gpt, draft_gpt_params=draft_gpt_params,
      classifier_params=classifier_params,
      classifier_test_accuracy=float(classifier_meta.get('test_accuracy', float('nan'))),
      reference_mean=reference['mean'], reference_cov=reference['cov'], manifest=manifest,
      overwrite=True)
  logging.info('family: wrote the bundle to %s (%.1f MB)', out, directory_megabytes(out))
  return str(out)


def directory_megabytes(path) -> float:
  total = 0
  for root, _, names in os.walk(path):
    total += sum(os.path.getsize(os.path.join(root, name)) for name in names)
  return total / 1e6


def check_config(config) -> None:
  """Raises cli.ConfigError on stage names, budgets, step counts, batch sizes or
  probabilities no run can use."""
  unknown = [s for s in config.stages if s not in STAGES]
  if unknown:
    raise cli.ConfigError(f'config.stages has unknown names {unknown}; stages are {STAGES}.')
  if not isinstance(config.bundle_dir, str):
    raise cli.ConfigError(f'config.bundle_dir={config.bundle_dir!r}: must be a string (\'\' = '
                          'the package\'s bundle).')
  for stage in STAGES:
    if stage in config:
      command.check_train_config(config[stage], f'config.{stage}')
  for stage in ('target', 'draft_gpt'):  # their model shapes, before any stage trains
    if stage in config.stages:
      train_gpt.check_config(config[stage], f'config.{stage}')


def reads(name: str) -> tuple:
  """The stages whose outputs `name` uses."""
  return STAGES[:-1] if name == 'bundle' else DEPENDS_ON.get(name, ())


def why_run(name: str, workdir: str, bundle_dir: str, pending: list) -> str | None:
  """Why a selected stage runs now (given the earlier stages that run), or None."""
  rerun = [dep for dep in reads(name) if dep in pending]
  if rerun:
    return f'it reads {rerun}, which run now'
  if stage_done(name, workdir, bundle_dir):
    return None
  if name != 'bundle' and os.path.isdir(stage_dirs(workdir)[name]):
    return stale_reason(name, workdir) or 'unfinished; it resumes from its checkpoints'
  return 'its outputs are missing or out of date'


def stages_to_run(config, workdir: str, bundle_dir: str) -> list:
  """The selected stages that run now, in pipeline order (not `config.stages`' order)."""
  pending = []
  for name in (s for s in STAGES if s in config.stages):
    reason = why_run(name, workdir, bundle_dir, pending)
    if reason:
      logging.info('family: stage %s runs: %s', name, reason)
      pending.append(name)
  return pending


def check_inputs(pending: list, workdir: str) -> None:
  """Raises FileNotFoundError when a stage in `pending` reads the outputs of a stage
  that neither runs before it nor has them in `workdir`."""
  for index, name in enumerate(pending):
    missing = [dep for dep in DEPENDS_ON.get(name, ())
               if dep not in pending[:index] and stage_fingerprint(dep, workdir) is None]
    if missing:
      raise FileNotFoundError(
          f'family: stage {name} reads the outputs of {missing}, which are missing in '
          f'{workdir}; add {missing} to config.stages (or restore their folders).')


def remove_if_stale(name: str, workdir: str) -> None:
  """Removes a training stage's folder made from other inputs than the current ones, so
  that it trains afresh instead of resuming (or re-exporting) from stale checkpoints."""
  folder = stage_dirs(workdir).get(name)
  if folder is None:  # the bundle: refuses stages trained on other inputs than the current
    stale = [s for s in DEPENDS_ON
             if os.path.isdir(stage_dirs(workdir)[s]) and stale_reason(s, workdir)]
    if stale:
      raise cli.ConfigError(f'family: the bundle would pair stages trained on other inputs: '
                            f'{stale} ({stale_reason(stale[0], workdir)}); add {stale} '
                            'to config.stages to retrain them.')
    return
  check_inputs([name], workdir)
  reason = stale_reason(name, workdir) if os.path.isdir(folder) else None
  if reason:
    logging.warning('family: stage %s: removing %s to train it afresh: %s', name, folder,
                    reason)
    shutil.rmtree(folder)


def train_family(config, workdir: str) -> str | None:
  """Runs the selected stages in pipeline order, skipping finished ones whose inputs are
  unchanged; returns the bundle folder (None when config.stages has no 'bundle')."""
  check_config(config)
  bundle_dir = config.bundle_dir or str(family_lib.BUNDLE_DIR)
  os.makedirs(workdir, exist_ok=True)
  log_path = os.path.join(workdir, MANIFEST)
  run_log = read_json(log_path) if os.path.isfile(log_path) else {'stage_wall_seconds': {}}
  pending = stages_to_run(config, workdir, bundle_dir)
  check_inputs(pending, workdir)  # before any stage trains
  logging.info('family: stages to run %s (done: %s); planned %.0f min', pending,
               [s for s in STAGES if s in config.stages and s not in pending],
               sum(planned_minutes(config, s) for s in pending))
  splits = None
  began = time.time()
  for index, name in enumerate(pending):
    if splits is None and name in ('tokenizer', 'classifier'):
      splits = kmeans_tokenizer.load_splits(config.tokenizer)
    remaining = sum(planned_minutes(config, s) for s in pending[index:])
    logging.info('family: stage %d/%d %s; elapsed %.1f min, ETA %.1f min', index + 1,
                 len(pending), name, (time.time() - began) / 60, remaining)
    remove_if_stale(name, workdir)
    # A resumed stage adds to its earlier wall time; one started afresh (its
    # folder removed to retrain it) and the bundle (rewritten whole) do not.
    resumed = name != 'bundle' and os.path.isdir(stage_dirs(workdir)[name])
    earlier = run_log['stage_wall_seconds'].get(name, 0.0) if resumed else 0.0
    record_inputs(name, workdir)
    start = time.time()
    run_stage(name, config, workdir, bundle_dir, splits)
    run_log['stage_wall_seconds'][name] = earlier + time.time() - start
    run_log.update(command=list(sys.argv), config=config.to_dict())
    files.write_atomic(log_path, json.dumps(run_log, indent=1, default=str).encode())
  minutes = (time.time() - began) / 60
  if 'bundle' not in config.stages:
    logging.info('family: done in %.1f min; stages in %s (no bundle written: add \'bundle\' '
                 'to config.stages)', minutes, workdir)
    return None
  logging.info('family: done in %.1f min; bundle in %s', minutes, bundle_dir)
  return bundle_dir


def main(argv):
  del argv
  command.check_workdir(flags.FLAGS.workdir)
  with command.locked_workdir(flags.FLAGS.workdir):  # once for all stages (in its folders)
    for folder in stage_dirs(flags.FLAGS.workdir).values():  # a trainer run on a stage
      files.FolderLock(folder, break_flag=None).refuse_if_held()
    train_family(flags.FLAGS.config, flags.FLAGS.workdir)


CONFIG_FILE = os.path.abspath(family_config.__file__)


def define_flags() -> None:
  """Defines the flags (only when run as a program)."""
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file('config', CONFIG_FILE, 'Family configuration.')
  flags.DEFINE_string('workdir', 'runs/family', 'Output folder of the stages.')


if __name__ == '__main__':
  cli.run_command(main, define_flags, CONFIG_FILE, refusals=command.REFUSALS)
