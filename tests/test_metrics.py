"""Tests of specdec_jax.metrics: the non-finite counters and how generate reports them,
and how the counters print."""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

from specdec_jax import metrics


@dataclasses.dataclass
class _Result:
  metrics: metrics.DecodeMetrics


class NonFiniteTest(absltest.TestCase):

  def test_record_counts_active_images_with_a_nan_or_inf_anywhere(self):
    target = jnp.full((4, 3, 5), 0.2).at[1, 2, 4].set(jnp.nan).at[3, 0, 0].set(jnp.inf)
    draft = jnp.full((4, 2, 5), 0.2).at[0, 1, 1].set(jnp.nan).at[2, 0, 0].set(jnp.nan)
    active = jnp.array([True, True, False, True])
    counters = metrics.DecodeMetrics.zeros(4, 2).record_nonfinite(active, target, draft)
    counters = counters.record_nonfinite(active, target)  # no drafts (e.g. the first token)
    np.testing.assert_array_equal(counters.nonfinite_target_steps, [0, 2, 0, 2])
    np.testing.assert_array_equal(counters.nonfinite_draft_steps, [1, 0, 0, 0])  # 2: inactive
    # Other counters are untouched; Vanilla's empty draft window [B, 0, V] counts nothing.
    empty = metrics.DecodeMetrics.zeros(4, 0).record_nonfinite(
        active, jnp.full((4, 1, 5), 0.2), jnp.zeros((4, 0, 5)))
    np.testing.assert_array_equal(empty.nonfinite_draft_steps, 0)
    np.testing.assert_array_equal(counters.verify_steps, 0)

  def test_record_updates_each_packed_counter_by_name(self):
    active = jnp.array([True, True, False])
    counters = metrics.DecodeMetrics.zeros(3, 4).record(
        active, num_accepted=jnp.array([2, 4, 3]), committed=jnp.array([3, 2, 0]),
        draft_forwards=5)
    np.testing.assert_array_equal(counters.verify_steps, [1, 1, 0])
    np.testing.assert_array_equal(counters.target_forwards, [2, 2, 1])  # + the prefill
    np.testing.assert_array_equal(counters.draft_forwards, [5, 5, 0])
    np.testing.assert_array_equal(counters.accepted_tokens, [2, 2, 0])  # image 1: 2 inside
    np.testing.assert_array_equal(counters.committed_tokens, [3, 2, 0])
    np.testing.assert_array_equal(counters.accepted_per_position,
                                  [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(counters.nonfinite_target_steps, 0)
    self.assertEqual(counters.counts.shape, (3, len(metrics.COUNTERS) + 4))
    named = counters.by_name()
    self.assertEqual(sorted(named), sorted(metrics.COUNTERS + ('accepted_per_position',)))
    np.testing.assert_array_equal(named['draft_forwards'], [5, 5, 0])
    with self.assertRaisesRegex(ValueError, r"unknown counters \['accepted'\]"):
      counters.added(accepted=1)

  def test_target_raises_with_the_result_and_drafts_warn(self):
    clean = metrics.DecodeMetrics.zeros(3, 2)
    with warnings.catch_warnings():
      warnings.simplefilter('error')
      self.assertIsInstance(metrics.report_nonfinite(_Result(clean)), _Result)
    broken = _Result(clean.added(nonfinite_target_steps=jnp.array([0, 3, 1], jnp.int32)))
    with self.assertRaisesRegex(metrics.NonFiniteProbabilitiesError,
                                r'target probabilities held NaN or inf for 2 image\(s\) '
                                r'\[1, 2\] \(in 3 step\(s\) at most\)') as raised:
      metrics.report_nonfinite(broken)
    self.assertIs(raised.exception.result, broken)
    np.testing.assert_array_equal(raised.exception.images, [1, 2])
    self.assertIsInstance(raised.exception, FloatingPointError)
    drafts = _Result(clean.added(nonfinite_draft_steps=jnp.array([2, 0, 0], jnp.int32)))
    with self.assertWarnsRegex(RuntimeWarning, r'draft probabilities held NaN or inf for 1 '
                                               r'image\(s\) \[0\]; those drafts were all rejected'):
      self.assertIs(metrics.report_nonfinite(drafts), drafts)


class SummaryTest(absltest.TestCase):
  """The summary's acceptance per position is a rate over verify steps."""

  def test_summary_acceptance_per_position_is_a_rate(self):
    m = metrics.DecodeMetrics.zeros(2, 3)
    for accepted in ([2, 0], [1, 3]):
      m = m.record(jnp.array([True, True]), jnp.array(accepted), jnp.array(accepted) + 1, 1)
    # image 0: positions accepted (2, 1, 0) of 2 steps; image 1: (1, 1, 1) of 2 steps.
    np.testing.assert_allclose(m.summary()['acceptance_per_position'], [0.75, 0.5, 0.25])



class ReprTest(absltest.TestCase):

  def test_prints_each_counter_by_name(self):
    """print(result.metrics) showed the packed counts array with no column names."""
    counters = metrics.DecodeMetrics.zeros(2, 3).record(
        jnp.array([True, False]), jnp.array([2, 0]), jnp.array([3, 0]), 1)
    text = repr(counters)
    for name, value in counters.by_name().items():
      self.assertIn(f'  {name}={np.asarray(value).tolist()},', text)
    self.assertIn('verify_steps=[1, 0],', text)
    self.assertIn('accepted_per_position=[[1, 1, 0], [0, 0, 0]],', text)
    self.assertIn('..., ', repr(metrics.DecodeMetrics.zeros(100, 1)))  # long batches summarised
    seen = []
    jax.jit(lambda m: seen.append(repr(m)) or m)(counters)  # a tracer inside jit
    self.assertStartsWith(seen[0], 'DecodeMetrics(counts=')


if __name__ == '__main__':
  absltest.main()
