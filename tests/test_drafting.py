"""Tests of specdec_jax.drafting: Jacobi window updates, drafter catch-up and tree drafting
through a cache (the draws themselves: tests/test_categorical.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

from specdec_jax import drafting
from specdec_jax import jacobi_drafts
from specdec_jax import logits
from specdec_jax import testing
from specdec_jax import verify
from specdec_jax.app import toy

VOCAB, CLASSES = 4, 2
_jacobi_next = jax.jit(jacobi_drafts.jacobi_next, static_argnums=4)


def _uniforms(seed: int, *shape) -> jax.Array:
  return jax.random.uniform(jax.random.key(seed), shape)


class JacobiTest(absltest.TestCase):

  def _one_hot_window(self, tokens):
    return jax.nn.one_hot(jnp.asarray(tokens), VOCAB)  # deterministic "samples"

  def test_carries_samples_beyond_the_rejection_with_their_laws(self):
    # W = 4; every index's distribution is a point mass, so y_i is known.
    target_probs = self._one_hot_window([[0, 1, 2, 3]])
    drafts, probs = _jacobi_next(_uniforms(0, 1, 7), target_probs, jnp.array([1]),
                                 jnp.array([1]), 'spatial')
    # accepted 1 draft: y_2, y_3 are carried, one fresh spatial draft repeats y_3.
    np.testing.assert_array_equal(np.asarray(drafts), [[2, 3, 3]])
    np.testing.assert_allclose(np.asarray(probs[0, :2]), np.asarray(target_probs[0, 2:]))
    np.testing.assert_allclose(np.asarray(probs[0, 2]), np.eye(VOCAB)[3])

  def test_all_accepted_refills_from_the_next_token(self):
    target_probs = self._one_hot_window([[0, 1, 2, 3]])
    drafts, probs = _jacobi_next(_uniforms(0, 1, 7), target_probs, jnp.array([3]),
                                 jnp.array([2]), 'spatial')
    np.testing.assert_array_equal(np.asarray(drafts), [[2, 2, 2]])
    np.testing.assert_allclose(np.asarray(probs[0]), np.eye(VOCAB)[[2, 2, 2]])

  def test_fresh_drafts_read_their_own_uniforms(self):
    """Fresh drafts come from uniforms[:, W:2W-1] alone: reusing the draws' uniforms
    made the last fresh draft equal the carried draft that shared its number."""
    window, vocab = 4, 10
    target_probs = jnp.full((2, window, vocab), 1.0 / vocab)
    uniforms = _uniforms(5, 2, 2 * window - 1)
    accepted, next_token = jnp.array([2, 0]), jnp.array([1, 1])
    next_window = jax.jit(jacobi_drafts.jacobi_next, static_argnums=(4,))
    drafts, _ = next_window(uniforms, target_probs, accepted, next_token, 'random')
    fresh = np.arange(window - 1)[None, :] >= window - 1 - np.asarray(accepted)[:, None]
    moved = uniforms.at[:, :window].set(_uniforms(6, 2, window))  # other draw numbers
    again, _ = next_window(moved, target_probs, accepted, next_token, 'random')
    np.testing.assert_array_equal(np.asarray(again)[fresh], np.asarray(drafts)[fresh])
    expected, _ = jacobi_drafts.jacobi_fresh(uniforms[:, window:], window - 1, vocab, 'random',
                                             next_token)
    np.testing.assert_array_equal(np.asarray(drafts)[fresh], np.asarray(expected)[fresh])

  def test_every_carried_draft_keeps_the_law_of_its_window_entry(self):
    """After n accepted, next draft j is window entry n + 1 + j's draw, with that entry's
    law, up to entry W - 1 (one-hot targets cannot tell a carried draw from a fresh
    point mass: dropping entry W - 1 kept every law exact and only lowered acceptance)."""
    window = 4
    target = jax.nn.softmax(jax.random.normal(jax.random.key(4), (window, window, 8)), axis=-1)
    for coupling in ('none', 'maximal'):
      _, probs = jacobi_drafts.jacobi_next(
          _uniforms(5, window, jacobi_drafts.jacobi_uniforms(window, 'maximal')), target,
          jnp.arange(window), jnp.zeros((window,), jnp.int32), 'random', coupling=coupling,
          old_tokens=jnp.zeros((window, window - 1), jnp.int32), old_probs=target[:, 1:])
      for n in range(window):
        for j in range(window - 1 - n):
          np.testing.assert_array_equal(probs[n, j], target[n, n + 1 + j], f'{coupling} {n} {j}')
        self.assertTrue(np.all(np.asarray(probs[n, window - 1 - n:]).max(-1) == 1.0))  # fresh

  def test_maximal_coupling_reads_its_own_keep_uniforms(self):
    """The keep tests read uniforms[:, 2W-1:], the fresh drafts uniforms[:, W:2W-1]:
    moving either set leaves what the other decides unchanged (keep tests on the fresh
    drafts' numbers tie a window's kept and fresh tokens together)."""
    window, batch, vocab = 4, 256, 8
    target = jax.nn.softmax(2 * jax.random.normal(jax.random.key(6), (batch, window, vocab)), -1)
    old_probs = jax.nn.softmax(2 * jax.random.normal(jax.random.key(7), (batch, window - 1, vocab)),
                               -1)
    old_tokens = jax.random.categorical(jax.random.key(8), jnp.log(old_probs)).astype(jnp.int32)
    accepted = jnp.arange(batch) % window
    uniforms = _uniforms(9, batch, jacobi_drafts.jacobi_uniforms(window, 'maximal'))
    step = lambda u: np.asarray(jacobi_drafts.jacobi_next(
        u, target, accepted, jnp.zeros((batch,), jnp.int32), 'random', coupling='maximal',
        old_tokens=old_tokens, old_probs=old_probs)[0])
    drafts = step(uniforms)
    carried = np.arange(window - 1)[None, :] < window - 1 - np.asarray(accepted)[:, None]
    other_fresh = step(uniforms.at[:, window:2 * window - 1].set(_uniforms(10, batch, window - 1)))
    np.testing.assert_array_equal(other_fresh[carried], drafts[carried])
    self.assertFalse(np.array_equal(other_fresh[~carried], drafts[~carried]))
    other_keep = step(uniforms.at[:, 2 * window - 1:].set(_uniforms(11, batch, window - 1)))
    np.testing.assert_array_equal(other_keep[~carried], drafts[~carried])
    self.assertFalse(np.array_equal(other_keep[carried], drafts[carried]))

  def test_random_init_is_one_hot_and_in_vocab(self):
    fresh = jax.jit(jacobi_drafts.jacobi_fresh, static_argnums=(1, 2, 3))
    tokens, probs = fresh(_uniforms(1, 64, 5), 5, VOCAB, 'random', jnp.zeros((64,), jnp.int32))
    self.assertTrue(np.all((np.asarray(tokens) >= 0) & (np.asarray(tokens) < VOCAB)))
    np.testing.assert_allclose(np.asarray(probs), np.asarray(jax.nn.one_hot(tokens, VOCAB)))
    self.assertGreater(len(np.unique(np.asarray(tokens))), 1)

  def test_random_init_draws_only_the_image_token_range(self):
    """SJD draws random drafts from the image tokens only (Lumina-mGPT: ids 4..8195)."""
    vocab, token_range = 16, (4, 12)
    fresh = jax.jit(jacobi_drafts.jacobi_fresh, static_argnums=(1, 2, 3, 5))
    tokens, probs = fresh(_uniforms(2, 256, 8), 8, vocab, 'random', jnp.zeros((256,), jnp.int32),
                          token_range)
    tokens = np.asarray(tokens)
    self.assertTrue(np.all((tokens >= 4) & (tokens < 12)))
    self.assertEqual(set(np.unique(tokens).tolist()), set(range(4, 12)))  # all of it, uniform
    counts = np.bincount(tokens.reshape(-1) - 4, minlength=8)
    self.assertGreater(testing.chi_square_pvalue(counts, np.full(8, 1 / 8))[0], 1e-4)
    np.testing.assert_allclose(np.asarray(probs), np.asarray(jax.nn.one_hot(tokens, vocab)))
    with self.assertRaisesRegex(ValueError, 'token_range'):
      jacobi_drafts.jacobi_fresh(_uniforms(0, 2, 3), 3, vocab, 'random', jnp.zeros((2,), jnp.int32),
                            (12, 12))
    with self.assertRaisesRegex(ValueError, r'token_range must be a non-empty range inside '
                                r'\[0, 16\], got \(4, 24\)'):  # past the vocabulary
      jacobi_drafts.jacobi_fresh(_uniforms(0, 2, 3), 3, vocab, 'random', jnp.zeros((2,), jnp.int32),
                                 (4, 24))

  def test_window_refill_draws_only_the_image_token_range(self):
    vocab, window, batch = 16, 6, 64
    target_probs = jnp.full((batch, window, vocab), 1.0 / vocab)
    next_window = jax.jit(jacobi_drafts.jacobi_next, static_argnums=(4, 5))
    # All drafts accepted: the whole next window is fresh.
    drafts, probs = next_window(_uniforms(3, batch, 2 * window - 1), target_probs,
                                jnp.full((batch,), window - 1), jnp.zeros((batch,), jnp.int32),
                                'random', (4, 8))
    drafts = np.asarray(drafts)
    self.assertTrue(np.all((drafts >= 4) & (drafts < 8)), drafts)
    np.testing.assert_allclose(np.asarray(probs), np.asarray(jax.nn.one_hot(drafts, vocab)))


class ScdCouplingTest(absltest.TestCase):
  """jacobi_drafts.maximal_coupling (SCD): x ~ q re-drafted against p.

  Closed form: the output law is min(q, p) + (1 - sum min(q, p)) Norm([p - q]_+)
  = p, and the old token survives with probability 1 - TV(p, q). Monte Carlo
  with N = 2**16 draws over V = 6 bins, chi-square p-value threshold 1e-4: a law
  at TV distance >= 0.03 from p is rejected with probability > 0.99; the
  negative control (always keep the old draft, whose law q is at TV 0.3 from p)
  must fail.
  """

  Q = np.array([0.3, 0.3, 0.1, 0.1, 0.1, 0.1])
  P = np.array([0.05, 0.25, 0.1, 0.2, 0.2, 0.2])
  N = 2 ** 16

  def _draws(self, coupling):
    keys = jax.random.split(jax.random.key(3), 3)
    old = jax.random.choice(keys[0], 6, (self.N,), p=jnp.asarray(self.Q))
    q = jnp.broadcast_to(jnp.asarray(self.Q, jnp.float32), (self.N, 6))
    p = jnp.broadcast_to(jnp.asarray(self.P, jnp.float32), (self.N, 6))
    new = coupling(jax.random.uniform(keys[1], (self.N,)), jax.random.uniform(keys[2], (self.N,)),
                   old.astype(jnp.int32), q, p)
    return np.asarray(old), np.asarray(new)

  def test_scd_coupling_has_the_new_law_and_keeps_the_most(self):
    old, new = self._draws(jacobi_drafts.maximal_coupling)
    counts = testing.histogram(new, 6)
    self.assertGreater(testing.chi_square_pvalue(counts, self.P)[0], 1e-4)
    keep = np.mean(old == new)
    expected = 1.0 - 0.5 * np.abs(self.P - self.Q).sum()  # 0.7
    self.assertAlmostEqual(keep, expected, delta=6 * np.sqrt(expected * (1 - expected) / self.N))

  def test_scd_negative_control_keeping_every_draft_fails(self):
    _, new = self._draws(lambda keep_u, draw_u, old, q, p: old)
    counts = testing.histogram(new, 6)
    self.assertLess(testing.chi_square_pvalue(counts, self.P)[0], 1e-4)

  def test_scd_old_draft_slots(self):
    """W = 4, n accepted: next draft j is window entry s = n + 1 + j's token, held by
    this step's draft s when s <= 2."""
    has_old, old_index = jacobi_drafts.old_draft_slots(jnp.array([0, 1, 2, 3]), 4)
    np.testing.assert_array_equal(np.asarray(has_old), [[True, True, False],
                                                        [True, False, False],
                                                        [False, False, False],
                                                        [False, False, False]])
    np.testing.assert_array_equal(np.asarray(old_index)[:2], [[1, 2, 2], [2, 2, 2]])

  def test_scd_window_update_without_coupling_is_sjd(self):
    """coupling='none' is the released SJD update; 'maximal' keeps a draft whose law
    did not move (p = q: kept with probability 1)."""
    target = jax.nn.softmax(jax.random.normal(jax.random.key(1), (1, 4, VOCAB)), axis=-1)
    uniforms = _uniforms(2, 1, jacobi_drafts.jacobi_uniforms(4, 'maximal'))
    old_tokens = jnp.array([[1, 2, 3]])
    # The old drafts' laws: what this forward predicts at their token indices.
    old_probs = target[:, :3]
    plain = _jacobi_next(uniforms, target, jnp.array([0]), jnp.array([1]), 'random')
    coupled = jacobi_drafts.jacobi_next(
        uniforms, target, jnp.array([0]), jnp.array([1]), 'random', coupling='maximal',
        old_tokens=old_tokens,
        old_probs=jnp.concatenate([old_probs[:, 1:], old_probs[:, :1]], axis=1))
    # Accepted 0: new drafts at window entries 1, 2 sit where old drafts 1, 2 were,
    # and their laws target[1], target[2] equal the old ones: both kept.
    np.testing.assert_array_equal(np.asarray(coupled[0][0, :2]), [2, 3])
    np.testing.assert_allclose(np.asarray(coupled[1]), np.asarray(plain[1]))
    with self.assertRaisesRegex(ValueError, 'coupling must be one of'):
      jacobi_drafts.jacobi_next(uniforms, target, jnp.array([0]), jnp.array([1]), 'random',
                                coupling='sinkhorn', old_tokens=old_tokens, old_probs=old_probs)
    with self.assertRaisesRegex(ValueError, "coupling 'maximal' at W=4 reads 10 uniforms per "
                                r'row \(jacobi_uniforms\), got 7'):  # the count without coupling
      jacobi_drafts.jacobi_next(uniforms[:, :7], target, jnp.array([0]), jnp.array([1]),
                                'random', coupling='maximal', old_tokens=old_tokens,
                                old_probs=old_probs)
    with self.assertRaisesRegex(ValueError, "coupling 'maximal' needs old_probs"):
      jacobi_drafts.jacobi_next(uniforms, target, jnp.array([0]), jnp.array([1]), 'random',
                                coupling='maximal', old_tokens=old_tokens)
    with self.assertRaisesRegex(ValueError, r"jacobi_fresh: init must be one of \('random', "
                                r"'spatial'\), got 'left'"):
      jacobi_drafts.jacobi_next(uniforms, target, jnp.array([0]), jnp.array([1]), 'left')
    with self.assertRaisesRegex(ValueError, "coupling 'gumbel' needs noise"):
      jacobi_drafts.jacobi_next(uniforms, target, jnp.array([0]), jnp.array([1]), 'random',
                                coupling='gumbel')


