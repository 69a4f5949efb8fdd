"""Tests for models/chameleon.py and converters/chameleon.py.

Parity is against an independent PyTorch forward of Hugging Face Chameleon as
Lumina-mGPT uses it (`tests/torch_reference_chameleon_janus.py`), on random weights in the
exact HF key layout, saved as two safetensors shards plus an index. Converter
checks that need no reference forward run without torch.
"""

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import warnings

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decode
from specdec_jax.converters import chameleon as converter
from specdec_jax.converters import command
from specdec_jax.converters import common
from specdec_jax.converters import hf_streaming
from specdec_jax.models import chameleon
from specdec_jax.models import lumina_layout as ll
from tests import torch_reference as ref
from tests import torch_reference_chameleon_janus as ref_chameleon_janus

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
  """Random float32 weights in the HF Chameleon key layout.

  qk_norm_rows: rows of every q/k norm tensor: 1 (Lumina 7B), None (one per
  head, current HF), or a model-parallel size R (Lumina's ChameleonLayerNorm
  layout of checkpoints trained with tensor parallelism).
  """
  rng = np.random.default_rng(seed)
  rand = lambda *shape, scale=0.2: (rng.standard_normal(shape) * scale).astype(np.float32)
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


def expand_qk_norm_rows(state, hf):
  """The same weights with every q/k norm repeated to one row per head."""
  out = dict(state)
  for name, value in state.items():
    if '.q_norm.' in name or '.k_norm.' in name:
      heads = hf['num_attention_heads' if '.q_norm.' in name else 'num_key_value_heads']
      out[name] = np.repeat(value, heads // value.shape[0], axis=0)
  return out


def transformers5_config(hf):
  """`hf` as transformers 5 writes it: the RoPE base under rope_parameters."""
  out = {k: v for k, v in hf.items() if k != 'rope_theta'}
  out['rope_parameters'] = {'rope_theta': hf['rope_theta'], 'rope_type': 'default'}
  return out


def vocabulary_map():
  vocab = {'<s>': 0, '<pad>': 1, '</s>': 2, '<racm3:break>': 8197, '<eoss>': 8196}
  vocab.update({ll.image_token_name(c): c + 4 for c in range(ll.NUM_IMAGE_CODES)})
  return vocab


def write_hf_checkpoint(folder, state, hf):
  """Two safetensors shards + index + config.json (with vocabulary_map)."""
  total = sum(v.nbytes for v in state.values())
  shards = hf_streaming.write_sharded_safetensors(
      state.items(), folder, max_shard_bytes=int(total * 0.6))
  assert len(shards) == 2, shards
  with open(pathlib.Path(folder) / 'config.json', 'w') as f:
    json.dump(dict(hf, vocabulary_map=vocabulary_map()), f)


def _tempdir(test):
  tmp = tempfile.TemporaryDirectory()
  test.addCleanup(tmp.cleanup)
  return pathlib.Path(tmp.name)


def convert_hf(test, hf, state, config_json=None):
  """Writes, converts and loads a checkpoint; config_json: the config.json to write."""
  src, out = _tempdir(test) / 'hf', _tempdir(test) / 'jax'
  write_hf_checkpoint(src, state, config_json or hf)
  converter.convert(src, out)  # the defaults: lossless (fp32 stays fp32)
  meta = common.read_meta(out)
  test.assertEqual(meta['dtype'], 'float32')
  test.assertLen(meta['source_files'], 4)  # 2 shards, index, config.json
  test.assertEqual(meta['image_token_offset'], 4)
  return converter.load_converted(out)


@ref.requires_torch
class ChameleonTest(parameterized.TestCase):
  """Converted checkpoints reproduce the PyTorch reference (needs torch)."""

  def _convert(self, hf, state, config_json=None):
    return convert_hf(self, hf, state, config_json)

  @parameterized.named_parameters(
      ('lumina_qk_norm_1xD', dict(), 1, False),
      ('hf_qk_norm_HxD', dict(), None, False),
      ('swin_norm_gqa', dict(swin_norm=True, num_key_value_heads=2), None, False),
      # Lumina's ChameleonLayerNorm with model_parallel_size 2: (2, D) norms,
      # each row shared by heads // 2 query heads and kv_heads // 2 kv heads.
      ('model_parallel_qk_norm_2xD', dict(num_key_value_heads=2), 2, False),
      # A transformers-5 config.json with a non-default RoPE base.
      ('transformers5_rope_parameters', dict(rope_theta=500.0), None, True),
  )
  def test_logit_parity_with_torch(self, overrides, qk_norm_rows, transformers5):
    hf = dict(TINY, **overrides)
    state = random_hf_state(hf, qk_norm_rows=qk_norm_rows)
    model, params = self._convert(hf, state, transformers5_config(hf) if transformers5 else None)
    self.assertEqual(model.config.swin_norm, hf['swin_norm'])
    self.assertEqual(model.config.rope_theta, hf['rope_theta'])
    ids = np.random.default_rng(0).integers(0, hf['vocab_size'], (2, 11))
    expected = ref_chameleon_janus.chameleon_logits(state, hf, ids)
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
    cond_ref = ref_chameleon_janus.chameleon_logits(state, hf, [cond_seq])[0]
    uncond_ref = ref_chameleon_janus.chameleon_logits(state, hf, [uncond_seq])[0]

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
    with self.assertWarnsRegex(UserWarning, 'plain Sampling'):  # no layout, as the reference
      result = decode.generate(
          model, params, prompt, num_tokens=num_tokens, key=jax.random.key(0),
          mode=decode.Jacobi(4), rule=rules.Lossless(),
          sampling=logits.Sampling(cfg_scale=3.0, temperature=0.0),
          compiler_options=decode.FAST_COMPILE)
    for text, tokens in zip(texts, np.asarray(result.tokens)):
      header = list(layout.header_tokens())
      generated = []
      for _ in range(num_tokens):
        cond = ref_chameleon_janus.chameleon_logits(state, hf, [text + header + generated])
        uncond = ref_chameleon_janus.chameleon_logits(state, hf, [header + generated])
        guided = uncond[0, -1] + 3.0 * (cond[0, -1] - uncond[0, -1])
        generated.append(int(np.argmax(guided)))
      np.testing.assert_array_equal(tokens, generated)


  def test_engine_eagle_chain_prefills_the_drafter_with_the_prompt(self):
    """An EAGLE chain on a padded CFG prompt: the drafter's prefill holds the P - 1
    prompt pairs (`EagleDrafter.prefix_pairs`, the uncond row's padding masked), and
    greedy decoding gives vanilla's greedy tokens."""
    from specdec_jax import decode, drafting, logits, rules  # pylint: disable=g-import-not-at-top
    from specdec_jax.models import eagle  # pylint: disable=g-import-not-at-top
    model, params = self._convert(TINY, random_hf_state(TINY, qk_norm_rows=1, seed=3))
    drafter = eagle.EagleDrafter(eagle.lumina_drafter_config(
        hidden_size=TINY['hidden_size'], num_heads=TINY['num_attention_heads'],
        intermediate_size=TINY['intermediate_size'], vocab_size=TINY['vocab_size'],
        dtype='float32'))
    draft_params = eagle.attach_head(drafter.init_params(jax.random.key(5)),
                                     params['lm_head']['kernel'])
    layout = ll.ImageLayout(2, 4)
    prompt = chameleon.build_prompt([[0, 17, 300, 8710], [0, 5, 6, 7, 8, 8710]], layout,
                                    cfg=True)
    prompt_len = prompt.tokens.shape[1]
    hidden = _fast_jit(model.prefill)(params, model.init_cache(4, 32), prompt).hidden
    prefilled = _fast_jit(drafting.Drafter(drafter, drafting.EAGLE).prefill)(
        draft_params, drafter.init_cache(4, 32), prompt, hidden)
    np.testing.assert_array_equal(prefilled.lengths, prompt_len - 1)
    np.testing.assert_array_equal(prefilled.position_offset,
                                  prompt_len - np.asarray(prompt.mask).sum(axis=1))
    run = lambda mode, **kw: decode.generate(
        model, params, prompt, num_tokens=8, key=jax.random.key(0), mode=mode,
        sampling=logits.Sampling(cfg_scale=3.0, temperature=0.0),
        compiler_options=decode.FAST_COMPILE, **kw)
    with warnings.catch_warnings():  # a plain Sampling on purpose: the tokens need no layout
      warnings.filterwarnings('ignore', 'generate: ChameleonModel sampled with a plain')
      chain = run(decode.ChainDraft(3, 'eagle'), rule=rules.Lossless(), draft=drafter,
                  draft_params=draft_params)
      vanilla = run(decode.Vanilla())
    np.testing.assert_array_equal(np.asarray(chain.tokens), np.asarray(vanilla.tokens))


class ConverterTest(parameterized.TestCase):
  """Config reading and key checks (no PyTorch needed)."""

  def test_wrong_config_is_reported_and_nothing_written(self):
    hf = TINY
    state = random_hf_state(hf, qk_norm_rows=None)
    src = _tempdir(self) / 'hf'
    write_hf_checkpoint(src, state, hf)
    wrong = _tempdir(self) / 'config.json'
    with open(wrong, 'w') as f:
      json.dump(dict(hf, num_hidden_layers=3, intermediate_size=64), f)
    out_parent = _tempdir(self)
    with self.assertRaises(common.CheckpointMismatchError) as ctx:
      converter.convert(src, out_parent / 'jax', config=str(wrong))
    message = str(ctx.exception)
    self.assertIn('13 missing', message)  # layer 2 does not exist
    self.assertIn('model.layers.2.self_attn.q_proj.weight', message)
    self.assertIn('model.layers.0.mlp.gate_proj.weight: expected (64, 32), found (48, 32)',
                  message)
    self.assertIn('3 layers', message)  # the config assumed is named
    self.assertEqual(list(out_parent.iterdir()), [])

  def test_meta_hashes_the_config_file_read(self):
    """With --config <file>, that file is hashed, not the unused input_dir/config.json
    (before: input_dir/config.json was hashed, the file read was not)."""
    src, other, out = _tempdir(self) / 'hf', _tempdir(self) / 'config.json', _tempdir(self)
    write_hf_checkpoint(src, random_hf_state(TINY, qk_norm_rows=1), TINY)
    other.write_text((src / 'config.json').read_text())
    (src / 'config.json').write_text('{"not": "read"}')
    converter.convert(src, out / 'jax', config=str(other))
    hashed = {f['path']: f['sha256'] for f in common.read_meta(out / 'jax')['source_files']}
    self.assertEqual(hashed.get(str(other.absolute())), common.sha256_file(other))
    self.assertNotIn(str((src / 'config.json').absolute()), hashed)
    self.assertLen(hashed, 4)  # 2 shards, index, the config read

  def test_model_parallel_qk_norms_convert_like_the_per_head_layout(self):
    # (model_parallel_size, D) q/k norms (Lumina's ChameleonLayerNorm, here
    # model_parallel_size 2 over 4 query and 2 kv heads) give exactly the
    # params of the same weights stored one row per head.
    hf = dict(TINY, num_key_value_heads=2)
    state = random_hf_state(hf, qk_norm_rows=2, seed=3)
    _, params = convert_hf(self, hf, state)
    _, expanded = convert_hf(self, hf, expand_qk_norm_rows(state, hf))
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, expanded)
    q_norm = params['model']['layers_1']['self_attn']['q_norm']['weight']
    self.assertEqual(q_norm.shape, (4, 8))
    # Row r covers heads [2r, 2r + 2): heads 0 and 1 share row 0, 2 and 3 row 1.
    np.testing.assert_array_equal(q_norm[1], state['model.layers.1.self_attn.q_norm.weight'][0])
    np.testing.assert_array_equal(q_norm[2], state['model.layers.1.self_attn.q_norm.weight'][1])

  def test_a_tied_head_is_the_embedding_and_an_untied_missing_head_is_named(self):
    """config.json's tie_word_embeddings with no lm_head.weight stored: the head is
    the embedding matrix (transformers' tying); without the tie, a missing head."""
    state = random_hf_state(TINY, qk_norm_rows=None)
    del state['lm_head.weight']
    _, params = convert_hf(self, dict(TINY, tie_word_embeddings=True), state)
    np.testing.assert_array_equal(params['lm_head']['kernel'],
                                  state['model.embed_tokens.weight'].T)
    src, out_parent = _tempdir(self) / 'hf', _tempdir(self)
    write_hf_checkpoint(src, state, dict(TINY, tie_word_embeddings=False))
    with self.assertRaisesRegex(common.CheckpointMismatchError, r'(?s)1 missing.*lm_head\.weight'):
      converter.convert(src, out_parent / 'jax')
    self.assertEqual(list(out_parent.iterdir()), [])
    # A tied checkpoint under a wrong config: its real keys are listed, not a head it lacks.
    write_hf_checkpoint(src, state, dict(TINY, tie_word_embeddings=True, num_hidden_layers=3))
    with self.assertRaises(common.CheckpointMismatchError) as ctx:
      converter.convert(src, out_parent / 'jax')
    self.assertIn('LM head tied to the embedding', str(ctx.exception))
    self.assertIn(f'checkpoint has {len(state) - 1} keys', str(ctx.exception))  # - the VQ key
    self.assertNotIn('lm_head', str(ctx.exception))

  def test_qk_norm_rows_that_fit_no_head_split_are_named(self):
    hf = dict(TINY, num_key_value_heads=2)
    state = random_hf_state(hf, qk_norm_rows=2)
    state['model.layers.0.self_attn.q_norm.weight'] = np.ones((3, 8), np.float32)
    src, out_parent = _tempdir(self) / 'hf', _tempdir(self)
    write_hf_checkpoint(src, state, hf)
    with self.assertRaises(common.CheckpointMismatchError) as ctx:
      converter.convert(src, out_parent / 'jax')
    message = str(ctx.exception)
    self.assertIn('model.layers.0.self_attn.q_norm.weight: expected (4, 8), found (3, 8)',
                  message)
    self.assertIn('1 q/k norm tensor(s) have a row count that does not divide', message)
    self.assertIn('(model_parallel_size, D)', message)
    self.assertEqual(list(out_parent.iterdir()), [])

  def test_transformers5_rope_parameters_are_read(self):
    # transformers 5 writes rope_parameters instead of a top-level rope_theta.
    hf = transformers5_config(dict(TINY, rope_theta=500000.0))
    self.assertNotIn('rope_theta', hf)
    self.assertEqual(chameleon.ChameleonConfig.from_hf_config(hf).rope_theta, 500000.0)
    state = random_hf_state(TINY, qk_norm_rows=1)
    model, _ = convert_hf(self, TINY, state, config_json=hf)
    self.assertEqual(model.config.rope_theta, 500000.0)
    # Both layouts at once must agree; the 4.x `rope_scaling: null` is fine.
    both = dict(hf, rope_theta=500000.0, rope_scaling=None)
    self.assertEqual(chameleon.ChameleonConfig.from_hf_config(both).rope_theta, 500000.0)
    with self.assertRaisesRegex(ValueError, 'conflicting RoPE bases'):
      chameleon.ChameleonConfig.from_hf_config(dict(hf, rope_theta=10000.0))

  @parameterized.named_parameters(
      ('transformers5_llama3', 'rope_parameters',
       {'rope_type': 'llama3', 'rope_theta': 10000.0, 'factor': 8.0}, "RoPE type 'llama3'"),
      ('transformers5_linear', 'rope_parameters',
       {'rope_type': 'linear', 'factor': 2.0}, "RoPE type 'linear'"),
      ('transformers4_dynamic', 'rope_scaling', {'type': 'dynamic', 'factor': 2.0},
       "RoPE type 'dynamic'"),
  )
  def test_unknown_rope_type_is_refused(self, field, value, message):
    hf = {k: v for k, v in TINY.items() if k != 'rope_theta'}
    hf[field] = value
    with self.assertRaisesRegex(ValueError, message):
      chameleon.ChameleonConfig.from_hf_config(hf)
    src, out_parent = _tempdir(self) / 'hf', _tempdir(self)
    write_hf_checkpoint(src, random_hf_state(TINY, qk_norm_rows=1), hf)
    with self.assertRaisesRegex(ValueError, rf'config\.json.*{field}.*{message}'):
      converter.convert(src, out_parent / 'jax')
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

  def test_prompt_structure_errors_name_the_fix(self):
    """Before: IndexError (1-D tokens), AttributeError (a bare array), and an empty
    prompt decoded silently."""
    model = chameleon.ChameleonModel(chameleon.ChameleonConfig.from_hf_config(TINY))
    for cond, message in (
        (jnp.ones((2, 3), jnp.int32), 'cond must be a ChameleonPrompt'),
        (chameleon.ChameleonPrompt(jnp.ones((3,), jnp.int32)), r'int32\(3,\)'),
        (chameleon.ChameleonPrompt(jnp.ones((2, 3), jnp.float32)), r'float32\(2, 3\)'),
        (chameleon.ChameleonPrompt(jnp.ones((2, 0), jnp.int32)), r'int32\(2, 0\)')):
      with self.assertRaisesRegex(ValueError, f'ChameleonModel: .*{message}'):
        decode.generate(model, {}, cond, num_tokens=2, key=jax.random.key(0))


