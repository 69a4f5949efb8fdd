"""Tests for models/janus.py and converters/janus.py (Janus-Pro generation path).

Parity is against an independent PyTorch forward of the original generation
path (`tests/torch_reference_chameleon_janus.py`): text prompt through the Llama embedding,
image tokens through gen_embed -> gen_aligner, HF Llama blocks, final norm,
gen_head. Random weights use the original DeepSeek key layout, saved as two
safetensors shards + index, or as two `pytorch_model-*.bin` shards + index
(the released format; needs torch). Config and layout checks run without
torch.
"""

import json
import pathlib
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.converters import common
from specdec_jax.converters import hf_streaming
from specdec_jax.converters import janus as converter
from specdec_jax.models import janus
from tests import torch_reference as ref
from tests import torch_reference_chameleon_janus as ref_chameleon_janus

# Released config.json layout, tiny dims (the LlamaConfig fields the release
# also leaves out, rms_norm_eps and rope_theta, take HF defaults).
TINY_HF = {
    'language_config': dict(vocab_size=64, hidden_size=32, intermediate_size=48,
                            num_hidden_layers=2, num_attention_heads=4,
                            max_position_embeddings=128),
    'gen_head_config': {'params': dict(image_token_embed=24, image_token_size=40, n_embed=32)},
    'gen_aligner_config': {'params': dict(input_dim=8, n_embed=32, depth=2)},
}
LM = TINY_HF['language_config']
PAD_ID = 5


def _fast_jit(fn):
  """jax.jit with cheap XLA:CPU compilation (the engine's FAST_COMPILE options)."""
  from specdec_jax import decode  # pylint: disable=g-import-not-at-top
  return jax.jit(fn, compiler_options=decode.FAST_COMPILE)


def _rel_err(actual, expected):
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  return np.abs(actual - expected).max() / np.abs(expected).max()


def random_janus_state(seed=0):
  """Random float32 weights in the original Janus key layout, with keys the converter skips."""
  rng = np.random.default_rng(seed)
  rand = lambda *shape, scale=0.2: (rng.standard_normal(shape) * scale).astype(np.float32)
  e, f = LM['hidden_size'], LM['intermediate_size']
  g, v = 24, 40
  prefix = 'language_model.model.'
  state = {prefix + 'embed_tokens.weight': rand(LM['vocab_size'], e, scale=1.0)}
  for i in range(LM['num_hidden_layers']):
    p = f'{prefix}layers.{i}.'
    state.update({p + f'self_attn.{n}_proj.weight': rand(e, e) for n in 'qkvo'})
    state.update({p + 'mlp.gate_proj.weight': rand(f, e), p + 'mlp.up_proj.weight': rand(f, e),
                  p + 'mlp.down_proj.weight': rand(e, f),
                  p + 'input_layernorm.weight': 1 + rand(e),
                  p + 'post_attention_layernorm.weight': 1 + rand(e)})
  state.update({
      prefix + 'norm.weight': 1 + rand(e),
      'gen_embed.weight': rand(v, 8, scale=1.0),
      'gen_aligner.layers.0.weight': rand(e, 8, scale=0.5),
      'gen_aligner.layers.0.bias': rand(e),
      'gen_aligner.layers.2.weight': rand(e, e),
      'gen_aligner.layers.2.bias': rand(e),
      'gen_head.output_mlp_projector.weight': rand(g, e),
      'gen_head.output_mlp_projector.bias': rand(g),
      'gen_head.vision_head.weight': rand(v, g),
      'gen_head.vision_head.bias': rand(v),
      # Present in the release, not part of the generation path:
      'language_model.lm_head.weight': rand(LM['vocab_size'], e),
      'vision_model.vision_tower.patch_embed.proj.weight': rand(4, 3, 2, 2),
      'aligner.layers.0.weight': rand(e, 4),
      'gen_vision_model.quantize.embedding.weight': rand(v, 8),
      'gen_vision_model.quantize.codebook_used': np.zeros(v, np.float32),
  })
  return state


def torch_janus_logits(state, prompt_ids, image_ids):
  """Reference generation-path forward -> float32 image logits [B, P + N, V]."""
  return ref_chameleon_janus.janus_logits(state, LM, prompt_ids, image_ids)


