"""EAGLE-2 dynamic-tree drafting: a tree per image, grown by the drafter, one target forward.

Legend: B images, V vocabulary, N tree nodes (root included), L expansions,
k top-k per node, D = L + 1 tree depth (K = D draft slots).

The tree comes from `dynamic_tree.draft_dynamic_tree`; node and window
conventions are `mode_tree`'s (window index j is node j, node 0 the pending
token), except that the ancestor mask and depths of the verify forward are
per image (`Mode.layout` returns [B, N, N] and [B, N]).
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import checks
from specdec_jax import drafting
from specdec_jax import dynamic_tree
from specdec_jax import mode_base
from specdec_jax import mode_tree
from specdec_jax import rules as rules_lib
from specdec_jax import verify


@flax.struct.dataclass
class TreeDrafts(mode_base.Drafts):
  """`mode_base.Drafts` of a per-image tree.

  tokens: int32[B, N] node tokens (node 0 unused); probs: drafts 'sampled':
  f32[B, N, V] the law each node's children were drawn from; 'top_k':
  f32[B, N, 1] the drafter's probability of each node's path (its ranking
  score: the drafts are deterministic, so verification reads no draft law;
  the engine's non-finite check reads these). depths int32[B, N], ancestor_mask
  bool[B, N, N], children int32[B, N, k]: the tree (`dynamic_tree.DynamicTree`).
  """

  depths: jax.Array | None = None
  ancestor_mask: jax.Array | None = None
  children: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class DynamicTreeDraft(mode_tree.NodeWindowMode):
  """EAGLE-2 dynamic trees (Li et al., EMNLP 2024), one per image.

  Fields as EAGLE-2's (and LANTERN's `total_token=59, depth=4, top_k=10`):
    total_tokens: N, tokens per verify forward (the root and N - 1 drafts).
    depth: L, drafter expansions; the tree is up to L + 1 drafts deep.
    top_k: k, children proposed per expanded node and nodes expanded per level.
    drafter: 'eagle' or 'model', as in ChainDraft.
    drafts: 'top_k' (EAGLE-2: each node's children are the drafter's k most
      likely tokens, verified as point masses, qx = 1) or 'sampled' (drawn
      without replacement, ranked by rank value, verified as EAGLE-1
      siblings; `dynamic_tree` explains why that stays exact).

  Verification goes sibling by sibling (`verify.verify_dynamic_tree_with_uniforms`):
  lossless with the lossless rule; every tree rule applies with the drafts' law.
  """

  total_tokens: int = 59
  depth: int = 4
  top_k: int = 10
  drafter: str = drafting.EAGLE
  drafts: str = 'top_k'

  rule_mode = rules_lib.TREE

  @property
  def width(self) -> int:
    return self.total_tokens

  @property
  def slots(self) -> int:
    return self.depth + 1

  @property
  def draft_forwards(self) -> int:
    return 1 + self.depth  # the catch-up (the root's children), then one per expansion

  @property
  def verify_uniforms(self) -> int:
    return self.slots * self.top_k + 1

  @property
  def draft_uniforms(self) -> int:
    if self.drafts == 'sampled':  # one draw per candidate
      return dynamic_tree.num_candidates(self.top_k, self.depth)
    return 0  # the drafts are deterministic

  def check(self, *, target, draft, draft_params, cond, num_tokens: int) -> None:
    for name in ('total_tokens', 'depth', 'top_k'):
      checks.check_int_field(self, name)
    if self.drafts not in dynamic_tree.DRAFTS:
      raise ValueError(f'generate: DynamicTreeDraft.drafts must be one of {dynamic_tree.DRAFTS}, '
                       f'got {self.drafts!r}.')
    if self.depth < 1 or self.top_k < 1:
      raise ValueError(f'generate: DynamicTreeDraft.depth and top_k must be >= 1, got depth='
                       f'{self.depth}, top_k={self.top_k}.')
    if self.top_k > target.vocab_size:
      raise ValueError(f'generate: DynamicTreeDraft.top_k={self.top_k} exceeds the vocabulary '
                       f'({target.vocab_size}).')
    most = 1 + dynamic_tree.num_candidates(self.top_k, self.depth)
    if not 2 <= self.total_tokens <= most:
      raise ValueError(f'generate: DynamicTreeDraft.total_tokens must be in [2, {most}] (the root '
                       f'plus at most top_k + depth * top_k^2 candidates), got '
                       f'{self.total_tokens}.')
    super().check(target=target, draft=draft, draft_params=draft_params, cond=cond,
                  num_tokens=num_tokens)

  def draft_capacity(self, *, draft, cond, prefix: int, num_tokens: int) -> int:
    # Beyond the committed length: the catch-up over the accepted path (at most
    # min(depth + 1, total_tokens - 1) tokens and the next one), then depth
    # expansions of top_k slots each. The base holds 2 * width + 2 of them.
    base = super().draft_capacity(draft=draft, cond=cond, prefix=prefix, num_tokens=num_tokens)
    writes = self.depth * self.top_k + min(self.depth + 1, self.total_tokens - 1) + 2
    return base + max(0, writes - 2 * self.width - 2)

  def layout(self, drafts):
    return drafts.ancestor_mask, drafts.depths

  def draft(self, drafter, plan, draft_params, cache, root_logits, root_hidden, uniforms,
            first_index):
    tree, cache = dynamic_tree.draft_dynamic_tree(
        drafter, draft_params, cache, root_logits, root_hidden, num_nodes=self.total_tokens,
        expansions=self.depth, top_k=self.top_k, sampling=plan.sampling, cfg=plan.cfg,
        first_index=first_index, uniforms=uniforms if self.drafts == 'sampled' else None,
        mesh=plan.mesh)
    probs = jnp.exp(tree.scores)[..., None] if tree.probs is None else tree.probs
    drafts = TreeDrafts(tokens=tree.tokens, probs=probs, depths=tree.depths,
                        ancestor_mask=tree.ancestor_mask, children=tree.children)
    return drafts, cache

  def verify(self, plan, rule, uniforms, window, drafts, target_probs, cache, start):
    target_arrays, law = drafting.node_laws(plan.sampling, target_probs)

    def one_image(uniforms, children, tokens, draft_probs, *target):
      return verify.verify_dynamic_tree_with_uniforms(
          rule, uniforms, children, self.slots, tokens, lambda node: law(*target, node),
          draft_probs if self.drafts == 'sampled' else None)

    path, num_accepted, next_token = jax.vmap(one_image)(
        uniforms, drafts.children, window, drafts.probs, *target_arrays)
    # A path holds at most total_tokens nodes, and the cache has room for that many
    # slots past start: with depth + 2 > total_tokens the path's tail is padding, and
    # compacting it would write past the room (onto committed slots).
    cache = mode_tree.compact_path(cache, start, path[:, :self.total_tokens], plan.cfg)
    return mode_base.Verdict(path, num_accepted, next_token), cache
