"""EAGLE-2 dynamic trees (`dynamic_tree`, `mode_dynamic_tree.DynamicTreeDraft`).

Exactness: the whole-loop joint-law test of tests/test_decode.py (second-order
Markov toy, V**n = 64 sequences, N = 2**14 images, chi-square p > 1e-4; power:
any law at TV >= 0.04 from the exact one is rejected with probability >=
0.99), with a negative control (a tree mask that hides the ancestors) that
must fail. Drafting: every node's score is its path's cumulative draft
log-probability when the path runs through the drafter as a plain chain, the
tree is closed under parents and differs per image.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from specdec_jax import decode
from specdec_jax import drafting
from specdec_jax import dynamic_tree
from specdec_jax import logits
from specdec_jax import rules
from specdec_jax import testing
from specdec_jax import verify
from specdec_jax.app import toy
from tests.decode_support import CLASSES
from tests.decode_support import DRAFT
from tests.decode_support import EAGLE
from tests.decode_support import FAST
from tests.decode_support import NUM_SAMPLES
from tests.decode_support import NUM_TOKENS
from tests.decode_support import P_THRESHOLD
from tests.decode_support import TARGET
from tests.decode_support import VOCAB
from tests.decode_support import _chi_square_pvalue
from tests.decode_support import assert_joint_law
from tests.decode_support import chain_law
from tests.decode_support import eagle_roots
from tests.decode_support import _cond
from tests.decode_support import _params

EAGLE2_CASES = (
    ('eagle2_eagle', decode.DynamicTreeDraft(total_tokens=5, depth=2, top_k=2), logits.Sampling()),
    ('eagle2_model_cfg_topk', decode.DynamicTreeDraft(total_tokens=6, depth=1, top_k=3,
                                                      drafter='model'),
     logits.Sampling(cfg_scale=1.5, top_k=3)),
    ('eagle2_eagle_temperature', decode.DynamicTreeDraft(total_tokens=7, depth=2, top_k=3),
     logits.Sampling(temperature=0.8)),
    ('eagle2_sampled_eagle', decode.DynamicTreeDraft(total_tokens=5, depth=2, top_k=2,
                                                     drafts='sampled'), logits.Sampling()),
    ('eagle2_sampled_model_cfg', decode.DynamicTreeDraft(total_tokens=7, depth=2, top_k=3,
                                                         drafter='model', drafts='sampled'),
     logits.Sampling(cfg_scale=1.5)),
)


def _generate(mode, sampling, *, num_images=NUM_SAMPLES, key=None, rule=rules.Lossless(),
              num_tokens=NUM_TOKENS):
  target_params, draft_params, eagle_params = _params()
  draft, params = (EAGLE, eagle_params) if mode.drafter == 'eagle' else (DRAFT, draft_params)
  key = jax.random.key(7) if key is None else key
  return decode.generate(TARGET, target_params, _cond(num_images, sampling),
                         num_tokens=num_tokens, key=key, mode=mode, sampling=sampling,
                         rule=rule, draft=draft, draft_params=params, compiler_options=FAST)


class Eagle2ExactnessTest(parameterized.TestCase):

  @parameterized.named_parameters(*EAGLE2_CASES)
  def test_eagle2_joint_law_matches_target(self, mode, sampling):
    assert_joint_law(self, _generate(mode, sampling), mode, sampling)

  def _p_value_with(self, name, replacement, mode, sampling) -> float:
    """The joint-law p-value with dynamic_tree.<name> replaced (a negative control)."""
    original = getattr(dynamic_tree, name)
    setattr(dynamic_tree, name, replacement(original))
    decode.clear_compile_cache()
    try:
      tokens = np.asarray(_generate(mode, sampling).tokens)
    finally:
      setattr(dynamic_tree, name, original)
      decode.clear_compile_cache()
    return _chi_square_pvalue(tokens, TARGET.joint_law(_params()[0], 0, NUM_TOKENS, sampling))

  def test_eagle2_depth_past_the_node_budget_keeps_the_target_law(self):
    """depth + 2 > total_tokens: a path holds at most total_tokens nodes, and only
    those slots may be compacted (moving all depth + 2 overran the cache's room past
    the row and overwrote its class token: p = 0). GridToy(width 2) reads the class
    token at every row start, which the Markov toy above does not."""
    target = drafter = toy.GridToy(VOCAB, CLASSES, width=2)
    params = target.init_params(jax.random.key(0))
    sampling, num_tokens = logits.Sampling(), 4
    result = decode.generate(
        target, params, np.zeros((2 ** 13,), np.int32), num_tokens=num_tokens,
        key=jax.random.key(7), mode=decode.DynamicTreeDraft(2, depth=5, top_k=1,
                                                             drafter='model'),
        sampling=sampling, rule=rules.Lossless(), draft=drafter,
        draft_params=drafter.init_params(jax.random.key(1)), compiler_options=FAST)
    law = target.joint_law(params, 0, num_tokens, sampling)
    self.assertGreater(_chi_square_pvalue(np.asarray(result.tokens), law), P_THRESHOLD)

  def test_eagle2_ancestors_hidden_fails(self):
    """Negative control: a tree mask where each node sees only itself (the target then
    predicts the next token of every draft from the wrong context)."""
    def self_only(original):
      del original
      return lambda parents, max_depth: jnp.broadcast_to(
          jnp.eye(parents.shape[1], dtype=bool), parents.shape + (parents.shape[1],))

    mode, sampling = EAGLE2_CASES[0][1:]
    self.assertLess(self._p_value_with('ancestor_mask', self_only, mode, sampling), P_THRESHOLD)

  def test_eagle2_sampled_ranked_by_own_token_fails(self):
    """Negative control for drafts 'sampled': ranking each sampled child by its own
    token's log-probability (EAGLE-2's score) makes whether it is kept depend on its
    token, and the sibling tests no longer see the law it was drawn from."""
    def own_token_scores(original):
      def children_of(probs, top_k, uniforms=None, mesh=None):
        scores, tokens = original(probs, top_k, uniforms, mesh)
        if uniforms is None:
          return scores, tokens
        return jnp.take_along_axis(dynamic_tree.log_probs(probs), tokens, axis=-1), tokens
      return children_of

    mode = decode.DynamicTreeDraft(total_tokens=4, depth=2, top_k=3, drafts='sampled')
    self.assertLess(self._p_value_with('children_of', own_token_scores, mode,
                                       logits.Sampling()), P_THRESHOLD)


class Eagle2RelaxedRulesTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('eagle2_uniform', rules.UniformRelaxed(omega=3.0)),
      ('eagle2_coolsd', rules.CoolSD(delta=3.0)),
      ('eagle2_lantern_pp', rules.LanternPP(
          neighbors=jnp.asarray([[1, 2], [0, 2], [3, 1], [2, 0]], jnp.int32), k=2, lam=3.0)),
  )
  def test_eagle2_relaxed_rules_accept_more_than_lossless(self, rule):
    mode, sampling = decode.DynamicTreeDraft(total_tokens=5, depth=2, top_k=2), logits.Sampling()
    summary = lambda r: float(_generate(mode, sampling, num_images=2048, rule=r).metrics.summary()[
        'tokens_per_target_forward'])
    self.assertGreater(summary(rule), summary(rules.Lossless()))


class Eagle2DynamicTreeVerifyTest(absltest.TestCase):

  def test_eagle2_one_step_law_of_deterministic_siblings(self):
    """One level of three deterministic siblings: the lossless output law is the
    target's; UniformRelaxed's is the closed form of sequential point-mass tests.
    Monte Carlo with 2**16 draws over 6 tokens, chi-square p > 1e-4 (power: TV >= 0.02
    rejected with probability > 0.99); the negative control (the target's own law for the
    relaxed rule) must fail."""
    target = jnp.asarray([0.3, 0.25, 0.2, 0.1, 0.1, 0.05])
    children = jnp.asarray([[1, 2, 3]] + [[-1, -1, -1]] * 3, jnp.int32)
    node_tokens = jnp.asarray([0, 4, 1, 5], jnp.int32)
    num = 2 ** 16
    uniforms = jax.random.uniform(jax.random.key(0), (num, 4))

    def draws(rule):
      one = lambda u: verify.verify_dynamic_tree_with_uniforms(
          rule, u, children, 1, node_tokens, lambda node: target)
      path, _, next_token = jax.jit(jax.vmap(one))(uniforms)
      token = jnp.where(path[:, 1] >= 0, node_tokens[jnp.maximum(path[:, 1], 0)], next_token)
      return testing.histogram(np.asarray(token), 6)

    self.assertGreater(testing.chi_square_pvalue(draws(rules.Lossless()), target)[0],
                       P_THRESHOLD)
    rule = rules.UniformRelaxed(omega=2.0)
    law, p, stay = np.zeros(6), np.asarray(target, np.float64), 1.0
    for token in (4, 1, 5):
      point = np.eye(6)[token]
      accept = float(rule.accept_prob_at(jnp.asarray(point, jnp.float32),
                                         jnp.asarray(p, jnp.float32), 1, token))
      law[token] += stay * accept
      stay *= 1 - accept
      p = np.asarray(rule.residual(jnp.asarray(point, jnp.float32), jnp.asarray(p, jnp.float32),
                                   1, token), np.float64)
    law += stay * p
    relaxed = draws(rule)
    self.assertGreater(testing.chi_square_pvalue(relaxed, law / law.sum())[0], P_THRESHOLD)
    self.assertLess(testing.chi_square_pvalue(relaxed, target)[0], P_THRESHOLD)
    with self.assertRaisesRegex(ValueError, r'uniforms must be \[D \* C \+ 1\] = \[4\]'):
      verify.verify_dynamic_tree_with_uniforms(rules.Lossless(), uniforms[0, :3], children, 1,
                                               node_tokens, lambda node: target)

  def test_eagle2_bad_verify_inputs_are_refused(self):
    """Rows that do not match the tree, and draft laws that are not distributions."""
    children = jnp.asarray([[1, 2]] + [[-1, -1]] * 2, jnp.int32)
    tokens, law = jnp.asarray([0, 1, 2], jnp.int32), jnp.full((3, 4), 0.25)
    verify_ = lambda tokens, draft_probs: verify.verify_dynamic_tree_with_uniforms(
        rules.Lossless(), jnp.zeros((3,)), children, 1, tokens, lambda node: law[node],
        draft_probs)
    verify_(tokens, law)  # well formed
    verify_(tokens, None)  # deterministic siblings
    rows = r'children has 3 rows \(N nodes, root included\) but got'
    with self.assertRaisesRegex(ValueError, rows + r" \{'node_tokens': 2\}"):
      verify_(tokens[:2], None)
    with self.assertRaisesRegex(ValueError, rows + r".*'draft_probs': 4"):
      verify_(tokens, jnp.full((4, 4), 0.25))
    with self.assertRaisesRegex(ValueError, 'draft_probs has negative entries.*not logits'):
      verify_(tokens, jnp.log(law))


class Eagle2DraftingTest(absltest.TestCase):

  def _tree(self, num_images=3, cfg=False, sampled=False, cfg_interval=-1):
    target, eagle = toy.MarkovToy(VOCAB, CLASSES), toy.ToyEagle(VOCAB, CLASSES)
    target_params, params = target.init_params(jax.random.key(0)), eagle.init_params(
        jax.random.key(1))
    sampling = (logits.Sampling(cfg_scale=1.5, cfg_interval=cfg_interval) if cfg
                else logits.Sampling())
    rows = 2 * num_images if cfg else num_images
    cond = jnp.arange(rows, dtype=jnp.int32) % CLASSES
    pending = jnp.arange(num_images, dtype=jnp.int32) % VOCAB

    @jax.jit
    def grow():
      drafter, cache, root_logits, root_hidden = eagle_roots(
          target, target_params, eagle, params, cond, pending, cfg)
      tree, after = dynamic_tree.draft_dynamic_tree(
          drafter, params, cache, root_logits, root_hidden, num_nodes=8, expansions=3,
          top_k=2, sampling=sampling, cfg=cfg, first_index=jnp.ones(num_images, jnp.int32),
          uniforms=jax.random.uniform(jax.random.key(5), (
              num_images, dynamic_tree.num_candidates(2, 3))) if sampled else None)
      return cache, root_logits, root_hidden, tree, after

    return eagle, params, sampling, grow()

  def test_eagle2_scores_are_path_log_probs_of_the_drafter_chain(self):
    # cfg_interval 0 guides token 1 only (first_index 1): depth-1 nodes are guided and
    # deeper ones not, so a node's law must be processed at its own token index.
    for cfg, cfg_interval in ((False, -1), (True, -1), (True, 0)):
      eagle, params, sampling, (cache, root_logits, root_hidden, tree, after) = self._tree(
          cfg=cfg, cfg_interval=cfg_interval)
      np.testing.assert_array_equal(np.asarray(after.lengths), np.asarray(cache.lengths))
      tokens, parents = np.asarray(tree.tokens), np.asarray(tree.parents)
      rows = lambda x: drafting.as_rows(x, cfg)

      @jax.jit
      def path_score(path_tokens):  # [B, d] -> f32[B]
        probs = drafting.guided_probs(sampling, root_logits[:, None],
                                      jnp.ones((path_tokens.shape[0], 1), jnp.int32), cfg)[:, 0]
        score = jnp.log(jnp.take_along_axis(probs, path_tokens[:, :1], axis=1)[:, 0])
        run_cache, hidden = cache, root_hidden[:, None]
        for step in range(path_tokens.shape[1] - 1):
          out = eagle.forward(params, run_cache, rows(path_tokens[:, step:step + 1]), hidden)
          run_cache, hidden = out.cache, out.hidden
          probs = drafting.guided_probs(sampling, out.logits, jnp.full(
              (path_tokens.shape[0], 1), step + 2, jnp.int32), cfg)[:, 0]
          score += jnp.log(jnp.take_along_axis(probs, path_tokens[:, step + 1:step + 2],
                                               axis=1)[:, 0])
        return score

      for image in range(tokens.shape[0]):
        for node in range(1, tokens.shape[1]):
          path = [node]
          while parents[image, path[-1]] > 0:
            path.append(parents[image, path[-1]])
          path = path[::-1]
          self.assertLen(path, int(tree.depths[image, node]))
          expected = path_score(jnp.asarray(tokens[:, path]))[image]
          np.testing.assert_allclose(float(tree.scores[image, node]), float(expected),
                                     rtol=1e-4, atol=1e-4)

  def test_eagle2_sampled_tree_laws_are_distributions_verify_accepts(self):
    """drafts 'sampled': every node's law (`DynamicTree.probs`) is a distribution,
    uniform at nodes never expanded, so the public tree passes straight into
    verify_dynamic_tree_with_uniforms, whose input check refuses rows that do not
    sum to 1 (a zero filler row did)."""
    _, _, _, (_, _, _, tree, _) = self._tree(num_images=2, sampled=True)
    expansions, top_k = 3, 2  # the fixture's
    probs, children = np.asarray(tree.probs), np.asarray(tree.children)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    never_expanded = np.asarray(tree.depths) == expansions + 1
    self.assertTrue(never_expanded.any())
    self.assertFalse((children[never_expanded] >= 0).any())
    np.testing.assert_allclose(probs[never_expanded], 1.0 / VOCAB)
    target_law = jnp.full((VOCAB,), 1.0 / VOCAB)
    for image in range(2):
      _, num_accepted, _ = verify.verify_dynamic_tree_with_uniforms(
          rules.Lossless(), jnp.full(((expansions + 1) * top_k + 1,), 0.5),
          tree.children[image], expansions + 1, tree.tokens[image], lambda node: target_law,
          tree.probs[image])
      self.assertGreaterEqual(int(num_accepted), 0)

  def test_eagle2_sampled_laws_and_rank_values(self):
    """drafts 'sampled': a node with children carries the drafter law of its path (as a
    plain chain gives it), its children are distinct, and each child's score is its
    parent's plus log of the sibling-rank-th largest probability of that law."""
    eagle, params, sampling, (cache, _, root_hidden, tree, _) = self._tree(num_images=4,
                                                                            sampled=True)
    tokens, parents = np.asarray(tree.tokens), np.asarray(tree.parents)
    children, probs = np.asarray(tree.children), np.asarray(tree.probs)
    scores = np.asarray(tree.scores)

    chain_probs = jax.jit(lambda path_tokens: chain_law(eagle, params, cache, root_hidden,
                                                        sampling, path_tokens))

    for image in range(tokens.shape[0]):
      for node in range(tokens.shape[1]):
        kids = [c for c in children[image, node] if c >= 0]
        if not kids:
          continue
        self.assertLen({int(tokens[image, c]) for c in kids}, len(kids))
        ranked = np.sort(probs[image, node])[::-1]
        for rank, kid in enumerate(kids):
          np.testing.assert_allclose(scores[image, kid], scores[image, node] + np.log(
              ranked[rank]), rtol=1e-5, atol=1e-5)
        if node:
          path = [node]
          while parents[image, path[-1]] > 0:
            path.append(parents[image, path[-1]])
          expected = chain_probs(jnp.asarray(tokens[:, path[::-1]]))[image]
          np.testing.assert_allclose(probs[image, node], np.asarray(expected), rtol=1e-5,
                                     atol=1e-6)

  def test_eagle2_tree_is_closed_ordered_and_per_image(self):
    _, _, _, (_, _, _, tree, _) = self._tree(num_images=6)
    parents, depths = np.asarray(tree.parents), np.asarray(tree.depths)
    mask, children = np.asarray(tree.ancestor_mask), np.asarray(tree.children)
    for image in range(parents.shape[0]):
      for node in range(1, parents.shape[1]):
        parent = parents[image, node]
        self.assertBetween(parent, 0, node - 1)  # parents come first
        self.assertEqual(depths[image, node], depths[image, parent] + 1)
        np.testing.assert_array_equal(mask[image, node],
                                      mask[image, parent] | (np.arange(8) == node))
        self.assertIn(node, children[image, parent].tolist())
    self.assertGreater(len({tuple(row) for row in parents.tolist()} |
                           {tuple(row) for row in np.asarray(tree.tokens).tolist()}), 2)

  def test_eagle2_tree_from_candidates_keeps_the_best_closed_set(self):
    # Candidates: 2 children of the root, then 4 grandchildren (parents 0, 0, 1, 1).
    scores = jnp.asarray([[-0.5, -1.0, -0.6, -2.0, -1.1, -1.2]])
    parents = jnp.asarray([[-1, -1, 0, 0, 1, 1]], jnp.int32)
    depths = jnp.asarray([[1, 1, 2, 2, 2, 2]], jnp.int32)
    tokens = jnp.asarray([[3, 1, 2, 0, 1, 3]], jnp.int32)
    tree = dynamic_tree.tree_from_candidates(scores, tokens, parents, depths, 5, 2, 2)
    np.testing.assert_array_equal(np.asarray(tree.tokens), [[0, 3, 1, 2, 1]])
    np.testing.assert_array_equal(np.asarray(tree.parents), [[-1, 0, 0, 1, 2]])
    np.testing.assert_array_equal(np.asarray(tree.children), [[[1, 2], [3, -1], [4, -1],
                                                               [-1, -1], [-1, -1]]])


