"""Tests for models/vq.py, models/vq_blocks.py and converters/vq.py.

The parity tests use an independent PyTorch forward of the original
architectures (`tests/torch_reference.py`): LlamaGen's VQ-16
(FoundationVision/LlamaGen `tokenizer/tokenizer_image/vq_model.py`) with its
`conv_blocks.{i}.res/attn/downsample|upsample` names and the taming/Chameleon
VQGAN with `down/up.{i}.block/attn`, `mid.block_1/attn_1/block_2`. Random
weights in those key layouts are saved in the original file formats,
converted, loaded, and compared at fp32. Converter checks that need no
reference run without torch, on numpy weights saved as safetensors.
"""

import argparse
import os
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
from unittest import mock

from absl import app
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.converters import common
from specdec_jax.converters import hf_streaming
from specdec_jax.converters import safetensors_io
from specdec_jax.converters import vq as vq_converter
from specdec_jax.models import vq
from tests import torch_reference as ref
from tests import torch_reference_vq as ref_vq

# Tiny shapes (compile time dominates): widths 32/64 (GroupNorm 32 needs
# multiples of 32), 2 levels, 8x8 images -> 4x4 token grids. Still covers a
# channel change (nin_shortcut), several res/attn indices per level, down- and
# upsampling.
TINY = dict(ch=32, ch_mult=(1, 2), num_res_blocks=1, z_channels=16)
TINY_VQ16 = dict(TINY, codebook_size=64, codebook_dim=8, attn_levels=(1,))
TINY_CHAMELEON = dict(TINY, codebook_size=64, codebook_dim=16)
IMAGE_SIZE = 8
GRID = (4, 4)


def make_tmp_dir(test: absltest.TestCase) -> pathlib.Path:
  """A fresh folder removed after the test (works under pytest and absltest)."""
  path = pathlib.Path(tempfile.mkdtemp(prefix='test_vq_'))
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return path


def relative_error(actual, expected) -> float:
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  return float(np.max(np.abs(actual - expected)) / np.max(np.abs(expected)))


def numpy_state(kind: str, overrides, seed: int = 0) -> dict[str, np.ndarray]:
  """Random float32 weights in the original key layout (no torch), plus the
  LlamaGen `quantize.codebook_used` buffer."""
  rng = np.random.default_rng(seed)
  config = vq_converter.preset_config(kind, overrides)
  state = {name: (rng.standard_normal(shape) * 0.1).astype(np.float32)
           for name, shape in vq_converter.expected_shapes(config, kind).items()}
  if kind == 'llamagen_vq16':
    state['quantize.codebook_used'] = np.zeros(64, np.float32)
  return state


def expected_params(state, kind, overrides):
  """What converting `state` must give, built from the layout alone."""
  config = vq_converter.preset_config(kind, overrides)
  params = {}
  for name, (path, _) in vq_converter.param_layout(config, kind).items():
    value = state[name]
    if path[-1] == 'kernel':
      value = np.transpose(value, (2, 3, 1, 0))
    node = params
    for part in path[:-1]:
      node = node.setdefault(part, {})
    node[path[-1]] = value
  return params


def random_images(seed: int, batch: int = 2) -> np.ndarray:
  rng = np.random.default_rng(seed)
  return rng.integers(0, 256, size=(batch, IMAGE_SIZE, IMAGE_SIZE, 3)).astype(np.uint8)


def torch_images(seed: int, batch: int = 2):
  images = random_images(seed, batch)
  nchw = ref.torch.from_numpy(images.astype(np.float32) / 127.5 - 1.0).permute(0, 3, 1, 2)
  return images, nchw


def make_llamagen(seed=0):
  model = ref_vq.TorchVQ('llamagen', **TINY_VQ16)
  ref_vq.randomize_(model, seed)
  return model.eval()


def make_chameleon(seed=1):
  model = ref_vq.TorchVQ('chameleon', **TINY_CHAMELEON)
  ref_vq.randomize_(model, seed)
  return model.eval()


def save_llamagen(model, path, *, extra=None):
  state = dict(model.state_dict())
  state.update(extra or {})
  ref.torch.save({'model': state, 'optimizer': {'state': {}}, 'steps': 7,
                  'args': argparse.Namespace(codebook_size=64)}, path)


