"""Tests for models/llamagen.py and converters/llamagen.py.

The PyTorch reference below is written from the reference notes
(`models_and_checkpoints.md` section 1): a full-sequence forward of the
original GPT on a state dict in the original key layout, with its 2D RoPE
table (zero rows for condition tokens) and the t2i emb_masks + diagonal mask.
"""

import argparse
import functools
import pathlib
import shutil
import tempfile

from absl import flags
from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
import safetensors.torch
import torch
import torch.nn.functional as F

from specdec_jax.converters import common
from specdec_jax.converters import llamagen as convert
from specdec_jax.models import llamagen

RTOL = 1e-4


def tiny_config(model_type='c2i', **overrides):
  fields = dict(n_layer=2, n_head=4, dim=64, vocab_size=64, block_size=16,
                model_type=model_type, num_classes=10, caption_dim=24,
                cls_token_num=1 if model_type == 'c2i' else 8)
  fields.update(overrides)
  return llamagen.GPTConfig(**fields)


def random_state_dict(config, seed=0):
  """Random weights in the original key layout and shapes."""
  generator = torch.Generator().manual_seed(seed)
  state = {}
  for key, shape in convert.expected_shapes(config).items():
    if key.endswith('norm.weight'):
      value = 1.0 + 0.1 * torch.randn(shape, generator=generator)
    elif 'embedding' in key:
      value = torch.randn(shape, generator=generator)
    else:
      value = torch.randn(shape, generator=generator) * shape[-1] ** -0.5
    state[key] = value.float()
  return state


# ------------------------------------------------- PyTorch reference ---