class Eagle2MainCommandTest(absltest.TestCase):

  def test_eagle2_and_trees_compile_with_xla_defaults_in_the_main_command(self):
    from specdec_jax.app import generate as generate_app  # pylint: disable=g-import-not-at-top
    latency = dict(decode.CPU_LATENCY_OPTIONS)
    tree_modes = (decode.DynamicTreeDraft(5, 2, 2), decode.JacobiPAC(3, 2, 1),
                  decode.TreeDraft(verify.StaticTree.from_paths(((0,), (1,))), 'eagle'))
    for mode in tree_modes:
      self.assertIsNone(generate_app.mode_compiler_options(mode, latency), mode)
    for mode in (decode.Vanilla(), decode.ChainDraft(2, 'eagle'), decode.Jacobi(3)):
      self.assertEqual(generate_app.mode_compiler_options(mode, latency), latency)
    self.assertEqual(generate_app.mode_compiler_options(tree_modes[0], FAST), FAST)


class Eagle2BatchTest(absltest.TestCase):

  def test_eagle2_rows_match_batch_of_one(self):
    """Each image's tokens equal its batch-of-one run, with a different tree per image."""
    sampling = logits.Sampling(cfg_scale=1.5)
    mode = decode.DynamicTreeDraft(total_tokens=5, depth=2, top_k=2)
    keys = jax.random.split(jax.random.key(3), 6)
    batch = _generate(mode, sampling, num_images=6, key=keys, num_tokens=6)
    self.assertGreater(len(set(np.asarray(batch.metrics.accepted_tokens).tolist())), 1)
    for row in range(6):
      single = _generate(mode, sampling, num_images=1, key=keys[row:row + 1], num_tokens=6)
      np.testing.assert_array_equal(np.asarray(single.tokens)[0], np.asarray(batch.tokens)[row])