def save_chameleon(model, path, *, extra=None):
  state = dict(model.state_dict())
  # What a taming/Lightning vqgan.ckpt also holds next to the tokenizer weights.
  state['loss.logvar'] = ref.torch.zeros(())
  state['loss.discriminator.main.0.weight'] = ref.torch.zeros(8, 3, 4, 4)
  state.update(extra or {})
  ref.torch.save({'state_dict': state, 'global_step': 3}, path)


def decode_reference(model, codes):
  """The torch model's decode_code as NHWC numpy."""
  with ref.torch.no_grad():
    return model.decode_code(ref.torch.from_numpy(np.asarray(codes)), GRID).permute(
        0, 2, 3, 1).numpy()


# ----------------------------------------------------------------- tests ---


@ref.requires_torch
class ParityTest(parameterized.TestCase):
  """Converted checkpoints reproduce the PyTorch originals at fp32."""

  def setUp(self):
    super().setUp()
    self.tmp = make_tmp_dir(self)

  def test_llamagen_vq16_encode_decode_parity(self):
    model = make_llamagen()
    save_llamagen(model, self.tmp / 'vq_ds16_c2i.pt')
    out = vq_converter.convert(self.tmp / 'vq_ds16_c2i.pt', self.tmp / 'flax', 'llamagen_vq16',
                               config_overrides=TINY_VQ16)
    tokenizer, params = vq_converter.load_tokenizer(out)
    self.assertEqual(tokenizer.config, vq.vq16_config(**TINY_VQ16))

    images, nchw = torch_images(0)
    with ref.torch.no_grad():
      ref_latents, ref_tokens = model.encode(nchw)
    latents = tokenizer.encode_latents(params, images)
    self.assertLess(relative_error(latents, ref_latents.permute(0, 2, 3, 1)), 1e-4)
    tokens = tokenizer.encode(params, images)
    self.assertEqual(tokens.dtype, jnp.int32)
    np.testing.assert_array_equal(tokens, ref_tokens.numpy())

    codes = np.random.default_rng(1).integers(0, 64, size=(2, 16))
    ref_images = decode_reference(model, codes)
    decoded = tokenizer.decode(params, codes, GRID)
    self.assertEqual(decoded.shape, (2, IMAGE_SIZE, IMAGE_SIZE, 3))
    self.assertLess(relative_error(decoded, ref_images), 1e-4)

  def test_chameleon_vqgan_decode_and_encode_parity(self):
    model = make_chameleon()
    save_chameleon(model, self.tmp / 'vqgan.ckpt')
    out = vq_converter.convert(self.tmp / 'vqgan.ckpt', self.tmp / 'flax', 'chameleon_vqgan',
                               config_overrides=TINY_CHAMELEON)
    tokenizer, params = vq_converter.load_tokenizer(out)
    self.assertFalse(tokenizer.config.codebook_l2_norm)
    self.assertNotIn('loss', params)

    codes = np.random.default_rng(2).integers(0, 64, size=(2, 16))
    ref_images = decode_reference(model, codes)
    decoded = tokenizer.decode(params, codes, GRID)
    self.assertLess(relative_error(decoded, ref_images), 1e-4)

    images, nchw = torch_images(3)
    with ref.torch.no_grad():
      ref_latents, ref_tokens = model.encode(nchw)
    self.assertLess(relative_error(tokenizer.encode_latents(params, images),
                                   ref_latents.permute(0, 2, 3, 1)), 1e-4)
    np.testing.assert_array_equal(tokenizer.encode(params, images), ref_tokens.numpy())

  def test_janus_prefix_is_stripped_and_other_weights_ignored(self):
    model = make_llamagen(seed=5)
    state = {f'gen_vision_model.{k}': v for k, v in model.state_dict().items()}
    state['language_model.model.embed_tokens.weight'] = ref.torch.zeros(10, 4)
    state['gen_head.vision_head.weight'] = ref.torch.zeros(64, 4)
    ref.torch.save(state, self.tmp / 'pytorch_model.bin')  # raw state dict, no wrapper
    with mock.patch.object(ref.torch, 'load', wraps=ref.torch.load) as load:
      out = vq_converter.convert(self.tmp / 'pytorch_model.bin', self.tmp / 'flax',
                                 'llamagen_vq16', config_overrides=TINY_VQ16)
    self.assertTrue(load.call_args.kwargs['mmap'])  # the LLM shard is memory-mapped
    tokenizer, params = vq_converter.load_tokenizer(out)
    codes = np.arange(16).reshape(1, 16)
    expected = decode_reference(model, codes)
    self.assertLess(relative_error(tokenizer.decode(params, codes, GRID), expected), 1e-4)
    self.assertEqual(common.read_meta(out)['tokenizer_prefix'], 'gen_vision_model.')

  def test_expected_key_counts_of_released_configs(self):
    # The released VQ-16 has 344 keys (343 + codebook_used), 194 of them in the
    # decoder; Chameleon's VQGAN 293 (notes 1.10, 2.5).
    vq16 = vq_converter.expected_shapes(vq.vq16_config(), 'llamagen_vq16')
    self.assertLen(vq16, 343)
    self.assertLen([k for k in vq16 if k.startswith('decoder.')], 194)
    self.assertEqual(vq16['decoder.conv_blocks.1.res.0.nin_shortcut.weight'], (256, 512, 1, 1))
    self.assertEqual(vq16['quantize.embedding.weight'], (16384, 8))
    self.assertIn('decoder.conv_blocks.0.attn.2.proj_out.weight', vq16)
    self.assertNotIn('decoder.conv_blocks.1.attn.0.q.weight', vq16)
    cham = vq_converter.expected_shapes(vq.chameleon_vqgan_config(), 'chameleon_vqgan')
    self.assertLen(cham, 293)
    self.assertEqual(cham['decoder.up.3.block.0.nin_shortcut.weight'], (256, 512, 1, 1))
    self.assertEqual(cham['decoder.mid.attn_1.q.weight'], (512, 512, 1, 1))
    self.assertNotIn('decoder.up.0.upsample.conv.weight', cham)
    self.assertEqual(cham['quant_conv.weight'], (256, 256, 1, 1))