class ScdGumbelCouplingTest(absltest.TestCase):
  """jacobi_drafts.gumbel_coupling and gumbel_noise (SCD's Gumbel coupling).

  Closed forms: argmax(log p + g) with g iid standard Gumbel is a draw from p
  (the Gumbel-max trick); two laws p, q drawn with the same g give the same
  token with probability between (1 - TV) / (1 + TV) (Gumbel coupling's
  bound) and 1 - TV (the maximal coupling's). Monte Carlo with N = 2**16 rows
  over V = 6 bins, chi-square p-value threshold 1e-4 (a law at TV >= 0.03 from
  p is rejected with probability > 0.99); the negative control (Gumbel numbers
  doubled: a draw from Norm(sqrt(p)), at TV 0.08 from p) must fail.
  """

  Q = ScdCouplingTest.Q
  P = ScdCouplingTest.P
  N = 2 ** 16

  def _noise(self, seed: int, token_index):
    seeds = jacobi_drafts.gumbel_seeds(_uniforms(seed, 1, jacobi_drafts.GUMBEL_SEED_UNIFORMS))
    return jacobi_drafts.gumbel_noise(seeds, jnp.asarray(token_index, jnp.int32)[None], 6)[0]

  def test_scd_gumbel_coupling_has_the_law_and_keeps_within_the_bounds(self):
    noise = self._noise(0, np.arange(self.N))  # one image, N token indices
    p = jnp.broadcast_to(jnp.asarray(self.P, jnp.float32), (self.N, 6))
    q = jnp.broadcast_to(jnp.asarray(self.Q, jnp.float32), (self.N, 6))
    new, old = (np.asarray(jacobi_drafts.gumbel_coupling(noise, law)) for law in (p, q))
    self.assertGreater(testing.chi_square_pvalue(testing.histogram(new, 6), self.P)[0], 1e-4)
    self.assertGreater(testing.chi_square_pvalue(testing.histogram(old, 6), self.Q)[0], 1e-4)
    tv = 0.5 * np.abs(self.P - self.Q).sum()  # 0.3
    keep, slack = np.mean(old == new), 6 * np.sqrt(0.25 / self.N)
    self.assertGreater(keep, (1 - tv) / (1 + tv) - slack)
    self.assertLess(keep, 1 - tv + slack)
    # A token without mass is never drawn, whatever its Gumbel number.
    sparse = jnp.asarray([0.0, 0.5, 0.0, 0.5, 0.0, 0.0], jnp.float32)
    self.assertTrue(set(np.unique(jacobi_drafts.gumbel_coupling(noise, sparse))) <= {1, 3})

  def test_scd_gumbel_negative_control_wrong_scale_fails(self):
    noise = self._noise(0, np.arange(self.N))
    p = jnp.broadcast_to(jnp.asarray(self.P, jnp.float32), (self.N, 6))
    new = np.asarray(jacobi_drafts.gumbel_coupling(2.0 * noise, p))
    self.assertLess(testing.chi_square_pvalue(testing.histogram(new, 6), self.P)[0], 1e-4)

  def test_scd_gumbel_noise_is_fixed_per_token_and_independent_across(self):
    first = np.asarray(self._noise(1, [5, 6, 7]))
    again = np.asarray(self._noise(1, [7, 5, 9]))
    np.testing.assert_array_equal(again[0], first[2])  # token 7 at any window slot
    np.testing.assert_array_equal(again[1], first[0])  # token 5
    self.assertFalse(np.any(first[0] == first[1]))  # other tokens, other numbers
    self.assertFalse(np.any(np.asarray(self._noise(2, [5])) == first[0]))  # other seed
    # Both seed words count, and no two of 64 tokens share a row (fold_in(n // 2) would).
    seeds = jnp.array([[3, 4], [3, 5], [6, 4]], jnp.uint32)
    rows = np.asarray(jacobi_drafts.gumbel_noise(seeds, jnp.zeros((3, 1), jnp.int32), 6))[:, 0]
    self.assertFalse(np.any(rows[0] == rows[1]) or np.any(rows[0] == rows[2]))
    tokens = np.asarray(self._noise(1, np.arange(64)))
    self.assertLen(np.unique(tokens[:, 0]), 64)
    # Standard Gumbel: mean Euler's gamma, variance pi^2 / 6 (s.e. over 6 N numbers).
    numbers = np.asarray(self._noise(3, np.arange(self.N))).ravel()
    self.assertAlmostEqual(numbers.mean(), np.euler_gamma, delta=6 * np.sqrt(1.645 / numbers.size))
    self.assertAlmostEqual(numbers.var(), np.pi ** 2 / 6, delta=0.05)