class Eagle2DrafterCacheTest(absltest.TestCase):

  def test_drafter_writes_fit_its_cache(self):
    """Every drafter cache write lands inside the cache: lax.dynamic_update_slice would
    clamp one that does not onto earlier slots, silently. A deep, narrow tree (depth 4,
    top-k 4, 5 nodes) overran it by a slot before the catch-up was counted."""
    from specdec_jax import kv_cache  # pylint: disable=g-import-not-at-top
    overruns, original = [], kv_cache.write_slots

    def write_slots(buffer, new, starts, slot_axis=kv_cache.VALUE_SLOT_AXIS, shared_start=False):
      end = new.shape[1] - buffer.shape[slot_axis]
      jax.debug.callback(lambda s: overruns.append(int(np.max(s)) + end), starts)
      return original(buffer, new, starts, slot_axis, shared_start)

    kv_cache.write_slots = write_slots
    decode.clear_compile_cache()
    try:
      for mode in (decode.DynamicTreeDraft(total_tokens=5, depth=4, top_k=4, drafts='sampled'),
                   decode.DynamicTreeDraft(total_tokens=4, depth=3, top_k=4)):
        jax.block_until_ready(_generate(mode, logits.Sampling(), num_images=64,
                                        num_tokens=9).tokens)
    finally:
      kv_cache.write_slots = original
      decode.clear_compile_cache()
    self.assertNotEmpty(overruns)
    self.assertLessEqual(max(overruns), 0)


class Eagle2BadInputTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('eagle2_budget', dict(total_tokens=8, depth=1, top_k=2), 'total_tokens must be in'),
      ('eagle2_depth', dict(depth=0), 'depth and top_k must be >= 1'),
      ('eagle2_top_k', dict(total_tokens=5, top_k=9), 'exceeds the vocabulary'),
      ('eagle2_top_k_one_past', dict(total_tokens=5, top_k=5), 'exceeds the vocabulary'),  # V 4
      ('eagle2_float', dict(total_tokens=5.0), 'total_tokens'),
      ('eagle2_drafts', dict(drafts='beam'), 'drafts must be one of'),
  )
  def test_eagle2_rejected_before_compilation(self, fields, message):
    original = decode._decode
    decode._decode = lambda *a, **k: (_ for _ in ()).throw(AssertionError('traced'))
    decode.clear_compile_cache()
    try:
      with self.assertRaisesRegex(ValueError, message):
        _generate(decode.DynamicTreeDraft(**{'total_tokens': 5, 'depth': 2, 'top_k': 2,
                                              **fields}), logits.Sampling(), num_images=2)
    finally:
      decode._decode = original
      decode.clear_compile_cache()


if __name__ == '__main__':
  absltest.main()
