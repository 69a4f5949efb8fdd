"""Tests for models/eagle.py and converters/lantern_drafter.py.

The PyTorch reference (`tests/torch_reference_eagle.py`: EAGLE-1 (Li et al. 2024)
as LANTERN's drafters (jadohu/LANTERN) implement it: fc on [embedding, target
feature], one decoder layer (LlamaGen: no input norm, interleaved 2D RoPE with
LANTERN's table; Lumina: input norm, per-head q/k LayerNorm, rotate_half 1D
RoPE), no final norm, target head) needs torch, as do `pytorch_model.bin`
files; the engine-path and safetensors converter tests run without it.
"""

import functools
import json
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

from specdec_jax import drafting
from specdec_jax.app import toy
from specdec_jax.converters import common
from specdec_jax.converters import hf_streaming
from specdec_jax.converters import lantern_drafter as convert
from specdec_jax.models import chameleon
from specdec_jax.models import eagle
from specdec_jax.models import llamagen
from tests import torch_reference as ref
from tests import torch_reference_eagle as ref_eagle

RTOL = 1e-4
BATCH, LENGTH = 2, 7


def config_json(kind, layers=1):
  """A LANTERN-style config.json for a tiny drafter."""
  base = {'hidden_size': 64, 'num_attention_heads': 4, 'num_key_value_heads': 4,
          'intermediate_size': 96, 'vocab_size': 48, 'num_hidden_layers': layers,
          'hidden_act': 'silu', 'rope_theta': 10000.0}
  if kind == 'llamagen':
    base.update(rms_norm_eps=1e-6, input_type='c2i', caption_dim=2048)  # 576 tokens, cls 0
  else:
    base.update(rms_norm_eps=1e-5, model_type='chameleon', bias=True)
  return base


def random_drafter_state(config, qk_norm_rows=1, seed=0):
  """Random float32 weights (numpy) in LANTERN's key layout; q/k norms (1, D) like Lumina."""
  rng = np.random.default_rng(seed)
  state = {}
  for key, shape in convert.expected_shapes(config).items():
    if 'norm' in key and key.endswith('weight'):
      shape = (qk_norm_rows, shape[1]) if '_norm.' in key and 'self_attn' in key else shape
      value = 1.0 + 0.1 * rng.standard_normal(shape)
    elif 'norm' in key and key.endswith('bias'):
      value = 0.1 * rng.standard_normal((qk_norm_rows, shape[1]))
    elif key == 'fc.bias':
      value = 0.1 * rng.standard_normal(shape)
    elif key == 'embed_tokens.weight':
      value = rng.standard_normal(shape)
    else:
      value = rng.standard_normal(shape) * shape[-1] ** -0.5
    state[key] = value.astype(np.float32)
  return state


def rel_err(actual, expected):
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  return np.max(np.abs(actual - expected)) / np.max(np.abs(expected))


def _tempdir(test):
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return pathlib.Path(path)


def write_drafter_dir(path, kind, state, weights='model.safetensors', layers=1):
  """config.json + weights; `pytorch_model.bin` (the released name) needs torch."""
  path.mkdir(parents=True, exist_ok=True)
  (path / 'config.json').write_text(json.dumps(config_json(kind, layers)))
  if weights.endswith('.bin'):
    ref.torch.save({k: ref.as_torch(v) for k, v in state.items()}, path / weights)
  else:
    hf_streaming.write_safetensors(path / weights, state)
  return path


@functools.lru_cache(maxsize=None)
def fixture(kind, layers=1):
  """(config, state dict, head weight [V, E], tokens [B, L], hidden [B, L, E]), numpy."""
  config = convert.drafter_config_from_json(config_json(kind, layers), kind)
  state = random_drafter_state(config)
  rng = np.random.default_rng(5)
  head = (rng.standard_normal((config.vocab_size, config.hidden_size)) * 0.2).astype(np.float32)
  tokens = rng.integers(0, config.vocab_size, (BATCH, LENGTH))
  hidden = rng.standard_normal((BATCH, LENGTH, config.hidden_size)).astype(np.float32)
  return config, state, head, tokens, hidden


@functools.partial(jax.jit, static_argnums=0)
def _jit_forward(model, params, cache, tokens, hidden, window_mask, depths):
  return model.forward(params, cache, tokens, hidden, window_mask, depths)