def transformers_native_names(state):
  """The original keys renamed as transformers' Janus conversion names them."""
  renames = (('language_model.model.', 'model.language_model.'),
             ('language_model.lm_head.', 'lm_head.'),
             ('gen_embed.', 'model.generation_embeddings.'),
             ('gen_aligner.layers.0.', 'model.generation_aligner.fc1.'),
             ('gen_aligner.layers.2.', 'model.generation_aligner.hidden_layers.0.'),
             ('gen_head.output_mlp_projector.', 'model.generation_head.proj_out.'),
             ('gen_head.', 'model.generation_head.'),
             ('gen_vision_model.', 'model.vqmodel.'),
             ('vision_model.', 'model.vision_model.'),
             ('aligner.', 'model.aligner.'))
  out = {}
  for name, value in state.items():
    for old, new in renames:
      if name.startswith(old):
        name = new + name[len(old):]
        break
    out[name] = value
  return out


def write_checkpoint(folder, state, file_format, config=None):
  """Two shards + index + config.json; 'bin' shards need torch."""
  folder = pathlib.Path(folder)
  folder.mkdir(parents=True)
  with open(folder / 'config.json', 'w') as f:
    json.dump(TINY_HF if config is None else config, f)
  if file_format == 'safetensors':
    total = sum(v.nbytes for v in state.values())
    hf_streaming.write_sharded_safetensors(state.items(), folder,
                                           max_shard_bytes=int(total * 0.6))
    return
  names = sorted(state)
  weight_map = {}
  for k, group in enumerate((names[::2], names[1::2])):
    shard = f'pytorch_model-{k + 1:05d}-of-00002.bin'
    ref.torch.save({n: ref.as_torch(state[n]) for n in group}, folder / shard)
    weight_map.update({n: shard for n in group})
  with open(folder / hf_streaming.TORCH_INDEX, 'w') as f:
    json.dump({'metadata': {}, 'weight_map': weight_map}, f)


class JanusTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.state = random_janus_state()
    cls.tmp = tempfile.TemporaryDirectory()
    root = pathlib.Path(cls.tmp.name)
    write_checkpoint(root / 'st', cls.state, 'safetensors')
    converter.convert(root / 'st', root / 'jax')  # the defaults: lossless (fp32 stays fp32)
    cls.model, cls.params = converter.load_converted(root / 'jax')
    cls.root = root

  @classmethod
  def tearDownClass(cls):
    cls.tmp.cleanup()
    super().tearDownClass()

  def test_converted_config_and_meta(self):
    c = self.model.config
    self.assertEqual((c.text_vocab_size, c.image_vocab_size, c.gen_head_dim, c.rms_norm_eps),
                     (64, 40, 24, 1e-6))
    meta = common.read_meta(self.root / 'jax')
    self.assertLen(meta['source_files'], 4)  # 2 shards, index, config.json
    self.assertNotIn('lm_head', self.params)

  def test_meta_hashes_the_config_file_read(self):
    """With --config <file>, that file is hashed (before: no config file at all)."""
    other = pathlib.Path(tempfile.mkdtemp(dir=self.root)) / 'config.json'
    other.write_text(json.dumps(TINY_HF))
    converter.convert(self.root / 'st', self.root / 'jax_config', config=str(other))
    hashed = {f['path']: f['sha256'] for f in common.read_meta(self.root / 'jax_config')[
        'source_files']}
    self.assertEqual(hashed.get(str(other.absolute())), common.sha256_file(other))
    self.assertNotIn(str((self.root / 'st' / 'config.json').absolute()), hashed)
    self.assertLen(hashed, 4)  # 2 shards, index, the config read

  @ref.requires_torch
  def test_released_bin_shards_convert_to_the_same_params(self):
    write_checkpoint(self.root / 'bin', self.state, 'bin')
    converter.convert(self.root / 'bin', self.root / 'jax_bin')
    _, params = converter.load_converted(self.root / 'jax_bin')
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, self.params)

  @ref.requires_torch
  def test_engine_path_matches_teacher_forced_torch(self):
    """Prefill, then a 1-token and a 4-token window, equal the full torch forward."""
    model, params = self.model, self.params
    prompts = [[0, 11, 12, 13, 14, 9], [0, 21, 22, 9]]  # BOS ... <begin_of_image>=9
    image = np.array([[3, 17, 39, 0, 25], [8, 8, 1, 30, 2]])
    cond = janus.build_prompt(prompts, pad_id=PAD_ID, cfg=True)
    # Unconditional rows keep BOS and <begin_of_image>, pad the text.
    np.testing.assert_array_equal(cond.tokens[2], [0, PAD_ID, PAD_ID, PAD_ID, PAD_ID, 9])
    np.testing.assert_array_equal(cond.tokens[3, -4:], [0, PAD_ID, PAD_ID, 9])
    np.testing.assert_array_equal(cond.mask.sum(axis=1), [6, 4, 6, 4])  # left-padded rows
    image_rows = np.concatenate([image, image])  # both CFG halves get the same tokens
    cache = model.init_cache(4, 16)
    out = _fast_jit(model.prefill)(params, cache, cond)
    forward = _fast_jit(model.forward)
    steps = [out]
    for chunk in (image_rows[:, :1], image_rows[:, 1:5]):
      steps.append(forward(params, steps[-1].cache, jnp.asarray(chunk, jnp.int32)))
    for row in range(4):
      real = int(cond.mask[row].sum())
      ids = np.asarray(cond.tokens[row, -real:])
      expected = torch_janus_logits(self.state, ids[None], image_rows[row:row + 1, :4])[0]
      got = np.concatenate([steps[0].logits[row, -real:], steps[1].logits[row],
                            steps[2].logits[row, :3]])
      self.assertLess(_rel_err(got, expected), 1e-4, f'row {row}')
    self.assertEqual(steps[-1].logits.shape, (4, 4, 40))
    np.testing.assert_array_equal(steps[-1].cache.lengths, [11] * 4)

  @ref.requires_torch
  def test_unpadded_prompt_single_forward_parity(self):
    prompt = janus.build_prompt([[0, 11, 12, 9]], pad_id=PAD_ID, cfg=False)
    self.assertIsNone(prompt.mask)
    out = _fast_jit(self.model.prefill)(self.params, self.model.init_cache(1, 8), prompt)
    expected = torch_janus_logits(self.state, [[0, 11, 12, 9]], np.zeros((1, 0), np.int64))
    self.assertLess(_rel_err(out.logits, expected), 1e-4)

  @ref.requires_torch
  def test_engine_jacobi_with_cfg_reproduces_greedy_reference(self):
    """decode.generate (Jacobi window 3, lossless, CFG 5) at temperature 0 gives
    exactly the greedy sequence of the torch reference with the original's CFG
    (unconditional prompt = text replaced by pads, attended as tokens)."""
    from specdec_jax import decode, logits, rules  # pylint: disable=g-import-not-at-top
    prompt_ids = [0, 11, 12, 13, 9]
    cond = janus.build_prompt([prompt_ids], pad_id=PAD_ID, cfg=True)
    num_tokens = 6
    result = decode.generate(
        self.model, self.params, cond, num_tokens=num_tokens, key=jax.random.key(0),
        mode=decode.Jacobi(3), rule=rules.Lossless(),
        sampling=logits.Sampling(cfg_scale=5.0, temperature=0.0),
        compiler_options=decode.FAST_COMPILE)
    uncond_ids = [0, PAD_ID, PAD_ID, PAD_ID, 9]
    generated = []
    for _ in range(num_tokens):
      image = np.array([generated], np.int64).reshape(1, -1)
      c = torch_janus_logits(self.state, [prompt_ids], image)[0, -1]
      u = torch_janus_logits(self.state, [uncond_ids], image)[0, -1]
      generated.append(int(np.argmax(u + 5.0 * (c - u))))
    np.testing.assert_array_equal(np.asarray(result.tokens)[0], generated)

  def test_wrong_config_is_reported_and_nothing_written(self):
    wrong = self.root / 'wrong.json'
    hf = json.loads(json.dumps(TINY_HF))
    hf['gen_head_config']['params']['image_token_size'] = 16384
    with open(wrong, 'w') as f:
      json.dump(hf, f)
    out_parent = pathlib.Path(tempfile.mkdtemp(dir=self.root))
    with self.assertRaises(common.CheckpointMismatchError) as ctx:
      converter.convert(self.root / 'st', out_parent / 'jax', config=str(wrong))
    message = str(ctx.exception)
    self.assertIn('gen_embed.weight: expected (16384, 8), found (40, 8)', message)
    self.assertIn('image vocab 16384', message)
    self.assertEqual(list(out_parent.iterdir()), [])

  def test_missing_language_config_is_an_error_not_llama_defaults(self):
    config = {k: v for k, v in TINY_HF.items() if k != 'language_config'}
    with self.assertRaisesRegex(ValueError, 'has no language_config'):
      converter.config_from_hf(config)
    parent = pathlib.Path(tempfile.mkdtemp(dir=self.root))
    write_checkpoint(parent / 'src', self.state, 'safetensors', config=config)
    with self.assertRaisesRegex(ValueError, r"config\.json' has no language_config"):
      converter.convert(parent / 'src', parent / 'out')
    self.assertFalse((parent / 'out').exists())

  def test_grouped_query_heads_are_read_from_the_config(self):
    """num_key_value_heads, when the config states it, sets the KV heads (absent: one per
    query head, as Janus-Pro's released configs)."""
    config = json.loads(json.dumps(TINY_HF))
    self.assertEqual(converter.config_from_hf(config).num_kv_heads, 4)
    config['language_config']['num_key_value_heads'] = 2
    self.assertEqual(converter.config_from_hf(config).num_kv_heads, 2)

  @parameterized.parameters('hidden_size', 'num_hidden_layers', 'vocab_size')
  def test_missing_shape_field_is_named(self, field):
    config = json.loads(json.dumps(TINY_HF))
    del config['language_config'][field]
    with self.assertRaisesRegex(ValueError, rf"language_config lacks \['{field}'\]"):
      converter.config_from_hf(config)

  def test_missing_gen_configs_are_named(self):
    for name, field in (('gen_head_config', 'image_token_size'),
                        ('gen_aligner_config', 'input_dim')):
      config = json.loads(json.dumps(TINY_HF))
      del config[name]
      with self.assertRaisesRegex(ValueError, rf'{name}\.params is missing'):
        converter.config_from_hf(config)
      config = json.loads(json.dumps(TINY_HF))
      del config[name]['params'][field]
      with self.assertRaisesRegex(ValueError, rf"{name}\.params lacks \['{field}'\]"):
        converter.config_from_hf(config)

  def test_aligner_without_depth_is_depth_one_as_the_original(self):
    # Janus's MlpProjector takes depth 1 when its config omits it; the port
    # implements the released depth 2 only, so such a config is refused by name.
    config = json.loads(json.dumps(TINY_HF))
    converter.config_from_hf(config)  # depth 2 stated: accepted
    del config['gen_aligner_config']['params']['depth']
    with self.assertRaisesRegex(ValueError, r'depth 1 \(1 when absent'):
      converter.config_from_hf(config)

  def test_transformers5_language_config_rope_parameters(self):
    config = json.loads(json.dumps(TINY_HF))
    config['language_config']['rope_parameters'] = {'rope_type': 'default',
                                                    'rope_theta': 50000.0}
    self.assertEqual(converter.config_from_hf(config).rope_theta, 50000.0)
    config['language_config']['rope_parameters']['rope_type'] = 'llama3'
    with self.assertRaisesRegex(ValueError, "language_config.*RoPE type 'llama3'"):
      converter.config_from_hf(config)

  def test_transformers_native_layout_is_refused_by_name(self):
    # transformers' JanusForConditionalGeneration layout: text_config in
    # config.json, model.language_model.* / model.generation_* weights.
    native_config = {'model_type': 'janus',
                     'text_config': dict(LM, model_type='llama'),
                     'vq_config': {'num_embeddings': 40, 'image_token_embed_dim': 24,
                                   'projection_dim': 32}}
    with self.assertRaisesRegex(converter.UnsupportedLayoutError,
                                "transformers-native Janus config.*text_config.*"
                                'deepseek-ai/Janus-Pro-7B'):
      converter.config_from_hf(native_config)
    native_state = transformers_native_names(self.state)
    self.assertIn('model.generation_aligner.hidden_layers.0.weight', native_state)
    for config in (native_config, TINY_HF):  # also with the original config.json
      parent = pathlib.Path(tempfile.mkdtemp(dir=self.root))
      write_checkpoint(parent / 'src', native_state, 'safetensors', config=config)
      with self.assertRaises(converter.UnsupportedLayoutError) as ctx:
        converter.convert(parent / 'src', parent / 'out')
      message = str(ctx.exception)
      self.assertIn("transformers' native Janus layout", message)
      self.assertNotIn('missing keys', message)  # not a wall of missing keys
      self.assertFalse((parent / 'out').exists())

  def test_presets(self):
    self.assertEqual(janus.janus_pro_7b().num_layers, 30)
    one_b = janus.janus_pro_1b()
    self.assertEqual((one_b.hidden_size, one_b.num_layers, one_b.gen_head_dim), (2048, 24, 2048))


if __name__ == '__main__':
  absltest.main()
