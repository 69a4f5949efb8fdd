"""Tests for models/vq.py, models/vq_blocks.py and converters/vq.py.

The parity tests hold an independent PyTorch forward of the original
architectures, written from the reference notes
(`models_and_checkpoints.md` 1.10 and 2.5): LlamaGen's VQ-16 with its
`conv_blocks.{i}.res/attn/downsample|upsample` names and the taming/Chameleon
VQGAN with `down/up.{i}.block/attn`, `mid.block_1/attn_1/block_2`. Random
weights in those key layouts are saved in the original file formats,
converted, loaded, and compared at fp32.
"""

import argparse
import os
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

from specdec_jax.converters import common
from specdec_jax.converters import vq as vq_converter
from specdec_jax.models import vq

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


# ------------------------------------------------ PyTorch reference (original) ---


def swish(x):
  return x * torch.sigmoid(x)


def group_norm(channels):
  return nn.GroupNorm(32, channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):

  def __init__(self, cin, cout):
    super().__init__()
    self.norm1 = group_norm(cin)
    self.conv1 = nn.Conv2d(cin, cout, 3, 1, 1)
    self.norm2 = group_norm(cout)
    self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
    if cin != cout:
      self.nin_shortcut = nn.Conv2d(cin, cout, 1, 1, 0)

  def forward(self, x):
    h = self.conv1(swish(self.norm1(x)))
    h = self.conv2(swish(self.norm2(h)))
    if hasattr(self, 'nin_shortcut'):
      x = self.nin_shortcut(x)
    return x + h


class AttnBlock(nn.Module):

  def __init__(self, channels):
    super().__init__()
    self.norm = group_norm(channels)
    self.q = nn.Conv2d(channels, channels, 1)
    self.k = nn.Conv2d(channels, channels, 1)
    self.v = nn.Conv2d(channels, channels, 1)
    self.proj_out = nn.Conv2d(channels, channels, 1)

  def forward(self, x):
    h = self.norm(x)
    q, k, v = self.q(h), self.k(h), self.v(h)
    b, c, height, width = q.shape
    q = q.reshape(b, c, height * width).permute(0, 2, 1)  # b, hw, c
    k = k.reshape(b, c, height * width)  # b, c, hw
    weights = torch.softmax(torch.bmm(q, k) * (int(c) ** -0.5), dim=2)
    out = torch.bmm(v.reshape(b, c, height * width), weights.permute(0, 2, 1))
    return x + self.proj_out(out.reshape(b, c, height, width))


class Downsample(nn.Module):

  def __init__(self, channels):
    super().__init__()
    self.conv = nn.Conv2d(channels, channels, 3, 2, 0)

  def forward(self, x):
    return self.conv(F.pad(x, (0, 1, 0, 1), mode='constant', value=0))


class Upsample(nn.Module):

  def __init__(self, channels):
    super().__init__()
    self.conv = nn.Conv2d(channels, channels, 3, 1, 1)

  def forward(self, x):
    return self.conv(F.interpolate(x, scale_factor=2.0, mode='nearest'))


class LlamaGenEncoder(nn.Module):
  """LlamaGen names: conv_blocks.{i}.res/attn/downsample, mid.{0,1,2}."""

  def __init__(self, ch, ch_mult, num_res_blocks, z_channels, attn_levels, in_channels=3):
    super().__init__()
    self.conv_in = nn.Conv2d(in_channels, ch, 3, 1, 1)
    self.conv_blocks = nn.ModuleList()
    block_in = ch
    for level, mult in enumerate(ch_mult):
      block = nn.Module()
      block.res, block.attn = nn.ModuleList(), nn.ModuleList()
      for _ in range(num_res_blocks):
        block.res.append(ResnetBlock(block_in, ch * mult))
        block_in = ch * mult
        if level in attn_levels:
          block.attn.append(AttnBlock(block_in))
      if level != len(ch_mult) - 1:
        block.downsample = Downsample(block_in)
      self.conv_blocks.append(block)
    self.mid = nn.ModuleList([ResnetBlock(block_in, block_in), AttnBlock(block_in),
                              ResnetBlock(block_in, block_in)])
    self.norm_out = group_norm(block_in)
    self.conv_out = nn.Conv2d(block_in, z_channels, 3, 1, 1)

  def forward(self, x):
    h = self.conv_in(x)
    for block in self.conv_blocks:
      for j, res in enumerate(block.res):
        h = res(h)
        if len(block.attn):
          h = block.attn[j](h)
      if hasattr(block, 'downsample'):
        h = block.downsample(h)
    for layer in self.mid:
      h = layer(h)
    return self.conv_out(swish(self.norm_out(h)))


