"""Tests for converters/llamagen.py (safetensors and original checkpoints,
CLI errors). See tests/test_llamagen.py.
"""

import dataclasses
import json
import pathlib
from unittest import mock

from absl import app
from absl import flags
from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax.numpy as jnp
import numpy as np

from specdec_jax.converters import common
from specdec_jax.converters import hf_streaming
from specdec_jax.converters import llamagen as convert
from specdec_jax.models import layers
from specdec_jax.models import llamagen
from tests import torch_reference as ref
from tests import torch_reference_llamagen as ref_llamagen
from tests.llamagen_support import tiny_config
from tests.llamagen_support import torch_state
from tests.llamagen_support import rel_err
from tests.llamagen_support import fixture
from tests.llamagen_support import jit_forward
from tests.llamagen_support import capacity
from tests.llamagen_support import _tempdir
from tests.llamagen_support import example_cond
from tests.llamagen_support import image_tokens
from tests.llamagen_support import RTOL


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

  def test_loading_checks_the_params_against_the_recorded_config(self):
    """A converted folder whose params and specdec_meta.json disagree is refused on load
    (more layers than the config ran silently on part of them; fewer failed in Flax)."""
    out = convert.convert_file(self._save(self.state), self.dir / 'out', self.config)
    meta_path = pathlib.Path(out) / common.META_FILENAME
    meta = json.loads(meta_path.read_text())
    for n_layer, listing in ((self.config.n_layer - 1, r'9 unexpected.*layers_1/'),
                             (self.config.n_layer + 1, r'missing keys:\n    layers_2/')):
      meta['config']['n_layer'] = n_layer
      meta_path.write_text(json.dumps(meta))
      with self.assertRaisesRegex(common.CheckpointMismatchError,
                                  f'(?s)LlamaGen GPT \\(c2i\\).*{listing}.*convert the '
                                  'original checkpoint again'):
        convert.load_llamagen(out)

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
    # The command line keeps the stored dtype (fp32 here) unless told --dtype=bfloat16.
    self._main(f'--input={self._save(self.state)}', '--model_type=c2i', '--image_size=64',
               '--dtype=bfloat16')
    model, params = convert.load_llamagen(self.dir / 'out')
    self.assertEqual(model.config, dataclasses.replace(self.config, dtype='bfloat16'))
    self.assertEqual(params['output']['kernel'].dtype, jnp.bfloat16)
    self._main(f'--input={self._save(self.state)}', '--image_size=64', '--overwrite')
    model, params = convert.load_llamagen(self.dir / 'out')
    self.assertEqual(model.config, self.config)
    self.assertEqual(params['output']['kernel'].dtype, jnp.float32)
    # The same checkpoint loads into a model scanning over its layers.
    model, stacked = convert.load_llamagen(self.dir / 'out', scan_layers=True)
    self.assertTrue(model.config.scan_layers)
    chex.assert_trees_all_equal(stacked, layers.stack_layer_params(params))
    self.assertEqual(stacked['layers']['mlp']['down']['kernel'].shape[0], self.config.n_layer)

  @ref.requires_torch
  @parameterized.parameters('c2i', 't2i')
  def test_command_line_defaults_reproduce_the_original_logits(self, model_type):
    """No --dtype: an fp32 checkpoint converts losslessly, so the converted model's
    logits equal the original PyTorch GPT's at fp32 tolerance (bfloat16, the old
    default, was 3.6% / 5.4% off)."""
    config, state, _ = fixture(model_type)
    extra = ['--model_type=t2i', f'--set=cls_token_num={config.cls_token_num}'] * (
        model_type == 't2i')
    self._main(f'--input={self._save(state, "ckpt_64.safetensors")}', *extra)
    model, params = convert.load_llamagen(self.dir / 'out')
    self.assertEqual(model.config, config)
    idx = image_tokens(config)
    cond_ref, mask, cond_jax = example_cond(config)
    expected = ref_llamagen.gpt_forward(state, config, cond_ref, idx, mask).numpy()
    actual = llamagen.forward_logits(params, model.config, cond_jax, jnp.asarray(idx, jnp.int32))
    self.assertLess(rel_err(actual, expected), RTOL)

  def test_default_keeps_a_bfloat16_checkpoint_bfloat16(self):
    """Lossless is not a blanket float32: bf16 weights stay bf16, bit for bit; a
    checkpoint mixing bf16 and fp32 tensors is written in fp32."""
    bf16 = {k: v.astype(jnp.bfloat16) for k, v in self.state.items()}
    self._main(f'--input={self._save(bf16, "ckpt_64.safetensors")}')
    model, params = convert.load_llamagen(self.dir / 'out')
    self.assertEqual(model.config.dtype, 'bfloat16')
    np.testing.assert_array_equal(params['output']['kernel'], bf16['output.weight'].T)
    mixed = dict(bf16, **{'norm.weight': self.state['norm.weight']})
    self._main(f'--input={self._save(mixed, "ckpt_64.safetensors")}', '--overwrite')
    model, params = convert.load_llamagen(self.dir / 'out')
    self.assertEqual(model.config.dtype, 'float32')
    self.assertEqual(common.read_meta(self.dir / 'out')['dtype'], 'float32')
    np.testing.assert_array_equal(params['output']['kernel'],
                                  bf16['output.weight'].T.astype(np.float32))

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
    model, _ = convert.load_llamagen(self.dir / 'out', dtype='auto')  # float32 on CPU
    self.assertEqual(model.config, self.config)  # block_size (64/16)^2 = 16

  @parameterized.named_parameters(
      ('bad_int', '--set=dim=abc', 'dim must be int'),
      ('unknown_field', '--set=width=3', "--set 'width=3'.*field one of"),
      ('bad_preset', '--config=GPT-Q', 'Unknown LlamaGen config'),
      ('not_a_grid', '--image_size=72', 'image_size 72 must be a multiple'),
      ('zero_image_size', '--image_size=0', 'image_size 0 must be a multiple of the VQ '
                                            'downsampling 16 and at least 16'),
      ('negative_image_size', '--image_size=-256', 'image_size -256 must be'),
      ('bad_bool', '--set=scan_layers=maybe', 'scan_layers must be bool'),
  )
  def test_config_errors_are_usage_errors(self, flag, message):
    path = self._save(self.state, 'c2i_tiny_64.safetensors')
    with self.assertRaisesRegex(app.UsageError, message):
      self._main(f'--input={path}', flag)
    self._assert_no_output()

  def test_set_parses_each_field_type(self):
    self.assertEqual(convert.parse_overrides(['dim=64', 'rope_base=1e4', 'scan_layers=False',
                                              'model_type=t2i']),
                     dict(dim=64, rope_base=1e4, scan_layers=False, model_type='t2i'))
    self.assertIs(convert.parse_overrides(['scan_layers=TRUE'])['scan_layers'], True)

  def test_unwritable_output_fails_before_converting(self):
    """An --output under a file cannot be created: refused before any tensor is read."""
    (self.dir / 'a_file').write_text('x')
    path = self._save(self.state, 'c2i_tiny_64.safetensors')
    argv = [f'--input={path}', f'--output={self.dir / "a_file" / "out"}']
    with mock.patch.object(convert, 'convert_llamagen_gpt') as converted, \
        mock.patch.object(common, 'load_state_dict') as read:
      with self.assertRaisesRegex(app.UsageError, r'a_file/out.* cannot be written.*is a file'):
        self._main(*argv)
      with self.assertRaisesRegex(ValueError, 'cannot be written'):
        convert.convert_file(path, self.dir / 'a_file' / 'out', self.config)
    converted.assert_not_called()
    read.assert_not_called()


if __name__ == '__main__':
  absltest.main()
