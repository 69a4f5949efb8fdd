"""Shared toy models and helpers for the decode tests (test_decode*.py).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decode
from specdec_jax import drafting
from specdec_jax import logits
from specdec_jax import rules
from specdec_jax import testing
from specdec_jax import verify
from specdec_jax.app import toy
from specdec_jax.models import tiny


VOCAB, CLASSES, NUM_TOKENS = 4, 2, 3
NUM_SAMPLES = 2 ** 14
P_THRESHOLD = 1e-4
TREE = verify.StaticTree.from_paths(((0,), (1,), (0, 0), (0, 1), (1, 0)))
FAST = decode.FAST_COMPILE

TARGET = toy.MarkovToy(VOCAB, CLASSES)
DRAFT = toy.MarkovToy(VOCAB, CLASSES)
EAGLE = toy.ToyEagle(VOCAB, CLASSES)


def _params():
  return (TARGET.init_params(jax.random.key(0)), DRAFT.init_params(jax.random.key(1)),
          EAGLE.init_params(jax.random.key(2)))


def eagle_roots(target, target_params, eagle, params, cond, pending, cfg: bool = False):
  """The first drafting step's start as the decode makes it: the target's prefill of
  cond (rows), the EAGLE head's prefill on its features, and the catch-up over each
  image's pending token int32[B]. Returns (drafter, cache, root_logits, root_hidden)."""
  drafter = drafting.Drafter(eagle, drafting.EAGLE)
  rows = cond.shape[0]
  prefix = target.prefill(target_params, target.init_cache(rows, 8), cond)
  cache = drafter.prefill(params, eagle.init_cache(rows, 32), cond, prefix.hidden)
  root_logits, root_hidden, cache = drafting.catch_up(
      drafter, params, cache, drafting.image_rows(cache.lengths, cfg), pending[:, None],
      prefix.hidden[:, -1:], jnp.zeros(pending.shape, jnp.int32), cfg=cfg)
  return drafter, cache, root_logits, root_hidden


def chain_law(eagle, params, cache, root_hidden, sampling, path_tokens):
  """The EAGLE head's processed law after path_tokens int32[B, d] run as a plain
  chain from the root (no CFG): what a tree node at the path's end must carry."""
  run_cache, hidden = cache, root_hidden[:, None]
  for step in range(path_tokens.shape[1]):
    out = eagle.forward(params, run_cache, path_tokens[:, step:step + 1], hidden)
    run_cache, hidden = out.cache, out.hidden
  return sampling.probs(out.logits[:, 0])


def _cond(num_images: int, sampling: logits.Sampling, class_id: int = 0):
  ids = jnp.full((num_images,), class_id, jnp.int32)
  return tiny.cfg_class_rows(ids, CLASSES) if sampling.uses_cfg else ids


def _chi_square_pvalue(tokens: np.ndarray, law: np.ndarray, vocab: int = VOCAB) -> float:
  """Pearson chi-square (`specdec_jax.testing`) of sequences [N, n] over `vocab` tokens
  against a law over vocab**n sequences; a zero-probability sequence gives p = 0."""
  counts = testing.histogram(testing.sequence_index(tokens, vocab), law.size)
  return testing.chi_square_pvalue(counts, law)[0]


def assert_joint_law(test, result, mode, sampling) -> None:
  """The whole-loop exactness check: result.tokens [NUM_SAMPLES, NUM_TOKENS] follow the
  target's exact joint law (chi-square p > P_THRESHOLD) and, for a speculative mode,
  some steps accepted drafts (tokens per target forward > 1.05)."""
  tokens = np.asarray(result.tokens)
  chex.assert_shape(tokens, (NUM_SAMPLES, NUM_TOKENS))
  law = TARGET.joint_law(_params()[0], 0, NUM_TOKENS, sampling)
  p_value = _chi_square_pvalue(tokens, law)
  test.assertGreater(p_value, P_THRESHOLD, f'{mode}: p = {p_value:.3g}')
  if not isinstance(mode, decode.Vanilla):
    test.assertGreater(float(result.metrics.summary()['tokens_per_target_forward']), 1.05)


def _run(mode, sampling, *, num_images=NUM_SAMPLES, seed=7, rule=rules.Lossless(),
         compiler_options=FAST, num_tokens=NUM_TOKENS, **kwargs):
  target_params, draft_params, eagle_params = _params()
  draft, params = None, None
  if isinstance(mode, (decode.ChainDraft, decode.TreeDraft)):
    draft, params = ((EAGLE, eagle_params) if mode.drafter == 'eagle'
                     else (DRAFT, draft_params))
  return decode.generate(
      TARGET, target_params, _cond(num_images, sampling), num_tokens=num_tokens,
      key=jax.random.key(seed), mode=mode, sampling=sampling, rule=rule, draft=draft,
      draft_params=params, compiler_options=compiler_options, **kwargs)
