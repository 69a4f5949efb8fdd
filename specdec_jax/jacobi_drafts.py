"""The Jacobi family's drafts: fresh drafts, SJD's window update, SCD's couplings.

Legend: B images, V vocabulary, W Jacobi window (1 pending token + W - 1
drafts per verify forward).

A Jacobi draft has no draft model: the target's own distributions at the
window, computed in one forward under a context that is partly stale, become
the next drafts, each with the law it was drawn from (SJD, Teng et al.
2025). Speculative Coupled Decoding (SCD, So et al., arXiv 2510.24211)
re-drafts a position so that it keeps its previous token as often as its law
allows, in one of two ways (`COUPLINGS`):

  'maximal'  keep the old draft x ~ q with probability min(1, t(x)/q(x)), else
             draw from Norm([t - q]_+) (`maximal_coupling`): the most any
             coupling of two steps can keep, 1 - TV(t, q);
  'gumbel'   every draft of image token n is argmax(log t + g_n) with the same
             Gumbel numbers g_n at every step (`gumbel_noise`,
             `gumbel_coupling`): a token changes only when its law's ranking
             under g_n does, whatever happened between the two steps.

Either way a re-drafted token is a draw from t, the law the next
verification tests it against.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_jax import categorical
from specdec_jax import resampling


# Fresh drafts: uniform over the image tokens, or the token to the left (`jacobi_fresh`).
INITS = ('random', 'spatial')


def jacobi_fresh(uniforms, num: int, vocab: int, init: str, left_token,
                 token_range: tuple[int, int] | None = None):
  """Fresh Jacobi drafts and their one-hot draft distributions.

  'random': token ids uniform over the model's image tokens `token_range`
  (start, stop), default the whole vocabulary (SJD's default init draws from
  the image-token ids only; `protocol.image_token_range` gives a model's);
  'spatial': every fresh draft repeats left_token, the token just before the
  fresh positions (the last kept draft, or the token just committed): SJD's
  'repeat_horizon'. SJD's LlamaGen script asks for it, but its LlamaGen path
  reads no image width and so keeps random drafts; it takes effect in its
  Lumina-mGPT path. The releases write it in two
  ways: SCD's Cosmos code repeats the last committed token; the Lumina-mGPT
  Jacobi code of SJD and SCD copies each fresh position's own left neighbour
  and keeps random drafts in a row's first column.
  A fresh draft is a point mass, so its draft distribution is one-hot and
  acceptance is t(x). uniforms: f32[B, num] ('random' draws one token each).
  Returns (int32[B, num], f32[B, num, V]).
  """
  if init not in INITS:
    raise ValueError(f'jacobi_fresh: init must be one of {INITS}, got {init!r}.')
  start, stop = (0, vocab) if token_range is None else token_range
  if not 0 <= start < stop <= vocab:
    raise ValueError(f'jacobi_fresh: token_range must be a non-empty range inside [0, {vocab}], '
                     f'got {token_range!r}.')
  if init == 'random':
    tokens = categorical.randint(uniforms[:, :num], start, stop)
  else:
    tokens = jnp.repeat(left_token[:, None], num, axis=1)
  tokens = tokens.astype(jnp.int32)
  return tokens, jax.nn.one_hot(tokens, vocab, dtype=jnp.float32)


COUPLINGS = ('none', 'maximal', 'gumbel')
# Uniforms of step 0 that seed an image's Gumbel numbers ('gumbel' coupling).
GUMBEL_SEED_UNIFORMS = 2


def maximal_coupling(keep_uniforms, draw_uniforms, old_tokens, old_probs, new_probs,
                     has_old=None):
  """Re-drafts each position by a maximal coupling of its old and new laws (SCD).

  The old draft x ~ q (old_probs) is kept with probability min(1, p(x)/q(x))
  (p = new_probs), else a token is drawn from Norm([p - q]_+). Whatever x's
  law q, the result is distributed exactly as p, and it equals x as often as
  any coupling can (1 - TV(p, q)): positions whose law barely moved keep
  their token, so the window stops churning (So et al., "Speculative Coupled
  Decoding", arXiv 2510.24211).

  Args:
    keep_uniforms, draw_uniforms: f32[...] in [0, 1).
    old_tokens: int32[...]; old_probs, new_probs: f32[..., V].
    has_old: optional bool[...]; where False there is no old draft and the
      position is a plain draw from new_probs (with draw_uniforms).
  Returns:
    int32[...], a draw from new_probs.
  """
  old_mass = jnp.take_along_axis(old_probs, old_tokens[..., None], axis=-1)[..., 0]
  new_mass = jnp.take_along_axis(new_probs, old_tokens[..., None], axis=-1)[..., 0]
  keep = keep_uniforms * old_mass < new_mass  # u < min(1, p/q) without a division
  law = resampling.standard_residual(old_probs, new_probs)
  if has_old is not None:
    keep = keep & has_old
    law = jnp.where(has_old[..., None], law, new_probs)
  return jnp.where(keep, old_tokens, categorical.sample(draw_uniforms, law)).astype(jnp.int32)


def gumbel_seeds(uniforms: jax.Array) -> jax.Array:
  """uint32[B, 2]: each image's Gumbel seed, the bits of its two uniforms f32[B, 2]
  (23 random mantissa bits each)."""
  return jax.lax.bitcast_convert_type(uniforms, jnp.uint32)


def gumbel_noise(seeds: jax.Array, token_index: jax.Array, vocab: int) -> jax.Array:
  """The Gumbel numbers of image tokens: f32[B, m, V] for token_index int32[B, m].

  Image b's token n gets the V numbers of the key seeds[b] folded with n:
  the same at every step of the decode, independent across n and images.
  They are made inside the loop (V per re-drafted position and step) because
  drawing them before it would take n x V numbers per image (Lumina-mGPT:
  2304 x 8192).
  """
  def per_image(seed, indices):
    key = jax.random.fold_in(jax.random.key(seed[0]), seed[1])
    return jax.vmap(lambda n: jax.random.gumbel(jax.random.fold_in(key, n), (vocab,)))(indices)
  return jax.vmap(per_image)(seeds, token_index)


def gumbel_coupling(noise: jax.Array, probs: jax.Array) -> jax.Array:
  """argmax(log probs + noise): int32[...] from Gumbel numbers noise f32[..., V] and
  probs f32[..., V], an exact draw from probs (the Gumbel-max trick; a token
  without mass is never chosen). With the same noise a token's draft changes only
  where the law's ranking under it changes (SCD's Gumbel coupling)."""
  log_probs = jnp.where(probs > 0, jnp.log(jnp.maximum(probs, 1e-38)), -jnp.inf)
  return jnp.argmax(log_probs + noise, axis=-1).astype(jnp.int32)


def jacobi_uniforms(window: int, coupling: str = 'none') -> int:
  """Uniforms `jacobi_next` uses per step: W draws, W - 1 fresh drafts, and with
  the maximal coupling W - 1 keep tests; the Gumbel coupling adds the
  GUMBEL_SEED_UNIFORMS its first step seeds the noise with (`gumbel_seeds`)."""
  extra = {'maximal': window - 1, 'gumbel': GUMBEL_SEED_UNIFORMS}.get(coupling, 0)
  return 2 * window - 1 + extra


def old_draft_slots(num_accepted: jax.Array, window: int) -> tuple[jax.Array, jax.Array]:
  """Where each next draft's image token had a draft in this step.

  After n = num_accepted[b] accepted drafts, next draft j is the token window
  entry s = n + 1 + j predicts; this step's draft s (window entry s + 1) held
  that token, if s <= W - 2.
  Returns (has_old bool[B, W-1], old_index int32[B, W-1] into this step's
  drafts, clipped where has_old is False).
  """
  source = num_accepted[:, None] + 1 + jnp.arange(window - 1)[None, :]  # [B, W-1]
  return source <= window - 2, jnp.minimum(source, window - 2)


def jacobi_next(uniforms, target_probs, num_accepted, next_token, init: str,
                token_range: tuple[int, int] | None = None, *, coupling: str = 'none',
                old_tokens=None, old_probs=None, noise=None):
  """SJD's window update (Teng et al. 2025, as released): the next drafts.

  Every window index i also draws y_i ~ t_i; after committing n accepted
  drafts and the next token, y_{n+1..W-1} (sampled from this forward, whose
  context beyond n is now stale) become the next drafts *with the
  distributions they were drawn from*; the window is refilled with fresh
  drafts.

  coupling 'maximal' (SCD): a carried position whose image token already had
  a draft (the old draft at the same token index, with the law it came from)
  re-drafts by `maximal_coupling` instead of an independent y_i ~ t_i: the
  same law t_i, so verification is unchanged, but the old token survives
  with probability 1 - TV(t_i, q_old). The last window index (no old draft)
  and fresh drafts are as without coupling. coupling 'gumbel' (SCD's other
  coupling) draws every carried position as argmax(log t_i + g) with its token's
  Gumbel numbers g (`gumbel_coupling`); fresh drafts are as without coupling.

  Args:
    uniforms: f32[B, jacobi_uniforms(W, coupling)]: W for the draws y_i, W - 1
      for fresh drafts, then with the maximal coupling W - 1 keep tests (the
      Gumbel coupling's seed uniforms are read by the mode's first step only);
    target_probs: f32[B, W, V]; num_accepted, next_token: int32[B].
    init, token_range: as `jacobi_fresh`.
    old_tokens int32[B, W-1], old_probs f32[B, W-1, V]: this step's drafts and
      their laws (needed with coupling 'maximal').
    noise: f32[B, W-1, V] the Gumbel numbers of the next drafts' image tokens
      (`gumbel_noise`; needed with coupling 'gumbel').
  Returns:
    (drafts int32[B, W-1], draft_probs f32[B, W-1, V]).
  """
  batch, window, vocab = target_probs.shape
  needed = {'maximal': ('old_tokens', 'old_probs'), 'gumbel': ('noise',)}.get(coupling, ())
  given = dict(old_tokens=old_tokens, old_probs=old_probs, noise=noise)
  missing = [name for name in needed if given[name] is None]
  if missing:
    raise ValueError(f'jacobi_next: coupling {coupling!r} needs {", ".join(missing)} '
                     f'(see the docstring); pass them, or coupling="none".')
  needed_uniforms = jacobi_uniforms(window, 'maximal' if coupling == 'maximal' else 'none')
  if jnp.shape(uniforms)[-1] < needed_uniforms:
    raise ValueError(f'jacobi_next: coupling {coupling!r} at W={window} reads '
                     f'{needed_uniforms} uniforms per row (jacobi_uniforms), got '
                     f'{jnp.shape(uniforms)[-1]}.')
  source = num_accepted[:, None] + 1 + jnp.arange(window - 1)[None, :]  # [B, W-1]
  carried = source <= window - 1
  clipped = jnp.minimum(source, window - 1)
  carried_probs = jnp.take_along_axis(target_probs, clipped[..., None], axis=1)
  draw_uniforms = jnp.take_along_axis(uniforms[:, :window], clipped, axis=1)
  if coupling == 'maximal':
    has_old, old_index = old_draft_slots(num_accepted, window)
    carried_tokens = maximal_coupling(
        jnp.take_along_axis(uniforms[:, 2 * window - 1:], old_index, axis=1), draw_uniforms,
        jnp.take_along_axis(old_tokens, old_index, axis=1),
        jnp.take_along_axis(old_probs, old_index[..., None], axis=1), carried_probs, has_old)
  elif coupling == 'gumbel':
    carried_tokens = gumbel_coupling(noise, carried_probs)
  elif coupling == 'none':
    carried_tokens = categorical.sample(draw_uniforms, carried_probs)
  else:
    raise ValueError(f'jacobi_next: coupling must be one of {COUPLINGS}, got {coupling!r}.')
  # The left neighbour of the first fresh draft: the last carried draft (the
  # draw at window entry W - 1, never coupled), else the next token.
  any_carried = num_accepted < window - 1
  last_carried = jnp.take_along_axis(carried_tokens, jnp.maximum(
      window - 2 - num_accepted, 0)[:, None], axis=1)[:, 0]
  left = jnp.where(any_carried, last_carried, next_token)
  fresh_tokens, fresh_probs = jacobi_fresh(uniforms[:, window:2 * window - 1], window - 1, vocab,
                                           init, left, token_range)
  del batch
  return (jnp.where(carried, carried_tokens, fresh_tokens),
          jnp.where(carried[..., None], carried_probs, fresh_probs))
