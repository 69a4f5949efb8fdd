"""Per-image decoding counters, carried through the decode loop.

Legend: B images, K draft slots per iteration (chain k, Jacobi W-1, tree depth).

A "verify step" is one loop iteration in which the image was still
unfinished: one target forward (plus its drafting). Tokens per target forward
(step compression) is the mean over verify steps of the tokens the step
committed (accepted drafts + 1, as LANTERN and EAGLE report it), counting
only tokens inside the image: an image's last step may accept drafts past
its last token, and those are not credited. Vanilla decoding gives exactly 1.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


@flax.struct.dataclass
class DecodeMetrics:
  """Counters per image (int32 arrays, leading dim B).

  Attributes:
    verify_steps: loop iterations in which the image was unfinished.
    target_forwards: target forwards including the prefill (verify_steps + 1).
    draft_forwards: drafter forwards including its prefill and catch-up.
    accepted_tokens: drafts accepted inside the image, summed over steps.
    committed_tokens: tokens committed inside the image by verify steps
      (accepted drafts + the next token), summed over steps: n - 1 for a
      finished image (its first token comes from the prefill).
    accepted_per_position: [B, K]; entry i counts steps in which draft
      position i+1 (tree: depth i+1) was accepted inside the image.
  """

  verify_steps: jax.Array
  target_forwards: jax.Array
  draft_forwards: jax.Array
  accepted_tokens: jax.Array
  committed_tokens: jax.Array
  accepted_per_position: jax.Array

  @classmethod
  def zeros(cls, num_images: int, draft_slots: int) -> 'DecodeMetrics':
    zeros = jnp.zeros((num_images,), jnp.int32)
    return cls(verify_steps=zeros, target_forwards=zeros + 1, draft_forwards=zeros,
               accepted_tokens=zeros, committed_tokens=zeros,
               accepted_per_position=jnp.zeros((num_images, max(draft_slots, 1)), jnp.int32))

  def record(self, active, num_accepted, committed, draft_forwards: int) -> 'DecodeMetrics':
    """Adds one iteration for rows with active[b] (bool[B]).

    num_accepted: int32[B] drafts the step accepted; committed: int32[B]
    tokens it committed inside the image (min(num_accepted + 1, tokens the
    image still needed); 0 for inactive rows).
    """
    step = active.astype(jnp.int32)
    accepted = jnp.minimum(num_accepted, committed) * step  # drafts inside the image
    slots = self.accepted_per_position.shape[1]
    accepted_at = (jnp.arange(slots)[None, :] < accepted[:, None]).astype(jnp.int32)
    return DecodeMetrics(
        verify_steps=self.verify_steps + step,
        target_forwards=self.target_forwards + step,
        draft_forwards=self.draft_forwards + step * draft_forwards,
        accepted_tokens=self.accepted_tokens + accepted,
        committed_tokens=self.committed_tokens + committed * step,
        accepted_per_position=self.accepted_per_position + accepted_at)

  def add_draft_forwards(self, count: int) -> 'DecodeMetrics':
    return self.replace(draft_forwards=self.draft_forwards + count)

  @property
  def tokens_per_target_forward(self) -> jax.Array:
    """Tokens committed inside the image per verify step, per image (float32[B])."""
    steps = jnp.maximum(self.verify_steps, 1).astype(jnp.float32)
    return self.committed_tokens.astype(jnp.float32) / steps

  def summary(self) -> dict:
    """Host-side means over images (plain floats), for logs and benchmarks."""
    host = jax.tree.map(np.asarray, self)
    steps = np.maximum(host.verify_steps, 1)
    return {
        'verify_steps': float(host.verify_steps.mean()),
        'target_forwards': float(host.target_forwards.mean()),
        'draft_forwards': float(host.draft_forwards.mean()),
        'tokens_per_target_forward': float((host.committed_tokens / steps).mean()),
        'acceptance_per_position': (host.accepted_per_position / steps[:, None]).mean(0).tolist(),
    }
