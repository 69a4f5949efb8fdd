"""Monte Carlo checks of verify_tree against exact laws (lossless and relaxed
rules). Power and controls as in tests/test_verify.py.
"""

import functools
from typing import Any

from absl.testing import absltest
from absl.testing import parameterized
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import rules
from specdec_jax import testing
from specdec_jax import verify
from tests.rules_support import dirichlet_pair, line_neighbors
from tests.verify_support import NUM_SAMPLES
from tests.verify_support import AcceptEverything


def sample_tree(rule, tree, draft_probs, target_probs, seed=0, num_samples=NUM_SAMPLES,
                uniforms_map=None):
  """Drafts each node's children without replacement (Gumbel top-k) from the
  node's draft distribution, then verifies; returns (node_tokens, path, next).
  uniforms_map (negative controls): changes each sample's verify uniforms."""
  children = tree.children
  key_draft, key_verify = jax.random.split(jax.random.key(seed))

  def draft_tree(key):
    tokens = jnp.zeros((tree.num_nodes,), jnp.int32)
    keys = jax.random.split(key, tree.num_nodes)
    for node in range(tree.num_nodes):
      kids = [c for c in children[node] if c >= 0]
      if not kids:
        continue
      gumbel = jax.random.gumbel(keys[node], draft_probs[node].shape)
      ranked = jnp.argsort(-(jnp.log(draft_probs[node]) + gumbel))
      for sibling, child in enumerate(kids):
        tokens = tokens.at[child].set(ranked[sibling])
    return tokens

  node_tokens = jax.vmap(draft_tree)(jax.random.split(key_draft, num_samples))
  def verify_one(key, toks):
    if uniforms_map is None:
      return verify.verify_tree(rule, key, tree, toks, draft_probs, target_probs)
    uniforms = uniforms_map(jax.random.uniform(key, (verify.tree_uniforms(tree),)))
    return verify.verify_tree_with_uniforms(rule, uniforms, tree, toks, draft_probs,
                                            target_probs)

  run = jax.jit(jax.vmap(verify_one))
  path, num_accepted, next_token = run(jax.random.split(key_verify, num_samples), node_tokens)
  return np.asarray(node_tokens), np.asarray(path), np.asarray(num_accepted), np.asarray(next_token)


def tree_setup(vocab=8):
  """A depth-2 tree whose root siblings have 2, 1 and 0 children, with context-free
  distributions: each node's draft and target laws depend only on its depth."""
  tree = verify.StaticTree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)])
  depth_targets = [dirichlet_pair(40 + i, vocab, concentration=0.7) for i in range(3)]
  draft_probs = jnp.stack([depth_targets[d][0] for d in tree.depths])
  target_probs = jnp.stack([depth_targets[d][1] for d in tree.depths])
  return tree, draft_probs, target_probs, depth_targets


def emitted_tokens(node_tokens, path, num_accepted, next_token):
  """(first, second) emitted tokens of each verified tree (second valid if n >= 1)."""
  rows = np.arange(len(path))
  first = np.where(num_accepted > 0, node_tokens[rows, np.maximum(path[:, 1], 0)], next_token)
  second = np.where(num_accepted > 1, node_tokens[rows, np.maximum(path[:, 2], 0)], next_token)
  return first, second


