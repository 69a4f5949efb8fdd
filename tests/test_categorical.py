"""Tests of specdec_jax.categorical: inverse-CDF draws, draws without replacement, randint.

Monte Carlo tests use n = 2^16 draws; `testing.bins_match` at its default 6
sigmas detects a shift of 1.0 percentage point in a bin of mass 0.1 with
probability 0.99 (power ~1 against the negative controls below, false alarm at
most 2.2e-9 per bin).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from specdec_jax import categorical
from specdec_jax import testing

NUM = 2 ** 16


def _uniforms(seed: int, *shape) -> jax.Array:
  return jax.random.uniform(jax.random.key(seed), shape)


def _law(vocab: int, seed: int) -> np.ndarray:
  """A law with zeros (every third token, and the last ones), over `vocab` tokens."""
  rng = np.random.default_rng(seed)
  law = rng.gamma(0.5, size=vocab)
  law[::3] = 0.0
  law[-5:] = 0.0
  return law / law.sum()


_sample = jax.jit(categorical.sample)


class SampleTest(parameterized.TestCase):

  # 8 tokens: one level; 1000 tokens: two levels (8 blocks of 128, the last padded).
  @parameterized.parameters(8, 1000)
  def test_draws_follow_the_law_and_never_hit_zero_mass(self, vocab):
    law = _law(vocab, vocab)
    draws = np.asarray(_sample(_uniforms(1, NUM), jnp.broadcast_to(jnp.asarray(law, jnp.float32),
                                                                   (NUM, vocab))))
    self.assertTrue(np.all(law[draws] > 0))
    if vocab > 8:  # pool into 8 bins of roughly equal mass for the test's power
      edges = np.searchsorted(np.cumsum(law), np.linspace(0, 1, 9)[1:-1])
      bins = np.searchsorted(edges, np.arange(vocab), side='right')
      law, draws = np.bincount(bins, weights=law, minlength=8), bins[draws]
    report = testing.bins_match(testing.histogram(draws, len(law)), law)
    self.assertTrue(report.ok, report.message)

  @parameterized.parameters(8, 1000)
  def test_negative_control_fails(self, vocab):
    """Squared uniforms are not uniform: the same check must reject their draws."""
    law = _law(vocab, vocab)
    probs = jnp.broadcast_to(jnp.asarray(law, jnp.float32), (NUM, vocab))
    draws = np.asarray(_sample(_uniforms(1, NUM) ** 2, probs))
    edges = np.searchsorted(np.cumsum(law), np.linspace(0, 1, 9)[1:-1])
    bins = np.searchsorted(edges, np.arange(vocab), side='right')
    pooled = np.bincount(bins, weights=law, minlength=8)
    report = testing.bins_match(testing.histogram(bins[draws], 8), pooled)
    self.assertFalse(report.ok)

  @parameterized.parameters(8, 1000, 16384)
  def test_inverse_cdf_matches_a_float64_search(self, vocab):
    """Each draw is the first token whose cumulative mass exceeds u (away from rounding)."""
    law = _law(vocab, 3)
    uniforms = np.asarray(_uniforms(5, 512))
    draws = np.asarray(_sample(jnp.asarray(uniforms), jnp.broadcast_to(
        jnp.asarray(law, jnp.float32), (512, vocab))))
    cumulative = np.cumsum(law.astype(np.float32).astype(np.float64))
    cumulative /= cumulative[-1]
    expected = np.searchsorted(cumulative, uniforms, side='right')
    near_edge = np.min(np.abs(cumulative[None, :] - uniforms[:, None]), axis=1) < 1e-5
    np.testing.assert_array_equal(draws[~near_edge], expected[~near_edge])
    self.assertGreater((~near_edge).sum(), 400)

  def test_edges(self):
    probs = jnp.array([[0.0, 0.5, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0],
                       [2.0, 0.0, 6.0, 0.0]])
    top = jnp.float32(1.0 - 2.0 ** -24)  # the largest uniform below 1
    np.testing.assert_array_equal(_sample(jnp.full((4,), top), probs), [2, 0, 1, 2])
    np.testing.assert_array_equal(_sample(jnp.zeros((4,)), probs), [1, 0, 1, 0])
    # Unnormalised rows: the draw is from probs / sum(probs) (u = 0.3 -> token 2 of [2, 0, 6]).
    self.assertEqual(int(_sample(jnp.float32(0.3), probs[3])), 2)
    self.assertEqual(int(_sample(jnp.float32(0.2), probs[3])), 0)
    wide = jnp.zeros((5000,)).at[4999].set(1.0).at[130].set(1e-30)
    self.assertEqual(int(_sample(top, wide)), 4999)
    self.assertEqual(int(_sample(jnp.float32(0.0), wide)), 130)

  def test_non_finite_entries_carry_no_mass(self):
    # A broken drafter's NaN row once gave index V (out of the vocabulary): the
    # target then embedded it as NaN and the decode blamed the target.
    for vocab in (8, 5000):  # one-level and two-level draws
      for bad in (jnp.nan, jnp.inf, -jnp.inf):
        row = jnp.full((vocab,), bad)
        for u in (0.0, 0.3, 1.0 - 2.0 ** -24):
          self.assertEqual(int(_sample(jnp.float32(u), row)), 0, (vocab, bad, u))
        mixed = row.at[3].set(1.0)  # the finite entry holds all the mass
        self.assertEqual(int(_sample(jnp.float32(0.5), mixed)), 3, (vocab, bad))
        picks = np.asarray(categorical.sample_distinct(_uniforms(0, 1, 2)[0], mixed))
        np.testing.assert_array_equal(picks, [3, 0])

  def test_shape_errors(self):
    with self.assertRaisesRegex(ValueError, 'one uniform per draw'):
      categorical.sample(jnp.zeros((3, 8)), jnp.full((3, 8), 1 / 8))


class SampleDistinctTest(absltest.TestCase):

  def test_ordered_pairs_follow_sequential_sampling_without_replacement(self):
    probs = jnp.array([0.5, 0.3, 0.15, 0.05])
    picks = np.asarray(jax.jit(categorical.sample_distinct)(
        _uniforms(0, NUM, 2), jnp.broadcast_to(probs, (NUM, 4))))
    self.assertTrue(np.all(picks[:, 0] != picks[:, 1]))
    p = np.asarray(probs, np.float64)
    pairs = list(itertools.permutations(range(4), 2))
    law = np.array([p[a] * p[b] / (1 - p[a]) for a, b in pairs])
    index = {pair: i for i, pair in enumerate(pairs)}
    counts = np.bincount([index[tuple(row)] for row in picks], minlength=len(pairs))
    self.assertGreater(testing.chi_square_pvalue(counts, law / law.sum())[0], 1e-4)
    # Negative control: two independent draws *with* replacement fail the same test.
    again = np.asarray(_sample(_uniforms(1, NUM, 2), jnp.broadcast_to(probs, (NUM, 2, 4))))
    distinct = again[again[:, 0] != again[:, 1]]
    counts = np.bincount([index[tuple(row)] for row in distinct], minlength=len(pairs))
    self.assertLess(testing.chi_square_pvalue(counts, law / law.sum())[0], 1e-6)

  def test_distinct_when_the_mass_runs_out(self):
    probs = jnp.array([[0.0, 0.7, 0.0, 0.3, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]])
    for seed in range(10):
      picks = np.asarray(categorical.sample_distinct(_uniforms(seed, 2, 4), probs))
      self.assertEqual(set(picks[0, :2].tolist()), {1, 3})
      np.testing.assert_array_equal(picks[0, 2:], [0, 2])  # lowest indices not drawn yet
      np.testing.assert_array_equal(picks[1], [2, 0, 1, 3])


class RandintTest(absltest.TestCase):

  def test_uniform_in_range(self):
    draws = np.asarray(categorical.randint(_uniforms(2, NUM), 4, 12))
    self.assertTrue(np.all((draws >= 4) & (draws < 12)))
    counts = np.bincount(draws - 4, minlength=8)
    self.assertGreater(testing.chi_square_pvalue(counts, np.full(8, 1 / 8))[0], 1e-4)
    self.assertEqual(int(categorical.randint(jnp.float32(1.0 - 2.0 ** -24), 0, 3)), 2)
    with self.assertRaisesRegex(ValueError, 'start < stop'):
      categorical.randint(jnp.zeros(2), 3, 3)


if __name__ == '__main__':
  absltest.main()
