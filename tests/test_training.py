"""The shared training loop learns, checkpoints and resumes."""

import json
import os
import tempfile

from absl.testing import absltest
import ml_collections
import numpy as np

from specdec_jax.train import classifier as train_classifier


def synthetic_split(num, seed):
  """Class c images are a bright square at a class-specific place (learnable)."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 4, num).astype(np.int32)
  images = rng.integers(0, 40, (num, 32, 32, 1)).astype(np.uint8)
  for i, label in enumerate(labels):
    row, col = divmod(int(label), 2)
    images[i, 4 + 14 * row:14 + 14 * row, 4 + 14 * col:14 + 14 * col] = 220
  return images, labels


class ClassifierTrainingTest(absltest.TestCase):

  def test_learns_and_resumes(self):
    config = ml_collections.ConfigDict(dict(
        seed=0, batch_size=32, num_steps=30, learning_rate=2e-3, warmup_steps=3,
        weight_decay=0.0, log_every=10, save_every=20, data_dir=''))
    train_data, test_data = synthetic_split(512, 0), synthetic_split(128, 1)
    with tempfile.TemporaryDirectory() as workdir:
      _, accuracy = train_classifier.train(config, workdir, train_data, test_data)
      self.assertGreater(accuracy, 0.9)  # chance is 0.25
      config.num_steps = 40  # resume: only steps 31..40 run
      state, _ = train_classifier.train(config, workdir, train_data, test_data)
      self.assertEqual(int(state.step), 40)
      history = json.load(open(os.path.join(workdir, 'classifier_history.json')))
      self.assertEqual(history[0]['step'], 40)


if __name__ == '__main__':
  absltest.main()
