"""`bench/random_weights.py`: the benchmarks' random parameters keep the model's tree.

The GPU benchmarks replace a model's `init_params` (one large program, slow to
compile on XLA:GPU) by one small fill program per distinct (shape, dtype).
Checked: the same tree, shapes and dtypes as the model's own init, the stated
law of the values, and the number of compiled fill programs.
"""

import dataclasses
import os
import sys

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'bench'))

import random_weights  # pylint: disable=g-import-not-at-top,wrong-import-position
from specdec_jax.models import llamagen  # pylint: disable=g-import-not-at-top,wrong-import-position


def _small_gpt():
  config = llamagen.gpt_config('GPT-B', image_size=64, dtype='float32')
  return llamagen.LlamaGenGPT(dataclasses.replace(config, n_layer=3, dim=64, n_head=2,
                                                  n_kv_head=2, vocab_size=512))


class RandomWeightsTest(absltest.TestCase):

  def test_same_tree_shapes_and_dtypes_as_the_model_init(self):
    model = _small_gpt()
    params = random_weights.random_params(model.init_params, 0, jnp.bfloat16)
    reference = jax.eval_shape(model.init_params, jax.random.key(0))
    self.assertEqual(jax.tree.structure(params), jax.tree.structure(reference))
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(reference)):
      self.assertEqual(got.shape, want.shape)
      self.assertEqual(got.dtype, jnp.bfloat16 if jnp.issubdtype(want.dtype, jnp.floating)
                       else want.dtype)
    # The model runs on them: finite logits.
    cond = model.cfg_cond(params, jnp.array([1]))
    out = model.prefill(params, model.init_cache(2, 20), cond)
    self.assertTrue(bool(jnp.isfinite(out.logits).all()))

  def test_values_follow_the_stated_law(self):
    model = _small_gpt()
    params = random_weights.random_params(model.init_params, 0, jnp.float32)
    matrices = np.concatenate([np.ravel(x) for x in jax.tree.leaves(params) if x.ndim >= 2])
    vectors = [np.asarray(x) for x in jax.tree.leaves(params) if x.ndim < 2]
    # ~100k draws: the sample std is within 1% of 0.02 (its s.e. is about 0.2%).
    self.assertAlmostEqual(float(matrices.std()), random_weights.WEIGHT_STD, delta=2e-4)
    self.assertLess(abs(float(matrices.mean())), 1e-4)
    self.assertTrue(all(np.all(v == 1.0) for v in vectors))
    # Another seed draws other values; the same seed the same.
    again = random_weights.random_params(model.init_params, 0, jnp.float32)
    other = random_weights.random_params(model.init_params, 1, jnp.float32)
    leaf = lambda tree: np.asarray(tree['tok_embeddings']['embedding'])
    np.testing.assert_array_equal(leaf(again), leaf(params))
    self.assertFalse(np.array_equal(leaf(other), leaf(params)))

  def test_one_fill_program_per_distinct_shape(self):
    model = _small_gpt()
    reference = jax.eval_shape(model.init_params, jax.random.key(0))
    distinct = {(x.shape, x.dtype) for x in jax.tree.leaves(reference)}
    jax.clear_caches()
    random_weights.random_params(model.init_params, 0, jnp.float32)
    self.assertEqual(random_weights._fill._cache_size(), len(distinct))  # pylint: disable=protected-access
    self.assertLess(3 * len(distinct), len(jax.tree.leaves(reference)))  # 3 layers share shapes


if __name__ == '__main__':
  absltest.main()
