"""bench/pareto_sampled.py's sweep points: each one a method of the sampler with
hyperparameters it takes, so no point of a long background sweep fails late; and
which finished sets it reuses, extends or refuses."""

from __future__ import annotations

import json
import os
import sys
import tempfile

from absl.testing import absltest

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


class ReuseTest(absltest.TestCase):

  def _folder(self, settings: dict) -> str:
    """A finished set's config.json (the sampler's nested config) and metrics."""
    folder = tempfile.mkdtemp()
    config = {'method': settings['method'], 'num_images': settings['num_images'],
              'seed': settings['seed'], 'hparams': {
                  name.split('.', 1)[1]: value for name, value in settings.items()
                  if name.startswith('hparams.')}}
    with open(os.path.join(folder, 'config.json'), 'w') as f:
      json.dump({'config': config}, f)
    with open(os.path.join(folder, 'metrics.jsonl'), 'w') as f:
      f.write(json.dumps({'index': 0, 'committed_tokens': 196}) + '\n')
    return folder

  def test_a_finished_set_is_reused_extended_or_refused(self):
    point = pareto_sampled.sweep_points()[2]
    folder = self._folder(pareto_sampled.sampler_settings(point, 200))
    self.assertTrue(pareto_sampled.check_reusable(
        folder, pareto_sampled.sampler_settings(point, 200)))
    self.assertFalse(pareto_sampled.check_reusable(  # more images: the sampler extends it
        folder, pareto_sampled.sampler_settings(point, 2000)))
    with self.assertRaisesRegex(ValueError, r'num_images: 200 \(folder\) -> 100'):
      pareto_sampled.check_reusable(folder, pareto_sampled.sampler_settings(point, 100))
    other = pareto_sampled.sampler_settings(point, 2000)
    other['seed'] = 7
    with self.assertRaisesRegex(ValueError, 'seed: 0 \\(folder\\) -> 7'):
      pareto_sampled.check_reusable(folder, other)


if __name__ == '__main__':
  absltest.main()
