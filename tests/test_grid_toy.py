"""Whole-loop laws of the decoding modes on `GridToy`, a target that reads two tokens back.

`MarkovToy` (tests/decode_support.py) reads only the token before a query,
which in a tree window is the node's parent. `GridToy` with width 3 reads
the token `width - 1 = 2` positions before the query as well (the upper
neighbour), which inside a tree is the node's grandparent: so its law checks
the whole ancestor path of the tree mask, where MarkovToy's checks one edge.
Modes: SJD, SCD and SJD-PAC (Jacobi), EAGLE-2's per-image trees, a static
tree and a chain, the trees three drafts deep.

Chi-square of 2**16 images over the V**n = 3**6 = 729 sequences of a 2 x 3
grid (sequences with expected count under 5 merged into groups of similar
probability, `testing.chi_square_pvalue`), p > 1e-4 as tests/decode_support.py,
but 4x its images: the grid has more bins (about 200-410 degrees of freedom
after merging), and at 2**14 a law at total variation 0.04 spread over them
was rejected with probability 0.15-0.3 only (simulated). At 2**16 any law at
TV >= 0.04 (chi-square divergence >= 4 TV^2 = 0.0064, noncentrality 419) is
rejected with probability > 0.999.
Negative controls that must fail: the same tokens against the law with the
upper neighbour ignored (the toy's second read is visible in the test: total
variation 0.75), and
SJD-PAC and EAGLE-2 with a tree mask that shows each node only itself and
its parent (their law breaks on GridToy, and still passes on MarkovToy,
which cannot see a missing grandparent). GridToy's three image-model options
(background columns, a pull of the tokens before, background growing from
the border) get the same check, each with the law without the option as a
control that must fail.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from specdec_jax import decode
from specdec_jax import logits
from specdec_jax import mode_dynamic_tree
from specdec_jax import mode_pac
from specdec_jax import mode_tree
from specdec_jax import rules
from specdec_jax import verify
from specdec_jax.app import toy
from specdec_jax.models import tiny
from tests.decode_support import _chi_square_pvalue
from tests.decode_support import P_THRESHOLD

VOCAB, CLASSES, WIDTH, NUM_TOKENS = 3, 2, 3, 6  # P_THRESHOLD: the Markov tests'
NUM_SAMPLES = 2 ** 16  # images per law (module docstring: the power at 729 sequences)
GRID = toy.GridToy(VOCAB, CLASSES, WIDTH)
PARAMS = GRID.init_params(jax.random.key(0))
MARKOV = toy.MarkovToy(VOCAB, CLASSES)  # the same table shape: it runs on PARAMS too
# Drafters for the drafter modes: an independent draft model and an EAGLE head.
DRAFTERS = {'model': (MARKOV, MARKOV.init_params(jax.random.key(1))),
            'eagle': (toy.ToyEagle(VOCAB, CLASSES),
                      toy.ToyEagle(VOCAB, CLASSES).init_params(jax.random.key(2)))}
DEEP_TREE = verify.StaticTree.from_paths(
    ((0,), (1,), (0, 0), (1, 0), (1, 1), (0, 0, 0), (1, 0, 0), (1, 1, 0)))

CASES = (
    ('sjd_random', decode.Jacobi(5, init='random'), logits.Sampling()),
    ('scd_spatial_cfg', decode.Jacobi(5, init='spatial', coupling='maximal'),
     logits.Sampling(cfg_scale=1.5)),
    ('scd_gumbel', decode.Jacobi(4, init='spatial', coupling='gumbel'), logits.Sampling()),
    ('sjd_pac_random', decode.JacobiPAC(5, branches=2, depth=2, init='random'),
     logits.Sampling()),
    ('sjd_pac_spatial_deep_tree', decode.JacobiPAC(5, branches=3, depth=3, init='spatial'),
     logits.Sampling(cfg_scale=1.5)),
    # Drafter modes whose trees are 3 drafts deep: a node at depth 3 reads its
    # depth-1 ancestor, which differs between branches.
    ('eagle2_sampled_deep', decode.DynamicTreeDraft(total_tokens=8, depth=3, top_k=2,
                                                    drafts='sampled'), logits.Sampling()),
    ('eagle2_top_k_model_cfg', decode.DynamicTreeDraft(total_tokens=7, depth=3, top_k=2,
                                                       drafter='model'),
     logits.Sampling(cfg_scale=1.5)),
    ('static_tree_eagle', decode.TreeDraft(DEEP_TREE, 'eagle'), logits.Sampling()),
    ('chain_model', decode.ChainDraft(4, 'model'), logits.Sampling()),
)


def _decode(mode, sampling, target=GRID, params=PARAMS):
  """Tokens int32[NUM_SAMPLES, NUM_TOKENS] of class 0 and the run's tokens per forward."""
  ids = jnp.zeros((NUM_SAMPLES,), jnp.int32)
  cond = tiny.cfg_class_rows(ids, CLASSES) if sampling.uses_cfg else ids
  draft, draft_params = DRAFTERS.get(getattr(mode, 'drafter', None), (None, None))
  result = decode.generate(target, params, cond, num_tokens=NUM_TOKENS, key=jax.random.key(7),
                           mode=mode, sampling=sampling, rule=rules.Lossless(), draft=draft,
                           draft_params=draft_params, compiler_options=decode.FAST_COMPILE)
  tokens = np.asarray(result.tokens)
  return tokens, float(result.metrics.summary()['tokens_per_target_forward'])


