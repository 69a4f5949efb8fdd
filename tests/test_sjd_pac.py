"""Tests of SJD-PAC (`specdec_jax.mode_pac.JacobiPAC`, arXiv 2603.18599).

Whole loop: the joint law of the generated tokens on the Markov toy target
equals the exact law (chi-square over the V**n = 64 sequences, N = 2**14
images, p > 1e-4; power as tests/test_decode.py: any TV distance >= 0.04 is
rejected with probability >= 0.99), with siblings from the target's law (the
default) and from the residual, and with the chain re-drafted without the
coupling; broken proactive drafts (greedy siblings, which the sibling
renormalisation does not describe; residual siblings verified as draws from
the target's law) fail it. On five-token images (window 4, 243 sequences,
N = 2**16) both branching levels, couplings of drawn old drafts and
continuations from sibling nodes are used; there level 2's siblings tested
against level 1's law fail.

One step: the first token emitted by one proactive level (old draft x ~ o,
maximal coupling to the new law q, K - 1 siblings without replacement from q
or from the residual Norm([q - o]_+), EAGLE-1 sibling walk against the target
t) has law exactly t: in closed form (`_level_law`, float64, every draw
enumerated) and by Monte Carlo with 2**16 draws, chi-square over V = 6 tokens
(5 degrees of freedom), p > 1e-4: a law whose chi-square divergence
sum (o - t)^2 / t from t is >= 7.7e-4 (e.g. a TV distance of 0.013 moved
between two tokens of mass ~0.2) is rejected with probability >= 0.99
(noncentral chi-square, noncentrality 2**16 x 7.7e-4 = 50). The closed-form
law of the residual siblings' negative control is asserted to lie that far
from t.
"""

from __future__ import annotations

import contextlib
import types
from unittest import mock

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from specdec_jax import categorical
from specdec_jax import decode
from specdec_jax import jacobi_drafts
from specdec_jax import logits
from specdec_jax import mode_base
from specdec_jax import mode_pac
from specdec_jax import resampling
from specdec_jax import rules
from specdec_jax import testing
from specdec_jax import verify
from specdec_jax.app import generate as generate_app
from specdec_jax.app import cli
from specdec_jax.app import methods as methods_lib
from specdec_jax.app import toy
from specdec_jax.configs import generate as generate_config
from specdec_jax.models import tiny
from tests.decode_support import NUM_TOKENS
from tests.decode_support import P_THRESHOLD
from tests.decode_support import TARGET
from tests.decode_support import VOCAB
from tests.decode_support import _chi_square_pvalue
from tests.decode_support import assert_joint_law
from tests.decode_support import _params
from tests.decode_support import _run

SJD_PAC_CASES = (
    ('sjd_pac_random', decode.JacobiPAC(3, branches=2, depth=2, init='random'),
     logits.Sampling()),
    ('sjd_pac_spatial_cfg', decode.JacobiPAC(3, branches=3, depth=1, init='spatial'),
     logits.Sampling(cfg_scale=1.5)),
    # Top-2 laws hold fewer tokens than the 3 candidates: siblings run out of mass.
    ('sjd_pac_support_used_up', decode.JacobiPAC(3, branches=3, depth=2, init='random'),
     logits.Sampling(top_k=2)),
    # Siblings from the residual (the released code's draw), recorded for verification.
    ('sjd_pac_residual_random', decode.JacobiPAC(3, 3, 2, 'random', sibling_law='residual'),
     logits.Sampling()),
    ('sjd_pac_residual_spatial_cfg', decode.JacobiPAC(3, 3, 1, 'spatial', sibling_law='residual'),
     logits.Sampling(cfg_scale=1.5)),
    ('sjd_pac_residual_support_used_up', decode.JacobiPAC(3, 3, 2, 'random',
                                                          sibling_law='residual'),
     logits.Sampling(top_k=2)),
    # Proactive drafting alone (the chain re-drafted without the coupling).
    ('sjd_pac_no_continuation', decode.JacobiPAC(3, 3, 2, 'random', adaptive_continuation=False),
     logits.Sampling()),
    # Sharper laws: the residual siblings' negative control below fails here.
    ('sjd_pac_residual_sharp', decode.JacobiPAC(3, 3, 2, 'random', sibling_law='residual'),
     logits.Sampling(temperature=0.5)),
)