def jit_forward(model, params, cache, tokens, hidden, window_mask=None, depths=None):
  num_new = tokens.shape[1]
  if window_mask is None:
    window_mask = jnp.tril(jnp.ones((num_new, num_new), bool))
  if depths is None:
    depths = jnp.arange(num_new, dtype=jnp.int32)
  return _jit_forward(model, params, cache, tokens, hidden, window_mask, depths)


# ------------------------------------------------------------- tests ---


class ConfigTest(absltest.TestCase):

  def test_llamagen_drafter_matches_lantern_config(self):
    target = llamagen.gpt_config('GPT-XL', model_type='t2i', image_size=256)
    config = eagle.llamagen_drafter_config(target)
    self.assertEqual((config.hidden_size, config.num_heads, config.intermediate_size),
                     (1280, 20, 3584))
    self.assertEqual((config.cls_token_num, config.grid_size, config.rms_norm_eps),
                     (119, 16, 1e-6))
    c2i = eagle.llamagen_drafter_config(llamagen.gpt_config('GPT-B', image_size=384))
    self.assertEqual((c2i.cls_token_num, c2i.grid_size), (0, 24))
    from_json = convert.drafter_config_from_json(
        dict(config_json('llamagen'), input_type='t2i2'))
    self.assertEqual((from_json.grid_size, from_json.cls_token_num), (32, 119))
    self.assertFalse(from_json.input_layernorm)
    # LANTERN's LlamaGen drafter uses RoPE base 10000 whatever config.json says.
    with self.assertLogs(level='WARNING') as logs:
      based = convert.drafter_config_from_json(dict(config_json('llamagen'), rope_theta=500.0))
    self.assertEqual(based.rope_theta, 10000.0)
    self.assertIn('ignores it', logs.output[0])
    lumina = convert.drafter_config_from_json(dict(config_json('lumina'), rope_theta=500.0))
    self.assertEqual(lumina.rope_theta, 500.0)
    no_type = dict(config_json('llamagen'))
    del no_type['input_type']
    with self.assertRaisesRegex(ValueError, r"must name its input_type, one of \['c2i', 't2i'"):
      convert.drafter_config_from_json(no_type, 'llamagen')
    lumina = convert.drafter_config_from_json(config_json('lumina'))
    self.assertTrue(lumina.input_layernorm and lumina.qk_norm)
    self.assertEqual(lumina.rope, '1d')

  def test_embedding_sources(self):
    target = {'tok_embeddings': {'embedding': np.ones((5, 3))},
              'output': {'kernel': np.arange(15.0).reshape(3, 5)}}
    np.testing.assert_array_equal(eagle.embedding_from_llamagen(target), np.ones((5, 3)))
    np.testing.assert_array_equal(eagle.embedding_from_llamagen(target, 'output'),
                                  np.arange(15.0).reshape(3, 5).T)
    with self.assertRaisesRegex(ValueError, "source must be one of"):
      eagle.embedding_from_llamagen(target, 'lm_head')

  def test_lumina_7b_key_shapes(self):
    shapes = convert.expected_shapes(eagle.lumina_drafter_config())
    self.assertEqual(shapes['fc.weight'], (4096, 8192))
    self.assertEqual(shapes['layers.0.self_attn.q_norm.weight'], (32, 128))
    self.assertIn('layers.0.input_layernorm.weight', shapes)
    self.assertLen(shapes, 16)


@ref.requires_torch
class ParityTest(parameterized.TestCase):

  @parameterized.parameters(('llamagen', 1), ('lumina', 1), ('llamagen', 2))
  def test_converted_drafter_matches_torch(self, kind, layers):
    """Two layers: EAGLE's layers after the first normalise their input (the released
    drafters have one layer, so only this test sees layer 1)."""
    config, state, head, tokens, hidden = fixture(kind, layers)
    folder = write_drafter_dir(_tempdir(self) / 'drafter', kind, state,
                               weights='pytorch_model.bin', layers=layers)
    out = convert.convert_dir(folder, folder.parent / 'converted')  # defaults: lossless
    model, params = convert.load_drafter(out, head.T)
    self.assertEqual(model.config, config)
    expected_logits, expected_features = ref_eagle.drafter_forward(
        state, config_json(kind, layers), kind, head, tokens, hidden)
    result = jit_forward(model, params, model.init_cache(BATCH, LENGTH + 3),
                         jnp.asarray(tokens, jnp.int32), jnp.asarray(hidden))
    chex.assert_shape(result.logits, (BATCH, LENGTH, config.vocab_size))
    self.assertLess(rel_err(result.logits, expected_logits), RTOL)
    self.assertLess(rel_err(result.hidden, expected_features), RTOL)
    np.testing.assert_array_equal(result.cache.lengths, LENGTH)

  def test_rope_2d_table_with_lantern_padding(self):
    # The drafter's table equals LANTERN's, including the zero rows past the grid.
    cos_ref, sin_ref = ref.rope_2d_table(4, 16, 10000.0, 2, trailing_zeros=10)
    positions = jnp.arange(2 + 16 + 10)[None]
    cos, sin = jax.jit(llamagen.rope_2d, static_argnums=(1, 2, 3))(positions, 16, 4, 2)
    np.testing.assert_allclose(cos[0], cos_ref.numpy(), atol=1e-6)
    np.testing.assert_allclose(sin[0], sin_ref.numpy(), atol=1e-6)