class CommandLineTest(parameterized.TestCase):

  @parameterized.parameters('chameleon', 'janus')
  def test_config_errors_are_usage_messages(self, module):
    """A bad --config or config.json is a usage message, not a traceback."""
    with tempfile.TemporaryDirectory() as tmp:
      folder = pathlib.Path(tmp) / 'ckpt'
      folder.mkdir()
      (folder / 'config.json').write_text('{"hidden_size": 32,')
      for flag, message in (('', 'config.json\' is not valid JSON'),
                            ('--config=7x', "--config '7x': neither a preset")):
        result = subprocess.run(
            [sys.executable, '-m', f'specdec_jax.converters.{module}', f'--input_dir={folder}',
             f'--output={tmp}/out', *([flag] if flag else [])],
            env=dict(os.environ, JAX_PLATFORMS='cpu'), capture_output=True, text=True,
            timeout=300)
        self.assertEqual(result.returncode, command.EXIT_USAGE, result.stderr[-2000:])
        self.assertIn(message, result.stderr)
        self.assertNotIn('Traceback', result.stderr)
        self.assertFalse(os.path.exists(f'{tmp}/out'))

  @parameterized.named_parameters(
      ('drafter_without_input_type', 'lantern_drafter', {'input_type': None},
       ['--kind=llamagen'], "must name its input_type, one of ['c2i', 't2i', 't2i2']"),
      ('drafter_unknown_input_type', 'lantern_drafter', {'input_type': 'c2x'}, [],
       "input_type 'c2x' is not one of"),
      ('drafter_heads_not_dividing_hidden', 'lantern_drafter', {'num_attention_heads': 5}, [],
       'hidden_size 64 must be divisible by num_heads 5'),
      ('lumina_vocabulary_map_without_an_image_token', 'chameleon', {}, [],
       '1 of 8192 image codes have no IMGIMG...Z entry in vocabulary_map (first: [7])'),
  )
  def test_bad_config_values_are_usage_messages(self, module, change, flags_, message):
    """Config values the converter cannot use are one message and exit 2, before any
    weight is read (before: a ValueError traceback, exit 1)."""
    with tempfile.TemporaryDirectory() as tmp:
      folder = pathlib.Path(tmp) / 'ckpt'
      folder.mkdir()
      if module == 'chameleon':
        vocab = vocabulary_map()
        del vocab[ll.image_token_name(7)]
        config = dict(TINY, vocabulary_map=vocab)
        flags_ = [f'--input_dir={folder}', *flags_]
      else:
        config = {'hidden_size': 64, 'num_attention_heads': 4, 'intermediate_size': 96,
                  'vocab_size': 48, 'num_hidden_layers': 1, 'input_type': 'c2i'}
        config = {k: v for k, v in {**config, **change}.items() if v is not None}
        flags_ = [f'--input={folder}', *flags_]
      (folder / 'config.json').write_text(json.dumps(config))
      (folder / 'model.safetensors').write_bytes(b'not read')
      result = subprocess.run(
          [sys.executable, '-m', f'specdec_jax.converters.{module}', f'--output={tmp}/out',
           *flags_],
          env=dict(os.environ, JAX_PLATFORMS='cpu'), capture_output=True, text=True, timeout=300)
      self.assertEqual(result.returncode, command.EXIT_USAGE, result.stderr[-2000:])
      self.assertIn(message, result.stderr)
      self.assertIn(str(folder / 'config.json'), result.stderr)
      self.assertNotIn('Traceback', result.stderr)
      self.assertFalse(os.path.exists(f'{tmp}/out'))

  @parameterized.parameters(('chameleon', 'HF'), ('janus', 'Janus-Pro'))
  def test_help_lists_the_flags(self, module, checkpoint):
    result = subprocess.run(
        [sys.executable, '-m', f'specdec_jax.converters.{module}', '--help'],
        env=dict(os.environ, JAX_PLATFORMS='cpu'), capture_output=True, text=True, timeout=300)
    text = result.stdout + result.stderr
    self.assertIn(f'--input_dir: Folder with the {checkpoint} checkpoint.', text)
    for flag in ('--output:', '--config:', '--dtype:', '--[no]overwrite:'):
      self.assertIn(flag, text)

  @parameterized.parameters(
      ('chameleon', ['--input_dir={tmp}/absent'], "--input_dir '{tmp}/absent' is not a folder"),
      ('janus', ['--input_dir={tmp}/absent'], "--input_dir '{tmp}/absent' is not a folder"),
      ('llamagen', ['--input={tmp}/absent_384.pt'], "'{tmp}/absent_384.pt' does not exist"),
      ('vq', ['--input={tmp}/absent.pt', '--kind=llamagen_vq16'], "'{tmp}/absent.pt' does not exist"),
      ('lantern_drafter', ['--input={tmp}/absent'], '{tmp}/absent'),
  )
  def test_a_missing_input_is_a_message_not_a_traceback(self, module, flags_, message):
    with tempfile.TemporaryDirectory() as tmp:
      result = subprocess.run(
          [sys.executable, '-m', f'specdec_jax.converters.{module}', f'--output={tmp}/out',
           *[f.format(tmp=tmp) for f in flags_]],
          env=dict(os.environ, JAX_PLATFORMS='cpu'), capture_output=True, text=True, timeout=300)
      self.assertEqual(result.returncode, command.EXIT_USAGE, result.stderr[-2000:])
      self.assertIn(message.format(tmp=tmp), result.stderr)
      self.assertNotIn('Traceback', result.stderr)
      self.assertLess(len(result.stderr.splitlines()), 5, result.stderr)  # not the whole --help
      self.assertFalse(os.path.exists(f'{tmp}/out'))


if __name__ == '__main__':
  absltest.main()
