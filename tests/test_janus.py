"""Tests for models/janus.py and converters/janus.py (Janus-Pro generation path).

Parity is against an independent PyTorch forward of the original generation
path (written here from the reference notes): text prompt through the Llama
embedding, image tokens through gen_embed -> gen_aligner, HF Llama blocks,
final norm, gen_head. Random weights use the original DeepSeek key layout,
saved as two `pytorch_model-*.bin` shards + index (the released format) or as
two safetensors shards + index.
"""

import json
import pathlib
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F

from specdec_jax.converters import common
from specdec_jax.converters import hf_streaming
from specdec_jax.converters import janus as converter
from specdec_jax.models import janus

# Released config.json layout, tiny dims (LlamaConfig fields left out take HF defaults).
TINY_HF = {
    'language_config': dict(vocab_size=64, hidden_size=32, intermediate_size=48,
                            num_hidden_layers=2, num_attention_heads=4,
                            max_position_embeddings=128),
    'gen_head_config': {'params': dict(image_token_embed=24, image_token_size=40, n_embed=32)},
    'gen_aligner_config': {'params': dict(input_dim=8, n_embed=32, depth=2)},
}
PAD_ID = 5


def _fast_jit(fn):
  """jax.jit with cheap XLA:CPU compilation (the engine's FAST_COMPILE options)."""
  from specdec_jax import decode  # pylint: disable=g-import-not-at-top
  return jax.jit(fn, compiler_options=decode.FAST_COMPILE)


def _rel_err(actual, expected):
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  return np.abs(actual - expected).max() / np.abs(expected).max()


def random_janus_state(seed=0):
  """Random weights in the original Janus key layout, with keys the converter skips."""
  gen = torch.Generator().manual_seed(seed)
  rand = lambda *shape, scale=0.2: torch.randn(*shape, generator=gen) * scale
  lm = TINY_HF['language_config']
  e, f = lm['hidden_size'], lm['intermediate_size']
  g, v = 24, 40
  prefix = 'language_model.model.'
  state = {prefix + 'embed_tokens.weight': rand(lm['vocab_size'], e, scale=1.0)}
  for i in range(lm['num_hidden_layers']):
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
      'language_model.lm_head.weight': rand(lm['vocab_size'], e),
      'vision_model.vision_tower.patch_embed.proj.weight': rand(4, 3, 2, 2),
      'aligner.layers.0.weight': rand(e, 4),
      'gen_vision_model.quantize.embedding.weight': rand(v, 8),
      'gen_vision_model.quantize.codebook_used': torch.zeros(v),
  })
  return state