class TreeMonteCarloTest(parameterized.TestCase):

  def _setup(self, vocab=8):
    return tree_setup(vocab)

  def _emitted(self, *out):
    return emitted_tokens(*out)

  def test_lossless_tree_emits_target_law(self):
    vocab = 8
    tree, draft_probs, target_probs, depth_targets = self._setup(vocab)
    out = sample_tree(rules.Lossless(), tree, draft_probs, target_probs)
    first, second = self._emitted(*out)
    report = testing.bins_match(testing.histogram(first, vocab), depth_targets[0][1])
    self.assertTrue(report.ok, report.message)
    has_second = out[2] >= 1
    report = testing.bins_match(testing.histogram(second[has_second], vocab),
                                depth_targets[1][1])
    self.assertTrue(report.ok, report.message)
    self.assertGreater(out[2].mean(), 0.3)  # the tree does accept

  def test_tree_negative_control(self):
    vocab = 8
    tree, draft_probs, target_probs, depth_targets = self._setup(vocab)
    out = sample_tree(AcceptEverything(), tree, draft_probs, target_probs)
    first, _ = self._emitted(*out)
    self.assertFalse(testing.bins_match(testing.histogram(first, vocab),
                                        depth_targets[0][1]).ok)

  def test_tree_structure(self):
    tree = verify.StaticTree.from_paths([(1,), (0,), (0, 0)])
    np.testing.assert_array_equal(tree.parents, [-1, 0, 0, 1])
    np.testing.assert_array_equal(tree.depths, [0, 1, 1, 2])
    np.testing.assert_array_equal(tree.children, [[1, 2], [3, -1], [-1, -1], [-1, -1]])
    self.assertTrue(tree.ancestor_mask[3, 1] and tree.ancestor_mask[3, 0])
    self.assertFalse(tree.ancestor_mask[3, 2])
    self.assertEqual(tree.children_per_depth, (2, 1))
    # The most children of any node at a depth, not those of the last path listed.
    self.assertEqual(verify.StaticTree.from_paths(
        ((0,), (1,), (0, 0), (0, 1), (1, 0))).children_per_depth, (2, 2))
    with self.assertRaisesRegex(ValueError, 'parent'):
      verify.StaticTree.from_paths([(0, 0)])
    with self.assertRaisesRegex(ValueError, 'skips sibling'):
      verify.StaticTree.from_paths([(0,), (2,)])
    with self.assertRaisesRegex(ValueError, r'path \(1,\) skips sibling 0'):
      verify.StaticTree.from_paths([(1,)])  # a second sample without the first
    with self.assertRaisesRegex(ValueError, r'bad path \(-1,\); .* indices >= 0'):
      verify.StaticTree.from_paths([(-1,)])

  def test_bad_sibling_probs_are_refused(self):
    tree, draft_probs, target_probs, _ = tree_setup()
    node_tokens = jnp.zeros((tree.num_nodes,), jnp.int32)
    uniforms = jnp.zeros((verify.tree_uniforms(tree),))
    with self.assertRaisesRegex(ValueError, r"sibling_probs must have draft_probs' shape "
                                r'\(7, 8\), got \(7, 4\)'):
      verify.verify_tree_with_uniforms(rules.Lossless(), uniforms, tree, node_tokens,
                                       draft_probs, target_probs, draft_probs[:, :4])
    with self.assertRaisesRegex(ValueError, 'sibling_probs rows must sum to 1'):
      verify.verify_tree_with_uniforms(rules.Lossless(), uniforms, tree, node_tokens,
                                       draft_probs, target_probs, 2 * draft_probs)


def _normalized(mass, fallback):
  total = mass.sum()
  return mass / total if total > 0 else fallback


def numpy_rule(name: str, depth: int):
  """(f(q, p, x), G(q, p, x)) of a relaxed rule at one tree depth, written out in numpy
  from the formulas (README "Methods"): q the sibling's draft law, p the current target."""
  if name in ('uniform', 'coolsd'):
    if name == 'uniform':
      weight = 2.5
    else:  # CoolSD(delta=1.2) over a depth-2 window, mean-normalised, floored at 1
      mu = np.log(np.mean(np.exp(-0.7 * np.arange(1, 3))))
      weight = max(1.0, 1.2 * np.exp(-0.7 * depth - mu))
    accept = lambda q, p, x: min(1.0, weight * p[x] / q[x])
    residual = lambda q, p, x: _normalized(np.maximum(p - np.minimum(q, weight * p), 0.0), p)
    return accept, residual
  table, k, lam = np.asarray(line_neighbors(8, 6)), 4, 3.0  # LanternPP, as the test's rule

  def accept(q, p, x):
    mass = 0.0
    for m in range(1, k + 1):
      if p[table[x, :m]].sum() <= (lam - 1.0) * p[x]:
        mass = p[table[x, :m]].sum()
    return min(1.0, (p[x] + mass) / q[x])

  return accept, lambda q, p, x: _normalized(np.maximum(p - q, 0.0), p)


