"""Verification: the exact one-step law, chain verification and EAGLE-1 static trees.

Legend: V vocabulary, k number of drafted tokens, N tree nodes (node 0 is the
root: the last committed token), D tree depth.

All functions act on one row; `jax.vmap` them over a batch with split keys
(rows then accept different numbers of tokens). Inputs are validated at the
public boundary: shapes always (they are static under jit), values (NaN,
negative or unnormalised probabilities) only when concrete. Inside `jit` the
values are tracers and are not checked: NaN probabilities then propagate to
NaN acceptance tests, which never accept, and the resampled token is
unspecified. Validate logits before decoding (the engine does) or wrap the
call with `jax.experimental.checkify`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import categorical
from specdec_jax import checks
from specdec_jax import static_tree
from specdec_jax import verify_inputs


check_probs = verify_inputs.check_probs
_check_rank = verify_inputs.check_rank
_is_concrete = verify_inputs.is_concrete


def output_law(rule, draft_probs, target_probs, position=1) -> jax.Array:
  """The exact law of the token one verification step emits, f32[V] (f64 for f64
  inputs), computed in that precision whatever the inputs' dtype, from one
  position's draft_probs and target_probs f[V].

  out(y) = d(y) f(y) + sum_x d(x) (1 - f(x)) G_x(y); for rules whose residual
  does not depend on the rejected token x this is d f + (1 - beta) G.
  """
  checks.check_rule(rule, 'output_law')
  check_probs('draft_probs', draft_probs)
  check_probs('target_probs', target_probs, jnp.shape(draft_probs)[-1])
  _check_rank('draft_probs', draft_probs, 1, 'a distribution [V]')
  _check_rank('target_probs', target_probs, 1, 'a distribution [V]')
  if _is_concrete(position) and not np.all(np.asarray(position) >= 1):
    raise ValueError(f'output_law: position is the 1-based draft position (>= 1), got '
                     f'{position}.')
  draft_probs, target_probs = at_least_float32(draft_probs, target_probs)
  accept = rule.accept_prob(draft_probs, target_probs, position)
  accepted = draft_probs * accept
  if not rule.residual_depends_on_token:
    rejected_mass = 1.0 - jnp.sum(accepted)
    return accepted + rejected_mass * rule.residual(draft_probs, target_probs, position)
  tokens = jnp.arange(draft_probs.shape[-1])
  residuals = jax.vmap(lambda x: rule.residual(draft_probs, target_probs, position, x))(tokens)
  return accepted + jnp.einsum('x,xy->y', draft_probs * (1.0 - accept), residuals)


def tv_distance(p, q) -> jax.Array:
  """Total variation 0.5 * sum |p - q| over the last axis (p and q of one shape)."""
  if jnp.shape(p) != jnp.shape(q):
    raise ValueError(f'tv_distance: p and q must have one shape, got {jnp.shape(p)} and '
                     f'{jnp.shape(q)}.')
  return 0.5 * jnp.sum(jnp.abs(p - q), axis=-1)


def excess_acceptance(rule, draft_probs, target_probs, position=1) -> jax.Array:
  """sum_x [d(x) f(x) - t(x)]_+: TV(out, t) under G*, and a lower bound for any G.

  draft_probs, target_probs: f32[..., V], one shape; returns f32[...].
  """
  check_probs('draft_probs', draft_probs)
  check_probs('target_probs', target_probs, jnp.shape(draft_probs)[-1])
  if jnp.shape(draft_probs) != jnp.shape(target_probs):
    raise ValueError(f'excess_acceptance: draft_probs {jnp.shape(draft_probs)} and '
                     f'target_probs {jnp.shape(target_probs)} must have one shape.')
  accept = rule.accept_prob(draft_probs, target_probs, position)
  return jnp.sum(jnp.maximum(draft_probs * accept - target_probs, 0.0), axis=-1)


def at_least_float32(*probs):
  """The probability arrays in float32 at least (bfloat16 inputs are promoted): the
  rules' min(1, t/d) and residuals in bfloat16 would sample another law than
  `output_law` gives."""
  dtype = jnp.promote_types(jnp.result_type(*probs), jnp.float32)
  return tuple(jnp.asarray(p, dtype) for p in probs)


def verify_chain(rule, key, draft_tokens, draft_probs, target_probs):
  """Verifies k chained drafts for one row, with k + 1 uniforms drawn from `key`.

  See `verify_chain_with_uniforms` (the decode loop's form) for the arguments.
  """
  num_drafts = jnp.shape(draft_probs)[0] if jnp.ndim(draft_probs) == 2 else 0
  return verify_chain_with_uniforms(rule, jax.random.uniform(key, (num_drafts + 1,)),
                                    draft_tokens, draft_probs, target_probs)


def verify_chain_with_uniforms(rule, uniforms, draft_tokens, draft_probs, target_probs):
  """Verifies k chained drafts for one row.

  Args:
    rule: an acceptance rule from `specdec_jax.rules`.
    uniforms: f32[k+1] in [0, 1): uniforms[i] tests draft i+1 (accepted iff
      uniforms[i] < f(x_{i+1})); uniforms[k] draws the next token
      (`categorical.sample`).
    draft_tokens: int32[k], drafted tokens x_1..x_k.
    draft_probs: f32[k, V], d_i: the distribution x_i was sampled from.
    target_probs: f32[k+1, V], t_i: the target's distribution at each draft
      position, plus the one after the last draft (for the bonus token).
  Returns:
    (num_accepted int32[] in [0, k], next_token int32[]): drafts x_1..x_n are
    accepted; next_token is drawn from the rule's residual at position n+1,
    or from target_probs[k] (the bonus) when n == k.
  """
  draft_tokens = verify_inputs.tokens_array('draft_tokens', draft_tokens)
  _check_rank('draft_tokens', draft_tokens, 1, 'int [k]')
  _check_rank('draft_probs', draft_probs, 2, '[k, V]')
  _check_rank('target_probs', target_probs, 2, '[k+1, V]')
  checks.check_rule(rule, 'verify_chain')
  num_drafts, vocab = draft_probs.shape
  if num_drafts < 1:
    raise ValueError('verify_chain: needs at least one draft (k >= 1), got draft_probs of '
                     f'shape {draft_probs.shape}.')
  if draft_tokens.shape[0] != num_drafts or target_probs.shape[0] != num_drafts + 1:
    raise ValueError(
        f'verify_chain: draft_tokens {draft_tokens.shape}, draft_probs {draft_probs.shape} '
        f'and target_probs {target_probs.shape} must be [k], [k, V] and [k+1, V].')
  if jnp.shape(uniforms) != (num_drafts + 1,):
    raise ValueError(f'verify_chain: uniforms must be [k+1] = [{num_drafts + 1}], got '
                     f'{jnp.shape(uniforms)}.')
  check_probs('draft_probs', draft_probs)
  check_probs('target_probs', target_probs, vocab)
  verify_inputs.check_token_range('draft_tokens', draft_tokens, vocab)
  verify_inputs.check_drafts_have_mass(draft_tokens, draft_probs)

  draft_probs, target_probs = at_least_float32(draft_probs, target_probs)
  positions = jnp.arange(1, num_drafts + 1)
  accept = jax.vmap(rule.accept_prob_at)(
      draft_probs, target_probs[:num_drafts], positions, draft_tokens)
  accepted = uniforms[:num_drafts] < accept
  num_accepted = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32))).astype(jnp.int32)

  stop = jnp.minimum(num_accepted, num_drafts - 1)
  residual = rule.residual(draft_probs[stop], target_probs[stop], stop + 1, draft_tokens[stop])
  next_probs = jnp.where(num_accepted == num_drafts, target_probs[num_drafts], residual)
  return num_accepted, categorical.sample(uniforms[num_drafts], next_probs)


# The tree structure lives in its own module; verification reads it as `verify.StaticTree`.
StaticTree = static_tree.StaticTree


def verify_tree(rule, key, tree: StaticTree, node_tokens, draft_probs, target_probs):
  """`verify_tree_with_uniforms` with its uniforms drawn from a PRNG key."""
  uniforms = jax.random.uniform(key, (tree_uniforms(tree),))
  return verify_tree_with_uniforms(rule, uniforms, tree, node_tokens, draft_probs, target_probs)


def tree_uniforms(tree: StaticTree) -> int:
  """Uniforms one tree verification uses: D * C sibling tests and the next token."""
  return tree.max_depth * tree.max_children + 1


def verify_tree_with_uniforms(rule, uniforms, tree: StaticTree, node_tokens, draft_probs,
                              target_probs, sibling_probs=None):
  """EAGLE-1 multi-candidate verification of a static tree, for one row.

  At the current node (starting at the root) its children x_1, x_2, ... were
  sampled without replacement from the drafter distribution q at the node.
  Sibling s is tested against q_s = q with earlier siblings removed and
  renormalised (so q_s is the law x_s was drawn from), with acceptance
  f = rule.accept_prob_at(q_s, p, depth, x_s); on rejection the target side
  becomes the rule's residual p <- residual(q_s, p, depth, x_s) for the next
  sibling. Accepting descends into that child with its own target and draft
  distributions; when every sibling is rejected the next token is drawn from
  the current residual; at a leaf it is the bonus from the leaf's target.
  Siblings with no draft mass left (the drafter's support ran out) are skipped.

  Args:
    rule: acceptance rule; `position` is the child's depth (1-based).
    uniforms: f32[D * C + 1] in [0, 1) (`tree_uniforms`): entry
      (depth - 1) * C + s tests sibling s at that depth, the last one draws
      the next token.
    tree: the static tree.
    node_tokens: int32[N]; node_tokens[0] is the root's (committed) token.
    draft_probs: f32[N, V], the drafter distribution at each node (its
      children were sampled from it).
    target_probs: f32[N, V], the target distribution at each node; or a
      function node (int32[], traced) -> f32[V] that computes it, so only
      the nodes verification visits (at most D + 1) are processed (the
      decode loop passes one: logits processing with top-k is the costly
      part of a wide tree).
    sibling_probs: optional f32[N, V]: the law a node's later children were
      drawn from (without replacement, the first child's token removed); the
      first child was still drawn from draft_probs. Sibling s >= 1 is then
      tested against q'_s = sibling_probs with the first s siblings' tokens
      removed and renormalised. Default: draft_probs (every child from one law).
  Returns:
    (path int32[D+1]: accepted node ids starting with the root 0, -1 padded;
     num_accepted int32[]; next_token int32[]).
  """
  node_tokens = verify_inputs.tokens_array('node_tokens', node_tokens)
  _check_rank('node_tokens', node_tokens, 1, 'int [N]')
  _check_rank('draft_probs', draft_probs, 2, '[N, V]')
  num_nodes = tree.num_nodes
  if callable(target_probs):
    target_at = target_probs
    verify_inputs.target_vocab(target_at, draft_probs.shape[-1], 'verify_tree')
    rows = num_nodes
  else:
    _check_rank('target_probs', target_probs, 2, '[N, V]')
    check_probs('target_probs', target_probs, draft_probs.shape[-1])
    (target_probs,) = at_least_float32(target_probs)
    target_at = lambda node: target_probs[node]
    rows = target_probs.shape[0]
  if (node_tokens.shape[0], draft_probs.shape[0], rows) != (num_nodes,) * 3:
    raise ValueError(f'verify_tree: the tree has {num_nodes} nodes (root included) but got '
                     f'node_tokens {node_tokens.shape}, draft_probs {draft_probs.shape}, '
                     f'target_probs with {rows} rows.')
  check_probs('draft_probs', draft_probs)
  verify_inputs.check_token_range('node_tokens', node_tokens, draft_probs.shape[-1])
  if sibling_probs is not None:
    if jnp.shape(sibling_probs) != jnp.shape(draft_probs):
      raise ValueError(f'verify_tree: sibling_probs must have draft_probs\' shape '
                       f'{jnp.shape(draft_probs)}, got {jnp.shape(sibling_probs)}.')
    check_probs('sibling_probs', sibling_probs)
    (sibling_probs,) = at_least_float32(sibling_probs)

  if jnp.shape(uniforms) != (tree_uniforms(tree),):
    raise ValueError(f'verify_tree: uniforms must be [D * C + 1] = [{tree_uniforms(tree)}], '
                     f'got {jnp.shape(uniforms)}.')
  (draft_probs,) = at_least_float32(draft_probs)
  tail = tree.chain_tail
  return _walk_tree(rule, uniforms, jnp.asarray(tree.children), tree.max_depth, node_tokens,
                    draft_probs, target_at, tree.children_per_depth, sibling_probs,
                    tail=(tail, tree.parents[tail]))


def verify_dynamic_tree_with_uniforms(rule, uniforms, children, max_depth: int, node_tokens,
                                      target_at, draft_probs=None):
  """Multi-candidate verification of a tree whose shape is an input, for one row.

  EAGLE-2's dynamic trees (Li et al. 2024) pick each node's children as the
  drafter's top-k tokens: no draft is random, so each sibling's draft law is
  a point mass at its token (LANTERN's and EAGLE-2's `qx = 1`). Sibling s
  is tested with f = rule.accept_prob_at(one_hot(x_s), p, depth, x_s) (the
  lossless rule: accept with probability p(x_s)) and on rejection p <-
  rule.residual(one_hot(x_s), p, depth, x_s) (lossless: p with x_s removed
  and renormalised), so the emitted token has law p whatever the tree.

  With draft_probs f32[N, V] the children of node i were instead drawn
  without replacement from draft_probs[i] and are tested as EAGLE-1's
  siblings (`verify_tree_with_uniforms`); that stays exact when whether a
  node is in the tree never depends on its own token
  (`dynamic_tree`, drafts 'sampled').

  Args:
    rule: acceptance rule; `position` is the child's depth (1-based).
    uniforms: f32[max_depth * C + 1] in [0, 1): entry (depth - 1) * C + s
      tests sibling s at that depth, the last one draws the next token.
    children: int32[N, C] child node ids of each node in test order, -1
      padded (traced: the tree may differ per row).
    max_depth: D, the deepest node's depth (static).
    node_tokens: int32[N]; node 0 is the root (the pending token).
    target_at: node (int32[], traced) -> f32[V], the target at that node.
  Returns:
    (path int32[D+1], num_accepted int32[], next_token int32[]) as
    `verify_tree_with_uniforms`.
  """
  children = verify_inputs.tokens_array('children', children, 'node ids')
  node_tokens = verify_inputs.tokens_array('node_tokens', node_tokens)
  _check_rank('children', children, 2, 'int [N, C]')
  _check_rank('node_tokens', node_tokens, 1, 'int [N]')
  rows = {'node_tokens': node_tokens.shape[0]}
  if draft_probs is not None:
    _check_rank('draft_probs', draft_probs, 2, '[N, V]')
    rows['draft_probs'] = draft_probs.shape[0]
  if any(n != children.shape[0] for n in rows.values()):
    raise ValueError(f'verify_dynamic_tree: children has {children.shape[0]} rows (N nodes, '
                     f'root included) but got {rows} rows.')
  if draft_probs is not None:
    check_probs('draft_probs', draft_probs)
  vocab = verify_inputs.target_vocab(
      target_at, None if draft_probs is None else draft_probs.shape[-1], 'verify_dynamic_tree')
  verify_inputs.check_token_range('node_tokens', node_tokens, vocab)
  verify_inputs.check_children(children)
  expected = (max_depth * children.shape[1] + 1,)
  if jnp.shape(uniforms) != expected:
    raise ValueError(f'verify_dynamic_tree: uniforms must be [D * C + 1] = [{expected[0]}], '
                     f'got {jnp.shape(uniforms)}.')
  return _walk_tree(rule, uniforms, children, max_depth, node_tokens, draft_probs, target_at)


def _walk_tree(rule, uniforms, children, max_depth: int, node_tokens, draft_probs, target_at,
               children_per_depth=None, sibling_probs=None, tail=None):
  """The tree walk shared by static trees (siblings drawn without replacement
  from draft_probs [N, V], the later ones from sibling_probs [N, V] if given)
  and deterministic trees (draft_probs None: each sibling's law is a point
  mass at its token).

  children_per_depth: static (c_1, ..., c_D), siblings tested at depth d (a static
  tree's; tests beyond find no child and change nothing), default C each.
  tail: static (nodes int32[L], their parents int32[L]), a static tree's
  `chain_tail` (with draft_probs): its L deepest levels are tested at once
  (`_test_chain_tail`), which gives the same verdict and draws as walking them.
  """
  max_children = children.shape[1]
  if children_per_depth is None:
    children_per_depth = (max_children,) * max_depth
  tail_length = 0 if tail is None or draft_probs is None else len(tail[0])
  node = jnp.int32(0)
  target = target_at(jnp.int32(0))
  vocab = target.shape[-1]
  stopped = jnp.bool_(False)
  path = -jnp.ones((max_depth + 1,), jnp.int32).at[0].set(0)
  for depth in range(1, max_depth + 1 - tail_length):
    if draft_probs is not None:
      draft = draft_probs[node]
      later = draft if sibling_probs is None else sibling_probs[node]  # siblings 1, 2, ...
      removed = jnp.zeros_like(draft)  # mass of earlier siblings in `later`
    accepted_child = jnp.int32(-1)
    for sibling in range(children_per_depth[depth - 1]):
      child = children[node, sibling]
      token = node_tokens[jnp.maximum(child, 0)]
      if draft_probs is None:
        sibling_draft = jax.nn.one_hot(token, vocab, dtype=jnp.float32)
        has_mass = True
      else:
        law = draft if sibling == 0 else later
        remaining = 1.0 - jnp.sum(removed)
        sibling_draft = jnp.where(remaining > 0,
                                  (law - removed) / jnp.maximum(remaining, 1e-30), 0.0)
        sibling_draft = jnp.maximum(sibling_draft, 0.0)
        has_mass = sibling_draft[token] > 0
      live = (~stopped) & (accepted_child < 0) & (child >= 0) & has_mass
      accept_prob = rule.accept_prob_at(sibling_draft, target, depth, token)
      uniform = uniforms[(depth - 1) * max_children + sibling]
      accept = live & (uniform < accept_prob)
      reject = live & ~accept
      residual = rule.residual(sibling_draft, target, depth, token)
      target = jnp.where(reject, residual, target)
      accepted_child = jnp.where(accept, child, accepted_child)
      if draft_probs is not None:
        removed = jnp.where(live, removed.at[token].set(later[token]), removed)
    descend = (~stopped) & (accepted_child >= 0)
    node = jnp.where(descend, accepted_child, node)
    target = jnp.where(descend, target_at(jnp.maximum(accepted_child, 0)), target)
    path = path.at[depth].set(jnp.where(descend, accepted_child, -1))
    stopped = stopped | ~descend
  if tail_length:
    path, target = _test_chain_tail(rule, uniforms, max_children, tail, node_tokens,
                                    draft_probs, target_at, node, stopped, path, target)
  num_accepted = jnp.sum(path[1:] >= 0).astype(jnp.int32)
  return path, num_accepted, categorical.sample(uniforms[-1], target)


def _test_chain_tail(rule, uniforms, max_children: int, tail, node_tokens, draft_probs,
                     target_at, node, stopped, path, target):
  """The walk over a tree's chain tail, all L tests at once: the tail is reached
  when the walk stands on its first node's parent; then node j (depth first + j)
  passes if its token has mass under its parent's draft law (it is its parent's
  only child, sibling 0) and its uniform is below the rule's acceptance, and the
  walk accepts the passing prefix. At the first failing node the next token's law
  is the rule's residual (a rejection) or the parent's target law (a token of no
  draft mass is not tested); past the last node, the last node's target law.
  Returns (path int32[D+1], target f32[V]) as the node-by-node walk leaves them.
  """
  nodes, parents = (np.asarray(a, np.int32) for a in tail)
  length, first = len(nodes), path.shape[0] - len(nodes)
  depths = np.arange(first, first + length, dtype=np.int32)
  tokens = node_tokens[nodes]
  drafts = draft_probs[parents]  # [L, V]
  targets = jax.vmap(target_at)(jnp.asarray(parents))  # [L, V]
  has_mass = jnp.take_along_axis(drafts, tokens[:, None], axis=1)[:, 0] > 0
  accept_prob = jax.vmap(rule.accept_prob_at)(drafts, targets, jnp.asarray(depths), tokens)
  passed = has_mass & (uniforms[(depths - 1) * max_children] < accept_prob)
  reached = ~stopped & (node == parents[0])
  count = jnp.where(reached, jnp.sum(jnp.cumprod(passed.astype(jnp.int32))), 0)
  path = path.at[first:].set(jnp.where(jnp.arange(length) < count, nodes, -1))
  stop = jnp.minimum(count, length - 1)
  residual = rule.residual(drafts[stop], targets[stop], stop + first, tokens[stop])
  at_stop = jnp.where(has_mass[stop], residual, targets[stop])
  final = jnp.where(count == length, target_at(jnp.int32(nodes[-1])), at_stop)
  return path, jnp.where(reached, final, target)
