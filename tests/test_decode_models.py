"""Decode with image-token ranges (Jacobi) and through real models (LlamaGen,
EAGLE-1 head).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

from specdec_jax import decode
from specdec_jax import jacobi_drafts
from specdec_jax import logits
from specdec_jax import rules
from specdec_jax import verify
from specdec_jax.app import toy
from tests.decode_support import VOCAB
from tests.decode_support import CLASSES
from tests.decode_support import NUM_TOKENS
from tests.decode_support import FAST
from tests.decode_support import TARGET
from tests.decode_support import _params
from tests.decode_support import _cond


class JacobiTokenRangeTest(absltest.TestCase):
  """Jacobi random drafts come from the target's declared image-token range."""

  def test_engine_passes_the_declared_range(self):
    ranged = _RangedToy(VOCAB, CLASSES, image_token_range=(1, 3))
    seen = []
    original = jacobi_drafts.jacobi_fresh

    def recording(*args, **kwargs):
      seen.append(args[5] if len(args) > 5 else kwargs.get('token_range'))
      return original(*args, **kwargs)

    jacobi_drafts.jacobi_fresh = recording
    decode.clear_compile_cache()
    try:
      target_params = _params()[0]
      decode.generate(ranged, target_params, _cond(4, logits.Sampling()), num_tokens=NUM_TOKENS,
                      key=jax.random.key(0), mode=decode.Jacobi(3), rule=rules.Lossless(),
                      compiler_options=FAST)
      self.assertNotEmpty(seen)
      self.assertEqual(set(seen), {(1, 3)})
      seen.clear()
      decode.generate(TARGET, target_params, _cond(4, logits.Sampling()), num_tokens=NUM_TOKENS,
                      key=jax.random.key(0), mode=decode.Jacobi(3), rule=rules.Lossless(),
                      compiler_options=FAST)
      self.assertEqual(set(seen), {(0, VOCAB)})  # no declaration: the whole vocabulary
    finally:
      jacobi_drafts.jacobi_fresh = original
      decode.clear_compile_cache()

  def test_released_models_declare_their_image_tokens(self):
    from specdec_jax import protocol  # pylint: disable=g-import-not-at-top
    from specdec_jax.models import chameleon, janus, llamagen  # pylint: disable=g-import-not-at-top
    self.assertEqual(protocol.image_token_range(chameleon.ChameleonModel(chameleon.lumina_7b())),
                     (4, 8196))  # 8192 VQ codes of 65536 ids
    self.assertEqual(protocol.image_token_range(janus.JanusModel(janus.JanusConfig())),
                     (0, 16384))
    self.assertEqual(protocol.image_token_range(llamagen.LlamaGenGPT(llamagen.GPTConfig())),
                     (0, 16384))
    self.assertEqual(protocol.image_token_range(TARGET), (0, VOCAB))  # undeclared: all

  def test_bad_range_is_rejected_before_compilation(self):
    bad = _RangedToy(VOCAB, CLASSES, image_token_range=(2, VOCAB + 1))
    with self.assertRaisesRegex(ValueError, 'image_token_range must be a non-empty range'):
      decode.generate(bad, _params()[0], _cond(2, logits.Sampling()), num_tokens=NUM_TOKENS,
                      key=jax.random.key(0), mode=decode.Jacobi(3), rule=rules.Lossless(),
                      compiler_options=FAST)


@dataclasses.dataclass(frozen=True)
class _RangedToy(toy.MarkovToy):
  """A Markov toy that declares which token ids are image tokens."""

  image_token_range: tuple = (0, VOCAB)


class GreedyRealModelTest(absltest.TestCase):
  """Through real models (LlamaGen 2D RoPE, the EAGLE-1 head): with temperature 0 every
  lossless mode must emit exactly vanilla greedy decoding's tokens (positions, tree masks,
  path compaction and drafter catch-up all have to be right for that; replacing the path
  compaction by a no-op makes this test fail)."""

  def test_all_modes_equal_vanilla_greedy(self):
    from specdec_jax.models import eagle, llamagen  # pylint: disable=g-import-not-at-top
    config = llamagen.GPTConfig(n_layer=1, n_head=4, dim=32, vocab_size=64, num_classes=4,
                                block_size=16)
    target = llamagen.LlamaGenGPT(config)
    target_params = target.init_params(jax.random.key(0))
    head = eagle.EagleDrafter(eagle.llamagen_drafter_config(config))
    head_params = eagle.attach_head(head.init_params(jax.random.key(1)),
                                    target_params['output']['kernel'])
    sampling = logits.Sampling(cfg_scale=2.0, temperature=0.0)
    cond = target.cfg_cond(target_params, jnp.array([0, 1, 3]))
    run = lambda mode, **kwargs: decode.generate(
        target, target_params, cond, num_tokens=16, key=jax.random.key(4), mode=mode,
        sampling=sampling, rule=rules.Lossless(), compiler_options=FAST, **kwargs)
    expected = np.asarray(run(decode.Vanilla()).tokens)
    tree = verify.StaticTree.from_paths(((0,), (1,), (0, 0), (1, 0), (0, 0, 0)))
    # The target drafting for itself: every greedy draft is accepted, so whole
    # depth-3 paths are compacted into the cache and bonus tokens follow.
    self_draft = run(decode.TreeDraft(tree, 'model'), draft=target, draft_params=target_params)
    np.testing.assert_array_equal(np.asarray(self_draft.tokens), expected)
    self.assertGreater(self_draft.metrics.summary()['tokens_per_target_forward'], 3.0)
    # A random EAGLE-1 head (models/eagle.py): mostly rejections, resampled from the target.
    eagle_run = run(decode.ChainDraft(3, 'eagle'), draft=head, draft_params=head_params)
    np.testing.assert_array_equal(np.asarray(eagle_run.tokens), expected)


if __name__ == '__main__':
  absltest.main()