def node_outcome_law(draft, target, num_children, accept, residual):
  """EAGLE-1 multi-candidate verification at one node, enumerated exactly.

  Siblings x_1, x_2, ... are drawn without replacement from `draft`; sibling s is
  tested against q_s (draft with earlier siblings removed, renormalised) and the
  current target p, accepted with f(q_s, p, x_s), else p <- G(q_s, p, x_s).
  Returns (accepted [num_children, V]: P(sibling s accepted and is x), resampled [V]:
  P(all rejected and the resample is y)); with no children, resampled = target.
  """
  vocab = draft.shape[0]
  accepted = np.zeros((num_children, vocab))
  resampled = np.zeros(vocab)

  def visit(sibling, removed, prob, p):
    if sibling == num_children:
      resampled[:] += prob * p
      return
    q = draft.copy()
    q[removed] = 0.0
    q /= q.sum()
    for x in range(vocab):
      if q[x] <= 0:
        continue
      f = accept(q, p, x)
      accepted[sibling, x] += prob * q[x] * f
      if f < 1:
        visit(sibling + 1, removed + [x], prob * q[x] * (1.0 - f), residual(q, p, x))

  visit(0, [], 1.0, target)
  return accepted, resampled


class TreeInputsTest(absltest.TestCase):

  def test_tokens_nodes_and_target_vocabularies_outside_the_tree_are_refused(self):
    tree = verify.StaticTree.from_paths([(0,), (0, 0)])
    uniform = jnp.full((3, 4), 0.25)
    static = functools.partial(verify.verify_tree, rules.Lossless(), jax.random.key(0), tree)
    with self.assertRaisesRegex(ValueError, r'node_tokens must be in \[0, 4\)'):
      static(jnp.array([0, 3, -1]), uniform, uniform)
    with self.assertRaisesRegex(ValueError, r'node_tokens must be in \[0, 4\)'):
      static(jnp.array([0, 3, 4]), uniform, uniform)  # the id V itself
    with self.assertRaisesRegex(ValueError, 'node_tokens must be an int array'):
      static(jnp.array([0., 3., 1.]), uniform, uniform)
    with self.assertRaisesRegex(ValueError, r'verify_tree: the target function returns shape '
                                r"\(5,\), expected \[V\] = \[4\] \(the drafts' vocabulary\)"):
      static(jnp.array([0, 3, 1]), uniform, lambda node: jnp.full(5, 0.2))
    dynamic = functools.partial(verify.verify_dynamic_tree_with_uniforms, rules.Lossless(),
                                jnp.zeros(3))
    target_at = lambda node: jnp.full(4, 0.25)
    with self.assertRaisesRegex(ValueError, r'node_tokens must be in \[0, 4\)'):
      dynamic(jnp.array([[1, -1], [-1, -1]]), 1, jnp.array([0, 9]), target_at)
    with self.assertRaisesRegex(ValueError, r'children entries must be node ids in \[0, 2\) '
                                'or -1'):
      dynamic(jnp.array([[5, -1], [-1, -1]]), 1, jnp.array([0, 1]), target_at)
    with self.assertRaisesRegex(ValueError, 'children must be an int array of node ids'):
      dynamic(jnp.array([[1., -1.], [-1., -1.]]), 1, jnp.array([0, 1]), target_at)
    with self.assertRaisesRegex(ValueError, r'the target function returns shape \(5,\)'):
      dynamic(jnp.array([[1, -1], [-1, -1]]), 1, jnp.array([0, 1]),
              lambda node: jnp.full(5, 0.2), draft_probs=jnp.full((2, 4), 0.25))
    path, _, _ = dynamic(jnp.array([[1, -1], [-1, -1]]), 1, jnp.array([0, 1]), target_at)
    self.assertEqual(int(path[0]), 0)