class ConverterErrorTest(parameterized.TestCase):
  """Bad inputs stop with a clear message and leave no output behind."""

  def setUp(self):
    super().setUp()
    self.tmp = make_tmp_dir(self)

  def assert_nothing_written(self):
    self.assertEqual(sorted(p.name for p in self.tmp.iterdir() if p.name != 'in'), [])

  def _input(self, name):
    folder = self.tmp / 'in'
    folder.mkdir(exist_ok=True)
    return folder / name

  def _safetensors(self, state, name='vq.safetensors'):
    path = self._input(name)
    hf_streaming.write_safetensors(path, state)
    return path

  def test_wrong_kind_names_the_right_one(self):
    path = self._safetensors(numpy_state('chameleon_vqgan', TINY_CHAMELEON))
    with self.assertRaises(common.CheckpointMismatchError) as ctx:
      vq_converter.convert(path, self.tmp / 'out', 'llamagen_vq16',
                           config_overrides=dict(TINY_CHAMELEON, attn_levels=()))
    message = str(ctx.exception)
    self.assertIn('--kind chameleon_vqgan', message)
    self.assertIn('decoder.conv_blocks.0.res.0.conv1.weight', message)  # missing
    self.assertIn('decoder.mid.block_1.conv1.weight', message)  # unexpected
    self.assert_nothing_written()

  def test_missing_keys_are_listed(self):
    state = numpy_state('llamagen_vq16', TINY_VQ16)
    del state['decoder.conv_out.bias']
    del state['quantize.embedding.weight']
    path = self._safetensors(state)
    with self.assertRaisesRegex(common.CheckpointMismatchError,
                                r'2 missing(.|\n)*decoder\.conv_out\.bias(.|\n)*'
                                r'quantize\.embedding\.weight'):
      vq_converter.convert(path, self.tmp / 'out', 'llamagen_vq16', config_overrides=TINY_VQ16)
    self.assert_nothing_written()

  def test_wrong_config_lists_misshaped_keys(self):
    path = self._safetensors(numpy_state('llamagen_vq16', TINY_VQ16))
    with self.assertRaises(common.CheckpointMismatchError) as ctx:
      vq_converter.convert(path, self.tmp / 'out', 'llamagen_vq16',
                           config_overrides=dict(TINY_VQ16, codebook_size=128))
    message = str(ctx.exception)
    self.assertIn('quantize.embedding.weight: expected (128, 8), found (64, 8)', message)
    self.assertIn('Assumed config', message)
    self.assert_nothing_written()

  def test_default_config_against_tiny_checkpoint(self):
    path = self._safetensors(numpy_state('llamagen_vq16', TINY_VQ16))
    with self.assertRaisesRegex(common.CheckpointMismatchError, 'mis-shaped'):
      vq_converter.convert(path, self.tmp / 'out', 'llamagen_vq16')
    self.assert_nothing_written()

  def test_unexpected_key_in_llamagen_checkpoint(self):
    state = dict(numpy_state('llamagen_vq16', TINY_VQ16),
                 **{'decoder.extra.weight': np.zeros(3, np.float32)})
    path = self._safetensors(state)
    with self.assertRaisesRegex(common.CheckpointMismatchError,
                                r'unexpected keys:\n\s+decoder\.extra\.weight'):
      vq_converter.convert(path, self.tmp / 'out', 'llamagen_vq16', config_overrides=TINY_VQ16)
    self.assert_nothing_written()

  @ref.requires_torch
  def test_truncated_file(self):
    path = self._input('vq.pt')
    save_llamagen(make_llamagen(), path)
    path.write_bytes(path.read_bytes()[:2000])
    with self.assertRaisesRegex(common.CheckpointReadError, 'truncated or corrupt'):
      vq_converter.convert(path, self.tmp / 'out', 'llamagen_vq16', config_overrides=TINY_VQ16)
    self.assert_nothing_written()

  def test_truncated_safetensors_file(self):
    path = self._safetensors(numpy_state('llamagen_vq16', TINY_VQ16))
    path.write_bytes(path.read_bytes()[:-100])
    with self.assertRaisesRegex(common.CheckpointReadError, r'vq\.safetensors.*truncated'):
      vq_converter.convert(path, self.tmp / 'out', 'llamagen_vq16', config_overrides=TINY_VQ16)
    self.assert_nothing_written()

  def test_existing_output_is_kept(self):
    (self.tmp / 'out').mkdir()
    with self.assertRaisesRegex(FileExistsError, '--overwrite'):
      vq_converter.convert(self._input('missing.pt'), self.tmp / 'out', 'llamagen_vq16')

  @parameterized.parameters(('kind', 'vq16', '--kind'), ('dtype', 'float16', '--dtype'))
  def test_bad_flags(self, name, value, message):
    kwargs = dict(kind='llamagen_vq16', dtype='float32')
    kwargs[name] = value
    with self.assertRaisesRegex(ValueError, message):
      vq_converter.convert(self._input('x.pt'), self.tmp / 'out', kwargs['kind'],
                           dtype=kwargs['dtype'])

  @parameterized.named_parameters(
      ('unknown_field', {'channels': 3}, r"unknown VQConfig field\(s\) \['channels'\]"),
      ('bad_value', {'ch': 48}, 'ch=48.*norm_groups'),
      ('vq8_without_attn_levels', {'ch_mult': [1, 2, 2, 4]},
       r'attn_levels \(4,\).*attn_levels=\(3,\)'),
      ('not_an_object', [1, 2], 'must be a JSON object'),
  )
  def test_config_override_errors_name_the_field(self, overrides, message):
    with self.assertRaisesRegex(ValueError, message):
      vq_converter.preset_config('llamagen_vq16', overrides)
    with self.assertRaisesRegex(ValueError, message):  # before any file is read
      vq_converter.convert(self._input('missing.pt'), self.tmp / 'out', 'llamagen_vq16',
                           config_overrides=overrides)
    self.assert_nothing_written()

  def test_bad_config_json_is_a_usage_error(self):
    with self.assertRaisesRegex(app.UsageError, '--config_json is not valid JSON'):
      vq_converter.parse_config_json('{"ch_mult": [1, 2, 2, 4]')
    with self.assertRaisesRegex(app.UsageError, '--config_json must be a JSON object'):
      vq_converter.parse_config_json('[1, 2]')
    self.assertEqual(vq_converter.parse_config_json('{"ch": 64}'), {'ch': 64})