def _greedy_siblings(uniforms, first, law):
  """A broken proactive draft: the K - 1 most likely other tokens, not a random
  draw without replacement (the law the sibling renormalisation assumes)."""
  rest = jnp.where(jax.nn.one_hot(first, law.shape[-1], dtype=bool), -1.0, law)
  others = jnp.argsort(-rest, axis=-1)[..., :uniforms.shape[-1]]
  return jnp.concatenate([first[..., None], others.astype(jnp.int32)], axis=-1)


class SjdPacExactnessTest(parameterized.TestCase):

  @parameterized.named_parameters(*SJD_PAC_CASES)
  def test_sjd_pac_joint_law_matches_target(self, mode, sampling):
    assert_joint_law(self, _run(mode, sampling), mode, sampling)

  def test_sjd_pac_greedy_siblings_fail(self):
    """Negative control: siblings taken greedily (top K - 1 of the law) while the
    verification renormalises them as draws without replacement."""
    mode = decode.JacobiPAC(3, branches=3, depth=2, init='random')
    pvalue = _joint_pvalue_with('draw_siblings', _greedy_siblings, mode, logits.Sampling())
    self.assertLess(pvalue, P_THRESHOLD)

  def test_sjd_pac_residual_siblings_told_as_target_fail(self):
    """Negative control: siblings from the residual, verified as draws from the
    main draft's law (the released code's bookkeeping), on case
    'sjd_pac_residual_sharp' (at temperature 1 the bias stays under the test's
    power: p 0.002 there)."""
    mode = decode.JacobiPAC(3, branches=3, depth=2, init='random', sibling_law='residual')
    pvalue = _joint_pvalue_with('draw_level', _told_main_law, mode,
                                logits.Sampling(temperature=0.5))
    self.assertLess(pvalue, P_THRESHOLD)


# Five-token images on a 3-token Markov toy, window 4 (N = 2**16 images, V**n = 243
# sequences): later steps verify trees whose siblings have mass at both branching
# levels, couple non-point-mass old drafts and continue from sibling nodes, none of
# which the 3-token cases above reach (their first step verifies point-mass fresh
# drafts only). Chi-square p > 1e-4 over 242 degrees of freedom rejects a law whose
# chi-square divergence from the exact one is >= 2.75e-3 (noncentrality 180) with
# probability >= 0.99.
LONG_TARGET = toy.MarkovToy(3, 2)
LONG_TOKENS = 5
SJD_PAC_LONG_CASES = (
    ('sjd_pac_long_target', decode.JacobiPAC(4, 3, 2), logits.Sampling()),
    ('sjd_pac_long_residual_sharp', decode.JacobiPAC(4, 3, 2, sibling_law='residual'),
     logits.Sampling(temperature=0.5)),
    ('sjd_pac_long_deep_spatial_cfg', decode.JacobiPAC(5, 2, 4, 'spatial'),
     logits.Sampling(cfg_scale=1.5)),
)


def _long_pvalue(mode, sampling) -> tuple[float, float]:
  """(joint-law p-value, tokens per target forward) on the five-token toy."""
  params = LONG_TARGET.init_params(jax.random.key(0), scale=1.0)
  ids = jnp.zeros((2 ** 16,), jnp.int32)
  cond = tiny.cfg_class_rows(ids, 2) if sampling.uses_cfg else ids
  result = decode.generate(LONG_TARGET, params, cond, num_tokens=LONG_TOKENS,
                           key=jax.random.key(7), mode=mode, sampling=sampling,
                           rule=rules.Lossless(), compiler_options=decode.FAST_COMPILE)
  law = LONG_TARGET.joint_law(params, 0, LONG_TOKENS, sampling)
  pvalue = _chi_square_pvalue(np.asarray(result.tokens), law, vocab=3)
  return pvalue, float(result.metrics.summary()['tokens_per_target_forward'])


def _level_one_sibling_laws(self, plan, rule, uniforms, window, drafts, target_probs, cache,
                            start):
  """A broken JacobiPAC.verify: every branching level's later siblings are tested
  against level 1's sibling law."""
  level_one = drafts.replace(sibling_probs=drafts.sibling_probs[:, :1].repeat(self.depth, 1))
  return ORIGINAL_VERIFY(self, plan, rule, uniforms, window, level_one, target_probs, cache,
                         start)


