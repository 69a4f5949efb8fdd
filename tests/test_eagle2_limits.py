"""EAGLE-2's node budget is inclusive: total_tokens may use the whole candidate budget
1 + top_k + depth * top_k^2 (mode_dynamic_tree.DynamicTreeDraft.check; the error
message says [2, most])."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from specdec_jax import decode
from specdec_jax import dynamic_tree
from specdec_jax import logits
from specdec_jax import rules
from specdec_jax.app import toy
from tests.decode_support import EAGLE
from tests.decode_support import FAST
from tests.decode_support import TARGET
from tests.decode_support import VOCAB
from tests.decode_support import _cond
from tests.decode_support import _params


class Eagle2InclusiveLimitsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('full_budget', dict(total_tokens=1 + dynamic_tree.num_candidates(1, 1), depth=1,
                           top_k=1)),
      ('full_budget_top_k_2', dict(total_tokens=1 + dynamic_tree.num_candidates(2, 1),
                                   depth=1, top_k=2)),
  )
  def test_edge_values_are_accepted_and_decode(self, fields):
    mode = decode.DynamicTreeDraft(**fields)
    sampling = logits.Sampling()
    target_params, _, eagle_params = _params()
    # Accepted by the checks (a ValueError before) ...
    mode.check(target=TARGET, draft=EAGLE, draft_params=eagle_params,
               cond=_cond(2, sampling), num_tokens=3)
    # ... and decode: every token in the vocabulary, every image finished.
    result = decode.generate(TARGET, target_params, _cond(4, sampling), num_tokens=3,
                             key=jax.random.key(0), mode=mode, sampling=sampling,
                             rule=rules.Lossless(), draft=EAGLE, draft_params=eagle_params,
                             compiler_options=FAST)
    tokens = np.asarray(result.tokens)
    self.assertEqual(tokens.shape, (4, 3))
    self.assertTrue(((tokens >= 0) & (tokens < VOCAB)).all())

  def test_every_level_of_the_tree_is_verified(self):
    """Greedy, the target as its own drafter, top_k 1 (the tree is a chain of depth + 1
    drafts): every step accepts all depth + 1 drafts and adds the bonus token, so 11
    tokens after the prefill take ceil(11 / 4) = 3 verify steps (4 if the deepest level
    were never verified)."""
    target = toy.MarkovToy(4, 2)
    params = target.init_params(jax.random.key(0))
    mode = decode.DynamicTreeDraft(total_tokens=4, depth=2, top_k=1, drafter='model')
    self.assertEqual(mode.slots, 3)
    result = decode.generate(target, params, jnp.zeros((4,), jnp.int32), num_tokens=12,
                             key=jax.random.key(1), mode=mode,
                             sampling=logits.Sampling(temperature=0.0), rule=rules.Lossless(),
                             draft=target, draft_params=params, compiler_options=FAST)
    np.testing.assert_array_equal(result.metrics.verify_steps, [3] * 4)
    np.testing.assert_array_equal(result.metrics.committed_tokens, [11] * 4)


if __name__ == '__main__':
  absltest.main()