class PrefixedTokenizerTest(parameterized.TestCase):
  """Tokenizers inside language-model checkpoints: only their tensors are read."""

  def setUp(self):
    super().setUp()
    self.tmp = make_tmp_dir(self)

  def _spy_reads(self):
    """Records the offset of every safetensors tensor read from disk."""
    read = hf_streaming._read_safetensors_tensor  # pylint: disable=protected-access
    offsets = []

    def spy(f, info):
      offsets.append(info.offset)
      return read(f, info)

    for module in (hf_streaming, safetensors_io):  # both modules read tensors
      patcher = mock.patch.object(module, '_read_safetensors_tensor', side_effect=spy)
      patcher.start()
      self.addCleanup(patcher.stop)
    return offsets

  def _llm_with_tokenizer(self, prefix, kind, overrides, seed=0):
    tokenizer = numpy_state(kind, overrides, seed)
    rng = np.random.default_rng(seed + 1)
    state = {f'{prefix}{k}': v for k, v in tokenizer.items()}
    state.update({'model.embed_tokens.weight': rng.standard_normal((100, 16)).astype(np.float32),
                  'model.layers.0.mlp.up_proj.weight': np.ones((32, 16), np.float32),
                  'lm_head.weight': np.zeros((100, 16), np.float32)})
    return tokenizer, state

  def _offsets(self, path, prefix):
    infos = hf_streaming.read_safetensors_header(path)
    return {i.offset for n, i in infos.items() if n.startswith(prefix)}

  @parameterized.named_parameters(
      ('hf_chameleon', 'model.vqmodel.', 'chameleon_vqgan', TINY_CHAMELEON),
      ('bare_vqmodel', 'vqmodel.', 'chameleon_vqgan', TINY_CHAMELEON),
      ('janus', 'gen_vision_model.', 'llamagen_vq16', TINY_VQ16),
  )
  def test_prefix_is_stripped_and_nothing_else_is_read(self, prefix, kind, overrides):
    tokenizer, state = self._llm_with_tokenizer(prefix, kind, overrides)
    path = self.tmp / 'model.safetensors'
    hf_streaming.write_safetensors(path, state)
    reads = self._spy_reads()
    out = vq_converter.convert(path, self.tmp / 'out', kind, config_overrides=overrides)
    self.assertTrue(reads)
    self.assertLessEqual(set(reads), self._offsets(path, prefix))  # LLM tensors never read
    _, params = vq_converter.load_tokenizer(out)
    jax.tree_util.tree_map(np.testing.assert_array_equal, params,
                           expected_params(tokenizer, kind, overrides))
    self.assertEqual(common.read_meta(out)['tokenizer_prefix'], prefix)

  def test_hugging_face_folder_and_tokenizer_in_one_shard_of_two(self):
    # Janus-Pro: the tokenizer sits in one shard; the other holds only LLM
    # tensors (it used to be taken whole as the tokenizer).
    tokenizer, state = self._llm_with_tokenizer('gen_vision_model.', 'llamagen_vq16', TINY_VQ16)
    llm = {k: v for k, v in state.items() if not k.startswith('gen_vision_model.')}
    vq_part = {k: v for k, v in state.items() if k.startswith('gen_vision_model.')}
    hf_streaming.write_safetensors(self.tmp / 'llm.safetensors', llm)
    hf_streaming.write_safetensors(self.tmp / 'vq.safetensors', vq_part)
    expected = expected_params(tokenizer, 'llamagen_vq16', TINY_VQ16)
    out = vq_converter.convert([self.tmp / 'llm.safetensors', self.tmp / 'vq.safetensors'],
                               self.tmp / 'out_files', 'llamagen_vq16',
                               config_overrides=TINY_VQ16)
    jax.tree_util.tree_map(np.testing.assert_array_equal,
                           vq_converter.load_tokenizer(out)[1], expected)
    # The same weights as a Hugging Face folder (index + shards), streamed.
    folder = self.tmp / 'hf'
    hf_streaming.write_sharded_safetensors(state.items(), folder, max_shard_bytes=20000)
    reads = self._spy_reads()
    out = vq_converter.convert(folder, self.tmp / 'out_folder', 'llamagen_vq16',
                               config_overrides=TINY_VQ16)
    jax.tree_util.tree_map(np.testing.assert_array_equal,
                           vq_converter.load_tokenizer(out)[1], expected)
    self.assertLen(reads, len(tokenizer) - 1)  # every tokenizer weight, no buffer, no LLM
    self.assertLen(common.read_meta(out)['source_files'], len(list(folder.iterdir())))

  @ref.requires_torch
  def test_janus_bin_shards_are_memory_mapped(self):
    tokenizer, state = self._llm_with_tokenizer('gen_vision_model.', 'llamagen_vq16', TINY_VQ16)
    names = sorted(state)
    paths = []
    for k, group in enumerate((names[::2], names[1::2])):
      paths.append(self.tmp / f'pytorch_model-{k + 1:05d}-of-00002.bin')
      ref.torch.save({n: ref.as_torch(state[n]) for n in group}, paths[-1])
    with mock.patch.object(ref.torch, 'load', wraps=ref.torch.load) as load:
      out = vq_converter.convert(paths, self.tmp / 'out', 'llamagen_vq16',
                                 config_overrides=TINY_VQ16)
    self.assertEqual([c.kwargs['mmap'] for c in load.call_args_list], [True, True])
    jax.tree_util.tree_map(np.testing.assert_array_equal, vq_converter.load_tokenizer(out)[1],
                           expected_params(tokenizer, 'llamagen_vq16', TINY_VQ16))

  def test_two_prefixes_are_refused(self):
    _, state = self._llm_with_tokenizer('gen_vision_model.', 'llamagen_vq16', TINY_VQ16)
    state['model.vqmodel.quantize.embedding.weight'] = np.zeros((64, 8), np.float32)
    path = self.tmp / 'model.safetensors'
    hf_streaming.write_safetensors(path, state)
    with self.assertRaisesRegex(common.CheckpointReadError, 'several prefixes'):
      vq_converter.convert(path, self.tmp / 'out', 'llamagen_vq16', config_overrides=TINY_VQ16)
    self.assertFalse((self.tmp / 'out').exists())

  def test_encoder_only_vqmodel_gets_a_hint(self):
    # Hugging Face Chameleon / Lumina-mGPT keep only the VQ encoder.
    _, state = self._llm_with_tokenizer('model.vqmodel.', 'chameleon_vqgan', TINY_CHAMELEON)
    state = {k: v for k, v in state.items() if not k.startswith('model.vqmodel.decoder.')}
    path = self.tmp / 'model.safetensors'
    hf_streaming.write_safetensors(path, state)
    with self.assertRaisesRegex(common.CheckpointMismatchError,
                                "(?s)missing.*decoder.conv_in.weight.*holds no decoder.*"
                                "vqgan.ckpt"):
      vq_converter.convert(path, self.tmp / 'out', 'chameleon_vqgan',
                           config_overrides=TINY_CHAMELEON)
    self.assertFalse((self.tmp / 'out').exists())

  def test_vq8_hint_is_a_valid_llamagen_vq8(self):
    # VQ-8 (FoundationVision/LlamaGen): ch_mult [1, 2, 2, 4], attention at the last level.
    config = vq_converter.preset_config('llamagen_vq16', vq_converter.VQ8_OVERRIDES)
    self.assertEqual((config.ch_mult, config.attn_levels), ((1, 2, 2, 4), (3,)))
    self.assertEqual(config.downsample_factor, 8)
    shapes = vq_converter.expected_shapes(config, 'llamagen_vq16')
    self.assertIn('encoder.conv_blocks.3.attn.1.q.weight', shapes)
    self.assertIn('decoder.conv_blocks.0.attn.2.q.weight', shapes)
    self.assertNotIn('encoder.conv_blocks.2.attn.0.q.weight', shapes)
    hint = vq_converter._kind_hint(  # pylint: disable=protected-access
        ['a'], 'llamagen_vq16', config)
    self.assertIn('"attn_levels": [3]', hint)


