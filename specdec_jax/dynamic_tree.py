"""EAGLE-2 dynamic draft trees, grown per image inside the compiled loop.

Legend: B images, R drafter cache rows (B, or 2B with CFG), V vocabulary, E
hidden width, k top-k per node, L expansions (EAGLE-2's `depth`), N tree
nodes (root included: EAGLE-2's `total_token`), C = k + L * k^2 candidates.

EAGLE-2 (Li et al., "EAGLE-2: Faster Inference of Language Models with
Dynamic Draft Trees", EMNLP 2024), as LANTERN's released code runs it on
image models (`total_token=59, depth=4, top_k=10`):

  1. the root's k most likely draft tokens are the first candidates, scored
     by their draft log-probability;
  2. L times: the k best-scored candidates of the last level (the frontier)
     run through the drafter in one forward; each proposes its top-k
     children, scored by the cumulative log-probability of their path
     (parent score + log q(child)): k^2 new candidates;
  3. the N - 1 best-scored of all C candidates become the tree (ordered as
     they were generated, so parents precede children). A child never
     outscores its parent (log q <= 0), and top-k breaks ties by the
     lower index, so the chosen set is closed under taking parents.

Drafts 'top_k' (EAGLE-2): every draft is the deterministic function of its
context, so verification treats each sibling's draft law as a point mass
(`verify.verify_dynamic_tree_with_uniforms`) and the decode stays lossless
with the lossless rule. Under sampling (temperature 1) that accepts at most
p(children) per level, less than a sampled chain's 1 - TV(p, q).

Drafts 'sampled' (this library's variant): each expanded node's k children are
drawn without replacement from q, in draw order, and verified as EAGLE-1's
siblings (against q with the earlier siblings removed). For that law to hold
no node's inclusion may depend on its own token, so candidates are ranked
not by their token's log-probability but by the *rank value* parent value +
log q_(j), q_(j) the j-th largest probability of q (what EAGLE-2's score
would be had the j-th draw been the j-th most likely token). A node's rank
value depends only on its ancestors' tokens; the candidates ranked above it
are never its descendants (their values are at most its own, ties go to the
lower index), so whether a node is kept, expanded, or has a later sibling
never depends on its own token: the sibling tests stay exact.

Static shapes throughout: each image gets its own tree, the shapes (N, L, k)
are the same for all.

Each expansion runs only its k frontier nodes through the drafter: the
earlier frontiers' keys and values stay in the drafter's cache, level l's at
slots committed + l k .. committed + (l + 1) k - 1, and the frontier's
attention window reaches back over them with its ancestor rows
(`kv.attention_mask`), so sibling subtrees never see each other.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import categorical
from specdec_jax import drafting
from specdec_jax import kv_cache as kv
from specdec_jax import sharding

as_rows = drafting.as_rows

# The score of a token the processed draft distribution excludes (top-k, top-p):
# finite, so sums of scores never meet inf - inf, and far below any real log-probability.
EXCLUDED_LOG_PROB = -1e4


class DynamicTree(NamedTuple):
  """One tree per image.

  tokens: int32[B, N] node tokens (node 0, the root, is left 0).
  parents: int32[B, N] parent node ids (parents[:, 0] = -1).
  depths: int32[B, N] node depths (the root 0).
  ancestor_mask: bool[B, N, N], [b, i, j] = node j is i or an ancestor of i.
  children: int32[B, N, k] child ids in test order (best-scored first), -1 padded.
  scores: f32[B, N] each node's ranking score (root 0): the cumulative draft
    log-probability of its path ('top_k'), or its rank value ('sampled').
  probs: f32[B, N, V] the law each node's children were drawn from (an expanded
    node whose children were all cut by the node budget keeps its law; a node
    never expanded has the uniform law), or None ('top_k': no draft is random).
  """

  tokens: jax.Array
  parents: jax.Array
  depths: jax.Array
  ancestor_mask: jax.Array
  children: jax.Array
  scores: jax.Array
  probs: jax.Array | None = None


def log_probs(probs: jax.Array) -> jax.Array:
  """log q with excluded tokens at EXCLUDED_LOG_PROB; NaN stays NaN (a broken drafter
  is reported by the engine's non-finite check, never hidden)."""
  safe = jnp.where(probs > 0, probs, 1.0)
  return jnp.where(probs > 0, jnp.log(safe), jnp.where(jnp.isnan(probs), probs,
                                                       EXCLUDED_LOG_PROB))


def num_candidates(top_k: int, expansions: int) -> int:
  """C: the root's k candidates plus k^2 per expansion."""
  return top_k + expansions * top_k * top_k


DRAFTS = ('top_k', 'sampled')


def children_of(probs: jax.Array, top_k: int, uniforms=None,
                mesh=None) -> tuple[jax.Array, jax.Array]:
  """(scores, tokens) f32/int32[B, ..., k] of one expansion step from q = probs [B, ..., V].

  uniforms None ('top_k'): the k most likely tokens, scored log q(token).
  uniforms f32[B, ..., k] ('sampled'): k draws without replacement in draw order
  (`categorical.sample_distinct`), scored by rank, log q_(j).
  mesh: the decode's mesh or None (top-k on each device's own images:
  `sharding.top_k_per_image`).
  """
  top_scores, top_tokens = sharding.top_k_per_image(log_probs(probs), top_k, mesh)
  if uniforms is None:
    return top_scores, top_tokens
  return top_scores, categorical.sample_distinct(uniforms, probs)


def tree_from_candidates(scores, tokens, parents, depths, num_nodes: int, top_k: int,
                         max_depth: int, expanded_slot=None, expanded_probs=None,
                         mesh=None) -> DynamicTree:
  """Keeps the num_nodes - 1 best candidates as a tree (step 3 above), per image.

  Args:
    scores, tokens, parents, depths: [B, C] candidate scores, tokens, parent
      candidate ids (-1: the root) and depths (>= 1); a parent's id is below
      its children's and its score is at least theirs.
    num_nodes: N; top_k: the most children a node has; max_depth: the
      deepest candidate's depth.
    expanded_slot: optional int32[B, C], each candidate's index into
      expanded_probs f32[B, 1 + L k, V] (the root's law first) or -1 if it
      was not expanded ('sampled': the tree carries its draft laws).
    mesh: the decode's mesh or None (see `children_of`).
  Returns:
    the `DynamicTree`.
  """
  batch = scores.shape[0]
  _, chosen = sharding.top_k_per_image(scores, num_nodes - 1, mesh)
  chosen = jnp.sort(chosen, axis=-1)  # generation order: parents first
  take = lambda x: jnp.take_along_axis(x, chosen, axis=1)
  parent_candidate = take(parents)
  # Node i + 1 is chosen[i]; a parent candidate maps to its node id (0: the root).
  # 'compare_all': one [T, T] comparison instead of a nested binary-search loop.
  search = functools.partial(jnp.searchsorted, method='compare_all')
  parent_node = jax.vmap(search)(chosen, jnp.maximum(parent_candidate, 0)) + 1
  parent_node = jnp.where(parent_candidate < 0, 0, parent_node)
  node_parents = jnp.concatenate([jnp.full((batch, 1), -1, jnp.int32),
                                  parent_node.astype(jnp.int32)], axis=1)
  node_depths = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), take(depths)], axis=1)
  node_tokens = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), take(tokens)], axis=1)
  node_scores = jnp.concatenate([jnp.zeros((batch, 1), scores.dtype), take(scores)], axis=1)
  node_probs = None
  if expanded_probs is not None:
    slot = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), take(expanded_slot)], axis=1)
    vocab = expanded_probs.shape[-1]
    gathered = jnp.take_along_axis(expanded_probs, jnp.maximum(slot, 0)[..., None], axis=1)
    node_probs = jnp.where((slot >= 0)[..., None], gathered, 1.0 / vocab)
  return DynamicTree(node_tokens, node_parents, node_depths,
                     ancestor_mask(node_parents, max_depth),
                     children_table(node_parents, top_k), node_scores, node_probs)


