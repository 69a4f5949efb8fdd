"""Tests for models/llamagen.py and converters/llamagen.py.

The PyTorch reference (`tests/torch_reference_llamagen.py`: a full-sequence forward of
the original GPT on a state dict in the original key layout, with its 2D RoPE
table, zero rows for condition tokens, and the t2i emb_masks + diagonal mask)
needs torch; the engine-path, config and safetensors converter tests run
without it (random weights are numpy arrays).
"""

import argparse

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import testing
from specdec_jax.converters import llamagen as convert
from specdec_jax.models import eagle
from specdec_jax.models import llamagen
from specdec_jax.models import tiny
from tests import torch_reference as ref
from tests import torch_reference_llamagen as ref_llamagen
from tests.llamagen_support import RTOL
from tests.llamagen_support import tiny_config
from tests.llamagen_support import random_state_dict
from tests.llamagen_support import torch_state
from tests.llamagen_support import rel_err
from tests.llamagen_support import t2i_inputs
from tests.llamagen_support import image_tokens
from tests.llamagen_support import fixture
from tests.llamagen_support import example_cond
from tests.llamagen_support import jit_prefill
from tests.llamagen_support import _jit_forward
from tests.llamagen_support import jit_forward
from tests.llamagen_support import capacity
from tests.llamagen_support import _tempdir


class ConfigTest(absltest.TestCase):

  def test_presets_match_the_table(self):
    table = {'GPT-B': (12, 768, 2048), 'GPT-L': (24, 1024, 2816),
             'GPT-XL': (36, 1280, 3584), 'GPT-XXL': (48, 1536, 4096),
             'GPT-XXXL': (48, 2560, 6912), 'GPT-1B': (22, 2048, 5632),
             'GPT-3B': (24, 3200, 8704), 'GPT-7B': (32, 4096, 11008)}
    for name, (n_layer, dim, ffn) in table.items():
      config = llamagen.gpt_config(name)
      self.assertEqual((config.n_layer, config.dim, config.ffn_dim), (n_layer, dim, ffn))
    self.assertEqual(llamagen.gpt_config('3B').head_dim, 100)
    t2i = llamagen.gpt_config('XL', model_type='t2i', image_size=512)
    self.assertEqual((t2i.cls_token_num, t2i.block_size), (120, 1024))
    self.assertEqual(llamagen.gpt_config('B', image_size=384).block_size, 576)

  def test_param_count_gpt_b(self):
    # 110.9M per the notes (c2i GPT-B); shapes only, no allocation.
    shapes = convert.expected_shapes(llamagen.gpt_config('GPT-B'))
    self.assertLen(shapes, 88)
    self.assertAlmostEqual(sum(np.prod(s) for s in shapes.values()) / 1e6, 110.9, delta=0.1)

  def test_bad_config_errors(self):
    with self.assertRaisesRegex(ValueError, 'model_type'):
      llamagen.GPTConfig(model_type='x2i')
    with self.assertRaisesRegex(ValueError, 'block_size 15 must be a square'):
      llamagen.GPTConfig(block_size=15)
    with self.assertRaisesRegex(ValueError, 'Unknown LlamaGen config'):
      llamagen.gpt_config('GPT-Q')


rope_2d = jax.jit(llamagen.rope_2d, static_argnums=(1, 2, 3))


class InitParamsTest(absltest.TestCase):

  def test_init_params_compiles_once_per_config(self):
    """Same-shape init_params calls (another key, another but equal model object) trace
    nothing new: LlamaGen, its EAGLE drafter and the tiny transformer."""
    config = tiny_config()
    for name, make in (('llamagen', lambda: llamagen.LlamaGenGPT(tiny_config())),
                       ('eagle', lambda: eagle.EagleDrafter(eagle.llamagen_drafter_config(config))),
                       ('tiny', tiny.TinyTransformer)):
      first = make().init_params(jax.random.key(0))
      with testing.jaxpr_traces() as traces:
        second = make().init_params(jax.random.key(1))
      self.assertEmpty(traces, f'{name}: init_params traced again')
      chex.assert_trees_all_equal_shapes(first, second)
      self.assertFalse(all(np.array_equal(a, b) for a, b in zip(
          jax.tree.leaves(first), jax.tree.leaves(second))), name)  # the key counts


class Rope2DTest(absltest.TestCase):

  def test_table_values(self):
    # G=16, D=64: image token n=1 (row 0, col 1): pairs 0..15 identity,
    # pair 16 rotates by 1 radian; condition positions are all zero.
    cos, sin = rope_2d(jnp.array([[0, 2]]), 64, 16, 1)
    np.testing.assert_array_equal(cos[0, 0], 0.0)
    np.testing.assert_array_equal(sin[0, 0], 0.0)
    np.testing.assert_allclose(cos[0, 1, :16], 1.0)
    np.testing.assert_allclose(sin[0, 1, :16], 0.0)
    np.testing.assert_allclose(cos[0, 1, 16], np.cos(1.0), rtol=1e-6)
    np.testing.assert_allclose(sin[0, 1, 16], np.sin(1.0), rtol=1e-6)

  @ref.requires_torch
  def test_matches_reference_table_head_dim_100(self):
    config = tiny_config(n_head=1, dim=100, block_size=36, cls_token_num=3)
    positions = jnp.arange(3 + 36)[None]
    cos, sin = rope_2d(positions, 100, 6, 3)
    ref_cos, ref_sin = ref.rope_2d_table(config.grid_size, config.head_dim, config.rope_base,
                                         config.cls_token_num)
    np.testing.assert_allclose(cos[0], ref_cos.numpy(), atol=1e-6)
    np.testing.assert_allclose(sin[0], ref_sin.numpy(), atol=1e-6)