class ConverterOutputTest(absltest.TestCase):

  @ref.requires_torch
  def test_meta_and_bfloat16_output(self):
    tmp = make_tmp_dir(self)
    model = make_llamagen()
    save_llamagen(model, tmp / 'vq.pt')
    out = vq_converter.convert(tmp / 'vq.pt', tmp / 'bf16', 'llamagen_vq16', dtype='bfloat16',
                               config_overrides=TINY_VQ16)
    meta = common.read_meta(out)
    self.assertEqual(meta['kind'], 'llamagen_vq16')
    self.assertEqual(meta['source_files'][0]['sha256'], common.sha256_file(tmp / 'vq.pt'))
    self.assertEqual(vq.VQConfig.from_dict(meta['config']), vq.vq16_config(**TINY_VQ16))
    tokenizer, params = vq_converter.load_tokenizer(out)
    dtypes = {str(x.dtype) for x in jax.tree_util.tree_leaves(params)}
    self.assertEqual(dtypes, {'bfloat16'})
    codes = np.arange(16).reshape(1, 16) * 3
    expected = decode_reference(model, codes)
    # Decoding the bf16 weights in float32 (reusing the compiled fp32 decode) stays
    # close to the fp32 original.
    decoded = tokenizer.decode(common.cast_params(params, 'float32'), codes, GRID)
    self.assertLess(relative_error(decoded, expected), 5e-2)

  def test_command_line(self):
    tmp = make_tmp_dir(self)
    state = numpy_state('chameleon_vqgan', TINY_CHAMELEON)
    state['loss.logvar'] = np.zeros((), np.float32)  # dropped: not a tokenizer weight
    hf_streaming.write_safetensors(tmp / 'vqgan.safetensors', state)
    env = dict(os.environ, JAX_PLATFORMS='cpu')

    def run(*flags_):
      cmd = [sys.executable, '-m', 'specdec_jax.converters.vq',
             f'--input={tmp / "vqgan.safetensors"}', f'--output={tmp / "out"}',
             '--kind=chameleon_vqgan', *flags_]
      return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)

    # A config error is a one-line usage error naming the field, not a traceback.
    result = run('--config_json={"channels": 3}')
    self.assertNotEqual(result.returncode, 0)
    self.assertIn("unknown VQConfig field(s) ['channels']", result.stderr)
    self.assertNotIn('Traceback', result.stderr)
    result = run(f'--config_json={json.dumps(TINY_CHAMELEON)}')
    self.assertEqual(result.returncode, 0, result.stderr[-2000:])
    self.assertIn('converting', result.stderr)  # absl progress lines
    self.assertTrue((tmp / 'out' / common.META_FILENAME).is_file())