def _pvalue(tokens, law) -> float:
  return _chi_square_pvalue(tokens, law, VOCAB)


def _parent_only(ancestor_mask, depths):
  """ancestor_mask bool[..., T, T] cut to each node and its parent (depth one less)."""
  parent = ancestor_mask & (depths[..., None, :] == depths[..., :, None] - 1)
  return jnp.eye(ancestor_mask.shape[-1], dtype=bool) | parent


def _parent_only_layout(self, drafts):
  """A broken SJD-PAC tree mask: each node sees itself and its parent, no further
  ancestor (window entries only; committed tokens stay visible)."""
  del drafts
  tree = self.tree
  depths = jnp.asarray(tree.depths)
  return _parent_only(jnp.asarray(tree.ancestor_mask), depths), depths


def _parent_only_dynamic_layout(self, drafts):
  """The same break in EAGLE-2's per-image trees (masks bool[B, T, T])."""
  return _parent_only(drafts.ancestor_mask, drafts.depths), drafts.depths


class GridToyLawTest(parameterized.TestCase):

  def test_grid_toy_vanilla_law_and_upper_neighbour_is_visible(self):
    sampling = logits.Sampling()
    tokens, _ = _decode(decode.Vanilla(), sampling)
    law = GRID.joint_law(PARAMS, 0, NUM_TOKENS, sampling)
    self.assertGreater(_pvalue(tokens, law), P_THRESHOLD)
    # Negative control: the law of the same table with the upper neighbour
    # ignored (every token in the first row) is rejected.
    no_upper = toy.GridToy(VOCAB, CLASSES, width=NUM_TOKENS).joint_law(PARAMS, 0, NUM_TOKENS)
    self.assertGreater(0.5 * np.abs(law - no_upper).sum(), 0.3)
    self.assertLess(_pvalue(tokens, no_upper), P_THRESHOLD)

  def test_grid_toy_rejects_width_below_one(self):
    with self.assertRaisesRegex(ValueError, r'GridToy.width must be >= 1, got 0'):
      toy.GridToy(VOCAB, CLASSES, width=0)

  @parameterized.named_parameters(*CASES)
  def test_grid_joint_law_matches_target(self, mode, sampling):
    tokens, tokens_per_forward = _decode(mode, sampling)
    law = GRID.joint_law(PARAMS, 0, NUM_TOKENS, sampling)
    self.assertGreater(_pvalue(tokens, law), P_THRESHOLD, f'{mode}')
    self.assertGreater(tokens_per_forward, 1.05)

  @parameterized.named_parameters(
      ('sjd_pac_context_pull', toy.GridToy(VOCAB, CLASSES, WIDTH, context_weight=1.0,
                                               context_span=2),
       decode.JacobiPAC(5, branches=3, depth=3, init='spatial'), 'context_weight'),
      ('scd_background_columns', toy.GridToy(VOCAB, CLASSES, WIDTH, border=1),
       decode.Jacobi(5, init='spatial', coupling='maximal'), 'border'),
      ('sjd_pac_background_pull', toy.GridToy(VOCAB, CLASSES, WIDTH, border=1,
                                              background_pull=2.0),
       decode.JacobiPAC(5, branches=2, depth=2, init='spatial'), 'background_pull'),
  )
  def test_grid_options_joint_law(self, target, mode, option):
    """GridToy's image-model options keep the engine exact; negative control: the
    same tokens against the law without the option are rejected."""
    sampling = logits.Sampling()
    params = target.init_params(jax.random.key(0))
    tokens, _ = _decode(mode, sampling, target, params)
    law = target.joint_law(params, 0, NUM_TOKENS, sampling)
    self.assertGreater(_pvalue(tokens, law), P_THRESHOLD)
    without = dataclasses.replace(target, **{option: 0}).joint_law(params, 0, NUM_TOKENS)
    self.assertGreater(0.5 * np.abs(law - without).sum(), 0.1)
    self.assertLess(_pvalue(tokens, without), P_THRESHOLD)

  def test_grid_toy_rejects_negative_background_pull(self):
    with self.assertRaisesRegex(ValueError, r'GridToy.background_pull must be >= 0'):
      toy.GridToy(VOCAB, CLASSES, WIDTH, background_pull=-1.0)

  def test_grid_toy_rejects_border_past_the_middle(self):
    with self.assertRaisesRegex(ValueError, r'GridToy.border must be in \[0, \(width - 1\) / 2\]'):
      toy.GridToy(VOCAB, CLASSES, width=4, border=2)

  @parameterized.named_parameters(
      ('sjd_pac', mode_pac.JacobiPAC, _parent_only_layout,
       decode.JacobiPAC(5, branches=3, depth=3, init='spatial')),
      ('eagle2', mode_dynamic_tree.DynamicTreeDraft, _parent_only_dynamic_layout,
       decode.DynamicTreeDraft(total_tokens=8, depth=3, top_k=2, drafts='sampled')),
  )
  def test_parent_only_tree_mask_fails_on_grid_only(self, mode_class, broken_layout, mode):
    """Negative control: a tree mask missing grandparents breaks GridToy's law; the
    Markov toy, which reads only parents, cannot tell."""
    sampling = logits.Sampling()
    original = mode_class.layout
    mode_class.layout = broken_layout
    decode.clear_compile_cache()
    try:
      grid_tokens, _ = _decode(mode, sampling)
      markov_tokens, _ = _decode(mode, sampling, MARKOV, PARAMS)
    finally:
      mode_class.layout = original
      decode.clear_compile_cache()
    self.assertLess(_pvalue(grid_tokens, GRID.joint_law(PARAMS, 0, NUM_TOKENS, sampling)),
                    P_THRESHOLD)
    markov_law = MARKOV.joint_law(PARAMS, 0, NUM_TOKENS, sampling)
    self.assertGreater(_pvalue(markov_tokens, markov_law), P_THRESHOLD)

  @parameterized.named_parameters(
      ('static_tree', decode.TreeDraft(DEEP_TREE, 'eagle')),
      ('eagle2', decode.DynamicTreeDraft(total_tokens=8, depth=3, top_k=2, drafts='sampled')),
      ('sjd_pac', decode.JacobiPAC(5, branches=3, depth=3, init='spatial')),
  )
  def test_tree_modes_fail_without_compacting_the_accepted_path(self, mode):
    """Negative control for the tree modes' KV bookkeeping: with the accepted path's
    keys and values left where the verify forward wrote them (`compact_path` a no-op),
    later steps read the wrong context and the law breaks. Six-token images make
    steps after a partial acceptance, which the Markov tests' three tokens do not."""
    sampling = logits.Sampling()
    original = mode_tree.compact_path
    mode_tree.compact_path = lambda cache, start, path, cfg: cache
    decode.clear_compile_cache()
    try:
      tokens, _ = _decode(mode, sampling)
    finally:
      mode_tree.compact_path = original
      decode.clear_compile_cache()
    self.assertLess(_pvalue(tokens, GRID.joint_law(PARAMS, 0, NUM_TOKENS, sampling)),
                    P_THRESHOLD)


if __name__ == '__main__':
  absltest.main()