class EnginePathTest(absltest.TestCase):

  def test_prefill_then_steps_and_tree_match_full_forward(self):
    config, state, head, tokens, hidden = fixture('llamagen')
    model = eagle.EagleDrafter(config)
    params = eagle.attach_head(convert.convert_drafter(state, config), head.T)
    tokens, hidden = jnp.asarray(tokens, jnp.int32), jnp.asarray(hidden)
    cache = model.init_cache(BATCH, LENGTH + 3)
    full = jit_forward(model, params, cache, tokens, hidden)
    # prefill on the first 4 pairs, then 3 single steps.
    out = jit_forward(model, params, cache, tokens[:, :4], hidden[:, :4])
    logits = [out.logits]
    for t in range(4, LENGTH):
      out = jit_forward(model, params, out.cache, tokens[:, t: t + 1], hidden[:, t: t + 1])
      logits.append(out.logits)
    self.assertLess(rel_err(jnp.concatenate(logits, 1), full.logits), RTOL)
    # Tree after 4 pairs: slot 4 = (t4, h4), two siblings at depth 1 fed
    # the drafter's own feature (EAGLE's deeper steps), not seeing each other.
    prefix = jit_forward(model, params, cache, tokens[:, :4], hidden[:, :4]).cache
    step = jit_forward(model, params, prefix, tokens[:, 4:5], hidden[:, 4:5])
    feature = step.hidden  # [B, 1, E]
    window_mask = jnp.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]], bool)
    depths = jnp.array([0, 1, 1, 0], jnp.int32)
    tree_tokens = jnp.concatenate([tokens[:, 4:5], tokens[:, 5:6], tokens[:, 6:7],
                                   tokens[:, 0:1]], 1)
    tree_hidden = jnp.concatenate([hidden[:, 4:5], feature, feature, hidden[:, 0:1]], 1)
    tree = jit_forward(model, params, prefix, tree_tokens, tree_hidden, window_mask, depths)
    self.assertLess(rel_err(tree.logits[:, 0], step.logits[:, 0]), RTOL)
    for sibling, column in ((1, 5), (2, 6)):
      chain = jit_forward(model, params, step.cache, tokens[:, column: column + 1], feature)
      self.assertLess(rel_err(tree.logits[:, sibling], chain.logits[:, 0]), RTOL)

  def test_logits_at_one_position_per_row(self):
    # The catch-up's head at one position per row: the full forward's logits
    # there, the same hidden states and cache; the toy EAGLE head (no
    # `head_at_one_position`) gets the same through `drafting.Drafter`'s gather.
    config, state, head, tokens, hidden = fixture('llamagen')
    model = eagle.EagleDrafter(config)
    params = eagle.attach_head(convert.convert_drafter(state, config), head.T)
    tokens, hidden = jnp.asarray(tokens, jnp.int32), jnp.asarray(hidden)
    cache = model.init_cache(BATCH, LENGTH)
    at = jnp.array([LENGTH - 1, 2], jnp.int32)
    full = model.forward(params, cache, tokens, hidden)
    for drafter in (model, drafting.Drafter(model, drafting.EAGLE)):
      one = drafter.forward(params, cache, tokens, hidden, logits_at=at)
      self.assertEqual(one.logits.shape, (BATCH, 1, config.vocab_size))
      want = jnp.take_along_axis(full.logits, at[:, None, None], axis=1)
      self.assertLess(rel_err(one.logits, want), RTOL)
      np.testing.assert_allclose(np.asarray(one.hidden), np.asarray(full.hidden), rtol=RTOL)
      np.testing.assert_array_equal(np.asarray(one.cache.lengths), np.asarray(full.cache.lengths))
    toy_head = toy.ToyEagle(vocab=4, num_classes=2)
    toy_params = toy_head.init_params(jax.random.key(0))
    toy_cache = toy_head.init_cache(BATCH, 4)
    toy_tokens = jnp.array([[1, 2, 3], [3, 0, 1]], jnp.int32)
    features = jax.random.normal(jax.random.key(1), (BATCH, 3, toy_head.hidden_size))
    toy_full = toy_head.forward(toy_params, toy_cache, toy_tokens, features)
    toy_one = drafting.Drafter(toy_head, drafting.EAGLE).forward(
        toy_params, toy_cache, toy_tokens, features, logits_at=jnp.array([0, 2]))
    np.testing.assert_allclose(np.asarray(toy_one.logits[:, 0]),
                               np.asarray(toy_full.logits[jnp.arange(BATCH), jnp.array([0, 2])]))
    with self.assertRaisesRegex(ValueError, r'logits_at must be int32\[B\] = \[2\]'):
      model.forward(params, cache, tokens, hidden, logits_at=jnp.zeros((2, 1), jnp.int32))

  def test_t2i_drafter_prefix_is_the_condition_features_with_token_zero(self):
    """LANTERN's t2i drafter (grid 16, 119 condition rows) first consumes the
    target's 119 condition features paired with token 0 (`initialize_tree`), so
    image token n is at position 119 + n. The engine's prefill (`prefix_pairs`)
    then the image pairs give LANTERN's logits; without the prefix (the engine
    before) they are far off (the negative control)."""
    cfg_json = dict(config_json('llamagen'), input_type='t2i')
    config = convert.drafter_config_from_json(cfg_json, 'llamagen')
    self.assertEqual((config.grid_size, config.cls_token_num), (16, 119))
    state = random_drafter_state(config)
    rng = np.random.default_rng(7)
    head = (rng.standard_normal((config.vocab_size, config.hidden_size)) * 0.2).astype(np.float32)
    image = rng.integers(0, config.vocab_size, (BATCH, 5))
    hidden = rng.standard_normal((BATCH, 119 + 5, config.hidden_size)).astype(np.float32)
    tokens = np.concatenate([np.zeros((BATCH, 119), np.int64), image], axis=1)
    expected, _ = ref_eagle.drafter_forward(state, cfg_json, 'llamagen', head, tokens, hidden,
                                            grid=16, cls_token_num=119)
    model = eagle.EagleDrafter(config)
    params = eagle.attach_head(convert.convert_drafter(state, config), head.T)
    drafter = drafting.Drafter(model, drafting.EAGLE)
    target_prefix = jnp.asarray(hidden[:, :120])  # the target's 120 condition positions
    fresh = model.init_cache(BATCH, 130)
    prefilled = drafter.prefill(params, fresh, None, target_prefix)
    np.testing.assert_array_equal(prefilled.lengths, 119)
    image_pairs = (jnp.asarray(image, jnp.int32), jnp.asarray(hidden[:, 119:]))
    got = model.forward(params, prefilled, *image_pairs).logits
    self.assertLess(rel_err(got, expected[:, 119:]), RTOL)
    unprefixed = model.forward(params, fresh, *image_pairs).logits
    self.assertGreater(rel_err(unprefixed, expected[:, 119:]), 0.1)
    # c2i and 1D (Lumina) drafters start empty.
    for kind in ('llamagen', 'lumina'):
      other = eagle.EagleDrafter(convert.drafter_config_from_json(config_json(kind), kind))
      self.assertIsNone(other.prefix_pairs(None, target_prefix))
    with self.assertRaisesRegex(ValueError, 'the target prefix must have 120; got 7'):
      model.prefix_pairs(None, target_prefix[:, :7])

  def test_lumina_drafter_prefix_is_the_prompt_with_its_padding(self):
    """LANTERN's Lumina-mGPT drafter first consumes the prompt (feature t with prompt
    token t + 1; left padding masked, positions mask.cumsum - 1). The engine's
    prefill (`prefix_pairs` with the prompt's mask) then the catch-up and image
    pairs give the torch reference's logits on a padded and an unpadded row;
    without the prefix they are far off (the negative control)."""
    cfg_json = config_json('lumina')
    config, state, head, _, _ = fixture('lumina')
    rng = np.random.default_rng(11)
    prompt_length, image_length = 6, 4
    prompt = rng.integers(0, config.vocab_size, (BATCH, prompt_length))
    mask = np.ones((BATCH, prompt_length), bool)
    mask[1, :2] = False  # row 1: two padding slots on the left
    image = rng.integers(0, config.vocab_size, (BATCH, image_length))
    length = prompt_length + image_length - 1  # LANTERN's drafter call: ids[:, 1:]
    hidden = rng.standard_normal((BATCH, length, config.hidden_size)).astype(np.float32)
    tokens = np.concatenate([prompt, image], axis=1)[:, 1:]
    slot_mask = np.concatenate([mask, np.ones((BATCH, image_length), bool)], axis=1)[:, :length]
    expected, _ = ref_eagle.drafter_forward(state, cfg_json, 'lumina', head, tokens, hidden,
                                            mask=slot_mask)
    model = eagle.EagleDrafter(config)
    params = eagle.attach_head(convert.convert_drafter(state, config), head.T)
    cond = chameleon.ChameleonPrompt(jnp.asarray(prompt, jnp.int32), jnp.asarray(mask))
    fresh = model.init_cache(BATCH, 16)
    prefilled = drafting.Drafter(model, drafting.EAGLE).prefill(
        params, fresh, cond, jnp.asarray(hidden[:, :prompt_length]))
    np.testing.assert_array_equal(prefilled.lengths, prompt_length - 1)
    pairs = (jnp.asarray(image, jnp.int32), jnp.asarray(hidden[:, prompt_length - 1:]))
    want = expected[:, prompt_length - 1:]  # the catch-up slot and the image pairs
    self.assertLess(rel_err(model.forward(params, prefilled, *pairs).logits, want), RTOL)
    self.assertGreater(rel_err(model.forward(params, fresh, *pairs).logits, want), 0.1)
    unpadded = chameleon.ChameleonPrompt(cond.tokens)
    self.assertLen(model.prefix_pairs(unpadded, jnp.asarray(hidden[:, :prompt_length])), 2)
    with self.assertRaisesRegex(ValueError, 'must cover the prompt tokens'):
      model.prefix_pairs(cond, jnp.asarray(hidden[:, :3]))

  def test_drafter_table_must_fit_the_target(self):
    t2i = llamagen.LlamaGenGPT(llamagen.gpt_config('GPT-XL', model_type='t2i', image_size=256))
    fits = eagle.EagleDrafter(eagle.llamagen_drafter_config(t2i.config))
    fits.check_target(t2i)
    for input_type in ('c2i', 't2i2'):
      other = eagle.EagleDrafter(convert.drafter_config_from_json(
          dict(config_json('llamagen'), input_type=input_type), 'llamagen'))
      with self.assertRaisesRegex(ValueError, r'does not fit the target \(grid 16, 120 '
                                  r'condition positions.*input_type'):
        other.check_target(t2i)
    eagle.EagleDrafter(convert.drafter_config_from_json(config_json('lumina'))).check_target(t2i)

  def test_input_errors(self):
    config, _, _, _, _ = fixture('llamagen')
    model = eagle.EagleDrafter(config)
    cache = model.init_cache(2, 4)
    with self.assertRaisesRegex(ValueError, r'target_hidden \[B, T, 64\]'):
      model.forward(None, cache, jnp.zeros((2, 3), jnp.int32), jnp.zeros((2, 3, 32)))
    with self.assertRaisesRegex(ValueError, 'capacity 4 is too small'):
      model.prefill(None, cache, jnp.zeros((2, 5), jnp.int32), jnp.zeros((2, 5, 64)))


class ConverterTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = _tempdir(self)

  def _assert_only(self, *names):
    self.assertEqual(sorted(p.name for p in self.dir.iterdir()), sorted(names))

  def test_safetensors_come_first_and_meta(self):
    """model.safetensors is read even beside a pytorch_model.bin (here a Git LFS
    pointer, as a clone without LFS leaves), as `hf_streaming.open_checkpoint` does."""
    config, state, head, _, _ = fixture('lumina')
    folder = write_drafter_dir(self.dir / 'drafter', 'lumina', state,
                               weights='model.safetensors')
    (folder / 'pytorch_model.bin').write_text(
        'version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1\n')
    out = convert.convert_dir(folder, self.dir / 'out', dtype='float32')
    model, params = convert.load_drafter(out, head.T)
    chex.assert_trees_all_close(
        params, eagle.attach_head(convert.convert_drafter(state, config), head.T))
    meta = common.read_meta(out)
    self.assertEqual(meta['source_files'][0]['sha256'],
                     common.sha256_file(folder / 'model.safetensors'))
    self.assertEqual(model.config.qk_norm, True)
    with self.assertRaisesRegex(ValueError, r'head_kernel must have shape \(64, 48\)'):
      convert.load_drafter(out, head)
    meta = common.read_meta(out)  # a config that does not fit the stored params
    meta['config']['num_layers'] += 1
    (pathlib.Path(out) / common.META_FILENAME).write_text(json.dumps(meta))
    with self.assertRaisesRegex(common.CheckpointMismatchError, 'EAGLE drafter.*missing'):
      convert.load_drafter(out, head.T)

  def test_strict_keys(self):
    _, state, _, _, _ = fixture('llamagen')
    bad = dict(state)
    del bad['layers.0.post_attention_layernorm.weight']
    bad['layers.0.input_layernorm.weight'] = np.ones(64, np.float32)  # LlamaGen layer 0 has none
    folder = write_drafter_dir(self.dir / 'drafter', 'llamagen', bad)
    with self.assertRaises(common.CheckpointMismatchError) as ctx:
      convert.convert_dir(folder, self.dir / 'out')
    message = str(ctx.exception)
    self.assertIn('layers.0.post_attention_layernorm.weight (expected shape (64,))', message)
    self.assertIn('unexpected keys:\n    layers.0.input_layernorm.weight', message)
    self.assertIn('EAGLE-1 drafter (1 layer(s), hidden 64', message)
    self._assert_only('drafter')

  def test_wrong_config_json(self):
    _, state, _, _, _ = fixture('llamagen')
    folder = write_drafter_dir(self.dir / 'drafter', 'llamagen', state)
    (folder / 'config.json').write_text(json.dumps(
        dict(config_json('llamagen'), intermediate_size=128)))
    with self.assertRaisesRegex(common.CheckpointMismatchError,
                                r'mlp.gate_proj.weight: expected \(128, 64\), found \(96, 64\)'):
      convert.convert_dir(folder, self.dir / 'out')
    self._assert_only('drafter')

  @ref.requires_torch
  def test_bad_folders(self):
    with self.assertRaisesRegex(common.CheckpointReadError, 'does not exist'):
      convert.convert_dir(self.dir / 'missing', self.dir / 'out')
    folder = self.dir / 'drafter'
    folder.mkdir()
    (folder / 'pytorch_model.bin').write_bytes(b'x')  # a file where the folder belongs
    with self.assertRaisesRegex(common.CheckpointReadError,
                                r"pytorch_model.bin' is a file; pass the drafter folder"):
      convert.convert_dir(folder / 'pytorch_model.bin', self.dir / 'out')
    (folder / 'pytorch_model.bin').unlink()
    (folder / 'config.json').write_text(json.dumps(config_json('llamagen')))
    with self.assertRaisesRegex(common.CheckpointReadError, 'pytorch_model.bin'):
      convert.convert_dir(folder, self.dir / 'out')
    ref.torch.save({k: ref.as_torch(v) for k, v in fixture('llamagen')[1].items()},
                   folder / 'pytorch_model.bin')
    data = (folder / 'pytorch_model.bin').read_bytes()
    (folder / 'pytorch_model.bin').write_bytes(data[: len(data) // 2])
    with self.assertRaisesRegex(common.CheckpointReadError, 'pytorch_model.bin.*truncated'):
      convert.convert_dir(folder, self.dir / 'out')
    self._assert_only('drafter')

  def test_command_line(self):
    _, state, _, _, _ = fixture('llamagen')
    folder = write_drafter_dir(self.dir / 'drafter', 'llamagen', state)
    argv = ['lantern_drafter', f'--input={folder}', f'--output={self.dir / "out"}',
            '--dtype=bfloat16']
    flag_values = flags.FlagValues()
    convert.define_flags(flag_values)
    flag_values(argv)
    convert.main(argv, flag_values)
    params, meta = common.load_params(self.dir / 'out')
    self.assertEqual(params['fc']['kernel'].dtype, jnp.bfloat16)
    self.assertEqual(meta['config']['dtype'], 'bfloat16')


if __name__ == '__main__':
  absltest.main()
