"""Relaxed rules on Jacobi drafts: the whole loop's output law in closed form.

The relaxed rules are not lossless, so the whole-loop check compares the
decoded images with the law the rule *should* give, composed exactly from
per-step output laws (`verify.output_law`, itself checked against Monte Carlo
in tests/test_rules_closed_form.py). On the Markov toy (V = 4, class 0, no
CFG), `Jacobi(3)` decodes a 3-token image (a, b, c) so:

  * a ~ t(.|BOS, class), from the prefill;
  * step 1 verifies fresh point-mass drafts d1, d2 ('random': uniform over V,
    each; 'spatial': both a) against t(.|class, a) at position 1 and
    t(.|a, d1) at position 2;
  * if d1 is rejected, b comes from the residual, and step 2 verifies the
    carried draft y ~ t(.|a, d1) (stale: drawn beside d1, not b; with the
    maximal coupling still of law t(.|a, d1)) against t(.|a, b) at position 1.

The rule each test uses is the engine's: `rules.jacobi_rule(rule.for_window(2),
relax_fresh_drafts)` (fresh drafts verified losslessly unless relaxed).
Chi-square over the 64 sequences, N = 2**15 images, p > 1e-4: a law whose
chi-square divergence from the closed form is >= 3.1e-3 (noncentrality 100 at
63 degrees of freedom) is rejected with probability >= 0.99. The negative
control runs fresh drafts relaxed and compares with the law of their lossless
verification; it must fail.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from specdec_jax import decode
from specdec_jax import logits
from specdec_jax import rules
from specdec_jax import verify
from tests.decode_support import P_THRESHOLD
from tests.decode_support import TARGET
from tests.decode_support import VOCAB
from tests.decode_support import _chi_square_pvalue
from tests.decode_support import _params
from tests.decode_support import _run

NUM_IMAGES = 2 ** 15


def _law(table, previous: int, current: int) -> np.ndarray:
  """t(.|previous, current) in float64 from the toy's logits table."""
  logits_ = np.asarray(table[previous, current], np.float64)
  weights = np.exp(logits_ - logits_.max())
  return weights / weights.sum()


def jacobi3_law(rule, init: str) -> np.ndarray:
  """float64[V**3]: the law of (a, b, c) under Jacobi(3) with `rule` (the rule as
  verification applies it), class 0, as in the module docstring."""
  table = np.asarray(_params()[0]['table'])
  bos, class_token = TARGET.bos, VOCAB
  out = lambda draft, target, position: np.asarray(verify.output_law(
      rule, jnp.asarray(draft, jnp.float32), jnp.asarray(target, jnp.float32), position),
      np.float64)
  point = np.eye(VOCAB)
  law = np.zeros((VOCAB,) * 3)
  for a, p_a in enumerate(_law(table, bos, class_token)):
    first_target = _law(table, class_token, a)
    if init == 'random':
      fresh = [((d1, d2), VOCAB**-2) for d1 in range(VOCAB) for d2 in range(VOCAB)]
    else:
      fresh = [((a, a), 1.0)]
    for (d1, d2), weight in fresh:
      accept = float(rule.accept_prob_at(jnp.asarray(point[d1], jnp.float32),
                                         jnp.asarray(first_target, jnp.float32), 1, d1))
      law[a, d1] += p_a * weight * accept * out(point[d2], _law(table, a, d1), 2)
      resampled = out(point[d1], first_target, 1) - accept * point[d1]  # b after rejection
      stale = _law(table, a, d1)  # the carried draft's law
      for b in range(VOCAB):
        if resampled[b] > 0:
          law[a, b] += p_a * weight * resampled[b] * out(stale, _law(table, a, b), 1)
  return law.reshape(-1)


def _pvalue(rule, mode, law_rule) -> float:
  """The chi-square p-value of `mode` decoding with `rule` against the closed form
  of `law_rule`."""
  tokens = np.asarray(_run(mode, logits.Sampling(), rule=rule, num_images=NUM_IMAGES,
                           seed=5).tokens)
  return _chi_square_pvalue(tokens, jacobi3_law(law_rule, mode.init))


def _engine_rule(rule, mode):
  return rules.jacobi_rule(rule.for_window(mode.slots), mode.relax_fresh_drafts)


CASES = (
    ('uniform_random', rules.UniformRelaxed(3.0), decode.Jacobi(3, 'random')),
    ('uniform_spatial_maximal', rules.UniformRelaxed(3.0),
     decode.Jacobi(3, 'spatial', coupling='maximal')),
    ('uniform_random_relaxed_fresh', rules.UniformRelaxed(3.0),
     decode.Jacobi(3, 'random', relax_fresh_drafts=True)),
    ('gsd_random_maximal', rules.Grouped(below=1, above=1, prob_threshold=0.3),
     decode.Jacobi(3, 'random', coupling='maximal')),
    ('gsd_spatial', rules.Grouped(below=1, above=1, prob_threshold=0.3),
     decode.Jacobi(3, 'spatial')),
    ('csd_random', rules.ContentAware(lam=0.3, tv_threshold=1.0), decode.Jacobi(3, 'random')),
    ('csd_spatial_maximal', rules.ContentAware(lam=0.3, tv_threshold=1.0),
     decode.Jacobi(3, 'spatial', coupling='maximal')),
    ('coolsd_spatial_relaxed_fresh', rules.CoolSD(delta=3.0),
     decode.Jacobi(3, 'spatial', relax_fresh_drafts=True)),
)


class JacobiRelaxedLawTest(parameterized.TestCase):

  @parameterized.named_parameters(*CASES)
  def test_jacobi_relaxed_rule_whole_loop_law(self, rule, mode):
    law_rule = _engine_rule(rule, mode)
    target = TARGET.joint_law(_params()[0], 0, 3, logits.Sampling())
    self.assertGreater(0.5 * np.abs(jacobi3_law(law_rule, mode.init) - target).sum(), 0.01,
                       'the relaxed law should differ from the target here')
    self.assertGreater(_pvalue(rule, mode, law_rule), P_THRESHOLD)

  def test_jacobi_relaxed_fresh_drafts_against_the_lossless_fresh_law_fail(self):
    """Negative control: fresh drafts relaxed, compared with the law of verifying them
    losslessly (what relax_fresh_drafts=False gives)."""
    rule, mode = rules.UniformRelaxed(3.0), decode.Jacobi(3, 'random', relax_fresh_drafts=True)
    self.assertLess(_pvalue(rule, mode, rules.jacobi_rule(rule, False)), P_THRESHOLD)


if __name__ == '__main__':
  absltest.main()
