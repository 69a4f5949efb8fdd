"""The one-command family trainer: stage order, skipping finished stages, bad stage names."""

import json
import os
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest
import numpy as np

from specdec_jax.app import cli
from specdec_jax.app import family as family_lib
from specdec_jax.app.train import family as train_family
from specdec_jax.app.train import kmeans_tokenizer
from specdec_jax.configs import family as family_config
from tests import test_generate

_replace = os.replace


def _tiny_splits(config):
  del config
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (40, 8, 8, 1)).astype(np.uint8)
  labels = rng.integers(0, 10, 40).astype(np.int32)
  return (images[:30], labels[:30]), (images[30:], labels[30:]), {'synthetic': True}


class _Runs(list):
  stale_checkpoints: list


def _fake_stage(runs: _Runs):
  """A run_stage writing distinct outputs (and noting stages whose old checkpoints remain)."""
  runs.stale_checkpoints = []

  def run(name, config, workdir, bundle_dir, splits):
    del config, bundle_dir, splits
    runs.append(name)
    if os.path.isdir(os.path.join(train_family.stage_dirs(workdir)[name], 'checkpoints')):
      runs.stale_checkpoints.append(name)
    for path in train_family.stage_outputs(name, workdir):
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, 'w') as f:
        f.write(f'{name} {os.urandom(8).hex()}')

  return run


def _tokenizer_only_config():
  """The family config running only a tiny tokenizer stage."""
  config = family_config.get_config()
  config.stages = ('tokenizer',)
  config.tokenizer.update(codebook_size=8, num_patches=500, iterations=2, eval_batch_size=16)
  return config