class LlamaGenDecoder(nn.Module):
  """conv_blocks.{k}: k = 0 is the lowest resolution (ch_mult index n-1)."""

  def __init__(self, ch, ch_mult, num_res_blocks, z_channels, attn_levels, out_channels=3):
    super().__init__()
    block_in = ch * ch_mult[-1]
    self.conv_in = nn.Conv2d(z_channels, block_in, 3, 1, 1)
    self.mid = nn.ModuleList([ResnetBlock(block_in, block_in), AttnBlock(block_in),
                              ResnetBlock(block_in, block_in)])
    self.conv_blocks = nn.ModuleList()
    for level in reversed(range(len(ch_mult))):
      block = nn.Module()
      block.res, block.attn = nn.ModuleList(), nn.ModuleList()
      for _ in range(num_res_blocks + 1):
        block.res.append(ResnetBlock(block_in, ch * ch_mult[level]))
        block_in = ch * ch_mult[level]
        if level in attn_levels:
          block.attn.append(AttnBlock(block_in))
      if level != 0:
        block.upsample = Upsample(block_in)
      self.conv_blocks.append(block)
    self.norm_out = group_norm(block_in)
    self.conv_out = nn.Conv2d(block_in, out_channels, 3, 1, 1)

  def forward(self, z):
    h = self.conv_in(z)
    for layer in self.mid:
      h = layer(h)
    for block in self.conv_blocks:
      for j, res in enumerate(block.res):
        h = res(h)
        if len(block.attn):
          h = block.attn[j](h)
      if hasattr(block, 'upsample'):
        h = block.upsample(h)
    return self.conv_out(swish(self.norm_out(h)))


class TamingEncoder(nn.Module):
  """Chameleon/taming names: down.{i}.block/attn/downsample, mid.block_1/attn_1/block_2."""

  def __init__(self, ch, ch_mult, num_res_blocks, z_channels, in_channels=3):
    super().__init__()
    self.conv_in = nn.Conv2d(in_channels, ch, 3, 1, 1)
    self.down = nn.ModuleList()
    block_in = ch
    for level, mult in enumerate(ch_mult):
      down = nn.Module()
      down.block, down.attn = nn.ModuleList(), nn.ModuleList()  # attn_resolutions = []
      for _ in range(num_res_blocks):
        down.block.append(ResnetBlock(block_in, ch * mult))
        block_in = ch * mult
      if level != len(ch_mult) - 1:
        down.downsample = Downsample(block_in)
      self.down.append(down)
    self.mid = nn.Module()
    self.mid.block_1 = ResnetBlock(block_in, block_in)
    self.mid.attn_1 = AttnBlock(block_in)
    self.mid.block_2 = ResnetBlock(block_in, block_in)
    self.norm_out = group_norm(block_in)
    self.conv_out = nn.Conv2d(block_in, z_channels, 3, 1, 1)  # double_z False

  def forward(self, x):
    h = self.conv_in(x)
    for down in self.down:
      for block in down.block:
        h = block(h)
      if hasattr(down, 'downsample'):
        h = down.downsample(h)
    h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
    return self.conv_out(swish(self.norm_out(h)))