ORIGINAL_VERIFY = mode_pac.JacobiPAC.verify


class SjdPacLongImageTest(parameterized.TestCase):

  @parameterized.named_parameters(*SJD_PAC_LONG_CASES)
  def test_sjd_pac_long_images_joint_law_matches_target(self, mode, sampling):
    pvalue, tokens_per_forward = _long_pvalue(mode, sampling)
    self.assertGreater(pvalue, P_THRESHOLD, f'{mode}: p = {pvalue:.3g}')
    self.assertGreater(tokens_per_forward, 1.5)

  def test_sjd_pac_long_images_level_two_told_level_one_law_fail(self):
    """Negative control on 'sjd_pac_long_residual_sharp': level 2's residual
    siblings verified against level 1's law (the 3-token cases cannot see this)."""
    mode, sampling = SJD_PAC_LONG_CASES[1][1:]
    with _patched(mode_pac.JacobiPAC, 'verify', _level_one_sibling_laws):
      pvalue, _ = _long_pvalue(mode, sampling)
    self.assertLess(pvalue, P_THRESHOLD)


@contextlib.contextmanager
def _patched(owner, name, replacement):
  """owner.<name> replaced, with the compile cache cleared on entry and exit (a broken
  variant compiles its own program and leaves none behind)."""
  with mock.patch.object(owner, name, replacement):
    decode.clear_compile_cache()
    try:
      yield
    finally:
      decode.clear_compile_cache()


def _joint_pvalue_with(function_name, replacement, mode, sampling):
  """The whole-loop chi-square p-value of `mode` with mode_pac.<function_name>
  replaced (`_patched`)."""
  with _patched(mode_pac, function_name, replacement):
    tokens = np.asarray(_run(mode, sampling).tokens)
  law = TARGET.joint_law(_params()[0], 0, NUM_TOKENS, sampling)
  return _chi_square_pvalue(tokens, law)


def _target_siblings(uniforms, first, old_law, new_law):
  del old_law
  return mode_pac.draw_level(uniforms, first, new_law, new_law)


def _residual_siblings(uniforms, first, old_law, new_law):
  return mode_pac.draw_level(uniforms, first, new_law,
                             resampling.standard_residual(old_law, new_law))


def _greedy_level(uniforms, first, old_law, new_law):
  del old_law
  return _greedy_siblings(uniforms, first, new_law), new_law


def _told_main_law(uniforms, first, main_law, sibling_law):
  """A broken record: candidates drawn as `mode_pac.draw_level` draws them, but the
  verifier told they came from the main draft's law."""
  candidates, _ = _DRAW_LEVEL(uniforms, first, main_law, sibling_law)
  return candidates, main_law


_DRAW_LEVEL = mode_pac.draw_level


def _one_level(draw, branches, old_law, new_law, target, num_draws, seed=0, tell=True):
  """First tokens emitted by one proactive level, f32 laws [V] -> int32[num_draws].

  Per draw: an old draft x ~ old_law is carried to new_law by the maximal
  coupling (SCD), the K children come from draw(uniforms, main, old_law,
  new_law) -> (int32[K], the law of children 2..K), and a depth-1 tree is
  verified against `target` (losslessly), told that law (tell=False: told
  new_law, as if every child came from it); the emitted token is the accepted
  child, else the residual draw. Returns (tokens, accepted bool[]).
  """
  tree = verify.StaticTree.from_paths([(i,) for i in range(branches)])
  vocab = target.shape[-1]

  def one(key):
    keys = jax.random.split(key, 4)
    old = categorical.sample(jax.random.uniform(keys[0]), old_law)
    first = jacobi_drafts.maximal_coupling(jax.random.uniform(keys[1]), jax.random.uniform(keys[2]),
                                      old, old_law, new_law)
    uniforms = jax.random.uniform(keys[3], (branches - 1 + verify.tree_uniforms(tree),))
    children, sibling_law = draw(uniforms[:branches - 1], first, old_law, new_law)
    node_tokens = jnp.concatenate([jnp.zeros((1,), jnp.int32), children])
    draft_probs = jnp.broadcast_to(new_law, (tree.num_nodes, vocab))
    sibling_probs = jnp.broadcast_to(sibling_law, (tree.num_nodes, vocab)) if tell else None
    path, num_accepted, next_token = verify.verify_tree_with_uniforms(
        rules.Lossless(), uniforms[branches - 1:], tree, node_tokens, draft_probs,
        jnp.broadcast_to(target, (tree.num_nodes, vocab)), sibling_probs)
    emitted = jnp.where(num_accepted > 0, node_tokens[jnp.maximum(path[1], 0)], next_token)
    return emitted, num_accepted > 0

  keys = jax.random.split(jax.random.key(seed), num_draws)
  tokens, accepted = jax.jit(jax.vmap(one))(keys)
  return np.asarray(tokens), np.asarray(accepted)


