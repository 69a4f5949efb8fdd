"""SJD-PAC: speculative Jacobi decoding with proactive drafting and adaptive continuation.

Kang et al., "SJD-PAC: Accelerating Speculative Jacobi Decoding via Proactive
Drafting and Adaptive Continuation", CVPR 2026, arXiv 2603.18599.

Legend: B images, V vocabulary, W Jacobi window (the pending token and W - 1
chain drafts), K branches, D tree depth (draft positions that branch),
N = T tree nodes (node 0 = the pending token), T verify width.

One verify forward runs a static tree (`pac_tree`): the Jacobi chain of W - 1
drafts is its first-sibling path (the *main chain*), and at each of the first
D draft positions the tree also holds K - 1 more candidates, under every node
of the level above (a full K-ary tree of depth D, K^1 + ... + K^D nodes,
followed by the rest of the chain). All nodes of one level with the same
sibling index carry the same token: a level's K candidates c_{d,0..K-1}.

Drafts (the paper's two parts, per position d of the next window):
  * adaptive continuation: the main-chain draft is SCD's maximal coupling of
    the old draft x ~ q_old at that image token with the stale target law p
    from this forward (keep x with probability min(1, p(x)/q_old(x)), else
    draw from Norm([p - q_old]_+); `jacobi_drafts.maximal_coupling`), so it is a
    draw from p and p is the law recorded for it (`adaptive_continuation=False`:
    an independent draw from p, as SJD re-drafts);
  * proactive drafting: at the first D positions, siblings 1..K-1 are drawn
    without replacement, the main draft removed (`draw_siblings`), from the
    sibling law s (`sibling_law`): 'target' (default) s = p, so c_{d,0..K-1}
    is a draw without replacement from p; 'residual' (the released code's
    draw, here verified against s rather than p, which would not be exact)
    s = Norm([p - q_old]_+), where the law moved since the old draft, with
    s = p where that has no mass besides the main draft or the position had
    no old draft, and s recorded (`PACDrafts.sibling_probs`). On the bundle
    'residual' accepts no more (docs/results.md, "SJD-PAC's siblings").
Verification is EAGLE-1's multi-candidate walk (`verify.verify_tree_with_uniforms`):
the main draft is tested against p, sibling s >= 1 against the recorded
sibling law with earlier candidates removed and renormalised, and each
rejection turns the target into the residual. It is lossless because every
candidate is tested against the law it was drawn from given the earlier
ones (any such laws give the target's law: sequential single-draft
verification), independent of the other levels given the past.
"""

from __future__ import annotations

import dataclasses
import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import categorical
from specdec_jax import checks
from specdec_jax import jacobi_drafts
from specdec_jax import mode_base
from specdec_jax import mode_chain
from specdec_jax import mode_tree
from specdec_jax import protocol
from specdec_jax import resampling
from specdec_jax import rules as rules_lib
from specdec_jax import verify


@functools.lru_cache(maxsize=None)
def pac_tree(window: int, branches: int, depth: int) -> verify.StaticTree:
  """The verify tree: a full `branches`-ary tree over draft positions 1..depth, then
  the first-sibling (main) chain on to position window - 1.

  Width: branches + ... + branches**depth + (window - 1 - depth) + 1 nodes.
  """
  paths = [path for level in range(1, depth + 1)
           for path in np.ndindex(*(branches,) * level)]
  paths += [(0,) * level for level in range(depth + 1, window)]
  return verify.StaticTree.from_paths(paths)


def main_chain(tree: verify.StaticTree) -> np.ndarray:
  """int32[W]: node ids of the first-sibling path (0,), (0, 0), ..., root first."""
  index = tree._index()  # pylint: disable=protected-access
  return np.array([index[(0,) * level] for level in range(tree.max_depth + 1)], np.int32)


