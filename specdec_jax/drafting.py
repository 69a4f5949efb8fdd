"""Drafting steps of the decode loop: drafter catch-up, chain and tree drafts.

(The Jacobi family's drafts, SJD's window update and SCD's couplings: `jacobi_drafts`.)

Legend: B images, R = B (no CFG) or 2B cache rows, V vocabulary, E hidden
width, k chain drafts, N tree nodes (node 0 = the root, the last committed
token), D tree depth, K1 catch-up width.

CFG row layout. Inside the engine an image's two rows are adjacent: row 2b
is image b's conditional row, 2b + 1 its unconditional row (`as_rows`,
`cfg_rows`, `image_rows`). With images split over the mesh's 'data' axis both
rows of an image then sit on one device, so combining them (`guided_probs`)
moves no logits between devices. The public convention of
`decode.generate(cond=...)` stays [cond; uncond] halves (what the models'
`cfg_cond` builds); `cfg_rows` converts it once, at the start of the decode.

Drafter bookkeeping. A drafter cache holds everything committed up to and
including the pending token (the last committed token, which the target has
not seen yet). After a verify step the newly committed tokens (accepted
drafts, then the resampled or bonus token) are fed in one "catch-up" forward
of static width K1 = K + 1 at the drafter's committed length; its head runs at
index `num_accepted` only: the first new draft's law. The rest of the window
is junk that the next write overwrites; the committed length moves by
`num_accepted + 1` (rollback = moving lengths, as for the target).

EAGLE drafters pair token t+1 with the target's hidden state at t (the
feature that predicted it): the catch-up feeds the target's hidden states
along the accepted path, later steps the drafter's own output hidden state.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import categorical
from specdec_jax import kv_cache as kv
from specdec_jax import protocol

EAGLE, MODEL = 'eagle', 'model'


def as_rows(x: jax.Array, cfg: bool) -> jax.Array:
  """Image-level [B, ...] -> cache rows [R, ...] (each image's entry twice under CFG)."""
  return jnp.repeat(x, 2, axis=0) if cfg else x


def image_rows(x: jax.Array, cfg: bool) -> jax.Array:
  """Cache rows [R, ...] -> the conditional rows [B, ...] (rows 0, 2, 4, ... under CFG)."""
  return x.reshape((x.shape[0] // 2, 2) + x.shape[1:])[:, 0] if cfg else x


def cfg_rows(cond, cfg: bool):
  """The public [cond; uncond] halves -> the engine's interleaved rows (a pytree,
  leading row axis): row 2b = cond[b], row 2b + 1 = cond[B + b]."""
  if not cfg:
    return cond

  def interleave(x):
    halves = x.reshape((2, x.shape[0] // 2) + x.shape[1:])
    return jnp.swapaxes(halves, 0, 1).reshape(x.shape)

  return jax.tree.map(interleave, cond)


class ImageLogits(NamedTuple):
  """A verify forward's raw logits regrouped by image, for distributions computed on demand.

  logits: [B, G, T, V], G = 2 (conditional, unconditional rows) with CFG, else 1.
  token_index: int32[B, T], the image-token index each window entry predicts.
  """

  logits: jax.Array
  token_index: jax.Array

  @classmethod
  def from_rows(cls, logits: jax.Array, token_index: jax.Array, cfg: bool) -> 'ImageLogits':
    groups = 2 if cfg else 1
    return cls(logits.reshape((logits.shape[0] // groups, groups) + logits.shape[1:]),
               token_index)


def probs_at(sampling, logits: jax.Array, token_index: jax.Array, entry) -> jax.Array:
  """One image's distribution at one window entry, f32[V], from its `ImageLogits`
  fields (logits [G, T, V], token_index int32[T]); entry may be traced."""
  rows = logits[:, entry]  # [G, V]
  uncond = rows[1] if rows.shape[0] == 2 else None
  return sampling.probs(rows[0], uncond, token_index=token_index[entry])


def node_laws(sampling, target_probs):
  """How a tree verification reads the target's law at a node, per image.

  target_probs: f32[B, N, V] (every node processed) or `ImageLogits` (on demand).
  Returns (arrays to vmap over the images, law(*one image's arrays, node) -> f32[V]).
  """
  if isinstance(target_probs, ImageLogits):
    return (target_probs.logits, target_probs.token_index), (
        lambda logits, token_index, node: probs_at(sampling, logits, token_index, node))
  return (target_probs,), lambda probs, node: probs[node]


def guided_probs(sampling, logits: jax.Array, token_index: jax.Array, cfg: bool) -> jax.Array:
  """Row logits [R, T, V] -> image distributions [B, T, V] (CFG, then processing).

  Args:
    sampling: a `specdec_jax.logits.Sampling`, the same for target and draft.
    logits: float32 raw logits of every cache row.
    token_index: int32[B, T], 0-based index of the predicted image token
      (decides the CFG interval).
    cfg: whether every image has a conditional and an unconditional row
      (rows 2b and 2b + 1, so the split below never crosses devices).
  """
  if not cfg:  # token_index still goes in: position-aware processors (Lumina layout) use it
    return sampling.probs(logits, token_index=token_index)
  pairs = logits.reshape((logits.shape[0] // 2, 2) + logits.shape[1:])  # [B, 2, T, V]
  return sampling.probs(pairs[:, 0], pairs[:, 1], token_index=token_index)


@dataclasses.dataclass(frozen=True)
class Drafter:
  """A draft model and how it is fed.

  kind 'model': any `DecodeModel`; its prefill runs the same conditioning.
  kind 'eagle': an EAGLE-style head (`models/eagle.py`) with
  `forward(params, cache, tokens, features, window_mask, depths)` and
  `prefill(params, cache, tokens, features)`; features are target hidden
  states [R, T, E]. If the head defines `prefix_pairs(cond, target_hidden)
  -> (tokens int32[R, Pd], features [R, Pd, E])` or None, the prefix pairs are
  prefilled first (LANTERN's t2i LlamaGen drafters: 119 condition features
  with token 0); without it, or with None, the head starts empty (Pd = 0, as
  LANTERN's class-conditional LlamaGen drafter: its first pair is the first
  image token with the class position's feature, fed by the catch-up).
  """

  model: Any
  kind: str

  def prefill(self, params, cache, cond, target_hidden) -> kv.KVCache:
    """The drafter cache after its prefix (lengths = Pd)."""
    if self.kind != EAGLE:
      return self.model.prefill(params, cache, cond).cache
    prefix_pairs = getattr(self.model, 'prefix_pairs', None)
    if prefix_pairs is None:
      return cache
    pairs = prefix_pairs(cond, target_hidden)
    if pairs is None:
      return cache
    return self.model.prefill(params, cache, *pairs).cache

  def forward(self, params, cache, tokens, features, window_mask=None, depths=None,
              logits_at=None):
    """logits_at int32[R]: logits [R, 1, V] there only (the head alone: `head_at_one_position`)."""
    args = (features,) if self.kind == EAGLE else ()
    if logits_at is not None and getattr(self.model, 'head_at_one_position', False):
      return self.model.forward(params, cache, tokens, *args, window_mask, depths,
                                logits_at=logits_at)
    out = self.model.forward(params, cache, tokens, *args, window_mask, depths)
    return out.replace(logits=protocol.at_positions(out.logits, logits_at))


def catch_up(drafter: Drafter, params, cache: kv.KVCache, committed_length, tokens,
             features, num_accepted, cfg: bool):
  """Feeds newly committed tokens to the drafter in one static-width forward.

  Args:
    committed_length: int32[B], drafter slots already committed.
    tokens: int32[B, K1]: accepted drafts, then the next token at index
      num_accepted (later entries are ignored).
    features: [R, K1, E] target hidden states along the accepted path
      (index 0 = the previously pending token), or None for kind 'model'.
    num_accepted: int32[B].
  Returns:
    (root_logits [R, V], root_hidden [R, E], cache): the drafter's output at
    the new pending token; cache lengths = committed_length + num_accepted + 1.
  """
  cache = kv.set_lengths(cache, as_rows(committed_length, cfg))
  take = as_rows(num_accepted, cfg)
  out = drafter.forward(params, cache, as_rows(tokens, cfg), features, logits_at=take)
  root_logits = out.logits[:, 0]
  root_hidden = protocol.at_positions(out.hidden, take)[:, 0]
  cache = kv.set_lengths(out.cache, as_rows(committed_length + num_accepted + 1, cfg))
  return root_logits, root_hidden, cache


def draft_chain(drafter: Drafter, params, cache: kv.KVCache, root_logits, root_hidden, *,
                num_drafts: int, sampling, cfg: bool, uniforms, first_index):
  """Drafts k tokens autoregressively from the drafter's root output.

  Args:
    root_logits: [R, V] drafter logits for the first draft.
    root_hidden: [R, E] the hidden state that produced them.
    uniforms: f32[B, k], one per draft (`categorical.sample`).
    first_index: int32[B] image-token index of the first draft.
  Returns:
    (draft_tokens int32[B, k], draft_probs f32[B, k, V], cache): k - 1
    drafter forwards; the caller resets the cache lengths.
  """
  logits, hidden = root_logits[:, None], root_hidden[:, None]  # [R, 1, V], [R, 1, E]
  tokens, probs = [], []
  for index in range(num_drafts):
    if index:
      out = drafter.forward(params, cache, as_rows(tokens[-1][:, None], cfg), hidden)
      logits, hidden, cache = out.logits, out.hidden, out.cache
    step_probs = guided_probs(sampling, logits, (first_index + index)[:, None], cfg)[:, 0]
    tokens.append(categorical.sample(uniforms[:, index], step_probs))
    probs.append(step_probs)
  return jnp.stack(tokens, axis=1), jnp.stack(probs, axis=1), cache


def draft_tree(drafter: Drafter, params, cache: kv.KVCache, root_logits, root_hidden, *,
               tree, sampling, cfg: bool, uniforms, first_index):
  """Drafts a static tree level by level (siblings without replacement).

  uniforms: f32[B, N - 1]; node j >= 1 is drawn with uniforms[:, j - 1]
  (`categorical.sample_distinct` over each node's children).

  Level l's forward runs the nodes of depth l - 1 only, up to the last one
  with children (the level's trailing leaves need no drafter output): node
  j's keys and values go to the drafter's cache slot committed + j - 1 (nodes
  are ordered by depth), and the forward's attention window reaches back
  over the earlier levels' slots with the tree's ancestor rows
  (`kv.attention_mask`), so each node sees exactly its own ancestors.

  Returns:
    (node_tokens int32[B, N] (node 0 left as 0 for the caller), node_probs
    f32[B, N, V] drafter distribution at each node (uniform at leaves not
    run, which verification never reads), cache); D - 1 drafter forwards.
  """
  depths, parents = tree.depths, tree.parents
  children, ancestor = tree.children, tree.ancestor_mask
  num_nodes, vocab = tree.num_nodes, root_logits.shape[-1]
  num_images = first_index.shape[0]
  committed = cache.lengths
  node_tokens = jnp.zeros((num_images, num_nodes), jnp.int32)
  node_probs = jnp.full((num_images, num_nodes, vocab), 1.0 / vocab, jnp.float32)
  node_hidden = jnp.zeros((root_hidden.shape[0], num_nodes, root_hidden.shape[-1]),
                          root_hidden.dtype).at[:, 0].set(root_hidden)
  level_logits, level_nodes = root_logits[:, None], np.array([0])
  for depth in range(1, tree.max_depth + 1):
    if depth > 1:  # the nodes of depth - 1 up to its last parent, at slots committed + id - 1
      level_nodes = np.nonzero(depths == depth - 1)[0]
      level_nodes = level_nodes[:np.nonzero((children[level_nodes] >= 0).any(axis=1))[0][-1] + 1]
      first, last = level_nodes[0], level_nodes[-1]
      out = drafter.forward(
          params, kv.set_lengths(cache, committed + first - 1),
          as_rows(node_tokens[:, level_nodes], cfg), node_hidden[:, parents[level_nodes]],
          window_mask=jnp.asarray(ancestor[level_nodes][:, 1:last + 1]),
          depths=jnp.full((level_nodes.size,), depth - 1 - first, jnp.int32))
      cache = out.cache
      node_hidden = node_hidden.at[:, level_nodes].set(out.hidden)
      level_logits = out.logits
    token_index = first_index[:, None] + depth - 1
    level_probs = guided_probs(sampling, level_logits, token_index, cfg)  # [B, n, V]
    node_probs = node_probs.at[:, level_nodes].set(level_probs)
    node_tokens = _draw_children(node_tokens, level_probs, children[level_nodes], uniforms)
  return node_tokens, node_probs, kv.set_lengths(cache, committed)


def _draw_children(node_tokens, level_probs, level_children: np.ndarray, uniforms):
  """Draws the children of one tree level in one `categorical.sample_distinct` call.

  level_probs f32[B, n, V] the laws of the level's n nodes; level_children
  int32[n, C] their child ids (-1 padded; static); uniforms f32[B, N - 1]
  (child j uses uniforms[:, j - 1]). Every node draws as many tokens as the
  level's most prolific node (padding draws use uniform 0 and are dropped): a
  node's first c draws without replacement have the law of c draws, and
  use the same uniforms as drawing them alone. Returns node_tokens with the
  children set.
  """
  has_kids = np.nonzero((level_children >= 0).any(axis=1))[0]
  if not has_kids.size:
    return node_tokens
  kids = level_children[has_kids]
  kids = kids[:, :(kids >= 0).sum(axis=1).max()]  # [m, c]
  draws = jnp.where(kids >= 0, uniforms[:, np.maximum(kids, 1) - 1], 0.0)  # [B, m, c]
  picks = categorical.sample_distinct(draws, level_probs[:, has_kids])  # [B, m, c]
  rows, cols = np.nonzero(kids >= 0)
  return node_tokens.at[:, kids[rows, cols]].set(picks[:, rows, cols])
