"""EAGLE-2 candidates never include a token the processed draft law excludes (top-k /
top-p) while real candidates remain: `dynamic_tree.log_probs` scores it
EXCLUDED_LOG_PROB, below any real path score, even paths at log q = -120."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

from specdec_jax import drafting
from specdec_jax import dynamic_tree
from specdec_jax import logits
from specdec_jax.app import toy

VOCAB, CLASSES = 4, 2


class ExcludedTokensTest(absltest.TestCase):

  def test_children_of_ranks_excluded_tokens_last(self):
    probs = jnp.asarray([[0.0, 0.1, 0.6, 0.3], [0.5, 0.0, 0.0, 0.5]])
    scores, tokens = dynamic_tree.children_of(probs, 3)
    np.testing.assert_array_equal(np.asarray(tokens)[0], [2, 3, 1])
    self.assertEqual(set(np.asarray(tokens)[1, :2].tolist()), {0, 3})
    np.testing.assert_allclose(np.asarray(scores)[0], np.log([0.6, 0.3, 0.1]), rtol=1e-6)
    self.assertEqual(float(scores[1, 2]), dynamic_tree.EXCLUDED_LOG_PROB)
    lp = np.asarray(dynamic_tree.log_probs(probs))
    self.assertTrue(np.all(lp[np.asarray(probs) == 0] == dynamic_tree.EXCLUDED_LOG_PROB))

  def test_improbable_real_paths_outrank_excluded_tokens(self):
    """Sampling top_k=2 of V=4, tree top_k=3: each node has 2 allowed tokens, 0 (q ~ 1)
    and 1 (q = e^-60), and 2 excluded ones. The 6 real candidates (0, 1, 00, 01, 10,
    11) fill the 7-node tree, the last (11) at log q = -120: far below -100, still far
    above an excluded token."""
    drafter_model = toy.MarkovToy(VOCAB, CLASSES)
    law = jnp.asarray([60.0, 0.0, -10.0, -10.0])  # the same next-token logits everywhere
    alphabet = drafter_model.alphabet
    params = {'table': jnp.broadcast_to(law, (alphabet, alphabet, VOCAB))}
    drafter = drafting.Drafter(drafter_model, drafting.MODEL)
    num_images = 2
    cond = jnp.arange(num_images, dtype=jnp.int32) % CLASSES

    @jax.jit
    def grow():
      cache = drafter_model.prefill(params, drafter_model.init_cache(num_images, 32), cond).cache
      root_logits, root_hidden, cache = drafting.catch_up(
          drafter, params, cache, cache.lengths, jnp.zeros((num_images, 1), jnp.int32), None,
          jnp.zeros((num_images,), jnp.int32), cfg=False)
      tree, _ = dynamic_tree.draft_dynamic_tree(
          drafter, params, cache, root_logits, root_hidden, num_nodes=7, expansions=1,
          top_k=3, sampling=logits.Sampling(top_k=2), cfg=False,
          first_index=jnp.ones(num_images, jnp.int32))
      return tree

    tree = grow()
    tokens, parents = np.asarray(tree.tokens), np.asarray(tree.parents)
    for image in range(num_images):
      paths = set()
      for node in range(1, 7):
        path, at = [], node
        while at > 0:
          path.append(int(tokens[image, at]))
          at = parents[image, at]
        paths.add(tuple(path[::-1]))
      self.assertEqual(paths, {(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)})
      np.testing.assert_allclose(np.sort(np.asarray(tree.scores)[image, 1:]),
                                 [-120, -60, -60, -60, 0, 0], atol=1e-3)


if __name__ == '__main__':
  absltest.main()