def continuation(tree: verify.StaticTree) -> np.ndarray:
  """int32[N, W]: [m, e] = the node at depth e > depth(m) that continues node m's path
  by first siblings, or the main chain's node at depth e where that path leaves the
  tree (entries e <= depth(m) repeat m).

  Its target output is the stale law of the draft at depth e + 1 once m is the
  last accepted node (SJD-PAC reads the accepted row inside the tree, the
  main chain beyond it).
  """
  index = tree._index()  # pylint: disable=protected-access
  main = main_chain(tree)
  table = np.zeros((tree.num_nodes, tree.max_depth + 1), np.int32)
  for path, node in index.items():
    for level in range(tree.max_depth + 1):
      first_siblings = path + (0,) * (level - len(path))
      table[node, level] = node if level <= len(path) else index.get(first_siblings,
                                                                      main[level])
  return table


# The most nodes a JacobiPAC verify tree may have: the tree grows as branches**depth, and
# its forward, N x N mask and N cache slots per step grow with it.
MAX_TREE_NODES = 1024


def pac_tree_nodes(window: int, branches: int, depth: int) -> int:
  """N, the nodes of `pac_tree(window, branches, depth)` (root included), counted
  without building it: branches + ... + branches**depth + window - depth."""
  return sum(branches**d for d in range(1, depth + 1)) + window - depth

# The law a branching level's candidates after the first are drawn from (`JacobiPAC`).
SIBLING_LAWS = ('residual', 'target')


def draw_siblings(uniforms, first, law):
  """A level's K candidates: the main draft, then K - 1 draws without replacement
  from `law` with the main draft removed (arXiv 2603.18599, proactive drafting).

  If `first` ~ law, the K tokens are a draw without replacement from law.

  Args:
    uniforms: f32[..., K - 1]; first: int32[...] the main draft; law: f32[..., V].
  Returns:
    int32[..., K]; once the law's support is used up (always behind a point-mass
    fresh draft), the later siblings repeat the main draft, which has no mass
    left for them, so verification skips them.
  """
  rest = jnp.where(jax.nn.one_hot(first, law.shape[-1], dtype=bool), 0.0, law)
  others = categorical.sample_distinct(uniforms, rest)
  has_mass = jnp.take_along_axis(rest, others, axis=-1) > 0
  others = jnp.where(has_mass, others, first[..., None])
  return jnp.concatenate([first[..., None], others], axis=-1)


def draw_level(uniforms, first, main_law, sibling_law):
  """A branching level's candidates: the main draft `first` int32[...] (drawn from
  main_law f32[..., V]), then K - 1 draws without replacement from sibling_law
  f32[..., V] without it; where sibling_law has no mass besides the main draft,
  from main_law instead. uniforms: f32[..., K - 1].

  Returns (int32[..., K], f32[..., V] the law the K - 1 were drawn from).
  """
  is_first = jax.nn.one_hot(first, sibling_law.shape[-1], dtype=bool)
  has_rest = jnp.sum(jnp.where(is_first, 0.0, sibling_law), axis=-1, keepdims=True) > 0
  law = jnp.where(has_rest, sibling_law, main_law)
  return draw_siblings(uniforms, first, law), law


