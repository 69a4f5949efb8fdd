"""Tests for models/neighbors.py: LANTERN neighbour tables."""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from specdec_jax.models import neighbors


def brute_force_table(codebook: np.ndarray, k: int) -> np.ndarray:
  """Full pairwise distances by explicit differences, stable argsort (ties -> lower id)."""
  book = codebook.astype(np.float64)
  dist = np.sqrt(np.sum((book[:, None, :] - book[None, :, :]) ** 2, axis=-1))
  np.fill_diagonal(dist, np.inf)
  return np.argsort(dist, axis=1, kind='stable')[:, :k]


class NeighborTableTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('llamagen_like', 97, 8, 10, 16),
      ('wide_codes', 64, 256, 63, 7),
      ('one_block', 50, 4, 5, 512),
      ('k_one', 33, 3, 1, 4),
  )
  def test_matches_brute_force(self, num_codes, dim, k, block_rows):
    rng = np.random.default_rng(num_codes)
    codebook = rng.normal(size=(num_codes, dim)).astype(np.float32)
    table = neighbors.neighbor_table(codebook, k, block_rows=block_rows)
    self.assertEqual(table.dtype, np.int32)
    self.assertEqual(table.shape, (num_codes, k))
    np.testing.assert_array_equal(table, brute_force_table(codebook, k))

  def test_self_excluded_and_nearest_first(self):
    rng = np.random.default_rng(0)
    codebook = rng.normal(size=(40, 8))
    table = neighbors.neighbor_table(codebook, 39, block_rows=6)
    rows = np.arange(40)[:, None]
    self.assertFalse(np.any(table == rows))
    # Every other code appears exactly once per row.
    np.testing.assert_array_equal(np.sort(table, axis=1),
                                  np.stack([np.delete(np.arange(40), r) for r in range(40)]))
    dist = np.linalg.norm(codebook[rows] - codebook[table], axis=-1)  # [40, 39]
    self.assertTrue(np.all(np.diff(dist, axis=1) >= 0))

  def test_ties_break_to_lower_index(self):
    # Integer points with duplicates: many exactly equal distances (exact in float64).
    codebook = np.array([[0, 0], [1, 0], [0, 1], [-1, 0], [0, -1], [1, 0], [2, 2]], np.float32)
    table = neighbors.neighbor_table(codebook, 6, block_rows=3)
    np.testing.assert_array_equal(table, brute_force_table(codebook, 6))
    # Code 0: four codes at distance 1 (ids 1, 2, 3, 4) and a duplicate of 1 (id 5).
    np.testing.assert_array_equal(table[0], [1, 2, 3, 4, 5, 6])
    # Code 1's exact duplicate (5) comes first, then the equidistant pair in id order.
    np.testing.assert_array_equal(table[1, :2], [5, 0])

  def test_tie_at_the_cut_keeps_lowest_ids(self):
    # Code 0 has five neighbours at the same distance; k=2 must keep ids 1 and 2.
    # Code 5 duplicates code 2, so it is a fifth code at distance 1 from code 0.
    codebook = np.array([[0, 0], [1, 0], [0, 1], [-1, 0], [0, -1], [0, 1], [3, 0]], float)
    table = neighbors.neighbor_table(codebook, 2)
    np.testing.assert_array_equal(table[0], [1, 2])
    np.testing.assert_array_equal(table, brute_force_table(codebook, 2))

  def test_rows_are_token_ids_with_an_offset(self):
    """Lumina-mGPT layout: token = code + 4 in a larger vocabulary. Row x holds the
    neighbours of token x (code x - 4) as token ids; other rows hold only -1."""
    rng = np.random.default_rng(1)
    codebook = rng.normal(size=(30, 16))
    codes = brute_force_table(codebook, 5)
    table = neighbors.neighbor_table(codebook, 5, token_offset=neighbors.LUMINA_TOKEN_OFFSET,
                                     vocab_size=40)
    self.assertEqual(table.shape, (40, 5))
    np.testing.assert_array_equal(table[4:34], codes + 4)
    np.testing.assert_array_equal(table[:4], neighbors.NO_NEIGHBOR)
    np.testing.assert_array_equal(table[34:], neighbors.NO_NEIGHBOR)
    # Looking up token id x gives code x-4's neighbours, in token ids, never x itself.
    tokens = np.array([[4, 10], [33, 20]])
    looked_up = np.asarray(neighbors.neighbors_of(table, tokens))
    np.testing.assert_array_equal(looked_up, codes[tokens - 4] + 4)
    self.assertFalse(np.any(looked_up == tokens[..., None]))
    # Ids without neighbours (text, layout, out of range) give -1 rows.
    outside = np.asarray(neighbors.neighbors_of(table, np.array([0, 35, 40, -1])))
    np.testing.assert_array_equal(outside, neighbors.NO_NEIGHBOR)
    # Beyond a table whose last row holds neighbours (not the clipped last row).
    dense = neighbors.neighbor_table(codebook, 5)  # 30 codes, every row real
    self.assertTrue(np.all(dense[-1] >= 0))
    np.testing.assert_array_equal(neighbors.neighbors_of(dense, np.array([30, 33, -1])),
                                  neighbors.NO_NEIGHBOR)

  def test_default_vocabulary_is_offset_plus_codes(self):
    codebook = np.random.default_rng(3).normal(size=(12, 4))
    np.testing.assert_array_equal(neighbors.neighbor_table(codebook, 3),
                                  neighbors.code_neighbor_table(codebook, 3))
    self.assertEqual(neighbors.neighbor_table(codebook, 3, token_offset=4).shape, (16, 3))
    with self.assertRaisesRegex(ValueError, 'vocab_size 15 cannot hold 12 codes'):
      neighbors.neighbor_table(codebook, 3, token_offset=4, vocab_size=15)
    with self.assertRaisesRegex(ValueError, 'token_offset must be >= 0'):
      neighbors.neighbor_table(codebook, 3, token_offset=-1)

  def test_from_tokenizer_params(self):
    codebook = np.random.default_rng(2).normal(size=(20, 8)).astype(np.float32)
    params = {'quantize': {'embedding': codebook}, 'decoder': {}}
    np.testing.assert_array_equal(
        neighbors.neighbor_table_from_params(params, 3, token_offset=4, vocab_size=30),
        neighbors.neighbor_table(codebook, 3, token_offset=4, vocab_size=30))
    np.testing.assert_array_equal(neighbors.neighbor_table_from_params(params, 3)[:20],
                                  brute_force_table(codebook, 3))

  def test_uses_raw_weights_not_normalised(self):
    # Two codes along the same direction are identical after L2 normalisation but
    # far apart raw; LANTERN measures raw distances.
    codebook = np.array([[1.0, 0.0], [10.0, 0.0], [0.0, 1.2]])
    table = neighbors.neighbor_table(codebook, 2)
    np.testing.assert_array_equal(table[0], [2, 1])

  @parameterized.named_parameters(
      ('k_zero', (10, 4), 0, 'k must be in'),
      ('k_too_big', (10, 4), 10, r'\[1, 9\]'),
      ('not_2d', (10,), 2, 'must be \\[C, Cq\\]'),
  )
  def test_bad_arguments(self, shape, k, message):
    with self.assertRaisesRegex(ValueError, message):
      neighbors.neighbor_table(np.zeros(shape), k)

  def test_non_finite_codebook(self):
    codebook = np.zeros((5, 2))
    codebook[3, 1] = np.nan
    with self.assertRaisesRegex(ValueError, 'NaN'):
      neighbors.neighbor_table(codebook, 2)


if __name__ == '__main__':
  absltest.main()
