"""SCD as released: a kept draft keeps the law it was first drawn from (a bench patch).

Speculative Coupled Decoding (So et al., arXiv 2510.24211) re-drafts every
window position after the accepted prefix by a maximal coupling with its
previous draft x ~ q_old: keep x with probability min(1, p_t(x) / q_old(x)),
else draw from Norm([p_t - q_old]_+). Either way the new draft is a draw from
p_t, so the next verification must test it against p_t, as
`jacobi_drafts.jacobi_next` records. The released maximal-coupling code (github
junhyukso/SCD, `lumina1/scheduler/jacobi_iteration_lumina_mgpt_SCDMC.py`,
`SpeculativeSampler.__call__`: on a kept draft it stores `draft_prob`, on a
redrawn one it keeps `advanced_prob`) records q_old for a kept draft instead.
That is not lossless: with q_old = (0.6, 0.3, 0.1) and the law unchanged,
p_t = p = (0.3, 0.3, 0.4), the coupling keeps token 0 with probability 0.5 and then
accepts it with min(1, 0.3 / 0.6) again, so token 0 comes out with
probability 0.6 x 0.5 x 0.5 = 0.15 instead of 0.3 (`biased_law_example`).

`released_recording()` patches `jacobi_drafts.jacobi_next` so that SCD records
q_old wherever the coupling kept the old draft; `bench/jacobi_acceptance.py
--released_scd` measures what that recording gains in tokens per forward,
and tests/test_decode.py checks that the engine's joint-law test rejects it.
"""

from __future__ import annotations

import contextlib

import jax.numpy as jnp
import numpy as np

from specdec_jax import decode
from specdec_jax import jacobi_drafts


def biased_law_example(q_old, p_t, p) -> np.ndarray:
  """Closed form: the law of the token committed at one position whose draft x ~ q_old
  was re-drafted once against p_t by the maximal coupling and then verified against p,
  when a kept draft records q_old (as released). Every argument is a [V] law."""
  q_old, p_t, p = (np.asarray(a, np.float64) for a in (q_old, p_t, p))

  def residual(a, b):
    mass = np.maximum(a - b, 0.0)
    return mass / mass.sum() if mass.sum() > 0 else mass

  law = np.zeros_like(p)
  for x in range(p.size):
    keep = min(1.0, p_t[x] / q_old[x]) if q_old[x] > 0 else 0.0
    accept = min(1.0, p[x] / q_old[x]) if q_old[x] > 0 else 0.0
    law[x] += q_old[x] * keep * accept
    law += q_old[x] * keep * (1.0 - accept) * residual(p, q_old)
    redrawn = residual(p_t, q_old)
    for y in np.flatnonzero(redrawn):
      accept_y = min(1.0, p[y] / p_t[y])
      law[y] += q_old[x] * (1.0 - keep) * redrawn[y] * accept_y
      law += q_old[x] * (1.0 - keep) * redrawn[y] * (1.0 - accept_y) * residual(p, p_t)
  return law


def _recording_old_law(jacobi_next):
  def patched(uniforms, target_probs, num_accepted, next_token, init, token_range=None, *,
              coupling='none', old_tokens=None, old_probs=None, **kwargs):
    tokens, probs = jacobi_next(uniforms, target_probs, num_accepted, next_token, init,
                                token_range, coupling=coupling, old_tokens=old_tokens,
                                old_probs=old_probs, **kwargs)
    if coupling != 'maximal':
      return tokens, probs
    # The old draft at the same token index, if any, as jacobi_next couples them.
    has_old, old_index = jacobi_drafts.old_draft_slots(num_accepted, target_probs.shape[1])
    old_at = jnp.take_along_axis(old_tokens, old_index, axis=1)
    # A redraw from Norm([p_t - q_old]_+) never equals x where the keep test could
    # fail (p_t(x) < q_old(x) leaves x no residual mass), so equal means kept.
    kept = has_old & (tokens == old_at)
    old_law = jnp.take_along_axis(old_probs, old_index[..., None], axis=1)
    return tokens, jnp.where(kept[..., None], old_law, probs)
  return patched


@contextlib.contextmanager
def released_recording():
  """Within the block, SCD (`decode.Jacobi` with coupling 'maximal') records a kept
  draft's old law as released. For SCD only: SJD-PAC's release (github
  KangJialiang/SJD-PAC) records the new law, as the library does, and its tree's
  laws are laid out differently. Compiled decodes are dropped on entry and exit
  so no program of the other recording is reused."""
  original = jacobi_drafts.jacobi_next
  jacobi_drafts.jacobi_next = _recording_old_law(original)
  decode.clear_compile_cache()
  try:
    yield
  finally:
    jacobi_drafts.jacobi_next = original
    decode.clear_compile_cache()