@flax.struct.dataclass
class PACDrafts(mode_base.Drafts):
  """`mode_base.Drafts` of SJD-PAC plus sibling_probs f32[B, D, V]: the law each
  branching level's candidates 1..K-1 were drawn from (the main draft removed);
  None with sibling_law 'target' (the main draft's law, `probs`)."""

  sibling_probs: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class JacobiPAC(mode_base.Mode):
  """SJD-PAC (arXiv 2603.18599): a Jacobi window W whose first `depth` drafts carry
  `branches` candidates each, verified as one static tree in the same forward.

  depth counts the draft positions that branch (the released code's
  tree_depth counts the root too: tree_depth = depth + 1). The chain keeps W;
  the tree adds branches + ... + branches**depth - depth nodes to the forward.
  init: fresh drafts as `Jacobi` ('random' or 'spatial'); a fresh draft is a
  point mass, so its extra siblings have no mass and are skipped.
  relax_fresh_drafts: as `Jacobi`'s (fresh drafts verified losslessly by default).
  sibling_law: 'target' or 'residual' (the released draw), the law the candidates after
  the main draft come from (module docstring).
  adaptive_continuation: False re-drafts the chain as SJD does (independent draws
  from p, no coupling): proactive drafting alone, the paper's ablation step.

  Drafts: tokens int32[B, T - 1] (window entries 1..T - 1, node j = entry j),
  probs f32[B, W - 1, V] the law of the chain draft at each depth (the law of
  every candidate of that level).
  """

  window: int
  branches: int = 3
  depth: int = 2
  init: str = 'random'
  relax_fresh_drafts: bool = False
  sibling_law: str = 'target'
  adaptive_continuation: bool = True

  rule_mode = rules_lib.TREE

  @property
  def tree(self) -> verify.StaticTree:
    return pac_tree(self.window, self.branches, self.depth)

  @property
  def width(self) -> int:
    return self.tree.num_nodes

  @property
  def slots(self) -> int:
    return self.window - 1

  @property
  def verify_uniforms(self) -> int:
    return verify.tree_uniforms(self.tree)

  @property
  def draft_uniforms(self) -> int:
    # The Jacobi update with the maximal coupling, then K - 1 per branching level.
    return jacobi_drafts.jacobi_uniforms(self.window, 'maximal') + self.depth * (self.branches - 1)

  def check(self, *, target, draft, draft_params, cond, num_tokens: int) -> None:
    del draft, draft_params, cond
    mode_chain.check_window_and_init(self, num_tokens, target)
    for field in ('branches', 'depth'):
      checks.check_int_field(self, field)
    if not isinstance(self.adaptive_continuation, bool):
      raise ValueError(f'generate: JacobiPAC.adaptive_continuation must be True or False, got '
                       f'{self.adaptive_continuation!r}.')
    if self.branches < 2:
      raise ValueError(f'generate: JacobiPAC.branches must be >= 2 (candidates per branching '
                       f'position; 1 is Jacobi(coupling="maximal")), got {self.branches}.')
    if self.sibling_law not in SIBLING_LAWS:
      raise ValueError(f'generate: JacobiPAC.sibling_law must be one of {SIBLING_LAWS}, '
                       f'got {self.sibling_law!r}.')
    if not 1 <= self.depth <= self.window - 1:
      raise ValueError(f'generate: JacobiPAC.depth must be in [1, window-1={self.window - 1}] '
                       f'(the draft positions that branch), got {self.depth}.')
    nodes = pac_tree_nodes(self.window, self.branches, self.depth)
    if nodes > MAX_TREE_NODES:
      raise ValueError(
          f'generate: JacobiPAC(window={self.window}, branches={self.branches}, '
          f'depth={self.depth}) verifies {nodes} tree nodes per target forward (branches + '
          f'... + branches**depth + window - depth), more than {MAX_TREE_NODES}; use fewer '
          'branches or a smaller depth (the released default, 3 and 2, is 12 + window - 2).')

  def layout(self, drafts):
    """The static tree of every image: ancestor mask bool[T, T], depths int32[T]
    (node j predicts image token num_generated + depth(j))."""
    del drafts
    tree = self.tree
    return jnp.asarray(tree.ancestor_mask), jnp.asarray(tree.depths)

  def start(self, plan, draft_params, draft_cond, prefill, first, first_index, uniforms):
    tokens, probs = jacobi_drafts.jacobi_fresh(uniforms, self.slots, plan.target.vocab_size,
                                          self.init, first,
                                          protocol.image_token_range(plan.target))
    return self._with_siblings(tokens, probs, None, uniforms), 0

  def verify(self, plan, rule, uniforms, window, drafts, target_probs, cache, start):
    tree, rule = self.tree, rules_lib.jacobi_rule(rule, self.relax_fresh_drafts)
    # A node's children are drawn from the law of the next depth (leaves: unused).
    child_law = np.minimum(tree.depths, self.window - 2)
    draft_probs = drafts.probs[:, child_law]  # [B, T, V]
    # Beyond the branching levels a node has one child: its sibling law is unused.
    sibling_probs = (None if drafts.sibling_probs is None else
                     drafts.sibling_probs[:, np.minimum(tree.depths, self.depth - 1)])

    def one_image(uniforms, tokens, draft_probs, target_probs, sibling_probs):
      return verify.verify_tree_with_uniforms(rule, uniforms, tree, tokens, draft_probs,
                                              target_probs, sibling_probs)

    path, num_accepted, next_token = jax.vmap(one_image)(uniforms, window, draft_probs,
                                                         target_probs, sibling_probs)
    cache = mode_tree.compact_path(cache, start, path, plan.cfg)
    return mode_base.Verdict(path, num_accepted, next_token), cache

  def advance(self, plan, draft_params, drafts, step, uniforms):
    tree, verdict = self.tree, step.verdict
    last = jnp.take_along_axis(verdict.path, verdict.num_accepted[:, None], axis=1)[:, 0]
    nodes = jnp.asarray(continuation(tree))[last]  # [B, W]
    stale = jnp.take_along_axis(step.target_probs, nodes[..., None], axis=1)  # [B, W, V]
    old_chain = drafts.tokens[:, main_chain(tree)[1:] - 1]  # [B, W-1]
    chain_uniforms = uniforms[:, :jacobi_drafts.jacobi_uniforms(self.window, 'maximal')]
    tokens, probs = jacobi_drafts.jacobi_next(
        chain_uniforms, stale, verdict.num_accepted, verdict.next_token, self.init,
        protocol.image_token_range(plan.target),
        coupling='maximal' if self.adaptive_continuation else 'none', old_tokens=old_chain,
        old_probs=drafts.probs)
    residual = None  # 'target': the siblings come from the main draft's law
    if self.sibling_law == 'residual':
      has_old, old_index = jacobi_drafts.old_draft_slots(verdict.num_accepted, self.window)
      old_law = jnp.take_along_axis(drafts.probs, old_index[:, :self.depth, None], axis=1)
      main_law = probs[:, :self.depth]
      residual = jnp.where(has_old[:, :self.depth, None],
                           resampling.standard_residual(old_law, main_law), main_law)
    return self._with_siblings(tokens, probs, residual, uniforms), 0

  def _with_siblings(self, chain_tokens, chain_probs, residual, uniforms) -> PACDrafts:
    """Chain drafts int32[B, W-1] and their laws f32[B, W-1, V] -> the tree's drafts,
    the siblings drawn with the last D * (K - 1) of uniforms f32[B, draft_uniforms]:
    from the main draft's law, or with sibling_law 'residual' from `residual`
    f32[B, D, V] (None at the first step: no old drafts), falling back to the main
    draft's law where that has no mass besides the main draft."""
    levels, extra = self.depth, self.branches - 1
    sibling_uniforms = uniforms[:, uniforms.shape[1] - levels * extra:].reshape(-1, levels, extra)
    first, main_law = chain_tokens[:, :levels], chain_probs[:, :levels]
    if self.sibling_law == 'target':
      candidates, sibling_law = draw_siblings(sibling_uniforms, first, main_law), None
    else:
      candidates, sibling_law = draw_level(sibling_uniforms, first, main_law,
                                           main_law if residual is None else residual)
    return PACDrafts(tokens=node_tokens(self.tree, candidates, chain_tokens), probs=chain_probs,
                     sibling_probs=sibling_law)


def node_tokens(tree: verify.StaticTree, candidates, chain_tokens) -> jax.Array:
  """The window's draft tokens int32[B, T-1] (node j = window entry j, j >= 1).

  A node of depth d <= D with sibling index s carries candidate c_{d,s}
  (candidates int32[B, D, K]); the chain beyond the tree carries chain_tokens
  int32[B, W-1] (entry d - 1 at depth d).
  """
  levels = candidates.shape[1]
  depths, siblings = tree.depths[1:], tree.sibling_index[1:]
  in_tree = candidates[:, np.minimum(depths, levels) - 1, siblings]  # [B, T-1]
  return jnp.where(depths <= levels, in_tree, chain_tokens[:, depths - 1]).astype(jnp.int32)