class TamingDecoder(nn.Module):
  """up.{i} is ch_mult index i; up.{n-1} (lowest resolution) runs first."""

  def __init__(self, ch, ch_mult, num_res_blocks, z_channels, out_channels=3):
    super().__init__()
    block_in = ch * ch_mult[-1]
    self.conv_in = nn.Conv2d(z_channels, block_in, 3, 1, 1)
    self.mid = nn.Module()
    self.mid.block_1 = ResnetBlock(block_in, block_in)
    self.mid.attn_1 = AttnBlock(block_in)
    self.mid.block_2 = ResnetBlock(block_in, block_in)
    self.up = nn.ModuleList()
    for level in reversed(range(len(ch_mult))):
      up = nn.Module()
      up.block, up.attn = nn.ModuleList(), nn.ModuleList()
      for _ in range(num_res_blocks + 1):
        up.block.append(ResnetBlock(block_in, ch * ch_mult[level]))
        block_in = ch * ch_mult[level]
      if level != 0:
        up.upsample = Upsample(block_in)
      self.up.insert(0, up)
    self.norm_out = group_norm(block_in)
    self.conv_out = nn.Conv2d(block_in, out_channels, 3, 1, 1)

  def forward(self, z):
    h = self.conv_in(z)
    h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
    for level in reversed(range(len(self.up))):
      for block in self.up[level].block:
        h = block(h)
      if level != 0:
        h = self.up[level].upsample(h)
    return self.conv_out(swish(self.norm_out(h)))


class TorchVQ(nn.Module):
  """VQModel: encoder, quant_conv, quantize.embedding, post_quant_conv, decoder."""

  def __init__(self, style, codebook_size, codebook_dim, ch, ch_mult, num_res_blocks,
               z_channels, attn_levels=()):
    super().__init__()
    self.style = style
    if style == 'llamagen':
      self.encoder = LlamaGenEncoder(ch, ch_mult, num_res_blocks, z_channels, attn_levels)
      self.decoder = LlamaGenDecoder(ch, ch_mult, num_res_blocks, z_channels, attn_levels)
    else:
      self.encoder = TamingEncoder(ch, ch_mult, num_res_blocks, z_channels)
      self.decoder = TamingDecoder(ch, ch_mult, num_res_blocks, z_channels)
    self.quantize = nn.Module()
    self.quantize.embedding = nn.Embedding(codebook_size, codebook_dim)
    if style == 'llamagen':
      self.quantize.register_buffer('codebook_used', torch.zeros(65536))
    self.quant_conv = nn.Conv2d(z_channels, codebook_dim, 1)
    self.post_quant_conv = nn.Conv2d(codebook_dim, z_channels, 1)
    self.l2_norm = style == 'llamagen'

  def table(self):
    weight = self.quantize.embedding.weight
    return F.normalize(weight, p=2, dim=-1) if self.l2_norm else weight

  def encode(self, x):
    """-> (pre-quant latents NCHW, token ids [B, h*w])."""
    latents = self.quant_conv(self.encoder(x))
    z = latents.permute(0, 2, 3, 1).reshape(-1, latents.shape[1])
    if self.l2_norm:
      z = F.normalize(z, p=2, dim=-1)
    table = self.table()
    dist = (torch.sum(z ** 2, dim=1, keepdim=True) + torch.sum(table ** 2, dim=1)
            - 2 * z @ table.t())
    return latents, torch.argmin(dist, dim=1).reshape(x.shape[0], -1)

  def decode_code(self, codes, grid):
    quant = self.table()[codes].reshape(codes.shape[0], *grid, -1).permute(0, 3, 1, 2)
    return self.decoder(self.post_quant_conv(quant))


