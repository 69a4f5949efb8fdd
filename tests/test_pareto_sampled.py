"""bench/pareto_sampled.py's sweep points: each one a method of the sampler with
hyperparameters it takes, so no point of a long background sweep fails late."""

from __future__ import annotations

import os
import sys

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


if __name__ == '__main__':
  absltest.main()