@ref.requires_torch
class ParityTest(parameterized.TestCase):

  @parameterized.parameters('c2i', 't2i')
  def test_forward_logits_match_torch(self, model_type):
    config, state, params = fixture(model_type)
    idx = image_tokens(config)
    cond_ref, mask, cond_jax = example_cond(config)
    expected = ref_llamagen.gpt_forward(state, config, cond_ref, idx, mask).numpy()
    actual = llamagen.forward_logits(params, config, cond_jax, jnp.asarray(idx, jnp.int32))
    chex.assert_shape(actual, (2, config.block_size, config.vocab_size))
    self.assertLess(rel_err(actual, expected), RTOL)

  def test_grouped_query_attention_matches_torch(self):
    """n_kv_head < n_head (the LlamaGen code's GQA option; no released GPT uses it):
    query head h reads k/v head h // (n_head / n_kv_head)."""
    for n_kv_head in (1, 2):
      with self.subTest(n_kv_head=n_kv_head):
        config, state, params = fixture('c2i', n_kv_head=n_kv_head)
        idx = image_tokens(config)
        cond_ref, mask, cond_jax = example_cond(config)
        expected = ref_llamagen.gpt_forward(state, config, cond_ref, idx, mask).numpy()
        actual = llamagen.forward_logits(params, config, cond_jax, jnp.asarray(idx, jnp.int32))
        self.assertLess(rel_err(actual, expected), RTOL)

  def test_caption_projection_matches_torch(self):
    """cap_proj (fc1 -> GELU, tanh form -> fc2) at 1e-5 on features of scale 4: the
    whole-model tolerance (1e-4) cannot tell the exact GELU from the tanh form."""
    config, state, params = fixture('t2i')
    features = 4 * t2i_inputs(config)[0]
    torch = ref.torch
    fc1, fc2 = (torch.as_tensor(np.asarray(state[f'cls_embedding.cap_proj.{name}.weight']))
                for name in ('fc1', 'fc2'))
    hidden = torch.as_tensor(features) @ fc1.T
    expected = (torch.nn.functional.gelu(hidden, approximate='tanh') @ fc2.T).numpy()
    actual = llamagen.LlamaGenGPT(config).module.apply(
        {'params': params}, jnp.asarray(features), method=llamagen.GPTModule.embed_cond)
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=1e-5, atol=1e-5)
    exact = (torch.nn.functional.gelu(hidden) @ fc2.T).numpy()  # the test can tell them apart
    self.assertGreater(np.abs(exact - expected).max(), 1e-4)

  def test_padding_matters(self):
    # Guard against a vacuous t2i test: masking the padding changes the logits.
    config, state, _ = fixture('t2i')
    features, mask = t2i_inputs(config)
    idx = np.zeros((2, 3), np.int64)
    masked = ref_llamagen.gpt_forward(state, config, features, idx, mask)
    unmasked = ref_llamagen.gpt_forward(state, config, features, idx, None)
    self.assertGreater(rel_err(masked[0], unmasked[0]), 1e-3)


@ref.requires_torch
class GreedyEndToEndTest(absltest.TestCase):

  def test_greedy_cfg_generation_matches_torch(self):
    config = tiny_config('c2i')
    state = random_state_dict(config, seed=3)
    tmp = _tempdir(self)
    ref.torch.save({'model': torch_state(state), 'args': argparse.Namespace(gpt_model='tiny'),
                    'steps': 1}, tmp / 'ckpt.pt')
    out_dir = convert.convert_file(tmp / 'ckpt.pt', tmp / 'out', config)
    model, params = convert.load_llamagen(out_dir)
    label, cfg_scale = 7, 2.0
    cond = model.cfg_cond(params, jnp.array([label], jnp.int32))  # [label, null]
    out = jit_prefill(model, params, model.init_cache(2, capacity(config)), cond)
    generated, compiled = [], None
    for step in range(config.block_size):
      cond_logits, uncond_logits = out.logits[0, -1], out.logits[1, -1]
      token = jnp.argmax(uncond_logits + (cond_logits - uncond_logits) * cfg_scale)
      generated.append(int(token))
      if step < config.block_size - 1:
        out = jit_forward(model, params, out.cache, jnp.stack([token, token])[:, None])
        if compiled is None:
          compiled = _jit_forward._cache_size()
    self.assertEqual(_jit_forward._cache_size(), compiled)  # no retrace per step
    expected = ref_llamagen.greedy_cfg(state, config, [label], cfg_scale)
    np.testing.assert_array_equal(generated, expected[0])
    self.assertGreater(len(set(generated)), 3)  # not a degenerate constant

    # Through the compiled engine: vanilla and lossless Jacobi SD, greedy CFG.
    from specdec_jax import decode, logits, rules  # pylint: disable=g-import-not-at-top
    sampling = logits.Sampling(cfg_scale=cfg_scale, temperature=0)
    params = jax.device_put(params)  # the loader's NumPy arrays, placed once
    for mode, rule in ((decode.Vanilla(), None), (decode.Jacobi(window=3), rules.Lossless())):
      result = decode.generate(model, params, cond, num_tokens=config.block_size,
                               key=jax.random.key(0), mode=mode, rule=rule, sampling=sampling)
      np.testing.assert_array_equal(result.tokens[0], expected[0], err_msg=type(mode).__name__)


if __name__ == '__main__':
  absltest.main()
