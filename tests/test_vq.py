"""Tests for models/vq.py, models/vq_blocks.py and converters/vq.py.

The parity tests use an independent PyTorch forward of the original
architectures (`tests/torch_reference_vq.py`): LlamaGen's VQ-16
(FoundationVision/LlamaGen `tokenizer/tokenizer_image/vq_model.py`) with its
`conv_blocks.{i}.res/attn/downsample|upsample` names and the taming/Chameleon
VQGAN with `down/up.{i}.block/attn`, `mid.block_1/attn_1/block_2`. Random
weights in those key layouts are saved in the original file formats,
converted, loaded, and compared at fp32. Converter checks that need no
reference run without torch, on numpy weights saved as safetensors.
"""

from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.converters import common
from specdec_jax.converters import vq as vq_converter
from specdec_jax.models import vq
from tests import torch_reference as ref
from tests.vq_support import TINY_VQ16
from tests.vq_support import TINY_CHAMELEON
from tests.vq_support import IMAGE_SIZE
from tests.vq_support import GRID
from tests.vq_support import make_tmp_dir
from tests.vq_support import relative_error
from tests.vq_support import random_images
from tests.vq_support import torch_images
from tests.vq_support import make_llamagen
from tests.vq_support import make_chameleon
from tests.vq_support import save_llamagen
from tests.vq_support import save_chameleon
from tests.vq_support import decode_reference


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
    # A 2 x 8 grid (raster order: rows of 8) decodes to a wide image, not a tall one.
    wide = tokenizer.decode(params, codes, (2, 8))
    self.assertEqual(wide.shape, (2, IMAGE_SIZE // 2, IMAGE_SIZE * 2, 3))
    self.assertLess(relative_error(wide, decode_reference(model, codes, (2, 8))), 1e-4)

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
    decoded = tokenizer.decode(params, codes, GRID)
    self.assertLess(relative_error(decoded, expected), 1e-4)
    self.assertEqual(common.read_meta(out)['tokenizer_prefix'], 'gen_vision_model.')
    # Janus's generation_inference.py: clip((x + 1) / 2 * 255, 0, 255) cast to uint8.
    # Its pixels are compared away from the rounding boundaries, where float noise
    # could move one either way; LlamaGen's cast (the negative control) is a grey
    # level higher on about half of them.
    janus = np.clip((np.asarray(decoded) + 1) / 2 * 255, 0, 255)
    clear = np.abs(janus - np.round(janus)) > 0.05
    self.assertEqual(tokenizer.config.uint8_style, 'chameleon')
    np.testing.assert_array_equal(np.asarray(tokenizer.to_uint8(decoded))[clear],
                                  janus.astype(np.uint8)[clear])
    llamagen_cast = np.asarray(vq.to_uint8(decoded, 'llamagen'))[clear]
    self.assertGreater(np.mean(llamagen_cast != janus.astype(np.uint8)[clear]), 0.2)

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
