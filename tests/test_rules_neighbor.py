"""Tests of the neighbour-row tables the relaxed rules use (models/neighbors.py).
"""


from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import resampling
from specdec_jax import rules
from specdec_jax.models import neighbors as neighbors_lib
from tests.rules_support import dirichlet_pair
from tests.rules_support import published_residual_law


def offset_vocabulary_table(k=4):
  """A Lumina-like vocabulary of 20 ids: 0..3 text, 4..15 image tokens (12 codes,
  token = code + 4), 16..19 layout ids; the codebook and its neighbour table."""
  codebook = np.random.default_rng(5).normal(size=(12, 3))
  return codebook, neighbors_lib.neighbor_table(codebook, k, token_offset=4, vocab_size=20)


class NeighborRowsTest(parameterized.TestCase):
  """LANTERN tables have one row per token id; offset vocabularies (Lumina-mGPT) pool
  each token's own neighbours and leave non-image tokens lossless."""

  @parameterized.parameters('lantern', 'lanternpp')
  def test_offset_vocabulary_pools_the_tokens_own_neighbours(self, name):
    codebook, table = offset_vocabulary_table()
    draft, target = dirichlet_pair(4, 20, concentration=1.0)
    t, d = np.asarray(target, np.float64), np.asarray(draft, np.float64)
    k = 3
    if name == 'lantern':
      rule = rules.Lantern(neighbors=jnp.asarray(table), k=k, delta=0.15)
    else:
      rule = rules.LanternPP(neighbors=jnp.asarray(table), k=k, lam=2.5)
    expected = []
    for x in range(20):
      mass = 0.0
      if 4 <= x < 16:  # an image token: code x - 4, neighbours by brute-force distance
        distance = np.linalg.norm(codebook - codebook[x - 4], axis=1)
        distance[x - 4] = np.inf
        near = np.argsort(distance, kind='stable')[:k] + 4
        bound = 0.15 if name == 'lantern' else 1.5 * t[x]
        for m in range(1, k + 1):
          if t[near[:m]].sum() <= bound:
            mass = t[near[:m]].sum()
      expected.append(min(1.0, (t[x] + mass) / d[x]))
    expected = np.array(expected)
    self.assertTrue(np.any(expected[4:16] > np.minimum(1, t / d)[4:16] + 1e-3))  # it relaxes
    np.testing.assert_allclose(rule.accept_prob(draft, target), expected, rtol=1e-5)
    for token in range(20):
      self.assertAlmostEqual(float(rule.accept_prob_at(draft, target, 1, token)),
                             expected[token], places=5)

  def test_published_residual_leaves_tokens_without_neighbours_alone(self):
    """A rejected layout/text token zeroes nothing (no wrap-around of the -1 padding)."""
    _, table = offset_vocabulary_table()
    draft, target = dirichlet_pair(8, 20, concentration=1.0)
    for mode in ('published_llamagen', 'published_lumina'):
      rule = rules.LanternPP(neighbors=jnp.asarray(table), k=3, lam=50.0, residual_mode=mode)
      for rejected in (0, 3, 16, 19):
        np.testing.assert_allclose(rule.residual(draft, target, 1, rejected),
                                   resampling.standard_residual(draft, target), atol=1e-7)
      # An image token's k + 1 = 4 neighbours are zeroed (ids in 4..15 only).
      zero = np.asarray(table[9, :4])
      expected = published_residual_law(draft, target, zero, mode)
      np.testing.assert_allclose(rule.residual(draft, target, 1, 9), expected, atol=1e-6)

  @parameterized.parameters('lantern', 'lanternpp')
  def test_table_rows_must_match_the_vocabulary(self, name):
    codebook, _ = offset_vocabulary_table()
    code_rows = neighbors_lib.code_neighbor_table(codebook, 4)  # 12 rows, indexed by code
    make = rules.Lantern if name == 'lantern' else rules.LanternPP
    rule = make(neighbors=jnp.asarray(code_rows), k=2)
    draft, target = dirichlet_pair(0, 20)
    for call in (lambda: rule.accept_prob(draft, target),
                 lambda: rule.accept_prob_at(draft, target, 1, 5),
                 lambda: jax.jit(rule.accept_prob)(draft, target)):
      with self.assertRaisesRegex(ValueError, r'12 rows but the vocabulary has V=20'):
        call()
    # More rows than tokens is refused too (a table built for a larger vocabulary).
    draft, target = dirichlet_pair(0, 16)
    rule = make(neighbors=jnp.asarray(offset_vocabulary_table()[1]), k=2)  # 20 rows
    for call in (lambda: rule.accept_prob(draft, target), lambda: rule.check_vocab(16)):
      with self.assertRaisesRegex(ValueError, r'20 rows but the vocabulary has V=16'):
        call()


if __name__ == '__main__':
  absltest.main()
