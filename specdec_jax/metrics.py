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

import warnings

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
    nonfinite_target_steps: steps (the first token's, then each verify
      step) whose target probabilities held a NaN or inf: the image's tokens
      are then not samples of any law (`decode.generate` raises).
    nonfinite_draft_steps: verify steps whose draft probabilities held a NaN
      or inf. Such drafts are never accepted (`rule_base.reject_nonfinite`)
      and every residual falls back to the target, so the tokens keep the
      target's law, at one token per forward (`decode.generate` warns).
  """

  verify_steps: jax.Array
  target_forwards: jax.Array
  draft_forwards: jax.Array
  accepted_tokens: jax.Array
  committed_tokens: jax.Array
  accepted_per_position: jax.Array
  nonfinite_target_steps: jax.Array
  nonfinite_draft_steps: jax.Array

  @classmethod
  def zeros(cls, num_images: int, draft_slots: int) -> 'DecodeMetrics':
    zeros = jnp.zeros((num_images,), jnp.int32)
    return cls(verify_steps=zeros, target_forwards=zeros + 1, draft_forwards=zeros,
               accepted_tokens=zeros, committed_tokens=zeros,
               accepted_per_position=jnp.zeros((num_images, max(draft_slots, 1)), jnp.int32),
               nonfinite_target_steps=zeros, nonfinite_draft_steps=zeros)

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
    return self.replace(
        verify_steps=self.verify_steps + step,
        target_forwards=self.target_forwards + step,
        draft_forwards=self.draft_forwards + step * draft_forwards,
        accepted_tokens=self.accepted_tokens + accepted,
        committed_tokens=self.committed_tokens + committed * step,
        accepted_per_position=self.accepted_per_position + accepted_at)

  def record_nonfinite(self, active, target_probs, draft_probs=None) -> 'DecodeMetrics':
    """Counts a step for rows with active[b] (bool[B]) whose target probs [B, ..., V]
    or draft probs [B, ..., V] (None: no drafts) hold a NaN or inf.

    A mode that computes the target's distributions on demand passes its raw
    logits instead (an object with `.logits` [B, ...]): NaN or +inf there
    is what makes a distribution non-finite (-inf logits are masked tokens).
    """
    def broken(probs):
      if probs is None:
        return jnp.zeros(active.shape, jnp.int32)
      if hasattr(probs, 'logits'):
        bad = jnp.isnan(probs.logits) | (probs.logits == jnp.inf)
      elif not probs.size:
        return jnp.zeros(active.shape, jnp.int32)
      else:
        bad = ~jnp.isfinite(probs)
      finite = ~jnp.any(bad, axis=tuple(range(1, bad.ndim)))
      return (active & ~finite).astype(jnp.int32)

    return self.replace(
        nonfinite_target_steps=self.nonfinite_target_steps + broken(target_probs),
        nonfinite_draft_steps=self.nonfinite_draft_steps + broken(draft_probs))

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


class NonFiniteProbabilitiesError(FloatingPointError):
  """A decode sampled from target probabilities holding NaN or inf.

  Attributes:
    result: the decode's `DecodeResult`; the images named in the message hold
      tokens that follow no law, the others are sound.
    images: their indices, int[...].
  """

  def __init__(self, message: str, result=None, images=()):
    super().__init__(message)
    self.result = result
    self.images = np.asarray(images)


def _named(images: np.ndarray) -> str:
  """'3 image(s) [0, 4, 7]', the list cut after 10."""
  shown = images[:10].tolist()
  return f'{images.size} image(s) {shown}' + (' ...' if images.size > 10 else '')


def report_nonfinite(result):
  """`decode.generate`'s result, after raising `NonFiniteProbabilitiesError` if any
  image met non-finite target probabilities (`result.metrics`), or warning
  (RuntimeWarning) if only drafts did.

  Why raise for the target: its tokens are then argmaxes over NaN (token 0),
  not samples, and an image grid of them would pass into an evaluation
  unnoticed; the error carries the result for callers who keep the rest.
  Drafts are different: they are all rejected and the output keeps the
  target's law, so the result is returned, with a warning that the drafter
  is broken (and decoding as slow as plain sampling).
  """
  metrics = result.metrics
  (target_images, target_steps), (draft_images, draft_steps) = (
      _local_counts(x) for x in (metrics.nonfinite_target_steps, metrics.nonfinite_draft_steps))
  if target_steps.any():
    images = target_images[target_steps > 0]
    raise NonFiniteProbabilitiesError(
        f'generate: the target probabilities held NaN or inf for {_named(images)} (in '
        f'{int(target_steps.max())} step(s) at most), so their tokens are not samples. '
        'Check the target parameters, the conditioning and the sampling (e.g. an overflow '
        'in the logits); the error\'s .result holds the decode.', result, images)
  if draft_steps.any():
    images = draft_images[draft_steps > 0]
    warnings.warn(
        f'generate: the draft probabilities held NaN or inf for {_named(images)}; '
        'those drafts were all rejected (the tokens keep the target\'s law, at one token '
        'per forward). Check the drafter parameters.', RuntimeWarning, stacklevel=3)
  return result


def _local_counts(counts: jax.Array) -> tuple[np.ndarray, np.ndarray]:
  """(image indices, counts) of a per-image counter int32[B] that this process holds.

  In a multi-process run the metrics are global arrays whose other shards live
  on other hosts: each process checks (and reports) the images it decoded.
  """
  if getattr(counts, 'is_fully_addressable', True):
    values = np.asarray(jax.device_get(counts))
    return np.arange(values.shape[0]), values
  images, values = [], []
  for shard in counts.addressable_shards:
    rows = range(counts.shape[0])[shard.index[0]]
    images.append(np.asarray(rows))
    values.append(np.asarray(shard.data))
  images, values = np.concatenate(images), np.concatenate(values)
  unique = np.unique(images, return_index=True)[1]  # replicated shards: count once
  return images[unique], values[unique]