def _level_law(main_law, sibling_law, target, branches, tell=True):
  """Closed form of `_one_level`'s emitted law, float64 [V]: the main draft a ~
  main_law, then branches - 1 siblings without replacement from sibling_law
  without a (main_law without a if that has no mass), each tested against the
  law it came from (tell=False: against main_law without the earlier
  candidates), every draw enumerated."""
  vocab = target.shape[0]
  out = np.zeros(vocab)

  def without(law, token):
    return np.where(np.arange(vocab) == token, 0.0, law)

  def walk(target_now, drawn, told, left, weight):
    """Siblings from `drawn` (unnormalised), tested against `told`."""
    if left == 0 or drawn.sum() <= 0:
      out[:] += weight * target_now
      return
    q, q_told = drawn / drawn.sum(), told / told.sum()
    for b in np.flatnonzero(q):
      accept = min(1.0, target_now[b] / q_told[b]) if q_told[b] > 0 else 0.0
      out[b] += weight * q[b] * accept
      rest = np.maximum(target_now - q_told, 0.0) if q_told[b] > 0 else target_now
      walk(rest / rest.sum() if rest.sum() > 0 else target_now, without(drawn, b),
           without(told, b), left - 1, weight * q[b] * (1 - accept))

  for a in np.flatnonzero(main_law):
    accept = min(1.0, target[a] / main_law[a])
    out[a] += main_law[a] * accept
    drawn = without(sibling_law, a)
    drawn = drawn if drawn.sum() > 0 else without(main_law, a)
    residual = np.maximum(target - main_law, 0.0)
    walk(residual / residual.sum(), drawn, drawn if tell else without(main_law, a),
         branches - 1, main_law[a] * (1 - accept))
  return out


class SjdPacOneStepTest(absltest.TestCase):

  VOCAB = 6
  DRAWS = 2 ** 16

  def _laws(self):
    rng = np.random.default_rng(3)
    make = lambda scale: jnp.asarray(jax.nn.softmax(scale * rng.normal(size=self.VOCAB)),
                                     jnp.float32)
    return make(1.5), make(1.5), make(1.5)  # old draft law, new (stale) law, target

  def _pvalue(self, tokens, target):
    counts = testing.histogram(tokens, self.VOCAB)
    return testing.chi_square_pvalue(counts, np.asarray(target, np.float64))[0]

  def _residual(self, old, new):
    return np.asarray(resampling.standard_residual(old, new), np.float64)

  def test_sjd_pac_closed_form_level_laws(self):
    """Either sibling law, told to the verifier, gives exactly t; siblings from the
    residual verified as if drawn from q (the released code's bookkeeping) do not,
    by more than the Monte Carlo test below detects with probability >= 0.99."""
    old, new, target = (np.asarray(law, np.float64) for law in self._laws())
    for sibling_law in (new, self._residual(old, new)):
      np.testing.assert_allclose(_level_law(new, sibling_law, target, 3), target, atol=1e-6)
    told_new = _level_law(new, self._residual(old, new), target, 3, tell=False)
    self.assertGreater(np.sum((told_new - target) ** 2 / target), 7.7e-4)

  def test_sjd_pac_one_level_residual_siblings_emit_the_target_law(self):
    old, new, target = self._laws()
    tokens, _ = _one_level(_residual_siblings, 3, old, new, target, self.DRAWS)
    self.assertGreater(self._pvalue(tokens, target), P_THRESHOLD)

  def test_sjd_pac_one_level_residual_siblings_told_as_target_fail(self):
    """Negative control: the same candidates, verified as if all came from q."""
    old, new, target = self._laws()
    tokens, _ = _one_level(_residual_siblings, 3, old, new, target, self.DRAWS, tell=False)
    self.assertLess(self._pvalue(tokens, target), P_THRESHOLD)

  def test_sjd_pac_one_level_emits_the_target_law(self):
    old, new, target = self._laws()
    tokens, accepted = _one_level(_target_siblings, 3, old, new, target, self.DRAWS)
    self.assertGreater(self._pvalue(tokens, target), P_THRESHOLD)
    # The proactive candidates raise acceptance above the chain's single draft,
    # whose closed form is sum_x min(q(x), t(x)).
    single = float(jnp.sum(jnp.minimum(new, target)))
    self.assertGreater(accepted.mean(), single + 0.05)

  def test_sjd_pac_one_level_greedy_siblings_fail(self):
    """The same test has the power to see greedy siblings (the whole-loop control)."""
    old, new, target = self._laws()
    tokens, _ = _one_level(_greedy_level, 3, old, new, target, self.DRAWS)
    self.assertLess(self._pvalue(tokens, target), P_THRESHOLD)

  def test_sjd_pac_siblings_are_distinct_and_start_with_the_main_draft(self):
    law = jnp.array([0.5, 0.3, 0.2, 0.0])
    uniforms = jax.random.uniform(jax.random.key(0), (100, 2))
    first = jnp.full((100,), 1, jnp.int32)
    picks = np.asarray(mode_pac.draw_siblings(uniforms, first, jnp.broadcast_to(law, (100, 4))))
    np.testing.assert_array_equal(picks[:, 0], 1)
    self.assertTrue(np.all(np.sort(picks[:, 1:], axis=1) == [0, 2]))  # the other two with mass
    # A point mass (a fresh draft) leaves nothing to draw: the siblings repeat it.
    point = jax.nn.one_hot(first, 4)
    np.testing.assert_array_equal(mode_pac.draw_siblings(uniforms, first, point), 1)


