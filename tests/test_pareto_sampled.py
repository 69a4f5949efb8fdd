"""bench/pareto_sampled.py's sweep points: each one a method of the sampler with
hyperparameters it takes, so no point of a long background sweep fails late."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

from absl.testing import absltest
import numpy as np

from specdec_jax.app import cli
from specdec_jax.app import config_checks
from specdec_jax.app import family as family_lib
from specdec_jax.app import methods as methods_lib
from specdec_jax.configs import generate as generate_config
from specdec_jax.configs import sample_fashion

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'bench'))
import pareto_sampled  # pylint: disable=g-import-not-at-top,wrong-import-position  (bench/)


class SweepPointsTest(absltest.TestCase):

  def test_points_are_unique_sampler_methods_with_known_hyperparameters(self):
    points = pareto_sampled.sweep_points()
    names = [point[0] for point in points]
    self.assertEqual(len(names), len(set(names)))
    self.assertEqual(names[:2], ['vanilla', 'vanilla_seed1'])
    family = family_lib.load()
    for name, _, _, method, hparams, seed in points:
      self.assertIn(method, methods_lib.METHOD_NAMES, name)
      self.assertIn(seed, (0, 1), name)
      settings = {'jacobi_window': pareto_sampled.JACOBI_WINDOW,
                  'jacobi_init': pareto_sampled.JACOBI_INIT, **hparams}
      unknown = set(settings) - set(sample_fashion.HYPERPARAMETERS)
      self.assertEmpty(unknown, f'{name}: the sampler has no hyperparameter {unknown}')
      cli.check_fields(settings, config_checks.HYPERPARAMETERS, name)  # as the sampler does
      config = generate_config.get_config()
      config.update(settings)
      config_checks.check_for_family(config, family, name)
      config.methods = tuple(dict.fromkeys(('vanilla', method)))
      built = methods_lib.build_methods(config, family)
      self.assertEqual(built[-1].name, method, name)

  def test_points_are_selected_by_name_and_unknown_names_refused(self):
    points = pareto_sampled.sweep_points()
    chosen = pareto_sampled.select_points(points, 'coolsd_2,vanilla')
    self.assertEqual([point[0] for point in chosen], ['vanilla', 'coolsd_2'])  # sweep order
    self.assertLen(pareto_sampled.select_points(points, ''), len(points))
    with self.assertRaisesRegex(SystemExit, r"unknown point\(s\) \['coolsd_2\.0'\]"):
      pareto_sampled.select_points(points, 'vanilla,coolsd_2.0')
    with self.assertRaisesRegex(SystemExit, 'add vanilla to --points'):
      pareto_sampled.select_points(points, 'coolsd_2')

  def test_jacobi_init_reaches_the_sampler_settings(self):
    point = next(p for p in pareto_sampled.sweep_points() if p[0] == 'sjd')
    self.assertEqual(pareto_sampled.sampler_settings(point, 8)['hparams.jacobi_init'],
                     pareto_sampled.JACOBI_INIT)
    self.assertEqual(pareto_sampled.sampler_settings(point, 8, 'random')['hparams.jacobi_init'],
                     'random')
    self.assertNotIn('hparams.jacobi_init', pareto_sampled.sampler_settings(
        pareto_sampled.sweep_points()[0], 8))  # vanilla does not read it


class ReusedSetsTest(absltest.TestCase):
  """A folder's set is reused only as the images it holds now."""

  def setUp(self):
    super().setUp()
    self.folder = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.folder)
    self.settings = pareto_sampled.sampler_settings(pareto_sampled.sweep_points()[0], 8)

  def write_set(self, config_images: int, merged_images: int):
    config = {'method': 'vanilla', 'num_images': config_images, 'seed': 0,
              'hparams': {'jacobi_window': pareto_sampled.JACOBI_WINDOW,
                          'jacobi_init': pareto_sampled.JACOBI_INIT}}
    for name, value in (('config.json', {'config': config}),
                        ('summary.json', {'num_images': merged_images})):
      with open(os.path.join(self.folder, name), 'w') as f:
        json.dump(value, f)
    with open(os.path.join(self.folder, 'metrics.jsonl'), 'w') as f:
      f.write(json.dumps({'committed_tokens': 196}) + '\n')
    np.savez(os.path.join(self.folder, 'samples.npz'),
             np.full((merged_images, 2, 2, 3), merged_images, np.uint8))

  def test_a_finished_set_is_reused_and_one_stopped_while_extended_is_not(self):
    self.write_set(8, 8)
    self.assertTrue(pareto_sampled.check_reusable(self.folder, self.settings))
    self.write_set(4, 4)
    self.assertFalse(pareto_sampled.check_reusable(self.folder, self.settings))  # extended
    # An extension to 8 stopped part-way by an older sampler: config.json names 8, and
    # the merged files are the 4-image set's (they were measured as the 8-image point).
    self.write_set(8, 4)
    self.assertFalse(pareto_sampled.check_reusable(self.folder, self.settings))
    self.write_set(16, 8)  # a larger set, stopped part-way: not this point's
    with self.assertRaisesRegex(ValueError, r'num_images: 16 \(folder\) -> 8 \(this sweep\)'):
      pareto_sampled.check_reusable(self.folder, self.settings)

  def test_cached_features_are_those_of_the_images_held_now(self):
    calls = []

    class Family:
      def classify(self, images):
        calls.append(len(images))
        return images[:, 0, 0, 0].astype(np.float32)[:, None], np.zeros((len(images), 3))

    self.write_set(4, 4)
    first = pareto_sampled.features_of(self.folder, Family())
    self.assertEqual(pareto_sampled.features_of(self.folder, Family())['logits'].tolist(),
                     first['logits'].tolist())
    self.assertEqual(calls, [4])  # the second call read the cache
    self.write_set(8, 8)  # the set extended: the cache was of its first 4 images
    self.assertEqual(pareto_sampled.features_of(self.folder, Family())['logits'].shape, (8, 1))
    self.assertEqual(calls, [4, 8])


if __name__ == '__main__':
  absltest.main()
