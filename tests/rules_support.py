"""Shared helpers for the acceptance-rule tests (test_rules*.py, test_verify*.py).
"""


import jax.numpy as jnp
import numpy as np

from specdec_jax import rules


ATOL = 2e-6


def dirichlet_pair(seed, vocab, concentration=0.3, draft_support=None):
  """Random (draft, target) distributions, sharp and different from each other."""
  rng = np.random.default_rng(seed)
  draft = rng.dirichlet(np.full(vocab, concentration))
  target = rng.dirichlet(np.full(vocab, concentration))
  if draft_support is not None:  # zero mass outside a top-k support
    keep = np.argsort(-draft)[:draft_support]
    draft = np.where(np.isin(np.arange(vocab), keep), draft, 0.0)
    draft /= draft.sum()
  return jnp.asarray(draft, jnp.float32), jnp.asarray(target, jnp.float32)


def line_neighbors(vocab, columns):
  """Neighbours on a 1-D latent line: token x's nearest are x-1, x+1, x-2, ..."""
  distance = np.abs(np.arange(vocab)[:, None] - np.arange(vocab)[None, :]) * 2.0
  distance = distance + (np.arange(vocab)[None, :] > np.arange(vocab)[:, None]) * 0.1
  np.fill_diagonal(distance, np.inf)
  return jnp.asarray(np.argsort(distance, axis=1, kind='stable')[:, :columns], jnp.int32)


def relaxed_rules(vocab):
  neighbors = line_neighbors(vocab, min(vocab - 1, 6))
  rng = np.random.default_rng(7)
  return {
      'uniform': rules.UniformRelaxed(omega=2.5),
      'coolsd': rules.CoolSD(delta=2.0, window=5),
      'lantern': rules.Lantern(neighbors=neighbors, k=4, delta=0.2),
      'lanternpp': rules.LanternPP(neighbors=neighbors, k=4, lam=3.0),
      'csd': rules.ContentAware(lam=0.3, tv_threshold=1.0),
      'gsd': rules.Grouped(below=2, above=2, prob_threshold=0.3, residual_mode='optimal',
                           embeddings=jnp.asarray(rng.normal(size=(vocab, 3)), jnp.float32),
                           dist_threshold=4.0),
  }


def published_residual_law(draft, target, zeroed, mode) -> np.ndarray:
  """LANTERN's published residual, float64[V]: Norm([t - d]_+) after zeroing the
  rejected token's neighbours `zeroed` in the draft ('published_llamagen') or in the
  target ('published_lumina'), as the released code does."""
  d, t = np.asarray(draft, np.float64).copy(), np.asarray(target, np.float64).copy()
  if mode == 'published_llamagen':
    d[zeroed] = 0
  else:
    t[zeroed] = 0
  return np.maximum(t - d, 0) / np.maximum(t - d, 0).sum()
