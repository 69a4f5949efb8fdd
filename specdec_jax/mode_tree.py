"""EAGLE-1 static-tree drafting: one target forward over every node, tree verification.

Legend: B images, R cache rows, V vocabulary, N tree nodes, D tree depth
(K = D draft slots), S cache slots.

Node convention (kept inside this mode): node 0 is the root, i.e. the
pending token; the drafts are int32[B, N] node tokens whose node 0 is
unused, and the verify window is [pending, node tokens 1..N-1], so window
index j *is* node j. The verify forward writes node j at slot start + j; the
accepted path is gathered into consecutive slots before the lengths move.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specdec_jax import drafting
from specdec_jax import kv_cache as kv
from specdec_jax import mode_base
from specdec_jax import rules as rules_lib
from specdec_jax import verify

as_rows = drafting.as_rows


def compact_path(cache: kv.KVCache, start, path, cfg: bool) -> kv.KVCache:
  """Moves the accepted tree path's KV into consecutive slots.

  The verify forward wrote node j at slot start + j; the accepted path
  (node ids path[0] = 0, path[1..], -1 padded) must sit at start, start + 1,
  ... for the next forward. This gather of D + 1 slots per layer is the only
  KV copy in the engine (chains never copy); junk beyond the accepted length
  is hidden by the lengths set afterwards.

  Args:
    cache: R rows; start: int32[B] row lengths before the verify forward;
    path: int32[B, D+1].
  """
  slots = as_rows(start[:, None] + jnp.maximum(path, 0), cfg)  # [R, D+1]
  starts = as_rows(start, cfg)

  def move(buffer, slot_axis):  # one layer's keys or values, in the cache's layout
    picked = kv.read_slots(buffer, slots, slot_axis)  # [R, D+1, heads, hd]
    return kv.write_slots(buffer, picked, starts, slot_axis, cache.shared_length)

  return kv.map_buffers(move, cache)  # per-layer tuple or stacked (scanned models)


class NodeWindowMode(mode_base.DrafterMode):
  """What the drafted tree modes share (this module's node convention): the window
  is [pending, node tokens 1..N-1], and with top-k or top-p on, the target is
  processed only at the nodes verification visits."""

  def verify_window(self, pending, drafts):
    return jnp.concatenate([pending, drafts.tokens[:, 1:]], axis=1)  # node 0 -> pending

  def target_probs(self, plan, logits, token_index):
    # Verification reads the target at most at D + 1 of the N nodes. Without top-k
    # and top-p (static choices) a node's law is one softmax, and all N at once
    # take fewer kernels than D + 1 apart; with them, process the visited nodes only.
    if not plan.sampling.top_k and not plan.sampling.flags.nucleus:
      return drafting.guided_probs(plan.sampling, logits, token_index, plan.cfg)  # [B, N, V]
    return drafting.ImageLogits.from_rows(logits, token_index, plan.cfg)


@dataclasses.dataclass(frozen=True)
class TreeDraft(NodeWindowMode):
  """EAGLE-1 static tree drafting (`verify.StaticTree`), drafter as in ChainDraft."""

  tree: verify.StaticTree
  drafter: str = drafting.EAGLE

  rule_mode = rules_lib.TREE

  @property
  def width(self) -> int:
    return self.tree.num_nodes

  @property
  def slots(self) -> int:
    return self.tree.max_depth

  @property
  def draft_forwards(self) -> int:
    return self.tree.max_depth

  @property
  def verify_uniforms(self) -> int:
    return verify.tree_uniforms(self.tree)

  @property
  def draft_uniforms(self) -> int:
    return self.tree.num_nodes - 1  # one draw per drafted node

  def check(self, *, target, draft, draft_params, cond, num_tokens: int) -> None:
    if not isinstance(self.tree, verify.StaticTree):
      raise ValueError('generate: TreeDraft.tree must be a verify.StaticTree, e.g. '
                       'StaticTree.from_paths(((0,), (1,), (0, 0))).')
    super().check(target=target, draft=draft, draft_params=draft_params, cond=cond,
                  num_tokens=num_tokens)

  def layout(self, drafts):
    del drafts
    # Each node sees its ancestors; node j predicts image token num_generated + depth(j).
    return jnp.asarray(self.tree.ancestor_mask), jnp.asarray(self.tree.depths)

  def draft(self, drafter, plan, draft_params, cache, root_logits, root_hidden, uniforms,
            first_index):
    tokens, probs, cache = drafting.draft_tree(
        drafter, draft_params, cache, root_logits, root_hidden, tree=self.tree,
        sampling=plan.sampling, cfg=plan.cfg, uniforms=uniforms, first_index=first_index)
    return mode_base.Drafts(tokens=tokens, probs=probs), cache

  def verify(self, plan, rule, uniforms, window, drafts, target_probs, cache, start):
    target_arrays, law = drafting.node_laws(plan.sampling, target_probs)

    def one_image(uniforms, tokens, draft_probs, *target):
      return verify.verify_tree_with_uniforms(rule, uniforms, self.tree, tokens, draft_probs,
                                              lambda node: law(*target, node))

    path, num_accepted, next_token = jax.vmap(one_image)(
        uniforms, window, drafts.probs, *target_arrays)
    cache = compact_path(cache, start, path, plan.cfg)
    return mode_base.Verdict(path, num_accepted, next_token), cache