def ancestor_mask(parents: jax.Array, max_depth: int) -> jax.Array:
  """bool[B, N, N] from parents int32[B, N]: each node sees itself and its ancestors.

  max_depth: an upper bound on the tree's depth (that many parent hops)."""
  num_nodes = parents.shape[1]
  eye = jnp.broadcast_to(jnp.eye(num_nodes, dtype=bool), parents.shape + (num_nodes,))
  has_parent = (parents >= 0)[..., None]
  mask = eye
  for _ in range(max_depth):
    mask = eye | (has_parent & jnp.take_along_axis(mask, jnp.maximum(parents, 0)[..., None],
                                                   axis=1))
  return mask


def children_table(parents: jax.Array, max_children: int) -> jax.Array:
  """int32[B, N, C] child ids of each node in node order, -1 padded, from parents [B, N]."""
  num_nodes = parents.shape[1]
  node = jnp.arange(num_nodes, dtype=jnp.int32)
  is_child = parents[:, None, :] == node[None, :, None]  # [B, parent, child]
  rank = jnp.cumsum(is_child, axis=-1) - 1  # sibling index of each child
  slot = jnp.arange(max_children, dtype=jnp.int32)
  match = is_child[:, :, None, :] & (rank[:, :, None, :] == slot[None, None, :, None])
  found = jnp.any(match, axis=-1)  # [B, N, C]
  return jnp.where(found, jnp.argmax(match, axis=-1), -1).astype(jnp.int32)


