"""Per-image decoding counters, carried through the decode loop.

Legend: B images, K draft slots per iteration (chain k, Jacobi W-1, tree depth).

A "verify step" is one loop iteration in which the image was still
unfinished: one target forward (plus its drafting). Tokens per target forward
(step compression) is the mean over verify steps of the tokens the step
committed (accepted drafts + 1, as LANTERN and EAGLE report it), counting
only tokens inside the image: an image's last step may accept drafts past
its last token, and those are not credited. Vanilla decoding gives exactly 1
(for images of two tokens or more: a one-token image has no verify step, its
token comes from the prefill, and the ratio reads 0).
"""

from __future__ import annotations

import warnings

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


# The per-image counters, in their column order in `DecodeMetrics.counts`;
# `accepted_per_position`'s K columns follow them.
COUNTERS = ('verify_steps', 'target_forwards', 'draft_forwards', 'accepted_tokens',
            'committed_tokens', 'nonfinite_target_steps', 'nonfinite_draft_steps')


def _counter(name: str):
  column = COUNTERS.index(name)
  return property(lambda self: self.counts[:, column],
                  doc=f'int32[B]: column {column} of `counts` (see the class docstring).')


@flax.struct.dataclass
class DecodeMetrics:
  """Counters per image, packed in one array so that the decode loop updates
  them all with one kernel per iteration (not one per counter).

  Attributes:
    counts: int32[B, len(COUNTERS) + K], the counters below by column (read
      them by name).
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

  counts: jax.Array

  verify_steps = _counter('verify_steps')
  target_forwards = _counter('target_forwards')
  draft_forwards = _counter('draft_forwards')
  accepted_tokens = _counter('accepted_tokens')
  committed_tokens = _counter('committed_tokens')
  nonfinite_target_steps = _counter('nonfinite_target_steps')
  nonfinite_draft_steps = _counter('nonfinite_draft_steps')

  @property
  def accepted_per_position(self) -> jax.Array:
    return self.counts[:, len(COUNTERS):]

  def by_name(self) -> dict:
    """{name: counter} for every name of COUNTERS (int32[B]) and
    accepted_per_position ([B, K])."""
    named = {name: getattr(self, name) for name in COUNTERS}
    named['accepted_per_position'] = self.accepted_per_position
    return named

  def __repr__(self) -> str:
    """The counters by name (long batches summarised), not the packed array."""
    if isinstance(self.counts, jax.core.Tracer) or not hasattr(self.counts, 'shape'):
      return f'DecodeMetrics(counts={self.counts!r})'
    text = lambda value: np.array2string(np.asarray(value), separator=', ',
                                         threshold=16).replace('\n', '')
    return 'DecodeMetrics(\n' + ''.join(f'  {name}={text(value)},\n'
                                        for name, value in self.by_name().items()) + ')'

  @classmethod
  def zeros(cls, num_images: int, draft_slots: int) -> 'DecodeMetrics':
    """Zero counters, but target_forwards = 1 (the prefill)."""
    counts = jnp.zeros((num_images, len(COUNTERS) + max(draft_slots, 1)), jnp.int32)
    return cls(counts=counts).added(target_forwards=1)

  def added(self, **increments) -> 'DecodeMetrics':
    """The counters plus named increments, in one update: int32[B] (or a scalar)
    for a name of COUNTERS, [B, K] for accepted_per_position."""
    num_images, width = self.counts.shape
    unknown = set(increments) - set(COUNTERS) - {'accepted_per_position'}
    if unknown:
      raise ValueError(f'DecodeMetrics.added: unknown counters {sorted(unknown)}; '
                       f'known: {list(COUNTERS)} and accepted_per_position.')
    columns = [jnp.broadcast_to(jnp.asarray(increments.get(name, 0), jnp.int32),
                                (num_images,))[:, None] for name in COUNTERS]
    columns.append(jnp.broadcast_to(
        jnp.asarray(increments.get('accepted_per_position', 0), jnp.int32),
        (num_images, width - len(COUNTERS))))
    return self.replace(counts=self.counts + jnp.concatenate(columns, axis=1))

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
    return self.added(verify_steps=step, target_forwards=step,
                      draft_forwards=step * draft_forwards, accepted_tokens=accepted,
                      committed_tokens=committed * step, accepted_per_position=accepted_at)

  def record_nonfinite(self, active, target_probs, draft_probs=None,
                       committed=None) -> 'DecodeMetrics':
    """Counts a step for rows with active[b] (bool[B]) whose target probs [B, ..., V]
    ([B, T, V] with `committed`) or draft probs [B, ..., V] (None: not checked) hold
    a NaN or inf.

    A mode that computes the target's distributions on demand passes its raw
    logits instead (an object with `.logits` [B, G, T, V]): NaN or +inf there
    is what makes a distribution non-finite (-inf logits are masked tokens).
    committed: (path, emitted) of the step (`used_entries`): only the target
    laws that gave its tokens in the image are checked; the others decide
    nothing (those after a rejected draft, or past the image's end), so a NaN
    there does not make the tokens wrong.
    """
    def broken(probs):
      if probs is None:
        return jnp.zeros(active.shape, jnp.int32)
      if hasattr(probs, 'logits'):
        bad = jnp.isnan(probs.logits) | (probs.logits == jnp.inf)  # [B, G, T, V]
        if committed is not None:
          bad = bad & used_entries(committed, bad.shape[2])[:, None, :, None]
      elif not probs.size:
        return jnp.zeros(active.shape, jnp.int32)
      else:
        bad = ~jnp.isfinite(probs)  # [B, T, V]
        if committed is not None:
          bad = bad & used_entries(committed, bad.shape[1])[:, :, None]
      finite = ~jnp.any(bad, axis=tuple(range(1, bad.ndim)))
      return (active & ~finite).astype(jnp.int32)

    return self.added(nonfinite_target_steps=broken(target_probs),
                      nonfinite_draft_steps=broken(draft_probs))

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


def used_entries(committed, width: int) -> jax.Array:
  """bool[B, T]: the verify-window entries whose laws gave a step's tokens in the image.

  committed: (path int32[B, K+1], the window indices of the step's committed
  tokens, -1 padded; emitted int32[B], how many of them are inside the image).
  The law at path[j] drew (or accepted) committed token j + 1 of the step, so
  entries path[0 .. emitted - 1] are the ones used.
  """
  path, emitted = committed
  inside = jnp.arange(path.shape[1])[None] < emitted[:, None]  # [B, K+1]
  on_path = path[:, :, None] == jnp.arange(width)[None, None]  # [B, K+1, T]
  return jnp.any(on_path & inside[:, :, None], axis=1)


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
  images, counts = _local_counts(result.metrics.counts)  # this process's images
  target_steps = counts[:, COUNTERS.index('nonfinite_target_steps')]
  draft_steps = counts[:, COUNTERS.index('nonfinite_draft_steps')]
  if target_steps.any():
    broken = images[target_steps > 0]
    raise NonFiniteProbabilitiesError(
        f'generate: the target probabilities held NaN or inf for {_named(broken)} (in '
        f'{int(target_steps.max())} step(s) at most), so their tokens are not samples. '
        'Check the target parameters, the conditioning and the sampling (e.g. an overflow '
        'in the logits); the error\'s .result holds the decode.', result, broken)
  if draft_steps.any():
    broken = images[draft_steps > 0]
    warnings.warn(
        f'generate: the draft probabilities held NaN or inf for {_named(broken)}; '
        'those drafts were all rejected (the tokens keep the target\'s law, at one token '
        'per forward). Check the drafter parameters.', RuntimeWarning, stacklevel=3)
  return result


def _local_counts(counts: jax.Array) -> tuple[np.ndarray, np.ndarray]:
  """(image indices int[b], their rows of counts [b, ...]) of the images (the
  leading dim of counts int32[B, ...]) that this process holds.

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
