"""Shared fixtures for the LlamaGen tests (test_llamagen*.py): tiny configs,
random weights in the original key layout, and jitted entry points shared so
each (model, shape) compiles once per process.
"""

import functools
import pathlib
import shutil
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.converters import llamagen as convert
from specdec_jax.models import llamagen
from tests import torch_reference as ref


RTOL = 1e-4


def tiny_config(model_type='c2i', **overrides):
  fields = dict(n_layer=2, n_head=4, dim=64, vocab_size=64, block_size=16,
                model_type=model_type, num_classes=10, caption_dim=24,
                cls_token_num=1 if model_type == 'c2i' else 8)
  fields.update(overrides)
  return llamagen.GPTConfig(**fields)


def random_state_dict(config, seed=0):
  """Random float32 weights (numpy) in the original key layout and shapes."""
  rng = np.random.default_rng(seed)
  state = {}
  for key, shape in convert.expected_shapes(config).items():
    noise = rng.standard_normal(shape)
    if key.endswith('norm.weight'):
      value = 1.0 + 0.1 * noise
    elif 'embedding' in key:
      value = noise
    else:
      value = noise * shape[-1] ** -0.5
    state[key] = value.astype(np.float32)
  return state


def torch_state(state):
  return {k: ref.as_torch(v) for k, v in state.items()}


def rel_err(actual, expected):
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  return np.max(np.abs(actual - expected)) / np.max(np.abs(expected))


def to_params(state, config):
  return convert.convert_llamagen_gpt(dict(state), config)


def t2i_inputs(config, batch=2, seed=1):
  """(caption features float32 [B, P, C], mask bool [B, P]), row 0 left-padded."""
  rng = np.random.default_rng(seed)
  features = rng.standard_normal((batch, config.cls_token_num, config.caption_dim))
  mask = np.ones((batch, config.cls_token_num), bool)
  mask[0, :3] = False  # row 0: 3 padding slots on the left
  return (features * mask[:, :, None]).astype(np.float32), mask


def image_tokens(config, seed=2):
  """The image tokens ParityTest and EnginePathTest share: int64 [2, N - 1]."""
  return np.random.default_rng(seed).integers(0, config.vocab_size, (2, config.block_size - 1))


@functools.lru_cache(maxsize=None)
def fixture(model_type, seed=0, **overrides):
  """(config, original state dict, converted params), shared by the tests."""
  config = tiny_config(model_type, **overrides)
  state = random_state_dict(config, seed)
  return config, state, to_params(state, config)


def example_cond(config):
  """(reference cond, reference mask or None, jax cond) for a batch of 2 rows."""
  if config.model_type == 'c2i':
    labels = np.array([3, config.num_classes])
    return labels, None, jnp.asarray(labels, jnp.int32)
  features, mask = t2i_inputs(config)
  return features, mask, llamagen.CaptionCond(jnp.asarray(features), jnp.asarray(mask))


# One jitted function per entry point, shared by every test, so each (model,
# shape) compiles once per file: compilation dominates the run time on CPU.
@functools.partial(jax.jit, static_argnums=0)
def jit_prefill(model, params, cache, cond):
  return model.prefill(params, cache, cond)


@functools.partial(jax.jit, static_argnums=0)
def _jit_forward(model, params, cache, tokens, window_mask, depths):
  return model.forward(params, cache, tokens, window_mask, depths)


def jit_forward(model, params, cache, tokens, window_mask=None, depths=None):
  """Always passes an explicit mask/depths so chains and trees share a trace."""
  num_new = tokens.shape[1]
  if window_mask is None:
    window_mask = jnp.tril(jnp.ones((num_new, num_new), bool))
  if depths is None:
    depths = jnp.arange(num_new, dtype=jnp.int32)
  return _jit_forward(model, params, cache, tokens, window_mask, depths)


def capacity(config):
  return config.cls_token_num + config.block_size


def _tempdir(test):
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return pathlib.Path(path)
