"""SCD's Gumbel coupling seeds its noise with uniforms of its own
(`mode_chain.Jacobi.start`: the last GUMBEL_SEED_UNIFORMS of the step's draft
uniforms), never with those the fresh random drafts are drawn from: the noise
must be independent of the drafts it later re-drafts (SCD's assumption)."""

from types import SimpleNamespace

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decode
from specdec_jax import jacobi_drafts
from tests.decode_support import TARGET


class GumbelSeedTest(absltest.TestCase):

  def test_seed_and_fresh_drafts_use_disjoint_uniforms(self):
    mode = decode.Jacobi(4, init='random', coupling='gumbel')
    plan = SimpleNamespace(target=TARGET)
    width = mode.draft_uniforms
    seed_cols = jacobi_drafts.GUMBEL_SEED_UNIFORMS
    num_images = 16
    base = jax.random.uniform(jax.random.key(0), (num_images, width))
    other = jax.random.uniform(jax.random.key(1), (num_images, width))
    first = jnp.zeros((num_images,), jnp.int32)

    def start(uniforms):
      drafts, _ = mode.start(plan, None, None, None, first, jnp.ones_like(first), uniforms)
      return np.asarray(drafts.tokens), np.asarray(drafts.noise_seed)

    tokens, seed = start(base)
    # Other draft uniforms, the same seed uniforms: other fresh drafts, the same seed.
    tokens_2, seed_2 = start(base.at[:, :-seed_cols].set(other[:, :-seed_cols]))
    self.assertFalse(np.array_equal(tokens, tokens_2))
    np.testing.assert_array_equal(seed, seed_2)
    # Other seed uniforms: the same fresh drafts, another seed.
    tokens_3, seed_3 = start(base.at[:, -seed_cols:].set(other[:, -seed_cols:]))
    np.testing.assert_array_equal(tokens, tokens_3)
    self.assertTrue(np.all(np.any(seed != seed_3, axis=-1)))


if __name__ == '__main__':
  absltest.main()