class LazyTargetTest(absltest.TestCase):

  def test_target_function_gives_the_array_results_and_reads_only_visited_nodes(self):
    """A target given as node -> distribution verifies exactly as the [N, V] array,
    and is evaluated at the root and the accepted nodes only (D + 1 calls in the walk)."""
    tree, draft_probs, target_probs, _ = tree_setup()
    node_tokens, _, _, _ = sample_tree(rules.Lossless(), tree, draft_probs, target_probs,
                                       num_samples=64)
    uniforms = jax.random.uniform(jax.random.key(9), (64, verify.tree_uniforms(tree)))
    calls = []

    def target_at(node):
      calls.append(node)
      return target_probs[node]

    by_array = jax.vmap(lambda u, t: verify.verify_tree_with_uniforms(
        rules.Lossless(), u, tree, t, draft_probs, target_probs))(uniforms, node_tokens)
    by_function = jax.vmap(lambda u, t: verify.verify_tree_with_uniforms(
        rules.Lossless(), u, tree, t, draft_probs, target_at))(uniforms, node_tokens)
    for got, want in zip(by_function, by_array):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # D + 1 in the walk, plus the abstract trace (jax.eval_shape) that checks the
    # function's vocabulary against draft_probs' before the walk.
    self.assertLen(calls, tree.max_depth + 2)


class ChildrenPerDepthTest(absltest.TestCase):

  def test_walk_testing_fewer_siblings_per_depth_gives_the_same_results(self):
    """A static tree's walk tests c_d siblings at depth d (here 3, 1, 1 of C = 3):
    same paths and tokens as testing C at every depth, for every uniform."""
    tree = verify.StaticTree.from_paths([(0,), (1,), (2,), (0, 0), (0, 0, 0)])
    self.assertEqual(tree.children_per_depth, (3, 1, 1))
    vocab = 6
    draft_probs = jnp.asarray(np.random.default_rng(3).dirichlet(np.ones(vocab), tree.num_nodes),
                              jnp.float32)
    target_probs = jnp.asarray(np.random.default_rng(4).dirichlet(np.ones(vocab), tree.num_nodes),
                               jnp.float32)
    node_tokens, _, _, _ = sample_tree(rules.Lossless(), tree, draft_probs, target_probs,
                                       num_samples=256)
    uniforms = jax.random.uniform(jax.random.key(5), (256, verify.tree_uniforms(tree)))
    children = jnp.asarray(tree.children)

    def walk(per_depth):
      return jax.vmap(lambda u, t: verify._walk_tree(  # pylint: disable=protected-access
          rules.UniformRelaxed(2.0), u, children, tree.max_depth, t, draft_probs,
          lambda node: target_probs[node], per_depth))(uniforms, node_tokens)

    every, fewer = walk(None), walk(tree.children_per_depth)
    for got, want in zip(fewer, every):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    self.assertGreater(int(np.sum(np.asarray(every[1]) == 3)), 0)  # some walks reach depth 3
    # Negative control: testing no sibling at depth 1 changes the results.
    cut = walk((0, 1, 1))
    self.assertFalse(np.array_equal(np.asarray(cut[0]), np.asarray(every[0])))