class SjdPacTreeTest(absltest.TestCase):

  def test_sjd_pac_tree_shape(self):
    tree = mode_pac.pac_tree(6, 3, 2)
    self.assertEqual(tree.num_nodes, 1 + 3 + 9 + 3)  # root, K, K^2, chain to depth 5
    self.assertEqual(tree.max_depth, 5)
    np.testing.assert_array_equal(mode_pac.main_chain(tree), [0, 1, 4, 13, 14, 15])
    mode = decode.JacobiPAC(6, branches=3, depth=2)
    self.assertEqual((mode.width, mode.slots), (16, 5))
    mask, depths = mode.layout(None)  # one static tree: the drafts are not read
    chex.assert_shape(mask, (16, 16))
    np.testing.assert_array_equal(depths, tree.depths)

  def test_sjd_pac_tree_nodes_counts_the_built_tree(self):
    for window, branches, depth in ((2, 2, 1), (4, 3, 2), (8, 3, 3), (32, 3, 2), (6, 2, 5)):
      self.assertEqual(mode_pac.pac_tree_nodes(window, branches, depth),
                       mode_pac.pac_tree(window, branches, depth).num_nodes)

  def test_sjd_pac_continuation_follows_the_accepted_branch(self):
    tree = mode_pac.pac_tree(6, 3, 2)
    table = mode_pac.continuation(tree)
    index = tree._index()  # pylint: disable=protected-access
    # Last accepted node (1,): its first-sibling child (1, 0), then the main chain.
    np.testing.assert_array_equal(table[index[(1,)], 2:], [index[(1, 0)], 13, 14, 15])
    np.testing.assert_array_equal(table[0], mode_pac.main_chain(tree))


class SjdPacValidationTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('sjd_pac_window_too_small', dict(window=1), r'JacobiPAC.window must be in \[2, '),
      ('sjd_pac_window_too_large', dict(window=NUM_TOKENS + 1),
       r'JacobiPAC.window must be in \[2, num_tokens=3\]'),
      ('sjd_pac_one_branch', dict(branches=1), r'JacobiPAC.branches must be >= 2'),
      ('sjd_pac_zero_depth', dict(depth=0), r'JacobiPAC.depth must be in \[1, window-1=2\]'),
      ('sjd_pac_depth_past_window', dict(depth=3), r'JacobiPAC.depth must be in \[1, '),
      ('sjd_pac_float_branches', dict(branches=2.5), 'branches'),
      ('sjd_pac_bad_init', dict(init='zeros'), r"JacobiPAC.init must be 'random' or"),
      ('sjd_pac_bad_continuation', dict(adaptive_continuation='yes'),
       r"JacobiPAC.adaptive_continuation must be True or False, got 'yes'"),
      ('sjd_pac_bad_sibling_law', dict(sibling_law='stale'),
       r"JacobiPAC.sibling_law must be one of \('residual', 'target'\), got 'stale'"),
      ('sjd_pac_tree_too_large', dict(branches=32, depth=2),
       r'verifies 1057 tree nodes per target forward .* more than 1024; use fewer branches'),
  )
  def test_sjd_pac_bad_fields_are_refused_before_compiling(self, fields, message):
    mode = decode.JacobiPAC(**{**dict(window=3, branches=2, depth=1), **fields})
    with self.assertRaisesRegex(ValueError, message):
      _run(mode, logits.Sampling(), num_images=2)

  def test_sjd_pac_refuses_a_rule_without_tree_verification(self):
    embeddings = jnp.asarray(np.random.default_rng(0).normal(size=(VOCAB, 4)), jnp.float32)
    with self.assertRaisesRegex(ValueError, "does not support 'tree' decoding"):
      _run(decode.JacobiPAC(3, 2, 1), logits.Sampling(), num_images=2,
           rule=rules.Grouped(embeddings=embeddings, below=1, above=1))

  def test_sjd_pac_runs_a_relaxed_tree_rule(self):
    """Rules of the 'tree' mode compose (COOL-SD's schedule takes the chain's W - 1 slots)."""
    result = _run(decode.JacobiPAC(3, 2, 1), logits.Sampling(), num_images=4,
                  rule=rules.CoolSD(delta=2.0))
    chex.assert_shape(result.tokens, (4, NUM_TOKENS))

  def test_sjd_pac_method_and_config(self):
    config = generate_config.get_config()
    self.assertIn('sjd_pac', config.methods)
    config.methods = ('vanilla', 'sjd_pac')
    method = methods_lib.build_methods(config, None)[-1]
    self.assertEqual(method.mode, decode.JacobiPAC(
        window=config.jacobi_window, branches=config.pac_branches, depth=config.pac_depth,
        init=config.jacobi_init, sibling_law='target'))
    self.assertEqual(method.hyperparameters, dict(
        window=config.jacobi_window, init=config.jacobi_init, branches=config.pac_branches,
        depth=config.pac_depth, siblings='target', rule='lossless'))
    generate_app.check_config(config)
    config.pac_siblings = 'stale'
    with self.assertRaisesRegex(cli.ConfigError, r"config.pac_siblings='stale': must be one of "
                                r"\('residual', 'target'\)"):
      generate_app.check_config(config)
    config.pac_siblings = 'residual'
    generate_app.check_config(config)
    config.pac_branches = 1
    with self.assertRaisesRegex(cli.ConfigError, r'config.pac_branches=1: must be an integer '
                                r'>= 2'):
      generate_app.check_config(config)