class NodeLawsTest(absltest.TestCase):

  def test_all_nodes_at_once_equal_the_on_demand_laws(self):
    """The tree modes' two ways of reading the target at a node (all N processed,
    or one node's logits processed on demand) give the same law, with CFG."""
    sampling = logits.Sampling(cfg_scale=2.0, temperature=0.7)
    row_logits = jax.random.normal(jax.random.key(0), (4, 5, 11)) * 3  # 2 images x 2 rows
    token_index = jnp.array([[3, 4, 4, 5, 5], [7, 8, 8, 8, 9]])
    on_demand = drafting.ImageLogits.from_rows(row_logits, token_index, cfg=True)
    all_nodes = drafting.guided_probs(sampling, row_logits, token_index, cfg=True)  # [2, 5, 11]
    for target in (on_demand, all_nodes):
      arrays, law = drafting.node_laws(sampling, target)
      laws = jax.vmap(lambda *a: jax.vmap(lambda n: law(*a, n))(jnp.arange(5)))(*arrays)
      np.testing.assert_allclose(laws, all_nodes, rtol=1e-6, atol=1e-7)
    # Negative control: the unconditional row alone is another law.
    plain = drafting.guided_probs(logits.Sampling(temperature=0.7), row_logits[1::2],
                                  token_index, cfg=False)
    self.assertGreater(float(jnp.abs(plain - all_nodes).max()), 0.05)


