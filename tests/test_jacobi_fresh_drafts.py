"""The Jacobi modes verify fresh drafts (point masses) losslessly under the chain rules.

A fresh Jacobi draft is a placeholder (a random token, or the left neighbour
with init 'spatial'), so `Jacobi` and `JacobiPAC` verify it with the lossless
test unless `relax_fresh_drafts` (`rules.jacobi_rule`). The rule below is
lossless on every draft drawn from a law and relaxes point masses only
(min(1, 3 t(x)), residual G*), so a decode with it is exact if and only if the
guard reaches every fresh draft: whole-loop joint-law test on the Markov toy
(tests/decode_support.py: chi-square over the 64 sequences of 3 tokens,
2**14 images, p threshold 1e-4, power >= 0.99 against any TV distance >= 0.04),
with `relax_fresh_drafts=True` as the negative control that must fail.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from specdec_jax import decode
from specdec_jax import logits
from specdec_jax import rules
from tests.decode_support import NUM_TOKENS
from tests.decode_support import P_THRESHOLD
from tests.decode_support import TARGET
from tests.decode_support import _chi_square_pvalue
from tests.decode_support import _params
from tests.decode_support import _run
from tests.decode_support import assert_joint_law


@flax.struct.dataclass
class _RelaxesPointMassesOnly(rules.Rule):
  """min(1, t/d) for a draft with a law, min(1, 3 t(x)) for a point mass; G*."""

  def accept_prob(self, draft_probs, target_probs, position=1):
    del position
    weight = jnp.where(rules.is_point_mass(draft_probs), 3.0, 1.0)
    return rules.ratio_accept(draft_probs, target_probs, weight)


MODES = (
    ('scd_spatial', decode.Jacobi(3, 'spatial', coupling='maximal')),
    ('sjd_random', decode.Jacobi(3, 'random')),
    ('sjd_pac_spatial', decode.JacobiPAC(3, branches=2, depth=1, init='spatial')),
)


class FreshDraftsTest(parameterized.TestCase):

  @parameterized.named_parameters(*MODES)
  def test_scd_sjd_pac_fresh_drafts_verified_losslessly(self, mode):
    sampling = logits.Sampling()
    assert_joint_law(self, _run(mode, sampling, rule=_RelaxesPointMassesOnly()), mode, sampling)

  @parameterized.named_parameters(*MODES)
  def test_scd_sjd_pac_relaxed_fresh_drafts_fail(self, mode):
    """Negative control: relaxing the fresh drafts moves the joint law."""
    sampling = logits.Sampling()
    mode = dataclasses.replace(mode, relax_fresh_drafts=True)
    tokens = np.asarray(_run(mode, sampling, rule=_RelaxesPointMassesOnly()).tokens)
    law = TARGET.joint_law(_params()[0], 0, NUM_TOKENS, sampling)
    self.assertLess(_chi_square_pvalue(tokens, law), P_THRESHOLD)

  def test_relax_fresh_drafts_must_be_a_bool(self):
    for mode in (decode.Jacobi(3, relax_fresh_drafts=1),
                 decode.JacobiPAC(3, 2, 1, relax_fresh_drafts='yes')):
      with self.assertRaisesRegex(ValueError, 'relax_fresh_drafts must be True or False'):
        _run(mode, logits.Sampling(), num_images=2)


if __name__ == '__main__':
  absltest.main()
