"""bench/pareto_sampled.py reuses a finished point folder only when the sampler drew
it with the point's settings, and has the sampler extend one of fewer images (no JAX
runs: the folders are written by hand)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
import tempfile
from unittest import mock

from absl.testing import absltest

from specdec_jax.configs import sample_fashion

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'bench'))
import pareto_sampled  # pylint: disable=g-import-not-at-top,wrong-import-position  (bench/)

POINT = ('coolsd_2', 'coolsd', 2.0, 'coolsd', {'coolsd_delta': 2.0}, 0)


def write_finished_set(folder: str, record: dict | None = None, **changes) -> None:
  """The files of a finished sampler folder that the sweep reads before reusing it:
  config.json (the sampler's config with `changes`), metrics.jsonl, summary.json (the
  images merged: config.json's num_images once the set is finished)."""
  config = sample_fashion.get_config()
  config.update(dict(method='coolsd', num_images=200, seed=0, out_dir=folder))
  config.hparams.update(dict(jacobi_window=pareto_sampled.JACOBI_WINDOW,
                             jacobi_init=pareto_sampled.JACOBI_INIT, coolsd_delta=2.0))
  for name, value in changes.items():
    node, *path = name.split('.')
    if path:
      config[node][path[0]] = value
    else:
      config[node] = value
  root = pathlib.Path(folder)
  root.mkdir(parents=True)
  (root / 'config.json').write_text(json.dumps(dict(fingerprint={}, config=config.to_dict())))
  record = record or dict(index=0, tokens_per_forward=3.9, verify_steps=50,
                          committed_tokens=195)
  (root / 'metrics.jsonl').write_text(json.dumps(record) + '\n')
  (root / 'summary.json').write_text(json.dumps(dict(num_images=config.num_images,
                                                     mean_tokens_per_forward=3.9)))


class ReuseTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.root = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.root)

  def draw(self, num_images=200):
    with mock.patch.object(pareto_sampled.subprocess, 'run') as run:
      folder = pareto_sampled.draw(POINT, self.root, num_images, batch=50)
    return folder, run

  def test_a_set_with_the_point_settings_is_reused(self):
    write_finished_set(os.path.join(self.root, 'coolsd_2'))
    folder, run = self.draw()
    self.assertEqual(folder, os.path.join(self.root, 'coolsd_2'))
    run.assert_not_called()

  def test_a_set_of_another_size_or_setting_is_refused_naming_the_field(self):
    for name, value, words in (
        ('num_images', 300, 'num_images: 300 (folder) -> 200 (this sweep)'),
        ('seed', 3, 'seed: 3 (folder) -> 0 (this sweep)'),
        ('method', 'uniform', "method: 'uniform' (folder) -> 'coolsd' (this sweep)"),
        ('hparams.coolsd_delta', 4.0, 'hparams.coolsd_delta: 4.0 (folder) -> 2.0')):
      with self.subTest(name):
        folder = os.path.join(self.root, 'coolsd_2')
        shutil.rmtree(folder, ignore_errors=True)
        write_finished_set(folder, **{name: value})
        with self.assertRaises(ValueError) as caught:
          self.draw()
        message = str(caught.exception)
        self.assertIn('holds another set than this sweep asks for', message)
        self.assertIn(words, message)
        self.assertLen(message.splitlines(), 3)  # that field alone

  def test_a_smaller_set_with_the_point_settings_is_extended_by_the_sampler(self):
    """A finished set of 14 images, the sweep asking for 200: the sampler runs into the
    same folder (it keeps the 14 and draws the rest, docs/sampling.md "Extending a
    set"); with another setting as well it is refused."""
    folder = os.path.join(self.root, 'coolsd_2')
    write_finished_set(folder, num_images=14)
    drawn, run = self.draw()
    self.assertEqual(drawn, folder)
    command = run.call_args.args[0]
    self.assertIn(f'--config.out_dir={folder}', command)
    self.assertIn('--config.num_images=200', command)
    shutil.rmtree(folder)
    write_finished_set(folder, num_images=14, seed=3)
    with self.assertRaisesRegex(ValueError, r'seed: 3 \(folder\) -> 0'):
      self.draw()

  def test_a_set_counted_before_committed_tokens_or_without_config_is_refused(self):
    folder = os.path.join(self.root, 'coolsd_2')
    write_finished_set(folder, record=dict(index=0, tokens_per_forward=3.92, verify_steps=50))
    with self.assertRaisesRegex(ValueError, 'tokens_per_forward counted drafts accepted past'):
      self.draw()
    os.remove(os.path.join(folder, 'config.json'))
    with self.assertRaisesRegex(ValueError, "configuration or metrics cannot be read"):
      self.draw()

  def test_an_unfinished_set_runs_the_sampler_with_the_point_settings(self):
    folder, run = self.draw(num_images=120)
    command = run.call_args.args[0]
    for flag in ('--config.method=coolsd', '--config.num_images=120', '--config.seed=0',
                 '--config.hparams.coolsd_delta=2.0', f'--config.out_dir={folder}'):
      self.assertIn(flag, command)
    self.assertEmpty([flag for flag in command if 'jacobi' in flag])  # a chain method

  def test_the_jacobi_settings_reach_the_sampler_and_the_reuse_check_of_jacobi_points(self):
    """A Jacobi point's set is its window's and fresh drafts'; a chain point's set is
    reused whatever --jacobi_init says (its images do not depend on it)."""
    sjd = ('sjd', 'lossless', None, 'sjd', {}, 0)
    with mock.patch.object(pareto_sampled.subprocess, 'run') as run:
      pareto_sampled.draw(sjd, self.root, 120, batch=50, jacobi_init='random')
    self.assertIn('--config.hparams.jacobi_init=random', run.call_args.args[0])
    self.assertIn('--config.hparams.jacobi_window=8', run.call_args.args[0])
    write_finished_set(os.path.join(self.root, 'sjd'), method='sjd')  # JACOBI_INIT, window 8
    with self.assertRaisesRegex(ValueError, "hparams.jacobi_init: 'spatial' \\(folder\\)"):
      pareto_sampled.draw(sjd, self.root, 200, batch=50, jacobi_init='random')
    shutil.rmtree(os.path.join(self.root, 'sjd'))
    write_finished_set(os.path.join(self.root, 'sjd'), method='sjd',
                       **{'hparams.jacobi_window': 4})
    with self.assertRaisesRegex(ValueError, 'hparams.jacobi_window: 4 \\(folder\\) -> 8'):
      pareto_sampled.draw(sjd, self.root, 200, batch=50)
    write_finished_set(os.path.join(self.root, 'coolsd_2'))
    for init in (pareto_sampled.JACOBI_INIT, 'random'):  # reused under either
      with mock.patch.object(pareto_sampled.subprocess, 'run') as run:
        pareto_sampled.draw(POINT, self.root, 200, batch=50, jacobi_init=init)
      run.assert_not_called()


if __name__ == '__main__':
  absltest.main()