def randomize_(module: nn.Module, seed: int) -> None:
  """Random weights everywhere (norm scales around 1) so no key is left at its init."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, param in module.named_parameters():
      noise = torch.randn(param.shape, generator=gen)
      if 'norm' in name and name.endswith('weight'):
        param.copy_(1.0 + 0.2 * noise)
      elif name.endswith('bias'):
        param.copy_(0.1 * noise)
      elif 'embedding' in name:
        param.copy_(noise)
      else:
        fan_in = param[0].numel()
        param.copy_(noise / np.sqrt(fan_in))


def random_images(seed: int, batch: int = 2) -> np.ndarray:
  rng = np.random.default_rng(seed)
  return rng.integers(0, 256, size=(batch, IMAGE_SIZE, IMAGE_SIZE, 3)).astype(np.uint8)


def torch_images(seed: int, batch: int = 2) -> tuple[np.ndarray, torch.Tensor]:
  images = random_images(seed, batch)
  nchw = torch.from_numpy(images.astype(np.float32) / 127.5 - 1.0).permute(0, 3, 1, 2)
  return images, nchw


def make_llamagen(seed=0):
  model = TorchVQ('llamagen', **TINY_VQ16)
  randomize_(model, seed)
  return model.eval()


def make_chameleon(seed=1):
  model = TorchVQ('chameleon', **TINY_CHAMELEON)
  randomize_(model, seed)
  return model.eval()


def save_llamagen(model, path, *, extra=None):
  state = dict(model.state_dict())
  state.update(extra or {})
  torch.save({'model': state, 'optimizer': {'state': {}}, 'steps': 7,
              'args': argparse.Namespace(codebook_size=64)}, path)


def save_chameleon(model, path, *, extra=None):
  state = dict(model.state_dict())
  # What a taming/Lightning vqgan.ckpt also holds next to the tokenizer weights.
  state['loss.logvar'] = torch.zeros(())
  state['loss.discriminator.main.0.weight'] = torch.zeros(8, 3, 4, 4)
  state.update(extra or {})
  torch.save({'state_dict': state, 'global_step': 3}, path)


# ----------------------------------------------------------------- tests ---


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
    with torch.no_grad():
      ref_latents, ref_tokens = model.encode(nchw)
    latents = tokenizer.encode_latents(params, images)
    self.assertLess(relative_error(latents, ref_latents.permute(0, 2, 3, 1)), 1e-4)
    tokens = tokenizer.encode(params, images)
    self.assertEqual(tokens.dtype, jnp.int32)
    np.testing.assert_array_equal(tokens, ref_tokens.numpy())

    codes = np.random.default_rng(1).integers(0, 64, size=(2, 16))
    with torch.no_grad():
      ref_images = model.decode_code(torch.from_numpy(codes), GRID).permute(0, 2, 3, 1)
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
    with torch.no_grad():
      ref_images = model.decode_code(torch.from_numpy(codes), GRID).permute(0, 2, 3, 1)
    decoded = tokenizer.decode(params, codes, GRID)
    self.assertLess(relative_error(decoded, ref_images), 1e-4)

    images, nchw = torch_images(3)
    with torch.no_grad():
      ref_latents, ref_tokens = model.encode(nchw)
    self.assertLess(relative_error(tokenizer.encode_latents(params, images),
                                   ref_latents.permute(0, 2, 3, 1)), 1e-4)
    np.testing.assert_array_equal(tokenizer.encode(params, images), ref_tokens.numpy())

  def test_janus_prefix_is_stripped_and_other_weights_ignored(self):
    model = make_llamagen(seed=5)
    state = {f'gen_vision_model.{k}': v for k, v in model.state_dict().items()}
    state['language_model.model.embed_tokens.weight'] = torch.zeros(10, 4)
    state['gen_head.vision_head.weight'] = torch.zeros(64, 4)
    torch.save(state, self.tmp / 'pytorch_model.bin')  # raw state dict, no wrapper
    out = vq_converter.convert(self.tmp / 'pytorch_model.bin', self.tmp / 'flax',
                               'llamagen_vq16', config_overrides=TINY_VQ16)
    tokenizer, params = vq_converter.load_tokenizer(out)
    codes = np.arange(16).reshape(1, 16)
    with torch.no_grad():
      ref = model.decode_code(torch.from_numpy(codes), GRID).permute(0, 2, 3, 1)
    self.assertLess(relative_error(tokenizer.decode(params, codes, GRID), ref), 1e-4)

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

  def test_wrong_kind_names_the_right_one(self):
    path = self._input('vqgan.ckpt')
    save_chameleon(make_chameleon(), path)
    with self.assertRaises(common.CheckpointMismatchError) as ctx:
      vq_converter.convert(path, self.tmp / 'out', 'llamagen_vq16',
                           config_overrides=dict(TINY_CHAMELEON, attn_levels=()))
    message = str(ctx.exception)
    self.assertIn('--kind chameleon_vqgan', message)
    self.assertIn('decoder.conv_blocks.0.res.0.conv1.weight', message)  # missing
    self.assertIn('decoder.mid.block_1.conv1.weight', message)  # unexpected
    self.assert_nothing_written()

  def test_missing_keys_are_listed(self):
    model = make_llamagen()
    path = self._input('vq.pt')
    state = dict(model.state_dict())
    del state['decoder.conv_out.bias']
    del state['quantize.embedding.weight']
    torch.save({'model': state}, path)
    with self.assertRaisesRegex(common.CheckpointMismatchError,
                                r'2 missing(.|\n)*decoder\.conv_out\.bias(.|\n)*'
                                r'quantize\.embedding\.weight'):
      vq_converter.convert(path, self.tmp / 'out', 'llamagen_vq16', config_overrides=TINY_VQ16)
    self.assert_nothing_written()

  def test_wrong_config_lists_misshaped_keys(self):
    path = self._input('vq.pt')
    save_llamagen(make_llamagen(), path)
    with self.assertRaises(common.CheckpointMismatchError) as ctx:
      vq_converter.convert(path, self.tmp / 'out', 'llamagen_vq16',
                           config_overrides=dict(TINY_VQ16, codebook_size=128))
    message = str(ctx.exception)
    self.assertIn('quantize.embedding.weight: expected (128, 8), found (64, 8)', message)
    self.assertIn('Assumed config', message)
    self.assert_nothing_written()

  def test_default_config_against_tiny_checkpoint(self):
    path = self._input('vq.pt')
    save_llamagen(make_llamagen(), path)
    with self.assertRaisesRegex(common.CheckpointMismatchError, 'mis-shaped'):
      vq_converter.convert(path, self.tmp / 'out', 'llamagen_vq16')
    self.assert_nothing_written()

  def test_unexpected_key_in_llamagen_checkpoint(self):
    path = self._input('vq.pt')
    save_llamagen(make_llamagen(), path, extra={'decoder.extra.weight': torch.zeros(3)})
    with self.assertRaisesRegex(common.CheckpointMismatchError,
                                r'unexpected keys:\n\s+decoder\.extra\.weight'):
      vq_converter.convert(path, self.tmp / 'out', 'llamagen_vq16', config_overrides=TINY_VQ16)
    self.assert_nothing_written()

  def test_truncated_file(self):
    path = self._input('vq.pt')
    save_llamagen(make_llamagen(), path)
    path.write_bytes(path.read_bytes()[:2000])
    with self.assertRaisesRegex(common.CheckpointReadError, 'truncated or corrupt'):
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


class ConverterOutputTest(absltest.TestCase):

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
    with torch.no_grad():
      ref = model.decode_code(torch.from_numpy(codes), GRID).permute(0, 2, 3, 1)
    # Decoding the bf16 weights in float32 (reusing the compiled fp32 decode) stays
    # close to the fp32 original.
    decoded = tokenizer.decode(common.cast_params(params, 'float32'), codes, GRID)
    self.assertLess(relative_error(decoded, ref), 5e-2)

  def test_command_line(self):
    tmp = make_tmp_dir(self)
    save_chameleon(make_chameleon(), tmp / 'vqgan.ckpt')
    cmd = [sys.executable, '-m', 'specdec_jax.converters.vq', f'--input={tmp / "vqgan.ckpt"}',
           f'--output={tmp / "out"}', '--kind=chameleon_vqgan',
           f'--config_json={json.dumps(TINY_CHAMELEON)}']
    env = dict(os.environ, JAX_PLATFORMS='cpu')
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
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

  def test_to_uint8_matches_the_original_expressions(self):
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
