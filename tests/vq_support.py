"""Shared fixtures for the VQ tokenizer tests (test_vq*.py): tiny configs,
random weights in the original key layouts, torch models and checkpoints.
"""

import argparse
import pathlib
import shutil
import tempfile

from absl.testing import absltest
import numpy as np

from specdec_jax.converters import vq as vq_converter
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


def decode_reference(model, codes, grid=GRID):
  """The torch model's decode_code on an (h, w) grid, as NHWC numpy."""
  with ref.torch.no_grad():
    return model.decode_code(ref.torch.from_numpy(np.asarray(codes)), grid).permute(
        0, 2, 3, 1).numpy()
