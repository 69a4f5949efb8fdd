"""Tests for models/chameleon.py and converters/chameleon.py.

Parity is against an independent PyTorch forward of Hugging Face Chameleon as
Lumina-mGPT uses it (written here from the reference notes), on random weights
in the exact HF key layout, saved as two safetensors shards plus an index.
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

from specdec_jax.converters import chameleon as converter
from specdec_jax.converters import common
from specdec_jax.converters import hf_streaming
from specdec_jax.models import chameleon
from specdec_jax.models import lumina_layout as ll

# Tiny config; vocab 8832 keeps every Lumina layout id (<= 8804 + grid) valid.
TINY = dict(vocab_size=8832, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, intermediate_size=48, rms_norm_eps=1e-5,
            rope_theta=10000.0, max_position_embeddings=256, swin_norm=False)


def _fast_jit(fn):
  """jax.jit with cheap XLA:CPU compilation (the engine's FAST_COMPILE options)."""
  from specdec_jax import decode  # pylint: disable=g-import-not-at-top
  return jax.jit(fn, compiler_options=decode.FAST_COMPILE)


def _rel_err(actual, expected):
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  return np.abs(actual - expected).max() / np.abs(expected).max()


def random_hf_state(hf, *, qk_norm_rows, seed=0):
  """Random weights in the HF Chameleon key layout (q/k norm rows: 1 or heads)."""
  gen = torch.Generator().manual_seed(seed)
  rand = lambda *shape, scale=0.2: torch.randn(*shape, generator=gen) * scale
  e, f = hf['hidden_size'], hf['intermediate_size']
  heads, kv_heads = hf['num_attention_heads'], hf['num_key_value_heads']
  d = e // heads
  state = {'model.embed_tokens.weight': rand(hf['vocab_size'], e, scale=1.0)}
  for i in range(hf['num_hidden_layers']):
    p = f'model.layers.{i}.'
    state.update({
        p + 'self_attn.q_proj.weight': rand(heads * d, e),
        p + 'self_attn.k_proj.weight': rand(kv_heads * d, e),
        p + 'self_attn.v_proj.weight': rand(kv_heads * d, e),
        p + 'self_attn.o_proj.weight': rand(e, heads * d),
        p + 'self_attn.q_norm.weight': 1 + rand(qk_norm_rows or heads, d),
        p + 'self_attn.q_norm.bias': rand(qk_norm_rows or heads, d),
        p + 'self_attn.k_norm.weight': 1 + rand(qk_norm_rows or kv_heads, d),
        p + 'self_attn.k_norm.bias': rand(qk_norm_rows or kv_heads, d),
        p + 'mlp.gate_proj.weight': rand(f, e),
        p + 'mlp.up_proj.weight': rand(f, e),
        p + 'mlp.down_proj.weight': rand(e, f),
        p + 'input_layernorm.weight': 1 + rand(e),
        p + 'post_attention_layernorm.weight': 1 + rand(e),
    })
  state['model.norm.weight'] = 1 + rand(e)
  state['lm_head.weight'] = rand(hf['vocab_size'], e)
  state['model.vqmodel.quantize.embedding.weight'] = rand(16, 4)  # ignored encoder key
  return state


def torch_chameleon_logits(state, hf, ids):
  """Reference forward (HF Chameleon, eager attention) -> float32 logits [B, L, V]."""
  e = hf['hidden_size']
  heads, kv_heads = hf['num_attention_heads'], hf['num_key_value_heads']
  d, eps = e // heads, hf['rms_norm_eps']
  batch, length = ids.shape

  def rms(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

  def rotate_half(x):
    return torch.cat([-x[..., d // 2:], x[..., :d // 2]], dim=-1)

  inv_freq = 1.0 / (hf['rope_theta'] ** (torch.arange(0, d, 2).float() / d))
  freqs = torch.arange(length).float()[:, None] * inv_freq[None, :]
  emb = torch.cat([freqs, freqs], dim=-1)
  cos, sin = emb.cos(), emb.sin()  # [L, D]
  causal = torch.full((length, length), float('-inf')).triu(1)

  def attention(x, p):
    q = (x @ state[p + 'q_proj.weight'].T).view(batch, length, heads, d)
    k = (x @ state[p + 'k_proj.weight'].T).view(batch, length, kv_heads, d)
    v = (x @ state[p + 'v_proj.weight'].T).view(batch, length, kv_heads, d)
    q = F.layer_norm(q, (d,), eps=1e-5) * state[p + 'q_norm.weight'] + state[p + 'q_norm.bias']
    k = F.layer_norm(k, (d,), eps=1e-5) * state[p + 'k_norm.weight'] + state[p + 'k_norm.bias']
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, heads, L, D]
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    weights = torch.softmax(q @ k.transpose(-1, -2) / d ** 0.5 + causal, dim=-1)
    out = (weights @ v).transpose(1, 2).reshape(batch, length, e)
    return out @ state[p + 'o_proj.weight'].T

  def mlp(x, p):
    gate = F.silu(x @ state[p + 'gate_proj.weight'].T)
    return (gate * (x @ state[p + 'up_proj.weight'].T)) @ state[p + 'down_proj.weight'].T

  x = state['model.embed_tokens.weight'][ids]
  for i in range(hf['num_hidden_layers']):
    p = f'model.layers.{i}.'
    in_norm = state[p + 'input_layernorm.weight']
    post_norm = state[p + 'post_attention_layernorm.weight']
    if hf['swin_norm']:
      x = x + rms(attention(x, p + 'self_attn.'), in_norm)
      x = x + rms(mlp(x, p + 'mlp.'), post_norm)
    else:
      x = x + attention(rms(x, in_norm), p + 'self_attn.')
      x = x + mlp(rms(x, post_norm), p + 'mlp.')
  x = rms(x, state['model.norm.weight'])
  return (x @ state['lm_head.weight'].T).float().numpy()


def vocabulary_map():
  vocab = {'<s>': 0, '<pad>': 1, '</s>': 2, '<racm3:break>': 8197, '<eoss>': 8196}
  vocab.update({ll.image_token_name(c): c + 4 for c in range(ll.NUM_IMAGE_CODES)})
  return vocab


def write_hf_checkpoint(folder, state, hf):
  """Two safetensors shards + index + config.json (with vocabulary_map)."""
  total = sum(t.numel() * t.element_size() for t in state.values())
  shards = hf_streaming.write_sharded_safetensors(
      state.items(), folder, max_shard_bytes=int(total * 0.6))
  assert len(shards) == 2, shards
  with open(pathlib.Path(folder) / 'config.json', 'w') as f:
    json.dump(dict(hf, vocabulary_map=vocabulary_map()), f)


class ChameleonTest(parameterized.TestCase):

  def _tempdir(self):
    tmp = tempfile.TemporaryDirectory()
    self.addCleanup(tmp.cleanup)
    return pathlib.Path(tmp.name)

  def _convert(self, hf, state):
    src, out = self._tempdir() / 'hf', self._tempdir() / 'jax'
    write_hf_checkpoint(src, state, hf)
    converter.convert(src, out, dtype='float32')
    meta = common.read_meta(out)
    self.assertLen(meta['source_files'], 4)  # 2 shards, index, config.json
    self.assertEqual(meta['image_token_offset'], 4)
    return converter.load_converted(out)

  @parameterized.named_parameters(
      ('lumina_qk_norm_1xD', dict(), 1),
      ('hf_qk_norm_HxD', dict(), None),
      ('swin_norm_gqa', dict(swin_norm=True, num_key_value_heads=2), None),
  )
  def test_logit_parity_with_torch(self, overrides, qk_norm_rows):
    hf = dict(TINY, **overrides)
    state = random_hf_state(hf, qk_norm_rows=qk_norm_rows)
    model, params = self._convert(hf, state)
    self.assertEqual(model.config.swin_norm, hf['swin_norm'])
    ids = np.random.default_rng(0).integers(0, hf['vocab_size'], (2, 11))
    expected = torch_chameleon_logits(state, hf, torch.from_numpy(ids))
    out = _fast_jit(model.forward)(params, model.init_cache(2, 16), jnp.asarray(ids, jnp.int32))
    self.assertEqual(out.logits.dtype, jnp.float32)
    self.assertLess(_rel_err(out.logits, expected), 1e-4)
    np.testing.assert_array_equal(out.cache.lengths, [11, 11])
    self.assertEqual(out.hidden.shape, (2, 11, hf['hidden_size']))

  def test_engine_path_and_cfg_rows_match_teacher_forcing(self):
    """Prefill + 1-token and 3-token window forwards equal full-sequence logits.

    Row 0 (cond) is the full text + image sequence; row 1 (uncond) is the image
    header alone, left-padded: it must equal the original's separate
    unconditional sequence `[8197, h, w, tokens...]` with positions from 0.
    """
    hf = TINY
    state = random_hf_state(hf, qk_norm_rows=1, seed=1)
    model, params = self._convert(hf, state)
    layout = ll.ImageLayout(2, 4)
    text = [0, 17, 300, 42, 8710]
    prompt = chameleon.build_prompt([text], layout, cfg=True)
    np.testing.assert_array_equal(prompt.mask.sum(axis=1), [len(text) + 3, 3])
    image = list(layout.body_tokens(np.arange(8).reshape(2, 4))[:7])  # 7 generated tokens
    cond_seq = text + list(layout.header_tokens()) + image
    uncond_seq = list(layout.header_tokens()) + image
    cond_ref = torch_chameleon_logits(state, hf, torch.tensor([cond_seq]))[0]
    uncond_ref = torch_chameleon_logits(state, hf, torch.tensor([uncond_seq]))[0]

    cache = model.init_cache(2, 32)
    out = _fast_jit(model.prefill)(params, cache, prompt)
    prompt_len = prompt.tokens.shape[1]
    self.assertLess(_rel_err(out.logits[0], cond_ref[:prompt_len]), 1e-4)
    self.assertLess(_rel_err(out.logits[1, -3:], uncond_ref[:3]), 1e-4)
    np.testing.assert_array_equal(out.cache.position_offset, [0, len(text)])

    forward = _fast_jit(model.forward)
    cache = out.cache
    cond_logits, uncond_logits = [], []
    for chunk in ([image[0]], image[1:4], image[4:7]):  # T = 1, then windows of 3
      tokens = jnp.asarray([chunk, chunk], jnp.int32)
      out = forward(params, cache, tokens)
      cache = out.cache
      cond_logits.append(out.logits[0])
      uncond_logits.append(out.logits[1])
    self.assertLess(_rel_err(jnp.concatenate(cond_logits), cond_ref[prompt_len:]), 1e-4)
    self.assertLess(_rel_err(jnp.concatenate(uncond_logits), uncond_ref[3:]), 1e-4)
    np.testing.assert_array_equal(cache.lengths, [prompt_len + 7] * 2)

  def test_engine_jacobi_with_cfg_reproduces_greedy_reference(self):
    """decode.generate (Jacobi window 4, lossless, CFG 3) at temperature 0 gives
    exactly the greedy sequence of the torch reference with the original's CFG
    (separate unconditional sequence [8197, h, w, ...] from position 0)."""
    from specdec_jax import decode, logits, rules  # pylint: disable=g-import-not-at-top
    hf = TINY
    state = random_hf_state(hf, qk_norm_rows=1, seed=2)
    model, params = self._convert(hf, state)
    layout = ll.ImageLayout(2, 4)
    texts = [[0, 17, 300, 8710], [0, 5, 6, 7, 8, 8710]]
    prompt = chameleon.build_prompt(texts, layout, cfg=True)
    num_tokens = 8
    result = decode.generate(
        model, params, prompt, num_tokens=num_tokens, key=jax.random.key(0),
        mode=decode.Jacobi(4), rule=rules.Lossless(),
        sampling=logits.Sampling(cfg_scale=3.0, temperature=0.0),
        compiler_options=decode.FAST_COMPILE)
    for text, tokens in zip(texts, np.asarray(result.tokens)):
      header = list(layout.header_tokens())
      generated = []
      for _ in range(num_tokens):
        cond = torch_chameleon_logits(state, hf, torch.tensor([text + header + generated]))
        uncond = torch_chameleon_logits(state, hf, torch.tensor([header + generated]))
        guided = uncond[0, -1] + 3.0 * (cond[0, -1] - uncond[0, -1])
        generated.append(int(np.argmax(guided)))
      np.testing.assert_array_equal(tokens, generated)

  def test_wrong_config_is_reported_and_nothing_written(self):
    hf = TINY
    state = random_hf_state(hf, qk_norm_rows=None)
    src = self._tempdir() / 'hf'
    write_hf_checkpoint(src, state, hf)
    wrong = self._tempdir() / 'config.json'
    with open(wrong, 'w') as f:
      json.dump(dict(hf, num_hidden_layers=3, intermediate_size=64), f)
    out_parent = self._tempdir()
    with self.assertRaises(common.CheckpointMismatchError) as ctx:
      converter.convert(src, out_parent / 'jax', config=str(wrong))
    message = str(ctx.exception)
    self.assertIn('13 missing', message)  # layer 2 does not exist
    self.assertIn('model.layers.2.self_attn.q_proj.weight', message)
    self.assertIn('model.layers.0.mlp.gate_proj.weight: expected (64, 32), found (48, 32)',
                  message)
    self.assertIn('3 layers', message)  # the config assumed is named
    self.assertEqual(list(out_parent.iterdir()), [])

  def test_configs(self):
    c7 = chameleon.lumina_7b()
    self.assertEqual((c7.hidden_size, c7.num_layers, c7.vocab_size, c7.swin_norm),
                     (4096, 32, 65536, False))
    self.assertTrue(chameleon.chameleon_34b().swin_norm)
    self.assertEqual(chameleon.ChameleonConfig.from_hf_config(TINY).num_kv_heads, 4)
    with self.assertRaisesRegex(ValueError, 'hidden_size'):
      chameleon.ChameleonConfig(hidden_size=30, num_heads=4, head_dim=8)

  def test_prompt_must_be_left_padded(self):
    model = chameleon.ChameleonModel(chameleon.ChameleonConfig.from_hf_config(TINY))
    prompt = chameleon.ChameleonPrompt(jnp.zeros((1, 4), jnp.int32),
                                       jnp.array([[True, False, True, True]]))
    with self.assertRaisesRegex(ValueError, 'not left-padded'):
      model.prefill({}, model.init_cache(1, 8), prompt)


if __name__ == '__main__':
  absltest.main()
