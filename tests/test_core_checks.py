"""Edges of the core layer's checks.py, metrics.py and sharding.py (pinned by a
mutation audit)."""

import types

from absl.testing import absltest
import jax.numpy as jnp
import numpy as np

from specdec_jax import checks
from specdec_jax import metrics
from specdec_jax import sharding


class CoreChecksTest(absltest.TestCase):

  def test_zero_or_negative_num_tokens_is_refused(self):
    """num_tokens is an int >= 1: 0 image tokens is no image."""
    for bad in (0, -3, np.int32(0)):
      with self.assertRaisesRegex(ValueError, r'num_tokens must be an int >= 1'):
        checks.check_num_tokens(bad)
    self.assertEqual(checks.check_num_tokens(np.int64(1)), 1)

  def test_tokens_per_target_forward_of_an_image_without_verify_steps(self):
    """An image finished by its prefill (one token) took no verify step: its rate is 0
    committed tokens per step, not 0 / 0 = NaN."""
    counters = metrics.DecodeMetrics.zeros(2, 1).record(
        jnp.array([False, True]), num_accepted=jnp.array([0, 1]), committed=jnp.array([0, 2]),
        draft_forwards=1)
    np.testing.assert_array_equal(counters.tokens_per_target_forward, [0.0, 2.0])

  def test_cache_rows_split_over_data_only_in_whole_images(self):
    """With CFG (2 rows per image) 4 rows are 2 images: a 4-way 'data' axis would put an
    image's conditional and unconditional rows on different devices, so the rows stay
    replicated; 8 rows (4 images) split."""
    mesh = types.SimpleNamespace(shape={sharding.DATA: 4})
    rows_axis = sharding._rows_axis  # pylint: disable=protected-access
    self.assertIsNone(rows_axis(4, mesh, 2))
    self.assertEqual(rows_axis(8, mesh, 2), sharding.DATA)
    self.assertEqual(rows_axis(4, mesh, 1), sharding.DATA)


if __name__ == '__main__':
  absltest.main()
