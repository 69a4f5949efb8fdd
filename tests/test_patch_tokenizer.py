"""The bundled family's patch k-means tokenizer and its trainer."""

import os
import tempfile

from absl.testing import absltest
import jax.numpy as jnp
import ml_collections
import numpy as np

from specdec_jax.app.train import gpt as train_gpt
from specdec_jax.app.train import kmeans_tokenizer
from specdec_jax.converters import vq as vq_converter
from specdec_jax.models import neighbors
from specdec_jax.models import patch_tokenizer


def _tokenizer(codebook_size=4, patch=2):
  return patch_tokenizer.PatchTokenizer(patch_tokenizer.PatchTokenizerConfig(
      codebook_size=codebook_size, patch_size=patch))


class PatchTokenizerTest(absltest.TestCase):

  def test_encode_decode_round_trip_and_raster_order(self):
    tokenizer = _tokenizer()
    # Four constant 2x2 patches: black, dark, light, white (pixels in [-1, 1]).
    levels = np.array([-1.0, -1.0 / 3, 1.0 / 3, 1.0], np.float32)
    params = patch_tokenizer.init_params(tokenizer.config, np.repeat(levels[:, None], 4, 1))
    tokens = np.array([[0, 1, 2, 3, 3, 2]], np.int32)  # grid 2 x 3
    images = tokenizer.decode(params, jnp.asarray(tokens), (2, 3))
    self.assertEqual(images.shape, (1, 4, 6, 1))
    np.testing.assert_allclose(np.asarray(images)[0, :2, 2:4, 0], levels[1])  # token 1
    np.testing.assert_allclose(np.asarray(images)[0, 2:, :2, 0], levels[3])  # token 3
    np.testing.assert_array_equal(tokenizer.encode(params, images), tokens)
    noisy = np.asarray(images) + 0.1 * np.random.default_rng(0).uniform(-1, 1, images.shape)
    np.testing.assert_array_equal(tokenizer.encode(params, noisy.astype(np.float32)), tokens)
    as_uint8 = tokenizer.to_uint8(images)
    np.testing.assert_array_equal(tokenizer.encode(params, as_uint8), tokens)
    # Patches with one bright pixel each (row-major p x p inside a patch): a transpose
    # inside the patch swaps tokens 1 and 2 (constant patches hide it).
    params = patch_tokenizer.init_params(tokenizer.config, 2 * np.eye(4, dtype=np.float32) - 1)
    images = np.asarray(tokenizer.decode(params, jnp.asarray(tokens), (2, 3)))
    self.assertEqual((images[0, 0, 3, 0], images[0, 1, 2, 0]), (1.0, -1.0))  # token 1: top right
    self.assertEqual(images[0, 1, 4, 0], 1.0)  # token 2 at grid (0, 2): bottom left
    np.testing.assert_array_equal(tokenizer.encode(params, images), tokens)

  def test_bad_input_is_a_clear_error(self):
    tokenizer = _tokenizer()
    params = patch_tokenizer.init_params(tokenizer.config, np.zeros((4, 4)))
    with self.assertRaisesRegex(ValueError, 'not divisible by the patch size'):
      tokenizer.encode(params, np.zeros((1, 5, 4, 1), np.uint8))
    with self.assertRaisesRegex(ValueError, r'\[B, H, W, 1\]'):
      tokenizer.encode(params, np.zeros((4, 4), np.uint8))
    with self.assertRaisesRegex(ValueError, r'must lie in \[0, 4\)'):
      tokenizer.decode(params, jnp.array([[0, 4]]), (1, 2))
    with self.assertRaisesRegex(ValueError, 'codebook shape'):
      patch_tokenizer.init_params(tokenizer.config, np.zeros((3, 4)))
    with self.assertRaisesRegex(ValueError, 'NaN'):
      patch_tokenizer.init_params(tokenizer.config, np.full((4, 4), np.nan))

  def test_lantern_neighbours_come_from_the_pixel_codebook(self):
    tokenizer = _tokenizer()
    levels = np.array([-1.0, 0.9, -0.8, 1.0], np.float32)
    params = patch_tokenizer.init_params(tokenizer.config, np.repeat(levels[:, None], 4, 1))
    table = neighbors.neighbor_table_from_params(params, 1)
    np.testing.assert_array_equal(table[:, 0], [2, 3, 0, 1])


class KMeansTest(absltest.TestCase):

  def test_recovers_separated_clusters_and_refills_empty_ones(self):
    rng = np.random.default_rng(0)
    centres = rng.uniform(-1, 1, (5, 4)).astype(np.float32) * 3
    points = np.concatenate([c + 0.01 * rng.standard_normal((200, 4)) for c in centres])
    found, history = kmeans_tokenizer.fit_kmeans(points.astype(np.float32), 5, 10, seed=1)
    distances = np.linalg.norm(found[:, None] - centres[None], axis=-1)
    self.assertLess(distances.min(0).max(), 0.05)  # every true centre found
    self.assertEqual(history[-1]['empty'], 0)
    # An empty cluster (a centre far from all data) takes the worst-fitted point.
    start = np.concatenate([centres[:4], np.full((1, 4), 100.0, np.float32)])
    new, _, counts = kmeans_tokenizer.lloyd_step(jnp.asarray(start), jnp.asarray(points))
    self.assertEqual(int(counts[4]), 0)
    self.assertLess(np.abs(np.asarray(new[4])).max(), 10.0)

  def test_train_writes_tokens_and_a_loadable_tokenizer(self):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (40, 8, 8, 1)).astype(np.uint8)
    labels = rng.integers(0, 10, 40).astype(np.int32)
    config = ml_collections.ConfigDict(dict(
        seed=0, codebook_size=8, patch_size=2, num_patches=500, iterations=3,
        eval_batch_size=16))
    with tempfile.TemporaryDirectory() as workdir:
      tokenizer, params, metrics = kmeans_tokenizer.train(
          config, workdir, (images[:30], labels[:30]), (images[30:], labels[30:]))
      data = train_gpt.load_tokens(os.path.join(workdir, 'tokens.npz'))
      self.assertEqual(data['train_tokens'].shape, (30, 16))
      self.assertEqual(data['grid'], (4, 4))
      self.assertEqual(data['vocab_size'], 8)
      loaded, loaded_params = vq_converter.load_tokenizer(os.path.join(workdir, 'tokenizer'))
      self.assertEqual(loaded.config, tokenizer.config)
      np.testing.assert_array_equal(loaded.encode(loaded_params, images[30:]),
                                    data['test_tokens'])
      self.assertGreater(metrics['test_psnr_db'], 5.0)


if __name__ == '__main__':
  absltest.main()