def _prefilled(model, params, cond, capacity=16):
  return model.prefill(params, model.init_cache(cond.shape[0], capacity), cond).cache


class CatchUpTest(absltest.TestCase):

  def test_junk_after_the_next_token_is_ignored_and_lengths_move(self):
    model = toy.MarkovToy(VOCAB, CLASSES)
    params = model.init_params(jax.random.key(0))
    drafter = drafting.Drafter(model, drafting.MODEL)
    cond = jnp.array([0, 1], jnp.int32)
    num_accepted = jnp.array([1, 0])
    tokens_a = jnp.array([[2, 3, 0], [1, 0, 0]])  # row 0: a1=2, next=3; row 1: next=1
    tokens_b = jnp.array([[2, 3, 1], [1, 3, 2]])  # different junk

    @jax.jit
    def both(params):
      cache = _prefilled(model, params, cond)
      first = drafting.catch_up(drafter, params, cache, cache.lengths, tokens_a, None,
                                num_accepted, cfg=False)
      second = drafting.catch_up(drafter, params, cache, cache.lengths, tokens_b, None,
                                 num_accepted, cfg=False)
      return cache.lengths, first, second

    committed, (logits_a, _, cache_a), (logits_b, _, _) = both(params)
    np.testing.assert_allclose(np.asarray(logits_a), np.asarray(logits_b))
    np.testing.assert_array_equal(np.asarray(cache_a.lengths), np.asarray(committed) + [2, 1])
    # Row 0's root is the token 3 after 2: table[2, 3]; row 1's: table[class 1 token, 1].
    np.testing.assert_allclose(np.asarray(logits_a[0]), np.asarray(params['table'][2, 3]))
    np.testing.assert_allclose(np.asarray(logits_a[1]),
                               np.asarray(params['table'][VOCAB + 1, 1]))

  def test_root_hidden_is_the_output_at_the_pending_token(self):
    """The catch-up's root hidden state is the drafter's output at the new pending
    token (index num_accepted of its window): another one keeps the decode exact but
    drafts from the wrong feature, accepting less, silently."""
    model = toy.MarkovToy(VOCAB, CLASSES)
    params = model.init_params(jax.random.key(0))
    drafter = drafting.Drafter(model, drafting.MODEL)
    cond = jnp.array([0, 1], jnp.int32)
    num_accepted = jnp.array([2, 0])
    tokens = jnp.array([[2, 1, 3], [1, 0, 0]])  # row 0: drafts 2, 1 accepted, next 3
    cache = _prefilled(model, params, cond)
    root_logits, root_hidden, _ = drafting.catch_up(drafter, params, cache, cache.lengths,
                                                    tokens, None, num_accepted, cfg=False)
    # MarkovToy's hidden state at a token is [one_hot(previous), one_hot(token)].
    alphabet = np.eye(model.alphabet)
    expected = np.stack([np.concatenate([alphabet[1], alphabet[3]]),  # 3 after 1
                         np.concatenate([alphabet[VOCAB + 1], alphabet[1]])])  # 1 after class 1
    np.testing.assert_array_equal(np.asarray(root_hidden), expected)
    np.testing.assert_allclose(np.asarray(root_logits[0]), np.asarray(params['table'][1, 3]))


