"""Projections that read the same input (q/k/v, gate/up) as one matmul on CPU
(`layers.project`): the same outputs and parameter trees as separate `nn.Dense`
layers, one dot in the CPU program, and no merging in scanned layers."""

from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import kv_cache as kv
from specdec_jax.models import layers
from tests import test_scan_layers


def _weights(use_bias, sizes=(16, 8, 8), width=12, seed=0):
  keys = jax.random.split(jax.random.key(seed), 2 * len(sizes))
  return [(jax.random.normal(keys[2 * i], (width, size)),
           jax.random.normal(keys[2 * i + 1], (size,)) if use_bias else None)
          for i, size in enumerate(sizes)]


class _DenseSwiGLU(nn.Module):
  """SwiGLU written with three nn.Dense layers (the layout before `project`)."""

  hidden_dim: int

  @nn.compact
  def __call__(self, x):
    gate = nn.Dense(self.hidden_dim, use_bias=False, name='gate')(x)
    up = nn.Dense(self.hidden_dim, use_bias=False, name='up')(x)
    return nn.Dense(x.shape[-1], use_bias=False, name='down')(jax.nn.silu(gate) * up)


class ProjectTest(parameterized.TestCase):

  @parameterized.product(merge=(True, False), use_bias=(True, False),
                         dtype=(jnp.float32, jnp.bfloat16))
  def test_equals_separate_dense_layers(self, merge, use_bias, dtype):
    weights = _weights(use_bias)
    x = jax.random.normal(jax.random.key(5), (2, 5, 12))
    got = jax.jit(lambda x: layers.project(x, weights, dtype, merge))(x)
    for out, (kernel, bias) in zip(got, weights):
      params = {'kernel': kernel} if bias is None else {'kernel': kernel, 'bias': bias}
      dense = nn.Dense(kernel.shape[1], use_bias=use_bias, dtype=dtype)
      want = dense.apply({'params': params}, x)
      self.assertEqual(out.dtype, want.dtype)
      tol = 1e-6 if dtype == jnp.float32 else 2e-2
      np.testing.assert_allclose(np.float32(out), np.float32(want), rtol=tol, atol=tol)

  def test_one_dot_on_cpu_when_merged(self):
    weights = _weights(False)
    x = jnp.ones((2, 5, 12))
    dots = lambda merge: jax.jit(lambda x: layers.project(x, weights, jnp.float32, merge)).lower(
        x).as_text().count('stablehlo.dot_general')
    self.assertEqual(dots(True), 1)
    self.assertEqual(dots(False), 3)  # negative control: one per layer

  def test_large_kernels_stay_separate(self):
    """Above MERGE_MAX_BYTES of kernels the matmuls stay separate (no concatenation
    copy); just below it they merge."""
    def dots(width, features):
      weights = [(jnp.zeros((width, features)), None)] * 3
      return jax.jit(lambda x: layers.project(x, weights, jnp.float32, True)).lower(
          jnp.ones((2, 1, width))).as_text().count('stablehlo.dot_general')
    below = layers.MERGE_MAX_BYTES // (3 * 4 * 64)  # 3 kernels [64, below] of f32
    self.assertEqual(dots(64, below), 1)
    self.assertEqual(dots(64, below + 1), 3)
    self.assertEqual(dots(768, 768), 3)  # LlamaGen GPT-B's q, k, v: 7 MB

  def test_swiglu_params_and_outputs_match_dense_layers(self):
    x = jax.random.normal(jax.random.key(1), (2, 3, 12))
    reference = _DenseSwiGLU(20)
    want_params = reference.init(jax.random.key(0), x)
    for merge in (True, False):
      module = layers.SwiGLU(20, merge_projections=merge)
      params = module.init(jax.random.key(0), x)
      # The same names, shapes and initial values: checkpoints load unchanged.
      chex.assert_trees_all_equal(params, want_params)
      np.testing.assert_allclose(module.apply(params, x), reference.apply(want_params, x),
                                 rtol=1e-6, atol=1e-6)


class ScannedLayersTest(parameterized.TestCase):

  @parameterized.parameters('llamagen', 'chameleon', 'janus')
  def test_merged_unless_scanned(self, kind):
    # Scanned layers slice their parameters inside the scan, where the kernels'
    # concatenation would run every layer: they keep one matmul per projection.
    for scan in (False, True):
      seen = []

      class Recording(layers.DecoderLayer):

        def __post_init__(self):
          seen.append(self.merge_projections)
          super().__post_init__()

      with mock.patch.object(layers, 'DecoderLayer', Recording):
        model, _ = test_scan_layers.build(kind, scan)
        model.init_params(jax.random.key(0))
      self.assertNotEmpty(seen)
      self.assertEqual(set(seen), {not scan}, f'{kind} scan_layers={scan}')


class NormEpsTest(parameterized.TestCase):
  """norm_eps reaches the post-attention norm (random-weight parity tests run
  at activations near 1, where eps 1e-5 and 1e-6 agree)."""

  @parameterized.parameters(False, True)  # pre-norm and Chameleon's swin-norm
  def test_decoder_layer_threads_norm_eps_into_the_post_attention_norm(self, swin):
    # Zero o_proj: the attention branch adds nothing, so the layer reduces to
    # x + mlp(post_norm(x)) (pre-norm) or x + post_norm(mlp(x)) (swin-norm), where
    # post_norm must use norm_eps. A large eps makes a mis-threaded eps visible.
    eps, width, batch, steps = 0.5, 16, 2, 3
    layer = layers.DecoderLayer(num_heads=2, num_kv_heads=2, head_dim=8, ffn_dim=32,
                                norm_eps=eps, rope='half', swin_norm=swin)
    x = jax.random.normal(jax.random.key(0), (batch, steps, width))
    cos = sin = jnp.zeros((batch, steps, 4))
    cache = kv.init_cache(num_layers=1, batch_size=batch, capacity=8, num_kv_heads=2, head_dim=8)
    params = layer.init(jax.random.key(1), x, cos, sin, cache, 0)['params']
    params['self_attn']['o_proj']['kernel'] = jnp.zeros_like(params['self_attn']['o_proj']['kernel'])
    params['post_attention_layernorm']['weight'] = jax.random.uniform(jax.random.key(2), (width,)) + 0.5
    got, _ = layer.apply({'params': params}, x, cos, sin, cache, 0)
    norm = lambda y: layers.RMSNorm(eps).apply({'params': params['post_attention_layernorm']}, y)
    mlp = lambda y: layers.SwiGLU(32).apply({'params': params['mlp']}, y)
    want = x + (norm(mlp(x)) if swin else mlp(norm(x)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


if __name__ == '__main__':
  absltest.main()
