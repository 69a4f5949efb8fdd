"""Tests for converters/vq.py: input errors and converter output files.

Run without torch except where marked; see tests/test_vq.py.
"""

import os
import json
import subprocess
import sys

from absl import app
from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from specdec_jax.converters import common
from specdec_jax.converters import hf_streaming
from specdec_jax.converters import vq as vq_converter
from specdec_jax.models import vq
from tests import torch_reference as ref
from tests.vq_support import TINY_VQ16
from tests.vq_support import TINY_CHAMELEON
from tests.vq_support import GRID
from tests.vq_support import make_tmp_dir
from tests.vq_support import relative_error
from tests.vq_support import numpy_state
from tests.vq_support import make_llamagen
from tests.vq_support import save_llamagen
from tests.vq_support import decode_reference


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


if __name__ == '__main__':
  absltest.main()