class ChainTailTest(parameterized.TestCase):
  """A static tree's chain tail (its deepest levels of one node each, SJD-PAC's
  main chain past its branching levels) is tested at once; the paths, counts and
  next tokens must equal the node-by-node walk's bit for bit."""

  TREES = {
      'sjd_pac_w8': ((0,), (1,), (2,)) + tuple((i, j) for i in range(3) for j in range(3))
                    + tuple((0,) * n for n in range(3, 8)),
      'chain': tuple((0,) * n for n in range(1, 6)),
      'tail_under_a_sibling_level': ((0,), (1,), (0, 0), (0, 0, 0), (0, 0, 0, 0)),
  }

  def test_chain_tail_nodes(self):
    tail = lambda name: verify.StaticTree.from_paths(self.TREES[name]).chain_tail.tolist()
    self.assertEqual(tail('sjd_pac_w8'), [13, 14, 15, 16, 17])
    self.assertEqual(tail('chain'), [1, 2, 3, 4, 5])
    self.assertEqual(tail('tail_under_a_sibling_level'), [3, 4, 5])
    self.assertEqual(verify.StaticTree.from_paths(((0,), (1,), (0, 0), (1, 0))).chain_tail
                     .tolist(), [])

  @parameterized.product(
      tree=tuple(TREES),
      rule=(rules.Lossless(), rules.UniformRelaxed(2.0),
            rules.CoolSD(delta=2.0, nu=0.2, mu=0.0, floor_at_one=False)))
  def test_chain_tail_at_once_equals_the_walk(self, tree, rule):
    tree, vocab, num = verify.StaticTree.from_paths(self.TREES[tree]), 6, 4096
    keys = jax.random.split(jax.random.key(0), 5)
    zeroed = jax.random.uniform(keys[0], (num, tree.num_nodes, vocab)) < 0.3
    draft = jnp.where(zeroed, 0.0, jax.random.dirichlet(keys[1], jnp.ones(vocab),
                                                         (num, tree.num_nodes)))
    draft = (draft.at[..., 0].add(1e-3) / (draft.sum(-1, keepdims=True) + 1e-3))
    target = 0.9 * draft + 0.1 * jax.random.dirichlet(keys[2], jnp.ones(vocab),
                                                      (num, tree.num_nodes))
    # Tokens drawn from the parent's draft law, one in five at random (some of no mass).
    drawn = jax.random.categorical(keys[3], jnp.log(draft[:, np.maximum(tree.parents, 0)]))
    tokens = jnp.where(jax.random.uniform(keys[4], drawn.shape) < 0.2,
                       jax.random.randint(keys[4], drawn.shape, 0, vocab), drawn)
    uniforms = jax.random.uniform(jax.random.key(1), (num, verify.tree_uniforms(tree)))
    at_once = jax.vmap(lambda u, x, d, t: verify.verify_tree_with_uniforms(
        rule, u, tree, x, d, t))(uniforms, tokens, draft, target)
    walked = jax.vmap(lambda u, x, d, t: verify._walk_tree(  # pylint: disable=protected-access
        rule, u, jnp.asarray(tree.children), tree.max_depth, x, d, lambda node: t[node],
        tree.children_per_depth))(uniforms, tokens, draft, target)
    for got, want in zip(at_once, walked):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    counts = np.bincount(np.asarray(at_once[1]), minlength=tree.max_depth + 1)
    self.assertTrue(np.all(counts > 0), f'some accepted lengths never occur: {counts}')


@flax.struct.dataclass
class TargetResidualOf(rules.Rule):
  """Negative control: `base`'s acceptance, but resampling from the current target."""

  base: Any = None

  def accept_prob(self, draft_probs, target_probs, position=1):
    return self.base.accept_prob(draft_probs, target_probs, position)

  def accept_prob_at(self, draft_probs, target_probs, position, token):
    return self.base.accept_prob_at(draft_probs, target_probs, position, token)

  def residual(self, draft_probs, target_probs, position=1, rejected_token=None):
    return target_probs


