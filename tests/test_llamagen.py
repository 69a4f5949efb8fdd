"""Tests for models/llamagen.py and converters/llamagen.py.

The PyTorch reference (`tests/torch_reference.py`: a full-sequence forward of
the original GPT on a state dict in the original key layout, with its 2D RoPE
table, zero rows for condition tokens, and the t2i emb_masks + diagonal mask)
needs torch; the engine-path, config and safetensors converter tests run
without it (random weights are numpy arrays).
"""

import argparse
import functools
import pathlib
import shutil
import tempfile
from unittest import mock

from absl import app
from absl import flags
from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.converters import common
from specdec_jax.converters import hf_streaming
from specdec_jax.converters import llamagen as convert
from specdec_jax.models import llamagen
from tests import torch_reference as ref
from tests import torch_reference_llamagen as ref_llamagen

RTOL = 1e-4


def tiny_config(model_type='c2i', **overrides):
  fields = dict(n_layer=2, n_head=4, dim=64, vocab_size=64, block_size=16,
                model_type=model_type, num_classes=10, caption_dim=24,
                cls_token_num=1 if model_type == 'c2i' else 8)
  fields.update(overrides)
  return llamagen.GPTConfig(**fields)


def random_state_dict(config, seed=0):
  """Random float32 weights (numpy) in the original key layout and shapes."""
  rng = np.random.default_rng(seed)
  state = {}
  for key, shape in convert.expected_shapes(config).items():
    noise = rng.standard_normal(shape)
    if key.endswith('norm.weight'):
      value = 1.0 + 0.1 * noise
    elif 'embedding' in key:
      value = noise
    else:
      value = noise * shape[-1] ** -0.5
    state[key] = value.astype(np.float32)
  return state


def torch_state(state):
  return {k: ref.as_torch(v) for k, v in state.items()}


def rel_err(actual, expected):
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  return np.max(np.abs(actual - expected)) / np.max(np.abs(expected))


def to_params(state, config):
  return convert.convert_llamagen_gpt(dict(state), config)


def t2i_inputs(config, batch=2, seed=1):
  """(caption features float32 [B, P, C], mask bool [B, P]), row 0 left-padded."""
  rng = np.random.default_rng(seed)
  features = rng.standard_normal((batch, config.cls_token_num, config.caption_dim))
  mask = np.ones((batch, config.cls_token_num), bool)
  mask[0, :3] = False  # row 0: 3 padding slots on the left
  return (features * mask[:, :, None]).astype(np.float32), mask


def image_tokens(config, seed=2):
  """The image tokens ParityTest and EnginePathTest share: int64 [2, N - 1]."""
  return np.random.default_rng(seed).integers(0, config.vocab_size, (2, config.block_size - 1))


@functools.lru_cache(maxsize=None)
def fixture(model_type, seed=0):
  """(config, original state dict, converted params), shared by the tests."""
  config = tiny_config(model_type)
  state = random_state_dict(config, seed)
  return config, state, to_params(state, config)


def example_cond(config):
  """(reference cond, reference mask or None, jax cond) for a batch of 2 rows."""
  if config.model_type == 'c2i':
    labels = np.array([3, config.num_classes])
    return labels, None, jnp.asarray(labels, jnp.int32)
  features, mask = t2i_inputs(config)
  return features, mask, llamagen.CaptionCond(jnp.asarray(features), jnp.asarray(mask))


# One jitted function per entry point, shared by every test, so each (model,
# shape) compiles once per file: compilation dominates the run time on CPU.
@functools.partial(jax.jit, static_argnums=0)
def jit_prefill(model, params, cache, cond):
  return model.prefill(params, cache, cond)


@functools.partial(jax.jit, static_argnums=0)
def _jit_forward(model, params, cache, tokens, window_mask, depths):
  return model.forward(params, cache, tokens, window_mask, depths)


def jit_forward(model, params, cache, tokens, window_mask=None, depths=None):
  """Always passes an explicit mask/depths so chains and trees share a trace."""
  num_new = tokens.shape[1]
  if window_mask is None:
    window_mask = jnp.tril(jnp.ones((num_new, num_new), bool))
  if depths is None:
    depths = jnp.arange(num_new, dtype=jnp.int32)
  return _jit_forward(model, params, cache, tokens, window_mask, depths)


def capacity(config):
  return config.cls_token_num + config.block_size


def _tempdir(test):
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return pathlib.Path(path)


# ------------------------------------------------------------- tests ---


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

  def test_padding_matters(self):
    # Guard against a vacuous t2i test: masking the padding changes the logits.
    config, state, _ = fixture('t2i')
    features, mask = t2i_inputs(config)
    idx = np.zeros((2, 3), np.int64)
    masked = ref_llamagen.gpt_forward(state, config, features, idx, mask)
    unmasked = ref_llamagen.gpt_forward(state, config, features, idx, None)
    self.assertGreater(rel_err(masked[0], unmasked[0]), 1e-3)


