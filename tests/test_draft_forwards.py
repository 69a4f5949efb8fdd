"""The draft_forwards metric counts the drafter forwards a decode really runs
(`mode_chain.ChainDraft.draft_forwards`, `mode_base.DrafterMode.start/advance`):
a drafter that reports each forward it executes gives the same total, per image."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from specdec_jax import decode
from specdec_jax import logits
from specdec_jax import rules
from specdec_jax.app import toy
from tests.decode_support import CLASSES
from tests.decode_support import FAST
from tests.decode_support import TARGET
from tests.decode_support import TREE
from tests.decode_support import VOCAB
from tests.decode_support import _cond
from tests.decode_support import _params

CALLS = []


@dataclasses.dataclass(frozen=True)
class CountingToy(toy.MarkovToy):
  """MarkovToy that records every executed prefill and forward (one image: one call each)."""

  def prefill(self, params, cache, cond):
    jax.debug.callback(lambda: CALLS.append('prefill'))
    return super().prefill(params, cache, cond)

  def forward(self, params, cache, tokens, window_mask=None, depths=None):
    jax.debug.callback(lambda: CALLS.append('forward'))
    return super().forward(params, cache, tokens, window_mask, depths)


class DraftForwardCountTest(parameterized.TestCase):

  def _metric_and_executed(self, mode, seed: int = 0) -> tuple[int, list[str]]:
    """One image decoded with `mode` and a counting drafter: (the draft_forwards
    metric, the drafter calls that ran)."""
    target_params, draft_params, _ = _params()
    sampling = logits.Sampling()
    CALLS.clear()
    decode.clear_compile_cache()
    result = decode.generate(TARGET, target_params, _cond(1, sampling), num_tokens=6,
                             key=jax.random.key(seed), mode=mode, sampling=sampling,
                             rule=rules.Lossless(), draft=CountingToy(VOCAB, CLASSES),
                             draft_params=draft_params, compiler_options=FAST)
    jax.effects_barrier()
    return int(np.asarray(result.metrics.draft_forwards)[0]), list(CALLS)

  @parameterized.named_parameters(('k1', 1), ('k2', 2), ('k3', 3))
  def test_metric_equals_executed_forwards(self, k):
    for seed in range(2):
      counted, calls = self._metric_and_executed(decode.ChainDraft(k=k, drafter='model'), seed)
      self.assertEqual(calls.count('prefill'), 1)
      self.assertEqual(counted, len(calls), f'k={k} seed={seed}: {calls}')

  @parameterized.named_parameters(
      ('static_tree', decode.TreeDraft(TREE, drafter='model')),
      # A step runs the catch-up and then `depth` expansions (the metric counted depth:
      # 9 against 13 executed here).
      ('dynamic_tree', decode.DynamicTreeDraft(total_tokens=5, depth=2, top_k=2,
                                               drafter='model')),
  )
  def test_tree_modes_metric_equals_executed_forwards(self, mode):
    counted, calls = self._metric_and_executed(mode)
    self.assertEqual(counted, len(calls), calls)

if __name__ == '__main__':
  absltest.main()