class DraftTreeTest(absltest.TestCase):

  def test_one_draw_per_level_equals_drawing_each_node_alone(self):
    """A level's children drawn in one batched call (nodes with 3, 0, 1 and 2
    children) are the tokens each node's own `sample_distinct` call gives."""
    tree = verify.StaticTree.from_paths(
        ((0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (2, 0), (3, 0), (3, 1)))
    level = np.nonzero(tree.depths == 1)[0]
    rng = np.random.default_rng(6)
    probs = jnp.asarray(rng.dirichlet(np.ones(7), (5, level.size)), jnp.float32)
    uniforms = jnp.asarray(rng.random((5, tree.num_nodes - 1)), jnp.float32)
    start = jnp.zeros((5, tree.num_nodes), jnp.int32)
    got = drafting._draw_children(  # pylint: disable=protected-access
        start, probs, tree.children[level], uniforms)
    want = start
    for slot, node in enumerate(level):
      kids = tree.children[node][tree.children[node] >= 0]
      if kids.size:
        want = want.at[:, kids].set(
            drafting.categorical.sample_distinct(uniforms[:, kids - 1], probs[:, slot]))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    for node in level:  # siblings distinct
      kids = tree.children[node][tree.children[node] >= 0]
      for row in np.asarray(got)[:, kids]:
        self.assertLen(set(row.tolist()), kids.size)
    # Negative control: other uniforms give other tokens (the comparison is not vacuous).
    other = drafting._draw_children(  # pylint: disable=protected-access
        start, probs, tree.children[level], 1.0 - uniforms)
    self.assertFalse(np.array_equal(np.asarray(other), np.asarray(want)))

  def test_nodes_see_exactly_their_ancestors(self):
    """The drafter law at every tree node equals running its path as a plain chain."""
    tree = verify.StaticTree.from_paths(((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))
    target = toy.MarkovToy(VOCAB, CLASSES)
    eagle = toy.ToyEagle(VOCAB, CLASSES)
    target_params = target.init_params(jax.random.key(0))
    params = eagle.init_params(jax.random.key(1))
    drafter = drafting.Drafter(eagle, drafting.EAGLE)
    sampling = logits.Sampling()
    cond = jnp.array([0, 1], jnp.int32)

    @jax.jit
    def draft(target_params, params):
      prefix = target.prefill(target_params, target.init_cache(2, 8), cond)
      cache = drafter.prefill(params, eagle.init_cache(2, 32), cond, prefix.hidden)
      root_logits, root_hidden, cache = drafting.catch_up(
          drafter, params, cache, cache.lengths, jnp.array([[2], [0]]), prefix.hidden[:, -1:],
          jnp.zeros((2,), jnp.int32), cfg=False)
      drafted = drafting.draft_tree(
          drafter, params, cache, root_logits, root_hidden, tree=tree, sampling=sampling,
          cfg=False, uniforms=_uniforms(2, 2, tree.num_nodes - 1),
          first_index=jnp.ones(2, jnp.int32))
      return cache, root_hidden, drafted

    cache, root_hidden, (node_tokens, node_probs, after) = draft(target_params, params)
    np.testing.assert_array_equal(np.asarray(after.lengths), np.asarray(cache.lengths))
    node_tokens = np.asarray(node_tokens)
    for node in range(1, tree.num_nodes):
      siblings = [c for c in tree.children[tree.parents[node]] if c >= 0]
      self.assertLen({int(node_tokens[0, c]) for c in siblings}, len(siblings))
    parents = tree.parents

    @jax.jit
    def chain_probs(cache, root_hidden, path_tokens):
      hidden = root_hidden[:, None]
      for step in range(path_tokens.shape[1]):
        out = eagle.forward(params, cache, path_tokens[:, step:step + 1], hidden)
        cache, hidden = out.cache, out.hidden
      return sampling.probs(out.logits[:, 0])

    has_children = (tree.children >= 0).any(axis=1)
    # Trailing leaves of a level (3 = (2,), 5 = (0, 1), 6 = (1, 0)) are not run: their
    # children laws would never be read, they stay uniform.
    for node in (3, 5, 6):
      self.assertFalse(has_children[node])
      np.testing.assert_array_equal(np.asarray(node_probs[:, node]), 1.0 / VOCAB)
    for node in np.nonzero(has_children)[0][1:]:  # every node with children below the root
      path = [node]
      while parents[path[-1]] > 0:
        path.append(parents[path[-1]])
      path = path[::-1]
      expected = chain_probs(cache, root_hidden, jnp.asarray(node_tokens[:, path]))
      np.testing.assert_allclose(np.asarray(node_probs[:, node]), np.asarray(expected),
                                 rtol=1e-5, atol=1e-6)


class GumbelSpatialTest(absltest.TestCase):
  """Spatial fresh drafts under the Gumbel coupling repeat the last carried draft."""

  def test_gumbel_spatial_fresh_drafts_repeat_the_last_carried_draft(self):
    batch, window, vocab = 64, 5, 16
    keys = jax.random.split(jax.random.key(0), 3)
    probs = jax.nn.softmax(jax.random.normal(keys[0], (batch, window, vocab)), -1)
    noise = jax.random.gumbel(keys[1], (batch, window - 1, vocab))
    uniforms = jax.random.uniform(keys[2], (batch, jacobi_drafts.jacobi_uniforms(window)))
    n = jnp.full((batch,), 1)
    tokens, _ = jacobi_drafts.jacobi_next(uniforms, probs, n, jnp.zeros((batch,), jnp.int32),
                                          'spatial', coupling='gumbel', noise=noise)
    # carried j = 0, 1, 2 (window entries 2..4); fresh j = 3 repeats carried j = 2.
    np.testing.assert_array_equal(tokens[:, 3], tokens[:, 2])


if __name__ == '__main__':
  absltest.main()