class EnginePathTest(parameterized.TestCase):

  def _setup(self, model_type):
    config, _, params = fixture(model_type)
    model = llamagen.LlamaGenGPT(config)
    tokens = image_tokens(config)  # same tokens as ParityTest
    return config, params, model, jnp.asarray(tokens, jnp.int32), example_cond(config)[2]

  @parameterized.parameters('c2i', 't2i')
  def test_one_by_one_and_chunked_match_teacher_forced(self, model_type):
    config, params, model, tokens, cond = self._setup(model_type)
    expected = llamagen.forward_logits(params, config, cond, tokens)  # [2, N, V]
    prefix = jit_prefill(model, params, model.init_cache(2, capacity(config)), cond)
    chex.assert_shape(prefix.logits, (2, config.cls_token_num, config.vocab_size))
    np.testing.assert_array_equal(prefix.cache.lengths, config.cls_token_num)

    cache, one_by_one = prefix.cache, [prefix.logits[:, -1]]
    for t in range(tokens.shape[1]):
      out = jit_forward(model, params, cache, tokens[:, t: t + 1])
      cache = out.cache
      one_by_one.append(out.logits[:, 0])
    one_by_one = jnp.stack(one_by_one, axis=1)
    self.assertLess(rel_err(one_by_one, expected), RTOL)
    np.testing.assert_array_equal(cache.lengths, config.cls_token_num + tokens.shape[1])

    if model_type == 't2i':
      return  # windows are model-type independent; spare a compile
    cache, chunked = prefix.cache, [prefix.logits[:, -1:]]
    for start in range(0, tokens.shape[1], 3):  # 15 tokens = 5 windows of 3
      out = jit_forward(model, params, cache, tokens[:, start: start + 3])
      cache = out.cache
      chunked.append(out.logits)
    self.assertLess(rel_err(jnp.concatenate(chunked, axis=1), one_by_one), RTOL)

  def test_rollback_and_tree_window(self):
    config, params, model, tokens, cond = self._setup('c2i')
    cache = jit_prefill(model, params, model.init_cache(2, capacity(config)), cond).cache
    chain = lambda *columns: jnp.concatenate([tokens[:, c: c + 1] for c in columns], 1)
    fresh = jit_forward(model, params, cache, chain(0, 5, 6))
    # Rollback: after writing tokens (0, 1, 2), move the length back to P + 1
    # and write token 5: same logits as a fresh (0, 5) chain.
    written = jit_forward(model, params, cache, chain(0, 1, 2)).cache
    redo = jit_forward(model, params, written.replace(lengths=written.lengths - 2),
                       chain(5))
    self.assertLess(rel_err(redo.logits[:, 0], fresh.logits[:, 1]), RTOL)
    # Tree: token 0, then two siblings at depth 1 that do not see each other.
    window_mask = jnp.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]], bool)
    depths = jnp.array([0, 1, 1], jnp.int32)
    tree = jit_forward(model, params, cache, chain(0, 3, 4), window_mask, depths)
    chain_a = jit_forward(model, params, cache, chain(0, 3, 7))
    chain_b = jit_forward(model, params, cache, chain(0, 4, 7))
    self.assertLess(rel_err(tree.logits[:, 1], chain_a.logits[:, 1]), RTOL)
    self.assertLess(rel_err(tree.logits[:, 2], chain_b.logits[:, 1]), RTOL)
    self.assertGreater(rel_err(tree.logits[:, 1], tree.logits[:, 2]), 1e-3)

  def test_cond_errors(self):
    config, params, model, _, _ = self._setup('c2i')
    cache = model.init_cache(2, 8)
    with self.assertRaisesRegex(ValueError, r'class ids of shape \(2,\)'):
      model.prefill(params, cache, jnp.array([1, 2, 3], jnp.int32))
    with self.assertRaisesRegex(ValueError, r'class ids must lie in \[0, 10\]'):
      model.prefill(params, cache, jnp.array([1, 11], jnp.int32))
    t2i = llamagen.LlamaGenGPT(tiny_config('t2i'))
    bad_mask = llamagen.CaptionCond(jnp.zeros((2, 8, 24)), jnp.array([[1] * 7 + [0]] * 2, bool))
    with self.assertRaisesRegex(ValueError, 'left padded'):
      t2i.prefill(None, t2i.init_cache(2, 9), bad_mask)

  def test_left_pad_captions(self):
    features = jnp.arange(2 * 4 * 1, dtype=jnp.float32).reshape(2, 4, 1) + 1
    mask = jnp.array([[1, 1, 0, 0], [1, 1, 1, 1]])
    cond = llamagen.left_pad_captions(features, mask)
    np.testing.assert_array_equal(cond.features[0, :, 0], [0, 0, 1, 2])
    np.testing.assert_array_equal(cond.features[1, :, 0], [5, 6, 7, 8])
    np.testing.assert_array_equal(cond.mask, [[0, 0, 1, 1], [1, 1, 1, 1]])


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
    for mode, rule in ((decode.Vanilla(), None), (decode.Jacobi(window=3), rules.Lossless())):
      result = decode.generate(model, params, cond, num_tokens=config.block_size,
                               key=jax.random.key(0), mode=mode, rule=rule, sampling=sampling)
      np.testing.assert_array_equal(result.tokens[0], expected[0], err_msg=type(mode).__name__)


class ConverterTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = _tempdir(self)
    self.config, self.state, _ = fixture('c2i')

  def _assert_no_output(self):
    self.assertEqual(sorted(p.name for p in self.dir.iterdir()
                            if p.suffix not in ('.pt', '.pth', '.safetensors')), [])

  def _save(self, state, name='ckpt.safetensors'):
    """The state as a safetensors file (no torch needed)."""
    hf_streaming.write_safetensors(self.dir / name, state)
    return self.dir / name

  @ref.requires_torch
  def test_formats_give_identical_params_and_buffers_are_dropped(self):
    with_buffers = torch_state(self.state)
    with_buffers['freqs_cis'] = ref.torch.zeros(17, 8, 2)
    with_buffers['layers.0.attention.kv_cache.k_cache'] = ref.torch.zeros(1, 4, 24, 16)
    ref.torch.save({'model': with_buffers, 'optimizer': {}, 'steps': 5}, self.dir / 'ddp.pt')
    ref.torch.save(torch_state(self.state), self.dir / 'consolidated.pth')
    self._save(self.state, 'model.safetensors')
    expected = fixture('c2i')[2]
    for name in ('ddp.pt', 'consolidated.pth', 'model.safetensors'):
      out = convert.convert_file(self.dir / name, self.dir / f'out_{name}', self.config)
      model, params = convert.load_llamagen(out)
      self.assertEqual(model.config, self.config)
      chex.assert_trees_all_equal(params, expected)
      meta = common.read_meta(out)
      self.assertEqual(meta['source_files'][0]['sha256'],
                       common.sha256_file(self.dir / name))
      self.assertEqual(meta['config']['dim'], 64)

  def test_safetensors_without_torch(self):
    state = dict(self.state, freqs_cis=np.zeros((17, 8, 2), np.float32))
    out = convert.convert_file(self._save(state), self.dir / 'out', self.config)
    _, params = convert.load_llamagen(out)
    chex.assert_trees_all_equal(params, fixture('c2i')[2])

  @ref.requires_torch
  def test_use_ema(self):
    ema = {k: v * 2 for k, v in self.state.items()}
    ref.torch.save({'model': torch_state(self.state), 'ema': torch_state(ema)},
                   self.dir / 'ckpt.pt')
    out = convert.convert_file(self.dir / 'ckpt.pt', self.dir / 'out', self.config,
                               use_ema=True)
    _, params = convert.load_llamagen(out)
    np.testing.assert_allclose(params['norm']['weight'], ema['norm.weight'])

  def test_bfloat16_output(self):
    path = self._save({k: v.astype(jnp.bfloat16) for k, v in self.state.items()})
    config = tiny_config('c2i', dtype='bfloat16')
    out = convert.convert_file(path, self.dir / 'out', config)
    model, params = convert.load_llamagen(out)
    self.assertEqual(params['output']['kernel'].dtype, jnp.bfloat16)
    self.assertEqual(model.init_cache(1, 1).keys[0].dtype, jnp.bfloat16)
    # One window of 3 tokens on an empty cache (shapes shared with the fp32
    # engine tests, so only the bf16 graph compiles here).
    tokens = jnp.array([[1, 2, 3], [4, 5, 6]], jnp.int32)
    bf16 = jit_forward(model, params, model.init_cache(2, capacity(config)), tokens)
    self.assertEqual(bf16.logits.dtype, jnp.float32)
    self.assertEqual(bf16.hidden.dtype, jnp.bfloat16)
    model32, params32 = convert.load_llamagen(out, dtype='float32')
    fp32 = jit_forward(model32, params32, model32.init_cache(2, capacity(config)), tokens)
    self.assertLess(rel_err(bf16.logits, fp32.logits), 5e-2)

  def test_wrong_config_lists_mis_shaped_keys(self):
    path = self._save(self.state)
    wrong = tiny_config('c2i', dim=32, n_head=2)
    with self.assertRaises(common.CheckpointMismatchError) as ctx:
      convert.convert_file(path, self.dir / 'out', wrong)
    message = str(ctx.exception)
    self.assertIn('custom c2i (2 layers, dim 32', message)
    self.assertIn('tok_embeddings.weight: expected (64, 32), found (64, 64)', message)
    self.assertIn('layers.1.attention.wqkv.weight: expected (96, 32), found (192, 64)',
                  message)
    self.assertIn('with 2 layers and dim 64', message)
    self._assert_no_output()

  def test_wrong_model_type_and_missing_keys(self):
    state = dict(self.state)
    del state['layers.1.ffn_norm.weight']
    state['extra.weight'] = np.zeros(3, np.float32)
    path = self._save(state)
    with self.assertRaises(common.CheckpointMismatchError) as ctx:
      convert.convert_file(path, self.dir / 'out', self.config)
    message = str(ctx.exception)
    self.assertIn('layers.1.ffn_norm.weight (expected shape (64,))', message)
    self.assertIn('extra.weight (shape (3,))', message)
    with self.assertRaisesRegex(common.CheckpointMismatchError,
                                'cls_embedding.cap_proj.fc1.weight'):
      convert.convert_file(path, self.dir / 'out', tiny_config('t2i'))
    self._assert_no_output()

  @ref.requires_torch
  def test_truncated_file(self):
    ref.torch.save({'model': torch_state(self.state)}, self.dir / 'ckpt.pt')
    data = (self.dir / 'ckpt.pt').read_bytes()
    (self.dir / 'ckpt.pt').write_bytes(data[: len(data) // 3])
    with self.assertRaisesRegex(common.CheckpointReadError, 'ckpt.pt.*truncated'):
      convert.convert_file(self.dir / 'ckpt.pt', self.dir / 'out', self.config)
    self._assert_no_output()

  def _main(self, *args):
    argv = ['llamagen', f'--output={self.dir / "out"}', '--config=GPT-B', '--set=n_layer=2',
            '--set=n_head=4', '--set=dim=64', '--set=vocab_size=64', '--set=num_classes=10',
            '--set=caption_dim=24', *args]
    flag_values = flags.FlagValues()
    convert.define_flags(flag_values)
    flag_values(argv)
    convert.main(argv, flag_values)

  def test_command_line(self):
    self._main(f'--input={self._save(self.state)}', '--model_type=c2i', '--image_size=64')
    model, _ = convert.load_llamagen(self.dir / 'out')
    self.assertEqual(model.config, self.config)

  @parameterized.named_parameters(
      ('c2i_xl_384', 'c2i_XL_384.pt', 384),
      ('c2i_b_256', 'c2i_B_256.pt', 256),
      ('t2i_stage1', 't2i_XL_stage1_256.pt', 256),
      ('t2i_stage2', 't2i_XL_stage2_512.pt', 512),
      ('safetensors', 'c2i_3B_384.safetensors', 384),
      ('fsdp', 'consolidated.pth', None),
      ('vq', 'vq_ds16_c2i.pt', None),
      ('not_a_multiple_of_16', 'c2i_B_100.pt', None),
  )
  def test_image_size_from_released_file_names(self, name, size):
    self.assertEqual(convert.infer_image_size(name), size)

  def test_image_size_is_required_or_inferred(self):
    path = self._save(self.state)  # ckpt.safetensors: no size in the name
    with self.assertRaisesRegex(app.UsageError, r'--image_size is required.*ckpt\.safetensors'):
      self._main(f'--input={path}')
    self._assert_no_output()
    named = self._save(self.state, 'c2i_tiny_64.safetensors')
    with mock.patch.object(convert.logging, 'info') as info:
      self._main(f'--input={named}')
    logged = [call.args[0] % call.args[1:] for call in info.call_args_list]
    self.assertIn('--image_size not given: using 64 from the file name '
                  'c2i_tiny_64.safetensors.', logged)
    model, _ = convert.load_llamagen(self.dir / 'out')
    self.assertEqual(model.config, self.config)  # block_size (64/16)^2 = 16

  @parameterized.named_parameters(
      ('bad_int', '--set=dim=abc', 'dim must be int'),
      ('unknown_field', '--set=width=3', "--set 'width=3'.*field one of"),
      ('bad_preset', '--config=GPT-Q', 'Unknown LlamaGen config'),
      ('not_a_grid', '--image_size=72', 'image_size 72 must be a multiple'),
  )
  def test_config_errors_are_usage_errors(self, flag, message):
    path = self._save(self.state, 'c2i_tiny_64.safetensors')
    with self.assertRaisesRegex(app.UsageError, message):
      self._main(f'--input={path}', flag)
    self._assert_no_output()


if __name__ == '__main__':
  absltest.main()