class SjdPacAdvanceTest(absltest.TestCase):
  """SJD-PAC's next drafts, read straight from `advance` (its output law
  cannot see these: they change acceptance only)."""

  def _pac_advance(self, mode, target_probs, path, num_accepted, old_tokens, old_probs, seed=0):
    batch, vocab = target_probs.shape[0], target_probs.shape[-1]
    plan = types.SimpleNamespace(target=types.SimpleNamespace(vocab_size=vocab))
    verdict = mode_base.Verdict(path, num_accepted, jnp.zeros((batch,), jnp.int32))
    step = mode_base.Step(None, None, target_probs, verdict, None, None, None)
    drafts = mode_pac.PACDrafts(tokens=old_tokens, probs=old_probs)
    uniforms = jax.random.uniform(jax.random.key(seed), (batch, mode.draft_uniforms))
    return mode.advance(plan, None, drafts, step, uniforms)[0]

  def test_adaptive_continuation_keeps_drafts_whose_law_did_not_move(self):
    """p = q_old: the maximal coupling keeps every old draft (u q(x) < q(x)); independent
    re-drafting from uniform p over 8 tokens keeps each w.p. 1/8 (all 128: 8**-128)."""
    mode = decode.JacobiPAC(window=4, branches=2, depth=1)
    batch, vocab, nodes = 64, 8, mode.tree.num_nodes
    law = jnp.full((batch, nodes, vocab), 1.0 / vocab)
    old = jax.random.randint(jax.random.key(1), (batch, nodes - 1), 0, vocab)
    path = jnp.zeros((batch, mode.slots + 1), jnp.int32)
    new = self._pac_advance(mode, law, path, jnp.zeros((batch,), jnp.int32), old,
                            law[:, :mode.slots])
    chain = mode_pac.main_chain(mode.tree)[1:] - 1
    np.testing.assert_array_equal(new.tokens[:, chain[:2]], old[:, chain[1:3]])

  def test_continuation_reads_the_accepted_branch(self):
    """Accepted node (1,): the next first draft is drawn from the target at (1, 0), a
    point mass here, not at the main chain's (0, 0)."""
    mode = decode.JacobiPAC(window=5, branches=2, depth=2)
    tree, index = mode.tree, mode.tree._index()  # pylint: disable=protected-access
    batch, vocab = 4, tree.num_nodes
    law = jnp.broadcast_to(jnp.eye(vocab), (batch, vocab, vocab))  # node j: point mass on j
    path = jnp.full((batch, mode.slots + 1), -1).at[:, 0].set(0).at[:, 1].set(index[(1,)])
    old = jnp.zeros((batch, tree.num_nodes - 1), jnp.int32)
    old_probs = jnp.full((batch, mode.slots, vocab), 1.0 / vocab)
    new = self._pac_advance(mode, law, path, jnp.ones((batch,), jnp.int32), old, old_probs)
    np.testing.assert_array_equal(new.tokens[:, index[(0,)] - 1], index[(1, 0)])
    np.testing.assert_array_equal(new.probs[:, 0], jax.nn.one_hot(
        jnp.full((batch,), index[(1, 0)]), vocab))

  def test_residual_siblings_come_from_the_new_law_minus_the_old(self):
    """sibling_law 'residual': Norm([p - q_old]_+) as released (p the new stale law,
    q_old the old draft's); reversed, Norm([q_old - p]_+) would only lower acceptance,
    which the law tests cannot see."""
    mode = decode.JacobiPAC(window=4, branches=2, depth=1, sibling_law='residual')
    batch, vocab, nodes = 2, 6, mode.tree.num_nodes
    p = jnp.array([.4, .3, .2, .1, 0., 0.])
    q_old = jnp.array([.1, .2, .3, .4, 0., 0.])
    path = jnp.zeros((batch, mode.slots + 1), jnp.int32)
    new = self._pac_advance(mode, jnp.broadcast_to(p, (batch, nodes, vocab)), path,
                            jnp.zeros((batch,), jnp.int32),
                            jnp.zeros((batch, nodes - 1), jnp.int32),
                            jnp.broadcast_to(q_old, (batch, mode.slots, vocab)))
    np.testing.assert_allclose(new.sibling_probs[:, 0], [[.75, .25, 0, 0, 0, 0]] * batch,
                               atol=1e-6)
    # Two of the four accepted: the new first draft had no old draft (it was beyond the
    # window), so its siblings come from p itself, not from a residual against the
    # law of some other position's old draft.
    new = self._pac_advance(mode, jnp.broadcast_to(p, (batch, nodes, vocab)), path,
                            jnp.full((batch,), 2, jnp.int32),
                            jnp.zeros((batch, nodes - 1), jnp.int32),
                            jnp.broadcast_to(q_old, (batch, mode.slots, vocab)))
    np.testing.assert_allclose(new.sibling_probs[:, 0], jnp.broadcast_to(p, (batch, vocab)),
                               atol=1e-6)

  def test_siblings_fall_back_to_the_main_law_where_the_residual_has_no_other_token(self):
    """draw_level: a residual whose only mass is the main draft leaves no sibling to
    draw, so the K - 1 siblings come from the main draft's law (distinct tokens)."""
    main_law = jnp.array([.5, .3, .2, 0.])
    residual = jnp.array([1., 0., 0., 0.])  # Norm([p - q_old]_+) = one-hot(main draft 0)
    uniforms = jax.random.uniform(jax.random.key(0), (2,))
    candidates, law = mode_pac.draw_level(uniforms, jnp.array(0, jnp.int32), main_law, residual)
    np.testing.assert_allclose(law, main_law)
    self.assertEqual(sorted(np.asarray(candidates).tolist()), [0, 1, 2])


if __name__ == '__main__':
  absltest.main()