class TokenizerTest(parameterized.TestCase):
  """Properties of the Flax tokenizer that hold for any weights."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tokenizer = vq.VQTokenizer(vq.vq16_config(**TINY_VQ16))
    cls.params = cls.tokenizer.init(jax.random.key(0))

  def test_tokens_are_nearest_normalised_codes(self):
    images = random_images(0)
    latents = np.asarray(self.tokenizer.encode_latents(self.params, images), np.float64)
    tokens = np.asarray(self.tokenizer.encode(self.params, images)).reshape(2, 4, 4)
    book = np.asarray(self.params['quantize']['embedding'], np.float64)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
    dist = np.sum((unit(latents)[..., None, :] - unit(book)) ** 2, axis=-1)  # [2, 4, 4, V]
    np.testing.assert_array_equal(tokens, np.argmin(dist, axis=-1))

  def test_codebook_rows_encode_to_themselves(self):
    # nearest_codes(table[i]) == i for a codebook of distinct unit rows.
    table = vq.l2_normalize(jax.random.normal(jax.random.key(1), (64, 8)))
    np.testing.assert_array_equal(vq.nearest_codes(table, table), np.arange(64))

  def test_uint8_and_float_inputs_agree(self):
    images = random_images(1)
    as_float = images.astype(np.float32) / 127.5 - 1.0
    np.testing.assert_array_equal(self.tokenizer.encode(self.params, images),
                                  self.tokenizer.encode(self.params, as_float))

  def test_decode_accepts_lists_and_rejects_bad_tokens(self):
    with self.assertRaisesRegex(ValueError, r'\[B, h\*w\] = \[B, 16\]'):
      self.tokenizer.decode(self.params, np.zeros((1, 15), np.int32), GRID)
    with self.assertRaisesRegex(ValueError, r'\[0, 64\).*\[64, 64\].*offset'):
      self.tokenizer.decode(self.params, np.full((1, 16), 64), GRID)
    with self.assertRaisesRegex(ValueError, 'divisible by the downsample factor 2'):
      self.tokenizer.encode(self.params, np.zeros((1, 9, 8, 3), np.uint8))
    with self.assertRaisesRegex(ValueError, r'\[B, H, W, 3\]'):
      self.tokenizer.encode(self.params, np.zeros((1, 3, 8, 8), np.uint8))

  def test_decode_compiles_once_per_shape(self):
    codes = lambda seed: np.random.default_rng(seed).integers(0, 64, (2, 16))
    self.tokenizer.decode(self.params, codes(0), GRID)
    compiled = vq._decode._cache_size()  # pylint: disable=protected-access
    for seed in range(1, 4):
      self.tokenizer.decode(self.params, codes(seed), GRID)
    self.assertEqual(vq._decode._cache_size(), compiled)  # pylint: disable=protected-access

  @parameterized.named_parameters(
      # x: -1, -0.999, 0, 0.5, 1, out of range both sides.
      ('llamagen', 'llamagen', [0, 0, 128, 191, 255, 0, 255]),
      ('chameleon', 'chameleon', [0, 0, 127, 191, 255, 0, 255]),
  )
  def test_to_uint8(self, style, expected):
    x = np.array([-1.0, -0.999, 0.0, 0.5, 1.0, -3.0, 3.0], np.float32)
    out = vq.to_uint8(x, style)
    self.assertEqual(out.dtype, jnp.uint8)
    np.testing.assert_array_equal(out, expected)

  @ref.requires_torch
  def test_to_uint8_matches_the_original_expressions(self):
    torch = ref.torch
    x = np.random.default_rng(2).uniform(-1.3, 1.3, size=1000).astype(np.float32)
    xt = torch.from_numpy(x)
    llamagen = torch.clamp(127.5 * xt + 128.0, 0, 255).to(torch.uint8).numpy()
    lumina = ((torch.clamp(xt, -1, 1) + 1) / 2 * 255).numpy().astype(np.uint8)
    np.testing.assert_array_equal(vq.to_uint8(x, 'llamagen'), llamagen)
    np.testing.assert_array_equal(vq.to_uint8(x, 'chameleon'), lumina)

  def test_small_config_gives_16x16_grid_for_32x32_images(self):
    # Shapes only (tracing, no compile): 32x32x1 -> 256 tokens -> 32x32x1.
    config = vq.small_vq_config()
    tokenizer = vq.VQTokenizer(config)
    params = tokenizer.param_shapes()
    self.assertEqual(tokenizer.latent_grid(32, 32), (16, 16))
    images = jax.ShapeDtypeStruct((2, 32, 32, 1), jnp.float32)
    encode, decode = vq._encode, vq._decode  # pylint: disable=protected-access
    _, tokens = jax.eval_shape(encode, config, params, images)
    self.assertEqual(tokens.shape, (2, 16, 16))
    decoded = jax.eval_shape(lambda p, t: decode(config, p, t, (16, 16)),
                             params, jax.ShapeDtypeStruct((2, 256), jnp.int32))
    self.assertEqual(decoded.shape, (2, 32, 32, 1))

  def test_vq_losses_straight_through(self):
    # One level (no stride) keeps the backward-pass compile short.
    tokenizer = vq.VQTokenizer(vq.vq16_config(**dict(TINY_VQ16, ch_mult=(1,), attn_levels=())))
    params = tokenizer.init(3)
    images = np.random.default_rng(3).integers(0, 256, (2, 4, 4, 3)).astype(np.uint8)
    loss_fn = lambda p: vq.vq_losses(tokenizer, p, images)
    (total, aux), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
    np.testing.assert_allclose(aux['commitment'], 0.25 * aux['codebook'], rtol=1e-5)
    np.testing.assert_allclose(
        total, aux['reconstruction'] + aux['codebook'] + aux['commitment'], rtol=1e-6)
    self.assertEqual(aux['tokens'].shape, (2, 16))
    self.assertEqual(aux['reconstructions'].shape, images.shape)
    # The reconstruction loss reaches the encoder through the straight-through path.
    encoder_grad = grads['encoder']['conv_in']['kernel']
    self.assertGreater(float(jnp.abs(encoder_grad).max()), 0.0)
    # Only the used codebook rows receive gradient (from the codebook loss).
    row_grad = np.abs(np.asarray(grads['quantize']['embedding'])).sum(axis=1)
    used = np.unique(np.asarray(aux['tokens']))
    self.assertTrue(np.all(row_grad[used] > 0))
    self.assertTrue(np.all(row_grad[np.setdiff1d(np.arange(64), used)] == 0))

  def test_config_validation(self):
    with self.assertRaisesRegex(ValueError, 'divisible by norm_groups=32'):
      vq.VQConfig(ch=48)
    with self.assertRaisesRegex(ValueError, 'attn_levels'):
      vq.VQConfig(attn_levels=(5,))
    with self.assertRaisesRegex(ValueError, 'unknown fields'):
      vq.VQConfig.from_dict({'channels': 3})


if __name__ == '__main__':
  absltest.main()