class RelaxedTreeMonteCarloTest(parameterized.TestCase):
  """Relaxed rules on an EAGLE-1 static tree against their exact law.

  The exact joint law of (first emitted token, second emitted token or none) is
  enumerated in numpy (`node_outcome_law`, over every ordered sibling draw) from the
  rules' formulas; the tree's second level has 2, 1 or 0 children depending on which
  root sibling was accepted. Power: n = 2^16 trees, 6 sigma per bin (+5 counts) over
  V (V + 1) = 72 bins: a bin of mass 0.1 detects 1.0 percentage point with probability
  0.99, a bin of mass 0.01 0.35; every zero-mass bin must stay empty. Negative control: the same rule
  resampling from the current target instead of its residual must fail.
  """

  def _rule(self, name, tree):
    rule = {
        'uniform': lambda: rules.UniformRelaxed(omega=2.5),
        'coolsd': lambda: rules.CoolSD(delta=1.2),  # w_1 = 1.60, w_2 = 0.80 -> floored to 1
        'lanternpp': lambda: rules.LanternPP(neighbors=line_neighbors(8, 6), k=4, lam=3.0),
    }[name]()
    return rule.for_window(tree.max_depth)  # as the decoder: window = tree depth

  def _exact_law(self, name, tree, depth_pairs):
    vocab = depth_pairs[0][0].shape[0]
    (d0, t0), (d1, t1) = [(np.asarray(d, np.float64), np.asarray(t, np.float64))
                          for d, t in depth_pairs[:2]]
    root_children = [c for c in tree.children[0] if c >= 0]
    accepted, resampled = node_outcome_law(d0, t0, len(root_children), *numpy_rule(name, 1))
    law = np.zeros((vocab, vocab + 1))  # [first, second]; column V: no second token
    law[:, vocab] = resampled
    for sibling, child in enumerate(root_children):
      grandchildren = int(np.sum(tree.children[child] >= 0))
      second_accepted, second_resampled = node_outcome_law(
          d1, t1, grandchildren, *numpy_rule(name, 2))
      second = second_accepted.sum(0) + second_resampled
      law[:, :vocab] += accepted[sibling][:, None] * second[None, :]
    np.testing.assert_allclose(law.sum(), 1.0, atol=1e-9)
    return law.reshape(-1)

  def _counts(self, out, vocab):
    node_tokens, path, num_accepted, next_token = out
    first, second = emitted_tokens(node_tokens, path, num_accepted, next_token)
    second = np.where(num_accepted >= 1, second, vocab)
    return testing.histogram(first * (vocab + 1) + second, vocab * (vocab + 1))

  @parameterized.parameters('uniform', 'coolsd', 'lanternpp')
  def test_tree_emits_exact_law(self, name):
    tree, draft_probs, target_probs, depth_pairs = tree_setup()
    rule = self._rule(name, tree)
    law = self._exact_law(name, tree, depth_pairs)
    lossless = self._exact_law_lossless(tree, depth_pairs)
    self.assertGreater(np.abs(law - lossless).sum(), 0.02)  # the rule does relax
    out = sample_tree(rule, tree, draft_probs, target_probs, seed=5)
    report = testing.bins_match(self._counts(out, 8), law)
    self.assertTrue(report.ok, report.message)

  @parameterized.parameters('uniform', 'coolsd', 'lanternpp')
  def test_negative_control_target_residual_fails(self, name):
    tree, draft_probs, target_probs, depth_pairs = tree_setup()
    broken = TargetResidualOf(base=self._rule(name, tree))
    out = sample_tree(broken, tree, draft_probs, target_probs, seed=6)
    report = testing.bins_match(self._counts(out, 8), self._exact_law(name, tree, depth_pairs))
    self.assertFalse(report.ok, f'{name}: the broken residual went unnoticed: {report.message}')

  def _exact_law_lossless(self, tree, depth_pairs):
    """The target's own joint law (what Lossless emits), for the relaxation check."""
    vocab = depth_pairs[0][0].shape[0]
    t0, t1 = (np.asarray(t, np.float64) for _, t in depth_pairs[:2])
    law = np.zeros((vocab, vocab + 1))
    law[:, :vocab] = t0[:, None] * t1[None, :]
    return law.reshape(-1)


class SiblingUniformsTest(absltest.TestCase):

  def _first_token_report(self, uniforms_map=None):
    tree = verify.StaticTree.from_paths([(0,), (1,)])
    q, p = jnp.array([.4, .4, .2], jnp.float32), jnp.array([.5, .1, .4], jnp.float32)
    out = sample_tree(rules.Lossless(), tree, jnp.stack([q] * 3), jnp.stack([p] * 3), seed=4,
                      uniforms_map=uniforms_map)
    tokens, path, n, nxt = out
    first = np.where(n > 0, tokens[np.arange(len(n)), np.maximum(path[:, 1], 0)], nxt)
    return testing.bins_match(testing.histogram(first, 3), p)

  def test_tree_siblings_use_independent_uniforms(self):
    """Two root siblings, Lossless: the first emitted token must follow p."""
    report = self._first_token_report()
    self.assertTrue(report.ok, report.message)

  def test_negative_control_sibling_reusing_its_elder_uniform_fails(self):
    """Sibling 1 tested with sibling 0's uniform (entries [s0, s1, next]) moves
    P(token 0) from .5 to .467 and token 2 up by .033: about 2200 counts at n = 2^16,
    against a 6-sigma bound of about 770."""
    report = self._first_token_report(lambda u: u.at[1].set(u[0]))
    self.assertFalse(report.ok, f'a shared sibling uniform went unnoticed: {report.message}')


if __name__ == '__main__':
  absltest.main()
