"""What each draft is computed from (`drafting`), which the law tests cannot see
(the decode stays exact; only acceptance drops): the catch-up's root feature is
the output at the pending token, each chain draft feeds the drafter its own last
hidden state, tree nodes below a later sibling read their own parent's slot, and
every draft and tree level is processed at its own image-token index (CFG
intervals)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

from specdec_jax import drafting
from specdec_jax import logits
from specdec_jax import verify
from specdec_jax.app import toy
from tests.decode_support import chain_law
from tests.decode_support import eagle_roots

VOCAB, CLASSES = 4, 2
NUM_IMAGES = 4


def _guided_interval_setup(num_images: int):
  """A ToyEagle drafter under CFG with cfg_interval 0 (image tokens 0 and 1 guided),
  drafting from first_index 1, with a different root hidden state per row (rows 2b
  conditional, 2b + 1 unconditional): (eagle, params, drafter, sampling,
  (root_logits, root_hidden, first_index, empty cache))."""
  eagle = toy.ToyEagle(VOCAB, CLASSES)
  rows = 2 * num_images
  roots = (jax.random.normal(jax.random.key(3), (rows, VOCAB)),
           jax.random.normal(jax.random.key(2), (rows, eagle.hidden_size)),
           jnp.ones((num_images,), jnp.int32), eagle.init_cache(rows, 16))
  return (eagle, eagle.init_params(jax.random.key(1)), drafting.Drafter(eagle, drafting.EAGLE),
          logits.Sampling(cfg_scale=3.0, cfg_interval=0), roots)


class ChainHiddenTest(absltest.TestCase):

  def test_each_draft_law_is_the_drafter_fed_its_own_hidden(self):
    eagle = toy.ToyEagle(VOCAB, CLASSES)
    params = eagle.init_params(jax.random.key(1))
    drafter = drafting.Drafter(eagle, drafting.EAGLE)
    sampling = logits.Sampling()
    num_images, k = 8, 3
    root_hidden = jax.random.normal(jax.random.key(2), (num_images, eagle.hidden_size))
    root_logits = jax.random.normal(jax.random.key(3), (num_images, VOCAB))
    uniforms = jax.random.uniform(jax.random.key(4), (num_images, k))
    cache = eagle.init_cache(num_images, 16)

    @jax.jit
    def chain():
      return drafting.draft_chain(drafter, params, cache, root_logits, root_hidden,
                                  num_drafts=k, sampling=sampling, cfg=False,
                                  uniforms=uniforms,
                                  first_index=jnp.ones((num_images,), jnp.int32))

    tokens, probs, _ = chain()

    @jax.jit
    def by_hand(tokens):
      laws = [sampling.probs(root_logits)]
      run_cache, hidden = cache, root_hidden[:, None]
      for step in range(k - 1):
        out = eagle.forward(params, run_cache, tokens[:, step:step + 1], hidden)
        run_cache, hidden = out.cache, out.hidden
        laws.append(sampling.probs(out.logits[:, 0]))
      return jnp.stack(laws, axis=1)

    np.testing.assert_allclose(np.asarray(probs), np.asarray(by_hand(tokens)), rtol=1e-5,
                               atol=1e-6)
    # The fed hidden state matters here: the root's differs from the drafts' own.
    self.assertGreater(float(jnp.abs(root_hidden[:, None] - eagle.forward(
        params, cache, tokens[:, :1], root_hidden[:, None]).hidden).max()), 0.1)


class ChainTokenIndexTest(absltest.TestCase):

  def test_each_draft_is_processed_at_its_own_token_index(self):
    """cfg_interval 0 guides image tokens 0 and 1 only: from first_index 1, the first
    chain draft's law is guided and the next ones are not. Processing every draft at
    first_index keeps the decode exact but drafts from the wrong law."""
    eagle, params, drafter, sampling, (root_logits, root_hidden, first_index, cache) = (
        _guided_interval_setup(NUM_IMAGES))
    k = 3
    uniforms = jax.random.uniform(jax.random.key(4), (NUM_IMAGES, k))

    @jax.jit
    def run():
      tokens, probs, _ = drafting.draft_chain(
          drafter, params, cache, root_logits, root_hidden, num_drafts=k, sampling=sampling,
          cfg=True, uniforms=uniforms, first_index=first_index)
      laws, wrong = [], []
      run_cache, row_logits, hidden = cache, root_logits[:, None], root_hidden[:, None]
      for step in range(k):
        if step:
          out = eagle.forward(params, run_cache,
                              drafting.as_rows(tokens[:, step - 1:step], True), hidden)
          run_cache, row_logits, hidden = out.cache, out.logits, out.hidden
        laws.append(drafting.guided_probs(sampling, row_logits, (first_index + step)[:, None],
                                          True)[:, 0])
        wrong.append(drafting.guided_probs(sampling, row_logits, first_index[:, None],
                                           True)[:, 0])
      return probs, jnp.stack(laws, axis=1), jnp.stack(wrong, axis=1)

    probs, laws, wrong = run()
    np.testing.assert_allclose(np.asarray(probs), np.asarray(laws), rtol=1e-5, atol=1e-6)
    self.assertGreater(float(jnp.abs(laws[:, 1] - wrong[:, 1]).max()), 0.05)



class DraftTreePathsTest(absltest.TestCase):

  def test_nodes_below_a_later_sibling_see_their_own_parent(self):
    # Nodes by depth: 1 = (0), 2 = (1), 3 = (0, 0), 4 = (1, 0), 5 = (1, 1), 6 = (1, 0, 0),
    # 7 = (1, 1, 0): nodes 4 and 5 run at level 3 with parent 2 (drafter slot 1).
    tree = verify.StaticTree.from_paths(
        ((0,), (1,), (0, 0), (1, 0), (1, 1), (1, 0, 0), (1, 1, 0)))
    self.assertEqual(tree.parents[4], 2)
    target, eagle = toy.MarkovToy(VOCAB, CLASSES), toy.ToyEagle(VOCAB, CLASSES)
    target_params = target.init_params(jax.random.key(0))
    params = eagle.init_params(jax.random.key(1))
    sampling = logits.Sampling()
    num_images = NUM_IMAGES
    cond = jnp.arange(num_images, dtype=jnp.int32) % CLASSES

    @jax.jit
    def draft():
      drafter, cache, root_logits, root_hidden = eagle_roots(
          target, target_params, eagle, params, cond,
          jnp.arange(num_images, dtype=jnp.int32) % VOCAB)
      drafted = drafting.draft_tree(
          drafter, params, cache, root_logits, root_hidden, tree=tree, sampling=sampling,
          cfg=False, uniforms=jax.random.uniform(jax.random.key(2),
                                                 (NUM_IMAGES, tree.num_nodes - 1)),
          first_index=jnp.ones(num_images, jnp.int32))
      return cache, root_hidden, drafted

    cache, root_hidden, (node_tokens, node_probs, _) = draft()
    node_tokens = np.asarray(node_tokens)

    chain_probs = jax.jit(lambda path_tokens: chain_law(eagle, params, cache, root_hidden,
                                                        sampling, path_tokens))

    for node in (1, 2, 4, 5):  # every node with children below the root
      path = [node]
      while tree.parents[path[-1]] > 0:
        path.append(tree.parents[path[-1]])
      expected = chain_probs(jnp.asarray(node_tokens[:, path[::-1]]))
      np.testing.assert_allclose(np.asarray(node_probs[:, node]), np.asarray(expected),
                                 rtol=1e-5, atol=1e-6, err_msg=f'node {node}')


class DraftTreeTokenIndexTest(absltest.TestCase):

  def test_each_level_is_processed_at_its_own_token_index(self):
    """cfg_interval 0 guides image tokens 0 and 1 only: from first_index 1 the root's
    law (the depth-1 drafts) is guided and the depth-1 nodes' laws (token 2) are not."""
    tree = verify.StaticTree.from_paths(((0,), (1,), (0, 0), (1, 0)))
    eagle, params, drafter, sampling, (root_logits, root_hidden, first_index, cache) = (
        _guided_interval_setup(NUM_IMAGES))

    @jax.jit
    def run():
      node_tokens, node_probs, _ = drafting.draft_tree(
          drafter, params, cache, root_logits, root_hidden, tree=tree, sampling=sampling,
          cfg=True, uniforms=jax.random.uniform(jax.random.key(4),
                                                (NUM_IMAGES, tree.num_nodes - 1)),
          first_index=first_index)
      want = {0: drafting.guided_probs(sampling, root_logits[:, None], first_index[:, None],
                                       True)[:, 0]}
      for node in (1, 2):
        out = eagle.forward(params, cache, drafting.as_rows(node_tokens[:, node:node + 1], True),
                            root_hidden[:, None])
        want[node] = drafting.guided_probs(sampling, out.logits, (first_index + 1)[:, None],
                                           True)[:, 0]
        want[-node] = drafting.guided_probs(sampling, out.logits, first_index[:, None],
                                            True)[:, 0]
      return node_probs, want

    node_probs, want = run()
    for node in (0, 1, 2):
      np.testing.assert_allclose(np.asarray(node_probs[:, node]), np.asarray(want[node]),
                                 rtol=1e-5, atol=1e-6, err_msg=f'node {node}')
    # Guided and unguided laws differ here: the check is not vacuous.
    self.assertGreater(float(jnp.abs(want[1] - want[-1]).max()), 0.05)



if __name__ == '__main__':
  absltest.main()