class FamilyTrainerTest(absltest.TestCase):

  def test_runs_a_stage_then_skips_it_when_its_outputs_exist(self):
    config = _tokenizer_only_config()
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(
        kmeans_tokenizer, 'load_splits', side_effect=_tiny_splits):
      workdir, bundle = os.path.join(tmp, 'work'), os.path.join(tmp, 'bundle')
      config.bundle_dir = bundle
      self.assertFalse(train_family.stage_done('tokenizer', workdir, bundle))
      train_family.train_family(config, workdir)
      self.assertTrue(train_family.stage_done('tokenizer', workdir, bundle))
      self.assertTrue(os.path.isfile(os.path.join(workdir, train_family.MANIFEST)))
      with mock.patch.object(kmeans_tokenizer, 'train', side_effect=AssertionError('rerun')):
        train_family.train_family(config, workdir)  # finished: not run again
      for stage in ('classifier', 'target', 'draft_gpt', 'eagle', 'bundle'):
        self.assertFalse(train_family.stage_done(stage, workdir, bundle))

  def test_bundle_is_stale_after_a_stage_is_retrained(self):
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(
        train_family.family_lib, 'bundle_available', return_value=True):
      workdir, bundle = os.path.join(tmp, 'work'), os.path.join(tmp, 'bundle')
      for name in train_family.STAGES[:-1]:
        for path in train_family.stage_outputs(name, workdir):
          os.makedirs(os.path.dirname(path), exist_ok=True)
          with open(path, 'w') as f:
            f.write(name)
      os.makedirs(bundle)

      def write_manifest(**fields):
        with open(os.path.join(bundle, 'manifest.json'), 'w') as f:
          json.dump(fields, f)

      write_manifest(workdir=os.path.abspath(workdir),
                     stage_fingerprints=train_family.stage_fingerprints(workdir))
      self.assertTrue(train_family.stage_done('bundle', workdir, bundle))
      target_meta = train_family.stage_outputs('target', workdir)[0]
      with open(target_meta, 'w') as f:
        f.write('retrained')
      self.assertFalse(train_family.stage_done('bundle', workdir, bundle))
      # A bundle from before fingerprints, or from another workdir, is stale too.
      write_manifest(workdir=os.path.abspath(workdir))
      self.assertFalse(train_family.stage_done('bundle', workdir, bundle))
      write_manifest(workdir=os.path.join(tmp, 'other'),
                     stage_fingerprints=train_family.stage_fingerprints(workdir))
      self.assertFalse(train_family.stage_done('bundle', workdir, bundle))

  def test_a_stage_started_afresh_does_not_add_its_earlier_wall_time(self):
    config = _tokenizer_only_config()
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(
        kmeans_tokenizer, 'load_splits', side_effect=_tiny_splits):
      workdir = os.path.join(tmp, 'work')
      config.bundle_dir = os.path.join(tmp, 'bundle')
      os.makedirs(workdir)
      log_path = os.path.join(workdir, train_family.MANIFEST)
      with open(log_path, 'w') as f:
        json.dump({'stage_wall_seconds': {'tokenizer': 1e6}}, f)  # an earlier, removed run
      with self.assertLogs(level='INFO') as logs:
        # Not the bundle folder: the tokenizer-only run did not write one.
        self.assertIsNone(train_family.train_family(config, workdir))
      self.assertTrue(any(f"stages in {workdir} (no bundle written: add 'bundle'" in line
                          for line in logs.output), logs.output)
      with open(log_path) as f:
        self.assertLess(json.load(f)['stage_wall_seconds']['tokenizer'], 1e5)

  def test_bundle_files_are_renamed_into_place_manifest_last(self):
    """write_bundle writes reference_features.npz and manifest.json whole (a temporary
    file renamed), the manifest last: a killed run never leaves a truncated manifest
    for `family.load` or the trainer's resume check (`stage_done`) to crash on."""
    with tempfile.TemporaryDirectory() as tmp:
      renamed = []
      with mock.patch('os.replace', side_effect=lambda src, dst: (
          renamed.append(os.path.basename(dst)), _replace(src, dst))):
        bundle = test_generate.tiny_bundle(os.path.join(tmp, 'bundle'))
      self.assertIn('reference_features.npz', renamed)
      self.assertEqual(renamed[-1], 'manifest.json')
      self.assertEqual(json.loads((bundle / 'manifest.json').read_text()),
                       {'note': 'test bundle'})
      self.assertEmpty([p for p in os.listdir(bundle) if p.endswith('.tmp')])
      self.assertEqual(family_lib.load(bundle).manifest, {'note': 'test bundle'})

  def test_retraining_a_stage_retrains_the_stages_that_read_it(self):
    """Each stage reruns when a stage it reads was retrained (its stale folder removed
    first, so it cannot resume or re-export from the old checkpoints)."""
    config = family_config.get_config()
    config.stages = ('eagle', 'target', 'tokenizer')  # runs in the pipeline's order
    runs = _Runs()
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(
        train_family, 'run_stage', side_effect=_fake_stage(runs)), mock.patch.object(
            kmeans_tokenizer, 'load_splits', return_value=None):
      workdir, config.bundle_dir = os.path.join(tmp, 'work'), os.path.join(tmp, 'bundle')
      dirs = train_family.stage_dirs(workdir)

      def rerun():
        runs.clear()
        os.makedirs(os.path.join(dirs['eagle'], 'checkpoints'), exist_ok=True)
        train_family.train_family(config, workdir)
        return list(runs)

      self.assertEqual(rerun(), ['tokenizer', 'target', 'eagle'])
      self.assertEqual(rerun(), [])
      shutil.rmtree(dirs['target'])
      self.assertEqual(rerun(), ['target', 'eagle'])
      shutil.rmtree(dirs['tokenizer'])
      self.assertEqual(rerun(), ['tokenizer', 'target', 'eagle'])
      os.remove(os.path.join(dirs['eagle'], train_family.INPUTS_FILE))  # an older workdir
      self.assertFalse(train_family.stage_done('eagle', workdir, config.bundle_dir))
      self.assertEqual(rerun(), ['eagle'])
      self.assertEqual(runs.stale_checkpoints, [])  # each stale folder was removed first
      shutil.rmtree(dirs['target'])
      config.stages = ('target', 'bundle')  # eagle left out: the bundle refuses its old head
      with self.assertRaisesRegex(ValueError, r"other inputs: \['eagle'\] \(\['target'\] changed"):
        rerun()
      self.assertEqual(runs, ['target'])

  def test_bad_trainer_values_are_refused_before_any_stage(self):
    for stage, field, value in (('target', 'log_every', 0), ('target', 'save_every', 0),
                                ('classifier', 'batch_size', 0),
                                ('draft_gpt', 'eval_batch_size', 0),
                                ('tokenizer', 'eval_batch_size', 0),
                                ('target', 'class_dropout', 1.5),
                                ('draft_gpt', 'class_dropout', -0.5),
                                ('eagle', 'uncond_prob', -0.5), ('eagle', 'uncond_prob', 2.0)):
      config = family_config.get_config()
      config[stage][field] = value
      with self.subTest(f'{stage}.{field}={value}'), mock.patch.object(
          train_family, 'run_stage', side_effect=AssertionError('a stage ran')):
        with self.assertRaisesRegex(cli.ConfigError, rf'config.{stage}.{field}='):
          train_family.train_family(config, '/nonexistent/workdir')

  def test_unknown_stage_is_a_clear_error(self):
    config = family_config.get_config()
    config.stages = ('tokenizer', 'vae')
    with tempfile.TemporaryDirectory() as tmp:
      with self.assertRaisesRegex(ValueError, r"unknown names \['vae'\]"):
        train_family.train_family(config, tmp)


if __name__ == '__main__':
  absltest.main()
