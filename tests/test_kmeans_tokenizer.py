"""The k-means tokenizer trainer's pieces against their definitions
(`app.train.kmeans_tokenizer`): an empty cluster takes the worst-fitted patch (the
farthest from its centre; the next empty one the next farthest), k-means++ seeds
one centre per well-separated cluster, and sampled patches are in the tokenizer's
[-1, 1] pixel space."""

import tempfile

from absl.testing import absltest
import jax.numpy as jnp
import ml_collections
import numpy as np

from specdec_jax.app import cli
from specdec_jax.app.train import kmeans_tokenizer


class LloydRefillTest(absltest.TestCase):

  def test_empty_clusters_take_the_farthest_patches_in_order(self):
    # Two centres near the data, two far away (empty). Patch distances to their
    # nearest centre: 0.1, 0.2, 0.3 (cluster 0), 2.0, 1.0 (cluster 1).
    patches = jnp.asarray([[0.1, 0.0], [0.2, 0.0], [-0.3, 0.0],
                           [10.0, 2.0], [10.0, -1.0]], jnp.float32)
    centres = jnp.asarray([[0.0, 0.0], [10.0, 0.0], [100.0, 100.0], [-100.0, 100.0]],
                          jnp.float32)
    new, inertia, counts = kmeans_tokenizer.lloyd_step(centres, patches)
    np.testing.assert_array_equal(np.asarray(counts), [3, 2, 0, 0])
    np.testing.assert_allclose(np.asarray(new[0]), [0.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(np.asarray(new[1]), [10.0, 0.5], atol=1e-6)
    np.testing.assert_allclose(np.asarray(new[2]), [10.0, 2.0])  # farthest: 2.0 away
    np.testing.assert_allclose(np.asarray(new[3]), [10.0, -1.0])  # next: 1.0 away
    np.testing.assert_allclose(float(inertia), (0.01 + 0.04 + 0.09 + 4.0 + 1.0) / 5, rtol=1e-5)


class KMeansPlusPlusTest(absltest.TestCase):

  def test_one_seed_per_separated_cluster(self):
    rng = np.random.default_rng(0)
    centres = np.eye(6, dtype=np.float32)[:, :6] * 50.0  # 6 clusters 70 apart
    points = np.concatenate([c + 0.01 * rng.standard_normal((50, 6)) for c in centres])
    points = points.astype(np.float32)
    for seed in range(5):
      chosen = kmeans_tokenizer.kmeans_plus_plus(points, 6, seed)
      nearest = np.argmin(np.linalg.norm(chosen[:, None] - centres[None], axis=-1), axis=1)
      self.assertEqual(sorted(nearest.tolist()), list(range(6)), f'seed {seed}')


class SamplePatchesTest(absltest.TestCase):

  def test_patches_are_in_minus_one_to_one(self):
    images = np.zeros((2, 4, 4, 1), np.uint8)
    images[1] = 255
    images[0, :2, :2] = 51  # one patch of value 51 -> 51 / 127.5 - 1 = -0.6
    patches = kmeans_tokenizer.sample_patches(images, 2, 100, seed=0)
    self.assertEqual(patches.shape, (8, 4))
    values = sorted({round(float(v), 5) for v in patches.reshape(-1)})
    self.assertEqual(values, [-1.0, -0.6, 1.0])



class TooFewPatchesTest(absltest.TestCase):

  def test_fewer_patches_than_codes_is_a_config_error(self):
    """A small max_examples can leave k-means fewer (distinct) patches than codes."""
    images = np.zeros((2, 28, 28, 1), np.uint8)  # 2 images of 49 patches, all alike
    images[1] = 255
    config = ml_collections.ConfigDict(dict(init='random', num_patches=512, codebook_size=16,
                                            patch_size=4, iterations=2, seed=0,
                                            eval_batch_size=2))
    with tempfile.TemporaryDirectory() as workdir, self.assertRaisesRegex(
        cli.ConfigError, r'kmeans: only 2 distinct patches for 16 codes \(2 training images\): '
        'raise config.max_examples'):
      kmeans_tokenizer.train(config, workdir, (images, np.zeros(2)), (images, np.zeros(2)))

if __name__ == '__main__':
  absltest.main()
