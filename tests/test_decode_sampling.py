"""The decode's Sampling is a traced argument: sweeping cfg_scale, temperature and
top_p reuses one compiled program, with the tokens of the old static behaviour.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

from specdec_jax import decode
from specdec_jax import categorical
from specdec_jax import logits
from specdec_jax import randomness
from specdec_jax import rules
from specdec_jax.models import tiny

CONFIG = tiny.TinyConfig(vocab_size=48, num_classes=3, width=32, num_layers=1, num_heads=2,
                         num_kv_heads=2, ffn_dim=64)
TARGET = tiny.TinyTransformer(CONFIG)
DRAFT = tiny.TinyTransformer(dataclasses.replace(CONFIG, width=16))
LABELS = jnp.array([0, 2, 1])
NUM_TOKENS = 6
# One structure (CFG on, sampled, top-p on, top_k 12), several values.
SWEEP = ((2.0, 1.0, 0.9), (4.0, 0.7, 0.8), (1.5, 1.3, 0.95))


def _sampling(cfg_scale, temperature, top_p):
  return logits.Sampling(cfg_scale=cfg_scale, temperature=temperature, top_p=top_p, top_k=12)


def _generate(sampling, mode=decode.Vanilla(), seed=0):
  params = TARGET.init_params(jax.random.key(0))
  drafter = not isinstance(mode, decode.Vanilla)
  return decode.generate(
      TARGET, params, tiny.cfg_class_rows(LABELS, CONFIG.num_classes), num_tokens=NUM_TOKENS,
      key=jax.random.key(seed), mode=mode, sampling=sampling,
      rule=rules.Lossless() if drafter else None, draft=DRAFT if drafter else None,
      draft_params=DRAFT.init_params(jax.random.key(1)) if drafter else None,
      compiler_options=decode.FAST_COMPILE)


def _static_decode(sampling, mode=decode.Vanilla(), seed=0):
  """The previous behaviour: the Sampling inside the static plan, its values compiled in."""
  params = TARGET.init_params(jax.random.key(0))
  drafter = not isinstance(mode, decode.Vanilla)
  plan, _, args = decode._prepare(  # pylint: disable=protected-access
      TARGET, params, tiny.cfg_class_rows(LABELS, CONFIG.num_classes), NUM_TOKENS,
      jax.random.key(seed), mode, sampling, rules.Lossless() if drafter else None,
      DRAFT if drafter else None, DRAFT.init_params(jax.random.key(1)) if drafter else None,
      None, None, None, decode.sharding.LLAMA_RULES, decode.sharding.LLAMA_RULES,
      tuple(sorted(decode.FAST_COMPILE.items())))
  static_plan = dataclasses.replace(plan, sampling=sampling)
  program = jax.jit(decode._decode, static_argnums=0)  # pylint: disable=protected-access
  return program(static_plan, *args[:-1])[0]


def _reference_vanilla(sampling, seed=0):
  """Plain AR sampling written out: prefill, then one forward per token, with the
  engine's random numbers (image b: key folded with b draws uniforms [n, 1]; token
  i is the inverse-CDF draw of uniform i)."""
  params = TARGET.init_params(jax.random.key(0))
  cond = tiny.cfg_class_rows(LABELS, CONFIG.num_classes)
  num_images = LABELS.shape[0]
  row_keys = [jax.random.fold_in(jax.random.key(seed), b) for b in range(num_images)]
  uniforms = jnp.stack([jax.random.uniform(k, (NUM_TOKENS, 1)) for k in row_keys])
  cache = TARGET.init_cache(2 * num_images, TARGET.prefix_length(cond) + NUM_TOKENS)
  out = TARGET.prefill(params, cache, cond)
  tokens = []
  for step in range(NUM_TOKENS):
    step_logits = out.logits[:, -1]
    probs = sampling.probs(step_logits[:num_images], step_logits[num_images:],
                           token_index=step)
    token = categorical.sample(uniforms[:, step, 0], probs)
    tokens.append(token)
    out = TARGET.forward(params, out.cache, jnp.concatenate([token, token])[:, None])
  return np.stack([np.asarray(t) for t in tokens], axis=1)


class TracedSamplingTest(absltest.TestCase):

  def test_sweep_compiles_once_and_matches_the_static_decode(self):
    decode.clear_compile_cache()
    original = decode._decode  # pylint: disable=protected-access
    decode._decode = chex.assert_max_traces(original, n=1)  # pylint: disable=protected-access
    try:
      results = [_generate(_sampling(*values)) for values in SWEEP]
    finally:
      decode._decode = original  # pylint: disable=protected-access
      chex.clear_trace_counter()
    self.assertGreater(results[0].compile_seconds, 0.0)
    self.assertEqual([r.compile_seconds for r in results[1:]], [0.0, 0.0])
    tokens = [np.asarray(r.tokens) for r in results]
    self.assertFalse(np.array_equal(tokens[0], tokens[1]))  # the values do reach the program
    for values, got in zip(SWEEP, tokens):
      np.testing.assert_array_equal(got, np.asarray(_static_decode(_sampling(*values))),
                                    err_msg=str(values))
      np.testing.assert_array_equal(got, _reference_vanilla(_sampling(*values)),
                                    err_msg=str(values))

  def test_array_values_reuse_the_program(self):
    """0-d jnp and NumPy values (a jnp.linspace sweep) reuse the program a call with
    Python floats compiled: each kind of leaf compiled its own before."""
    decode.clear_compile_cache()
    self.assertGreater(_generate(_sampling(2.0, 1.0, 0.9)).compile_seconds, 0.0)
    for values in ((jnp.asarray(3.5), jnp.float32(0.8), np.asarray(0.85)),
                   (np.float32(2.5), jnp.asarray(1.2, jnp.bfloat16), jnp.linspace(0.5, 0.9, 3)[1])):
      sampling = _sampling(*values)
      self.assertEqual(_generate(sampling).compile_seconds, 0.0, values)
      self.assertEqual({type(x) for x in jax.tree.leaves(sampling)}, {float})

  def test_chain_drafts_match_the_static_decode(self):
    """The drafter's distributions see the traced values too (one value: compiles are slow)."""
    mode, sampling = decode.ChainDraft(2, 'model'), _sampling(*SWEEP[1])
    np.testing.assert_array_equal(np.asarray(_generate(sampling, mode, seed=3).tokens),
                                  np.asarray(_static_decode(sampling, mode, seed=3)))

  def test_structural_changes_compile_a_new_program(self):
    """Crossing temperature = 0, top_p = 1 or changing top_k changes the program."""
    decode.clear_compile_cache()
    first = _generate(_sampling(2.0, 1.0, 0.9))
    self.assertGreater(first.compile_seconds, 0.0)
    for sampling in (_sampling(2.0, 0.0, 0.9), _sampling(2.0, 1.0, 1.0),
                     dataclasses.replace(_sampling(2.0, 1.0, 0.9), top_k=5)):
      self.assertGreater(_generate(sampling).compile_seconds, 0.0, sampling)

  def test_plan_holds_the_cfg_flag_not_the_sampling_values(self):
    """plan_for: two calls differing only in sampling values give one (equal) plan."""
    params = TARGET.init_params(jax.random.key(0))
    cond = tiny.cfg_class_rows(LABELS, CONFIG.num_classes)
    plan = lambda sampling, capacity=None: decode.plan_for(
        TARGET, params, cond, NUM_TOKENS, jax.random.key(0), decode.Vanilla(), sampling, None,
        None, None, None, capacity, None)
    first, second = plan(_sampling(*SWEEP[0])), plan(_sampling(*SWEEP[1]))
    self.assertEqual(first, second)
    self.assertEqual((first.sampling, first.cfg, first.rows_per_image, first.num_images),
                     (None, True, 2, LABELS.shape[0]))
    self.assertFalse(plan(logits.Sampling(cfg_scale=1.0)).cfg)
    with self.assertRaisesRegex(ValueError, 'generate: target cache'):
      plan(_sampling(*SWEEP[0]), capacity=first.target_capacity - 1)


class PerImageKeysTest(absltest.TestCase):

  def test_per_image_keys_fold_in_the_image_index(self):
    # generate(key) must give image b the tokens generate(keys) gives with keys[b] =
    # fold_in(key, b) (randomness.per_image_keys' contract), so an image of a batch can be
    # regenerated alone from (key, b).
    key = jax.random.key(7)
    got = randomness.per_image_keys(key, 3)
    for b in range(3):
      np.testing.assert_array_equal(jax.random.key_data(got[b]),
                                    jax.random.key_data(jax.random.fold_in(key, b)))


if __name__ == '__main__':
  absltest.main()