def draft_dynamic_tree(drafter: drafting.Drafter, params, cache: kv.KVCache, root_logits,
                       root_hidden, *, num_nodes: int, expansions: int, top_k: int, sampling,
                       cfg: bool, first_index, uniforms=None,
                       mesh=None) -> tuple[DynamicTree, kv.KVCache]:
  """Grows one EAGLE-2 tree per image from the drafter's root output.

  Args:
    drafter: the drafter; cache: its cache, lengths = committed slots.
    root_logits: [R, V] drafter logits at the root (for the depth-1 candidates).
    root_hidden: [R, E] the hidden state that produced them.
    num_nodes: N; expansions: L; top_k: k.
    sampling: the decode's logits processing (CFG, temperature, top-k, top-p):
      candidates are ranked by the processed draft distribution.
    first_index: int32[B] image-token index of the depth-1 nodes.
    uniforms: None (drafts 'top_k') or f32[B, C] (drafts 'sampled': the
      root's k draws, then k per expanded node, frontier by frontier).
    mesh: the decode's mesh or None (see `children_of`).
  Returns:
    (the `DynamicTree`, the cache with its lengths back at the committed
    slots); L drafter forwards.
  """
  batch = first_index.shape[0]
  committed = cache.lengths
  rows, width = root_hidden.shape[0], root_hidden.shape[-1]
  width_nodes = expansions * top_k  # drafted nodes (k per expansion), one drafter slot each
  root_probs = drafting.guided_probs(sampling, root_logits[:, None], first_index[:, None], cfg)
  sampled = uniforms is not None
  draws = lambda begin, shape: uniforms[:, begin:begin + int(np.prod(shape))].reshape(
      (batch,) + shape) if sampled else None
  level_scores, level_tokens = children_of(root_probs[:, 0], top_k, draws(0, (top_k,)), mesh)
  scores, tokens = [level_scores], [level_tokens]
  expanded_probs = [root_probs]  # [B, 1, V], then each frontier's [B, k, V]
  expanded_slot = jnp.full((batch, num_candidates(top_k, expansions)), -1, jnp.int32)
  parents = [jnp.full((batch, top_k), -1, jnp.int32)]
  depths = [jnp.ones((batch, top_k), jnp.int32)]
  # The frontier: candidate ids, scores, tokens, input features and ancestor rows.
  frontier_ids = jnp.broadcast_to(jnp.arange(top_k, dtype=jnp.int32), (batch, top_k))
  frontier_features = jnp.broadcast_to(root_hidden[:, None], (rows, top_k, width))
  frontier_parent_slot = None  # index among the drafted nodes (none at depth 1)
  # Row i: which drafted nodes (level-major, k per level) drafted node i sees.
  drafted_mask = jnp.zeros((batch, width_nodes, width_nodes), bool)
  offset = top_k  # candidate id of the next level's first candidate
  for level in range(expansions):
    # The frontier (depth level + 1) sees itself and its parent's ancestor row.
    begin, end = level * top_k, (level + 1) * top_k
    own = jax.nn.one_hot(jnp.arange(begin, end), width_nodes, dtype=bool)  # [k, M]
    if frontier_parent_slot is None:
      rows_mask = jnp.broadcast_to(own, (batch, top_k, width_nodes))
    else:
      rows_mask = own[None] | jnp.take_along_axis(drafted_mask,
                                                  frontier_parent_slot[..., None], axis=1)
    drafted_mask = drafted_mask.at[:, begin:end].set(rows_mask)
    # Written at slots committed + begin ..; the window reaches back over the
    # earlier levels (W = end); positions committed + level (depth offset level - begin).
    out = drafter.forward(
        params, kv.set_lengths(cache, committed + begin), as_rows(level_tokens, cfg),
        frontier_features, window_mask=as_rows(rows_mask[:, :, :end], cfg),
        depths=jnp.full((top_k,), level - begin, jnp.int32))
    cache = out.cache
    frontier_hidden = out.hidden  # [R, k, E]
    probs = drafting.guided_probs(sampling, out.logits,
                                  jnp.broadcast_to(first_index[:, None] + level + 1,
                                                   (batch, top_k)), cfg)  # [B, k, V]
    child_scores, child_tokens = children_of(probs, top_k,
                                             draws(offset, (top_k, top_k)), mesh)  # [B, k, k]
    child_scores = level_scores[:, :, None] + child_scores
    if sampled:  # the frontier's laws sit at expanded slots 1 + begin + f
      expanded_probs.append(probs)
      expanded_slot = expanded_slot.at[jnp.arange(batch)[:, None], frontier_ids].set(
          1 + begin + jnp.arange(top_k, dtype=jnp.int32))
    scores.append(child_scores.reshape(batch, -1))
    tokens.append(child_tokens.reshape(batch, -1))
    parents.append(jnp.repeat(frontier_ids, top_k, axis=1))
    depths.append(jnp.full((batch, top_k * top_k), level + 2, jnp.int32))
    # The next frontier: the k best of these k^2 children.
    level_scores, picked = sharding.top_k_per_image(child_scores.reshape(batch, -1), top_k, mesh)
    level_tokens = jnp.take_along_axis(child_tokens.reshape(batch, -1), picked, axis=1)
    frontier_ids = offset + picked
    frontier_parent_slot = begin + picked // top_k
    frontier_features = jnp.take_along_axis(frontier_hidden, as_rows(picked // top_k, cfg)[
        ..., None], axis=1)
    offset += top_k * top_k
  tree = tree_from_candidates(
      jnp.concatenate(scores, axis=1), jnp.concatenate(tokens, axis=1),
      jnp.concatenate(parents, axis=1), jnp.concatenate(depths, axis=1), num_nodes, top_k,
      expansions + 1, expanded_slot if sampled else None,
      jnp.concatenate(expanded_probs, axis=1) if sampled else None, mesh)
  return tree, kv.set_lengths(cache, committed)