def torch_janus_logits(state, prompt_ids, image_ids):
  """Reference generation-path forward -> float32 image logits [B, P + N, V]."""
  lm = TINY_HF['language_config']
  e, heads = lm['hidden_size'], lm['num_attention_heads']
  d, eps = e // heads, 1e-6
  prefix = 'language_model.model.'

  def rms(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

  def rotate_half(x):
    return torch.cat([-x[..., d // 2:], x[..., :d // 2]], dim=-1)

  text = state[prefix + 'embed_tokens.weight'][prompt_ids]
  image = state['gen_embed.weight'][image_ids]
  image = F.gelu(image @ state['gen_aligner.layers.0.weight'].T
                 + state['gen_aligner.layers.0.bias'])
  image = image @ state['gen_aligner.layers.2.weight'].T + state['gen_aligner.layers.2.bias']
  x = torch.cat([text, image], dim=1)
  batch, length, _ = x.shape
  inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
  freqs = torch.arange(length).float()[:, None] * inv_freq[None, :]
  cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
  causal = torch.full((length, length), float('-inf')).triu(1)
  for i in range(lm['num_hidden_layers']):
    p = f'{prefix}layers.{i}.'
    h = rms(x, state[p + 'input_layernorm.weight'])
    q, k, v = ((h @ state[p + f'self_attn.{n}_proj.weight'].T)
               .view(batch, length, heads, d).transpose(1, 2) for n in 'qkv')
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    weights = torch.softmax(q @ k.transpose(-1, -2) / d ** 0.5 + causal, dim=-1)
    attn = (weights @ v).transpose(1, 2).reshape(batch, length, e)
    x = x + attn @ state[p + 'self_attn.o_proj.weight'].T
    h = rms(x, state[p + 'post_attention_layernorm.weight'])
    gate = F.silu(h @ state[p + 'mlp.gate_proj.weight'].T)
    x = x + (gate * (h @ state[p + 'mlp.up_proj.weight'].T)) @ state[p + 'mlp.down_proj.weight'].T
  h = rms(x, state[prefix + 'norm.weight'])
  h = F.gelu(h @ state['gen_head.output_mlp_projector.weight'].T
             + state['gen_head.output_mlp_projector.bias'])
  logits = h @ state['gen_head.vision_head.weight'].T + state['gen_head.vision_head.bias']
  return logits.float().numpy()


def write_checkpoint(folder, state, file_format):
  folder = pathlib.Path(folder)
  folder.mkdir(parents=True)
  with open(folder / 'config.json', 'w') as f:
    json.dump(TINY_HF, f)
  if file_format == 'safetensors':
    total = sum(t.numel() * t.element_size() for t in state.values())
    hf_streaming.write_sharded_safetensors(state.items(), folder,
                                           max_shard_bytes=int(total * 0.6))
    return
  names = sorted(state)
  weight_map = {}
  for k, group in enumerate((names[::2], names[1::2])):
    shard = f'pytorch_model-{k + 1:05d}-of-00002.bin'
    torch.save({n: state[n] for n in group}, folder / shard)
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
    write_checkpoint(root / 'bin', cls.state, 'bin')
    converter.convert(root / 'bin', root / 'jax', dtype='float32')
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
    self.assertLen(meta['source_files'], 4)  # 2 .bin shards, index, config.json
    self.assertNotIn('lm_head', self.params)

  def test_safetensors_shards_convert_to_the_same_params(self):
    write_checkpoint(self.root / 'st', self.state, 'safetensors')
    converter.convert(self.root / 'st', self.root / 'jax_st', dtype='float32')
    _, params = converter.load_converted(self.root / 'jax_st')
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, self.params)

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
      expected = torch_janus_logits(self.state, torch.from_numpy(ids[None].astype(np.int64)),
                                    torch.tensor(image_rows[row:row + 1, :4]))[0]
      got = np.concatenate([steps[0].logits[row, -real:], steps[1].logits[row],
                            steps[2].logits[row, :3]])
      self.assertLess(_rel_err(got, expected), 1e-4, f'row {row}')
    self.assertEqual(steps[-1].logits.shape, (4, 4, 40))
    np.testing.assert_array_equal(steps[-1].cache.lengths, [11] * 4)

  def test_unpadded_prompt_single_forward_parity(self):
    prompt = janus.build_prompt([[0, 11, 12, 9]], pad_id=PAD_ID, cfg=False)
    self.assertIsNone(prompt.mask)
    out = _fast_jit(self.model.prefill)(self.params, self.model.init_cache(1, 8), prompt)
    expected = torch_janus_logits(self.state, torch.tensor([[0, 11, 12, 9]]),
                                  torch.zeros((1, 0), dtype=torch.long))
    self.assertLess(_rel_err(out.logits, expected), 1e-4)

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
      image = torch.tensor([generated], dtype=torch.long)
      c = torch_janus_logits(self.state, torch.tensor([prompt_ids]), image)[0, -1]
      u = torch_janus_logits(self.state, torch.tensor([uncond_ids]), image)[0, -1]
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
      converter.convert(self.root / 'bin', out_parent / 'jax', config=str(wrong))
    message = str(ctx.exception)
    self.assertIn('gen_embed.weight: expected (16384, 8), found (40, 8)', message)
    self.assertIn('image vocab 16384', message)
    self.assertEqual(list(out_parent.iterdir()), [])

  def test_presets(self):
    self.assertEqual(janus.janus_pro_7b().num_layers, 30)
    one_b = janus.janus_pro_1b()
    self.assertEqual((one_b.hidden_size, one_b.num_layers, one_b.gen_head_dim), (2048, 24, 2048))


if __name__ == '__main__':
  absltest.main()
