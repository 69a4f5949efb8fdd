"""Exact joint laws of relaxed decoding through the engine (test_decode.py has the
lossless ones).
"""

from __future__ import annotations


import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from specdec_jax import decode
from specdec_jax import logits
from specdec_jax import rules
from tests.decode_support import VOCAB
from tests.decode_support import NUM_TOKENS
from tests.decode_support import P_THRESHOLD
from tests.decode_support import TARGET
from tests.decode_support import _params
from tests.decode_support import _chi_square_pvalue
from tests.decode_support import _run


def _softmax64(logits_row) -> np.ndarray:
  x = np.asarray(logits_row, np.float64)
  e = np.exp(x - x.max())
  return e / e.sum()


def _relaxed_chain_law(weights, num_tokens=NUM_TOKENS) -> np.ndarray:
  """Exact law of the 3 tokens ChainDraft(2, 'model') emits on the toys under
  f_i = min(1, w_i t/d) with G*_i = Norm([t - d f_i]_+), written out here from the
  formulas (numpy, no project code), over V**3 sequences.

  Token 0 comes from the prefill (target law). The one verify step drafts
  x1 ~ d(.|a) and x2 ~ d(.|a, x1): if x1 is accepted (position 1), token 2 is
  the position-2 output; if rejected, token 1 is G*_1's sample and token 2 is
  the first draft of the next step, again at position 1.
  """
  assert num_tokens == 3
  target_params, draft_params, _ = _params()
  t_table = np.asarray(target_params['table'])
  d_table = np.asarray(draft_params['table'])
  bos, class_token = TARGET.bos, VOCAB  # class 0

  def parts(d, t, w):
    """(accepted mass d f, rejected mass (1 - beta) G*) over the vocabulary."""
    accepted = np.minimum(d, w * t)  # d min(1, w t/d)
    residual = np.maximum(t - accepted, 0.0)
    total = residual.sum()
    residual = residual / total if total > 0 else t
    return accepted, (1.0 - accepted.sum()) * residual

  w1, w2 = weights
  law = np.zeros((VOCAB,) * 3)
  first = _softmax64(t_table[bos, class_token])
  for a in range(VOCAB):
    accepted1, rejected1 = parts(_softmax64(d_table[class_token, a]),
                                 _softmax64(t_table[class_token, a]), w1)
    for b in range(VOCAB):
      d2, t2 = _softmax64(d_table[a, b]), _softmax64(t_table[a, b])
      after_accept = sum(parts(d2, t2, w2))  # x2 verified at position 2
      after_reject = sum(parts(d2, t2, w1))  # next step's first draft, position 1
      law[a, b] = first[a] * (accepted1[b] * after_accept + rejected1[b] * after_reject)
  return law.reshape(-1)


class RelaxedJointLawTest(parameterized.TestCase):
  """Relaxed rules through the engine at draft positions 1 *and* 2: the joint law of
  whole sequences against the closed form above. Same power as ExactnessTest (63
  degrees of freedom, N = 2**14, p threshold 1e-4: a chi-square divergence >= 0.0061
  is rejected with probability >= 0.99). Negative control: the law a decoder that
  used position 1's weight at position 2 would have (for equal weights, the lossless
  law); the test asserts that law is far enough (divergence >= 0.0061) and that the
  same samples reject it."""

  @parameterized.named_parameters(
      ('coolsd_floored', rules.CoolSD(delta=3.0)),
      ('coolsd_unfloored', rules.CoolSD(delta=1.1, floor_at_one=False)),
      ('uniform', rules.UniformRelaxed(omega=2.0)),
  )
  def test_joint_law_over_two_draft_positions(self, rule):
    mode = decode.ChainDraft(2, 'model')
    weights = [1.0, 1.0]
    if isinstance(rule, rules.CoolSD):
      windowed = rule.for_window(2)
      weights = [float(windowed.weight(1)), float(windowed.weight(2))]
    else:
      weights = [rule.omega, rule.omega]
    law = _relaxed_chain_law(weights)
    np.testing.assert_allclose(law.sum(), 1.0, atol=1e-9)
    tokens = np.asarray(_run(mode, logits.Sampling(), rule=rule, seed=11).tokens)
    p_value = _chi_square_pvalue(tokens, law)
    self.assertGreater(p_value, P_THRESHOLD, f'weights {weights}: p = {p_value:.3g}')
    # Equal weights (UniformRelaxed) leave no position mix-up to catch: the control is
    # then the lossless law, what a decoder that dropped the relaxation would give.
    wrong = _relaxed_chain_law([weights[0], weights[0]] if weights[0] != weights[1]
                               else [1.0, 1.0])
    divergence = float(np.sum((wrong - law) ** 2 / np.where(law > 0, law, 1.0)))
    self.assertGreater(divergence, 0.0061)
    self.assertLess(_chi_square_pvalue(tokens, wrong), P_THRESHOLD)


if __name__ == '__main__':
  absltest.main()