def torch_rope_table(config):
  """(cos, sin) [P + N, D/2]: zero rows for the P condition tokens."""
  half = config.head_dim // 2
  freqs = 1.0 / (config.rope_base ** (torch.arange(0, half, 2)[: half // 2].float() / half))
  grid = config.grid_size
  per_axis = torch.outer(torch.arange(grid, dtype=torch.float32), freqs)  # [G, D/4]
  angles = torch.cat([per_axis[:, None, :].expand(grid, grid, -1),     # row
                      per_axis[None, :, :].expand(grid, grid, -1)],    # column
                     dim=-1).reshape(grid * grid, half)
  zeros = torch.zeros(config.cls_token_num, half)
  return torch.cat([zeros, angles.cos()]), torch.cat([zeros, angles.sin()])


def torch_rotate(x, cos, sin):
  """Interleaved pairs; x [B, L, H, D], cos/sin [L, D/2]."""
  pairs = x.float().reshape(*x.shape[:-1], -1, 2)
  x0, x1 = pairs[..., 0], pairs[..., 1]
  c, s = cos[None, :, None, :], sin[None, :, None, :]
  return torch.stack([x0 * c - x1 * s, x1 * c + x0 * s], -1).flatten(3).type_as(x)


def torch_rms(x, weight, eps):
  normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
  return normed.type_as(x) * weight


def torch_gpt_forward(sd, config, cond, idx, emb_mask=None):
  """Original GPT.forward in training mode: logits [B, M + 1, V]."""
  c = config
  if c.model_type == 'c2i':
    cond_embeds = sd['cls_embedding.embedding_table.weight'][cond][:, None]
  else:
    hidden = cond @ sd['cls_embedding.cap_proj.fc1.weight'].T
    cond_embeds = F.gelu(hidden, approximate='tanh') @ sd['cls_embedding.cap_proj.fc2.weight'].T
  x = torch.cat([cond_embeds, sd['tok_embeddings.weight'][idx]], dim=1)
  batch, length, _ = x.shape
  cos, sin = torch_rope_table(c)
  cos, sin = cos[:length], sin[:length]
  mask = torch.tril(torch.ones(length, length, dtype=torch.bool)).expand(batch, -1, -1).clone()
  if emb_mask is not None:
    mask[:, :, : c.cls_token_num] &= emb_mask[:, None, :].bool()
    mask |= torch.eye(length, dtype=torch.bool)[None]
  hd, q_rows = c.head_dim, c.n_head * c.head_dim
  for i in range(c.n_layer):
    p = f'layers.{i}.'
    h = torch_rms(x, sd[p + 'attention_norm.weight'], c.norm_eps)
    qkv = h @ sd[p + 'attention.wqkv.weight'].T
    q, k, v = qkv.split([q_rows, c.n_kv_head * hd, c.n_kv_head * hd], dim=-1)
    q = torch_rotate(q.reshape(batch, length, c.n_head, hd), cos, sin)
    k = torch_rotate(k.reshape(batch, length, c.n_kv_head, hd), cos, sin)
    v = v.reshape(batch, length, c.n_kv_head, hd)
    attn = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask[:, None])
    x = x + attn.transpose(1, 2).reshape(batch, length, -1) @ sd[p + 'attention.wo.weight'].T
    h = torch_rms(x, sd[p + 'ffn_norm.weight'], c.norm_eps)
    gate, up = h @ sd[p + 'feed_forward.w1.weight'].T, h @ sd[p + 'feed_forward.w3.weight'].T
    x = x + (F.silu(gate) * up) @ sd[p + 'feed_forward.w2.weight'].T
  logits = (torch_rms(x, sd['norm.weight'], c.norm_eps) @ sd['output.weight'].T).float()
  return logits[:, c.cls_token_num - 1:]


def torch_greedy_cfg(sd, config, labels, cfg_scale):
  """Greedy CFG generation by full recomputation (c2i)."""
  null = torch.full_like(labels, config.num_classes)
  cond = torch.cat([labels, null])
  tokens = torch.zeros(2 * len(labels), 0, dtype=torch.long)
  for _ in range(config.block_size):
    logits = torch_gpt_forward(sd, config, cond, tokens)[:, -1]
    cond_logits, uncond_logits = logits.chunk(2)
    nxt = (uncond_logits + (cond_logits - uncond_logits) * cfg_scale).argmax(-1)
    tokens = torch.cat([tokens, torch.cat([nxt, nxt])[:, None]], dim=1)
  return tokens[: len(labels)].numpy()


def rel_err(actual, expected):
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  return np.max(np.abs(actual - expected)) / np.max(np.abs(expected))


def to_params(state, config):
  return convert.convert_llamagen_gpt({k: v.numpy() for k, v in state.items()}, config)


def t2i_inputs(config, batch=2, seed=1):
  generator = torch.Generator().manual_seed(seed)
  features = torch.randn(batch, config.cls_token_num, config.caption_dim, generator=generator)
  mask = torch.ones(batch, config.cls_token_num, dtype=torch.bool)
  mask[0, :3] = False  # row 0: 3 padding slots on the left
  features = features * mask[:, :, None]
  return features, mask


@functools.lru_cache(maxsize=None)
def fixture(model_type, seed=0):
  """(config, original state dict, converted params), shared by the tests."""
  config = tiny_config(model_type)
  state = random_state_dict(config, seed)
  return config, state, to_params(state, config)


def example_cond(config):
  """(torch cond, torch mask or None, jax cond) for a batch of 2 rows."""
  if config.model_type == 'c2i':
    labels = torch.tensor([3, config.num_classes])
    return labels, None, jnp.asarray(labels.numpy(), jnp.int32)
  features, mask = t2i_inputs(config)
  return features, mask, llamagen.CaptionCond(jnp.asarray(features.numpy()),
                                              jnp.asarray(mask.numpy()))


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

  def test_matches_reference_table_head_dim_100(self):
    config = tiny_config(n_head=1, dim=100, block_size=36, cls_token_num=3)
    positions = jnp.arange(3 + 36)[None]
    cos, sin = rope_2d(positions, 100, 6, 3)
    ref_cos, ref_sin = torch_rope_table(config)
    np.testing.assert_allclose(cos[0], ref_cos.numpy(), atol=1e-6)
    np.testing.assert_allclose(sin[0], ref_sin.numpy(), atol=1e-6)


class ParityTest(parameterized.TestCase):

  @parameterized.parameters('c2i', 't2i')
  def test_forward_logits_match_torch(self, model_type):
    config, state, params = fixture(model_type)
    generator = torch.Generator().manual_seed(2)
    idx = torch.randint(0, config.vocab_size, (2, config.block_size - 1), generator=generator)
    cond_torch, mask, cond_jax = example_cond(config)
    expected = torch_gpt_forward(state, config, cond_torch, idx, mask).numpy()
    actual = llamagen.forward_logits(params, config, cond_jax,
                                     jnp.asarray(idx.numpy(), jnp.int32))
    chex.assert_shape(actual, (2, config.block_size, config.vocab_size))
    self.assertLess(rel_err(actual, expected), RTOL)

  def test_padding_matters(self):
    # Guard against a vacuous t2i test: masking the padding changes the logits.
    config, state, _ = fixture('t2i')
    features, mask = t2i_inputs(config)
    idx = torch.zeros(2, 3, dtype=torch.long)
    masked = torch_gpt_forward(state, config, features, idx, mask)
    unmasked = torch_gpt_forward(state, config, features, idx, None)
    self.assertGreater(rel_err(masked[0], unmasked[0]), 1e-3)


class EnginePathTest(parameterized.TestCase):

  def _setup(self, model_type):
    config, _, params = fixture(model_type)
    model = llamagen.LlamaGenGPT(config)
    generator = torch.Generator().manual_seed(2)  # same tokens as ParityTest
    tokens = torch.randint(0, config.vocab_size, (2, config.block_size - 1), generator=generator)
    return config, params, model, jnp.asarray(tokens.numpy(), jnp.int32), example_cond(config)[2]

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


class GreedyEndToEndTest(absltest.TestCase):

  def test_greedy_cfg_generation_matches_torch(self):
    config = tiny_config('c2i')
    state = random_state_dict(config, seed=3)
    tmp = _tempdir(self)
    torch.save({'model': state, 'args': argparse.Namespace(gpt_model='tiny'), 'steps': 1},
               tmp / 'ckpt.pt')
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
    expected = torch_greedy_cfg(state, config, torch.tensor([label]), cfg_scale)
    np.testing.assert_array_equal(generated, expected[0])
    self.assertGreater(len(set(generated)), 3)  # not a degenerate constant

    # Through the compiled engine: vanilla and lossless Jacobi SD, greedy CFG.
    from specdec_jax import decode, logits, rules  # pylint: disable=g-import-not-at-top
    sampling = logits.Sampling(cfg_scale=cfg_scale, temperature=0)
    for mode, rule in ((decode.Vanilla(), None), (decode.Jacobi(window=3), rules.Lossless())):
      result = decode.generate(model, params, cond, num_tokens=config.block_size,
                               key=jax.random.key(0), mode=mode, rule=rule, sampling=sampling)
      np.testing.assert_array_equal(result.tokens[0], expected[0], err_msg=type(mode).__name__)


class ConverterTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = _tempdir(self)
    self.config, self.state, _ = fixture('c2i')

  def _assert_no_output(self):
    self.assertEqual(sorted(p.name for p in self.dir.iterdir() if p.name != 'ckpt.pt'), [])

  def test_formats_give_identical_params_and_buffers_are_dropped(self):
    with_buffers = dict(self.state)
    with_buffers['freqs_cis'] = torch.zeros(17, 8, 2)
    with_buffers['layers.0.attention.kv_cache.k_cache'] = torch.zeros(1, 4, 24, 16)
    torch.save({'model': with_buffers, 'optimizer': {}, 'steps': 5}, self.dir / 'ddp.pt')
    torch.save(self.state, self.dir / 'consolidated.pth')
    safetensors.torch.save_file(self.state, str(self.dir / 'model.safetensors'))
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

  def test_use_ema(self):
    ema = {k: v * 2 for k, v in self.state.items()}
    torch.save({'model': self.state, 'ema': ema}, self.dir / 'ckpt.pt')
    out = convert.convert_file(self.dir / 'ckpt.pt', self.dir / 'out', self.config,
                               use_ema=True)
    _, params = convert.load_llamagen(out)
    np.testing.assert_allclose(params['norm']['weight'], ema['norm.weight'].numpy())

  def test_bfloat16_output(self):
    torch.save({'model': {k: v.bfloat16() for k, v in self.state.items()}},
               self.dir / 'ckpt.pt')
    config = tiny_config('c2i', dtype='bfloat16')
    out = convert.convert_file(self.dir / 'ckpt.pt', self.dir / 'out', config)
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
    torch.save({'model': self.state}, self.dir / 'ckpt.pt')
    wrong = tiny_config('c2i', dim=32, n_head=2)
    with self.assertRaises(common.CheckpointMismatchError) as ctx:
      convert.convert_file(self.dir / 'ckpt.pt', self.dir / 'out', wrong)
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
    state['extra.weight'] = torch.zeros(3)
    torch.save({'model': state}, self.dir / 'ckpt.pt')
    with self.assertRaises(common.CheckpointMismatchError) as ctx:
      convert.convert_file(self.dir / 'ckpt.pt', self.dir / 'out', self.config)
    message = str(ctx.exception)
    self.assertIn('layers.1.ffn_norm.weight (expected shape (64,))', message)
    self.assertIn('extra.weight (shape (3,))', message)
    with self.assertRaisesRegex(common.CheckpointMismatchError,
                                'cls_embedding.cap_proj.fc1.weight'):
      convert.convert_file(self.dir / 'ckpt.pt', self.dir / 'out', tiny_config('t2i'))
    self._assert_no_output()

  def test_truncated_file(self):
    torch.save({'model': self.state}, self.dir / 'ckpt.pt')
    data = (self.dir / 'ckpt.pt').read_bytes()
    (self.dir / 'ckpt.pt').write_bytes(data[: len(data) // 3])
    with self.assertRaisesRegex(common.CheckpointReadError, 'ckpt.pt.*truncated'):
      convert.convert_file(self.dir / 'ckpt.pt', self.dir / 'out', self.config)
    self._assert_no_output()

  def test_command_line(self):
    torch.save({'model': self.state}, self.dir / 'ckpt.pt')
    argv = ['llamagen', f'--input={self.dir / "ckpt.pt"}', f'--output={self.dir / "out"}',
            '--config=GPT-B', '--model_type=c2i', '--image_size=64', '--set=n_layer=2',
            '--set=n_head=4', '--set=dim=64', '--set=vocab_size=64', '--set=num_classes=10',
            '--set=caption_dim=24']
    flag_values = flags.FlagValues()
    convert.define_flags(flag_values)
    flag_values(argv)
    convert.main(argv, flag_values)
    model, _ = convert.load_llamagen(self.dir / 'out')
    self.assertEqual(model.config, self.config)


if __name__ == '__main__':
  absltest.main()
