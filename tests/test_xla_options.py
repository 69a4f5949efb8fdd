"""decode.FAST_COMPILE changes compile time, never the laws a decode samples from."""

from absl.testing import absltest
import jax
import numpy as np

from specdec_jax import decode
from specdec_jax import drafting
from specdec_jax import logits


def nucleus_sizes(row_logits: np.ndarray, cfg_scale: float, temperature: float, top_k: int,
                  top_p: float) -> np.ndarray:
  """int[B, T]: tokens left by CFG, temperature, top-k then top-p (LlamaGen's order and
  stable sort), in float64, for rows [cond; uncond] pairs [2B, T, V]."""
  pairs = row_logits.reshape(-1, 2, *row_logits.shape[1:]).astype(np.float64)
  z = (pairs[:, 1] + cfg_scale * (pairs[:, 0] - pairs[:, 1])) / temperature
  sizes = np.zeros(z.shape[:-1], int)
  for index in np.ndindex(z.shape[:-1]):
    row = z[index]
    order = np.argsort(-row, kind='stable')
    kept_k = row >= row[order[top_k - 1]]
    probs = np.where(kept_k, np.exp(row - row.max()), 0.0)
    cumulative = np.cumsum(probs[order] / probs.sum())
    sizes[index] = min(1 + np.sum(cumulative[:-1] <= top_p), kept_k.sum())
  return sizes


class FastCompileTest(absltest.TestCase):

  def test_top_k_and_top_p_keep_the_same_tokens(self):
    """At xla_backend_optimization_level 0 (FAST_COMPILE before) about 10 of these
    2,400 rows lost a token (9 or 10 on the hosts tried)."""
    sampling = logits.Sampling(cfg_scale=3.0, temperature=0.9, top_k=12, top_p=0.8)
    probs = jax.jit(lambda x, t, s: drafting.guided_probs(s, x, t, True))
    shape, token_index = (4, 4, 64), np.zeros((2, 4), np.int32)  # B 2 with CFG, T 4, V 64
    compiled = probs.lower(np.zeros(shape, np.float32), token_index, sampling).compile(
        compiler_options=decode.FAST_COMPILE)
    rng, wrong = np.random.default_rng(0), 0
    for _ in range(300):
      row_logits = rng.normal(size=shape).astype(np.float32)
      support = (np.asarray(compiled(row_logits, token_index, sampling)) > 0).sum(-1)
      wrong += int(np.sum(support != nucleus_sizes(row_logits, 3.0, 0.9, 12, 0.8)))
    self.assertEqual(wrong, 0)


if __name__ == '__main__':
  absltest.main()
