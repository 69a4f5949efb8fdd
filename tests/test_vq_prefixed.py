"""Tests for prefixed VQ tokenizer checkpoints (converters/vq.py, models/vq.py).

See tests/test_vq.py for the reference setup.
"""

from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from specdec_jax.converters import common
from specdec_jax.converters import hf_streaming
from specdec_jax.converters import safetensors_io
from specdec_jax.converters import vq as vq_converter
from tests import torch_reference as ref
from tests.vq_support import TINY_VQ16
from tests.vq_support import TINY_CHAMELEON
from tests.vq_support import make_tmp_dir
from tests.vq_support import numpy_state
from tests.vq_support import expected_params


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

  def test_a_tensor_in_two_inputs_is_named_not_overwritten(self):
    """The same tokenizer tensor in two input files (a re-download beside the old
    shard): refused before any read, as `hf_streaming.open_checkpoint` refuses it."""
    _, state = self._llm_with_tokenizer('gen_vision_model.', 'llamagen_vq16', TINY_VQ16)
    names = sorted(state)
    twice = 'gen_vision_model.quantize.embedding.weight'
    paths = [self.tmp / 'first.safetensors', self.tmp / 'second.safetensors']
    for path, group in zip(paths, (names[::2], names[1::2])):
      group = set(group) | {twice}
      hf_streaming.write_safetensors(path, {n: state[n] for n in group})
    with self.assertRaisesRegex(common.CheckpointReadError,
                                r"1 tokenizer tensor\(s\) are in more than one input, such as "
                                r"'quantize.embedding.weight' in \[.*first.*second"):
      vq_converter.convert(paths, self.tmp / 'out', 'llamagen_vq16', config_overrides=TINY_VQ16)
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


if __name__ == '__main__':
  absltest.main()
