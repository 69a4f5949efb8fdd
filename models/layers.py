"""Transformer building blocks shared by LlamaGen, Chameleon, Janus-Pro and drafters.

Flax Linen modules with an explicit cache argument: a module call takes the
cache and returns the updated one, so `model.apply` stays a pure function the
decoding engine can run inside `lax.while_loop`.

Legend: B batch rows, T new tokens, E model width, H query heads, K key/value
heads, D head dim, F feed-forward width.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import attention
from specdec_jax import kv_cache as kv
from specdec_jax.models.dense_dot import dot_for


class RMSNorm(nn.Module):
  """RMSNorm as in Llama/LlamaGen: normalise in float32, cast back, scale.

  `x.float() * rsqrt(mean(x^2) + eps)` -> cast to the input dtype -> * weight.
  """

  eps: float = 1e-5
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    weight = self.param('weight', nn.initializers.ones, (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return normed.astype(x.dtype) * weight.astype(x.dtype)


class SwiGLU(nn.Module):
  """down(silu(gate(x)) * up(x)); LlamaGen names these w1 (gate), w3 (up), w2 (down)."""

  hidden_dim: int
  use_bias: bool = False
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  merge_projections: bool = True  # gate and up as one matmul on CPU (`project`)
  transpose_kernels: bool = True  # many-row matmuls on transposed kernels on CPU (`weight_dot`)

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    weights = [DenseParams(self.hidden_dim, self.use_bias, self.param_dtype, name=name)(x.shape[-1])
               for name in ('gate', 'up')]
    gate, up = project(x, weights, self.dtype, self.merge_projections, self.transpose_kernels)
    down = nn.Dense(x.shape[-1], use_bias=self.use_bias, dtype=self.dtype,
                    param_dtype=self.param_dtype, dot_general=dot_for(self.transpose_kernels),
                    name='down')
    return down(jax.nn.silu(gate) * up)


class DenseParams(nn.Module):
  """An `nn.Dense`'s parameters (same names, shapes, initialisers), for `project`.

  Returns (kernel [E, F], bias [F] or None) for E = in_features.
  """

  features: int
  use_bias: bool = False
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, in_features: int) -> tuple[jax.Array, jax.Array | None]:
    kernel = self.param('kernel', nn.linear.default_kernel_init,
                        (in_features, self.features), self.param_dtype)
    bias = (self.param('bias', nn.initializers.zeros_init(), (self.features,), self.param_dtype)
            if self.use_bias else None)
    return kernel, bias


# Merged projections only below this many bytes of concatenated kernels (see `project`).
MERGE_MAX_BYTES = 1 << 20


def project(x: jax.Array, weights, dtype: Any, merge: bool,
            transpose: bool = False) -> list[jax.Array]:
  """x through several dense layers that read it: [x @ kernel_i + bias_i], as `nn.Dense`.

  Args:
    x: [..., E].
    weights: (kernel [E, F_i], bias [F_i] or None) per layer (`DenseParams`).
    dtype: computation dtype (`nn.Dense(dtype=...)`).
    merge: on XLA:CPU, one matmul over the concatenated kernels instead of one
      per layer (the concatenation depends only on the parameters, so XLA
      hoists it out of the decode loop: 3 kernels fewer per decoder layer, a
      1-token forward of the bundled target about 10% faster; the price is a
      second copy of these kernels during a call). Other backends keep one
      matmul per layer: there a kernel launch matters less, accelerator
      memory more, and a concatenation along a model-parallel axis would
      move weights between devices. Off for scanned layers, whose parameters
      are sliced inside the scan, so the concatenation would run every layer,
      and for kernels of more than MERGE_MAX_BYTES together: a launch saved
      is then a small part of the matmul, and at LlamaGen GPT-B's width (7 MB
      for q, k, v) the merged decode ran 3% slower per iteration on CPU
      (docs/results.md, "Merged projections only for small kernels").
    transpose: the unmerged matmuls through `dense_dot.weight_dot` (large
      kernels read transposed on CPU when many rows multiply them).
  Returns:
    [..., F_i] per layer, in `dtype` (promoted as `nn.Dense` does).
  """
  promoted = [nn.dtypes.promote_dtype(x, kernel, bias, dtype=dtype) for kernel, bias in weights]
  x = promoted[0][0]
  pairs = [(kernel, bias) for _, kernel, bias in promoted]

  def one_per_layer(x, pairs):
    return [_dense(x, kernel, bias, dot_for(transpose)) for kernel, bias in pairs]

  def merged(x, pairs):
    kernel = jnp.concatenate([k for k, _ in pairs], axis=1)
    biases = [b for _, b in pairs]
    bias = None if biases[0] is None else jnp.concatenate(biases)
    sizes = np.cumsum([k.shape[1] for k, _ in pairs])[:-1]
    return jnp.split(_dense(x, kernel, bias, jax.lax.dot_general), sizes, axis=-1)

  kernel_bytes = sum(kernel.size * kernel.dtype.itemsize for kernel, _ in pairs)
  if not merge or len(pairs) == 1 or kernel_bytes > MERGE_MAX_BYTES:
    return one_per_layer(x, pairs)
  return jax.lax.platform_dependent(x, pairs, cpu=merged, default=one_per_layer)


def _dense(x, kernel, bias, dot_general):
  y = dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))
  return y if bias is None else y + bias


def rope_1d_angles(positions: jax.Array, head_dim: int, theta: float = 10000.0) -> jax.Array:
  """Standard Llama rotary angles.

  Args:
    positions: int32[B, T] position ids.
    head_dim: D (even).
    theta: rotary base.
  Returns:
    float32[B, T, D/2], angle of frequency j = position * theta^(-2j/D).
  """
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  return positions.astype(jnp.float32)[..., None] * inv_freq


def apply_rope_interleaved(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates pairs (x[2j], x[2j+1]) (LlamaGen / Meta layout).

  Args:
    x: [B, T, H, D].
    cos, sin: float32[B, T, D/2].
  """
  x32 = x.astype(jnp.float32).reshape(*x.shape[:-1], -1, 2)
  x0, x1 = x32[..., 0], x32[..., 1]
  c, s = cos[:, :, None, :], sin[:, :, None, :]
  out = jnp.stack([x0 * c - x1 * s, x1 * c + x0 * s], axis=-1)
  return out.reshape(x.shape).astype(x.dtype)


def apply_rope_half(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates halves (x[j], x[j+D/2]) (Hugging Face `rotate_half` layout).

  Args:
    x: [B, T, H, D].
    cos, sin: float32[B, T, D/2].
  HF computes cos/sin in float32 and casts them to the activation dtype before
  the product; we follow that order.
  """
  half = x.shape[-1] // 2
  c = jnp.concatenate([cos, cos], axis=-1)[:, :, None, :].astype(x.dtype)
  s = jnp.concatenate([sin, sin], axis=-1)[:, :, None, :].astype(x.dtype)
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * c + rotated * s


class HeadLayerNorm(nn.Module):
  """Chameleon's per-head q/k LayerNorm: normalise over D, then per-head affine.

  Parameters are stored as [H, D] (the HF layout); converters broadcast the
  (1, D) layout of early checkpoints to every head.
  """

  num_heads: int
  eps: float = 1e-5
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    shape = (self.num_heads, x.shape[-1])
    weight = self.param('weight', nn.initializers.ones, shape, self.param_dtype)
    bias = self.param('bias', nn.initializers.zeros, shape, self.param_dtype)
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    normed = ((x32 - mean) * jax.lax.rsqrt(var + self.eps)).astype(x.dtype)
    return normed * weight.astype(x.dtype) + bias.astype(x.dtype)


class CachedSelfAttention(nn.Module):
  """Multi-head attention writing to and reading from a `KVCache`.

  rope: 'interleaved' (LlamaGen) or 'half' (HF Llama/Chameleon/Janus).
  qk_norm: Chameleon's per-head LayerNorm on q and k before the rotation.
  """

  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope: str = 'interleaved'
  qk_norm: bool = False
  qk_norm_eps: float = 1e-5
  use_bias: bool = False
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  merge_projections: bool = True  # q, k and v as one matmul on CPU (`project`)
  transpose_kernels: bool = True  # many-row matmuls on transposed kernels on CPU (`weight_dot`)

  @nn.compact
  def __call__(self, x, cos, sin, cache: kv.KVCache, layer: int, window_mask=None):
    """x [B, T, E]; cos/sin float32[B, T, D/2] -> ([B, T, E], cache)."""
    batch, num_new, width = x.shape
    weights = [DenseParams(features, self.use_bias, self.param_dtype, name=name)(width)
               for features, name in ((self.num_heads * self.head_dim, 'q_proj'),
                                      (self.num_kv_heads * self.head_dim, 'k_proj'),
                                      (self.num_kv_heads * self.head_dim, 'v_proj'))]
    q, k, v = project(x, weights, self.dtype, self.merge_projections, self.transpose_kernels)
    q = q.reshape(batch, num_new, self.num_heads, self.head_dim)
    k = k.reshape(batch, num_new, self.num_kv_heads, self.head_dim)
    v = v.reshape(batch, num_new, self.num_kv_heads, self.head_dim)
    if self.qk_norm:
      q = HeadLayerNorm(self.num_heads, self.qk_norm_eps, self.param_dtype, name='q_norm')(q)
      k = HeadLayerNorm(self.num_kv_heads, self.qk_norm_eps, self.param_dtype, name='k_norm')(k)
    rotate = {'interleaved': apply_rope_interleaved, 'half': apply_rope_half}[self.rope]
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    out, cache = attention.cached_attention(q, k, v, cache, layer, window_mask)
    out = out.reshape(batch, num_new, self.num_heads * self.head_dim)
    o_proj = nn.Dense(width, use_bias=self.use_bias, dtype=self.dtype,
                      param_dtype=self.param_dtype,
                      dot_general=dot_for(self.transpose_kernels), name='o_proj')
    return o_proj(out), cache


class DecoderLayer(nn.Module):
  """Pre-norm Llama block (optionally Chameleon's swin-norm ordering).

  pre-norm:  h = x + attn(input_norm(x));  out = h + mlp(post_attention_norm(h))
  swin-norm: h = x + input_norm(attn(x));  out = h + post_attention_norm(mlp(h))
  input_norm=False drops the first norm (EAGLE-1 drafter layer 0).
  """

  num_heads: int
  num_kv_heads: int
  head_dim: int
  ffn_dim: int
  norm_eps: float = 1e-5
  rope: str = 'interleaved'
  qk_norm: bool = False
  swin_norm: bool = False
  input_norm: bool = True
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  merge_projections: bool = True  # see `project`; False for scanned layers
  transpose_kernels: bool = True  # see `weight_dot`; False for scanned layers

  @nn.compact
  def __call__(self, x, cos, sin, cache: kv.KVCache, layer: int, window_mask=None):
    """x [B, T, E] -> ([B, T, E], cache)."""
    attn = CachedSelfAttention(
        self.num_heads, self.num_kv_heads, self.head_dim, rope=self.rope,
        qk_norm=self.qk_norm, dtype=self.dtype, param_dtype=self.param_dtype,
        merge_projections=self.merge_projections, transpose_kernels=self.transpose_kernels,
        name='self_attn')
    mlp = SwiGLU(self.ffn_dim, dtype=self.dtype, param_dtype=self.param_dtype,
                 merge_projections=self.merge_projections,
                 transpose_kernels=self.transpose_kernels, name='mlp')
    post_norm = RMSNorm(self.norm_eps, self.param_dtype, name='post_attention_layernorm')
    norm_in = (RMSNorm(self.norm_eps, self.param_dtype, name='input_layernorm')
               if self.input_norm else (lambda y: y))
    if self.swin_norm:
      attn_out, cache = attn(x, cos, sin, cache, layer, window_mask)
      h = x + norm_in(attn_out)
      return h + post_norm(mlp(h)), cache
    attn_out, cache = attn(norm_in(x), cos, sin, cache, layer, window_mask)
    h = x + attn_out
    return h + mlp(post_norm(h)), cache


# ------------------------------------------------------- scan over layers ---

SCANNED = 'layers'  # param key of the stacked layers of a scanned model


def _scan_body(layer, carry, index, cos, sin, window_mask):
  x, cache = carry
  return layer(x, cos, sin, cache, index, window_mask), None


def scan_layers(layer: DecoderLayer, num_layers: int, x, cos, sin, cache: kv.KVCache,
                window_mask=None):
  """Runs `layer` num_layers times with `nn.scan`: one compiled block, not N.

  Params get a leading layer axis under the layer's name (`SCANNED`; see
  `stack_layer_params`). The cache rides in the scan carry and each layer
  writes its slice of a stacked cache in place (`kv.update_layer` with the
  traced layer index); a tuple-layout cache is stacked on entry and unstacked
  on exit, a copy of every buffer per call, so scanned models create stacked
  caches.

  Args:
    layer: an unbound DecoderLayer (or a bound submodule from `setup`).
    x: [B, T, E]; cos, sin: float32[B, T, D/2]; window_mask: as DecoderLayer.
  Returns:
    (x [B, T, E], cache in the layout it came in).
  """
  stacked = cache.stacked
  cache = kv.stack_layers(cache)
  scan = nn.scan(_scan_body, variable_axes={'params': 0}, split_rngs={'params': True},
                 in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast), length=num_layers)
  (x, cache), _ = scan(layer, (x, cache), jnp.arange(num_layers, dtype=jnp.int32), cos, sin,
                       window_mask)
  return x, (cache if stacked else kv.unstack_layers(cache))


def _decoder_layer_names(params) -> list[str]:
  """['layers_0', ..., 'layers_{N-1}'] if a dict holds exactly those DecoderLayers, else []."""
  found = [k for k in params if k.startswith('layers_') and k[len('layers_'):].isdigit()]
  names = [f'layers_{i}' for i in range(len(found))]
  if not found or sorted(found) != sorted(names):
    return []
  return names if all('self_attn' in params[n] for n in names) else []


def stack_layer_params(params: Any) -> Any:
  """Unscanned params (`layers_0` ... `layers_{N-1}`) -> scanned (`layers`, leading N axis).

  Applies to every dict of the tree holding exactly the decoder layers
  `layers_0` ... `layers_{N-1}` (LlamaGen's top level, Chameleon's and
  Janus-Pro's `model`; not Janus's `gen_aligner`, whose `layers_0`/`layers_2`
  are Dense layers), so a converted checkpoint loads into a model built with
  `scan_layers=True`. Numpy leaves stay numpy.
  """
  if not hasattr(params, 'items'):
    return params
  names = _decoder_layer_names(params)
  out = {k: stack_layer_params(v) for k, v in params.items() if k not in names}
  if names:
    per_layer = [params[name] for name in names]
    stack = np.stack if all(isinstance(l, np.ndarray)
                            for l in jax.tree_util.tree_leaves(per_layer)) else jnp.stack
    out[SCANNED] = jax.tree.map(lambda *leaves: stack(leaves), *per_layer)
  return out


def unstack_layer_params(params: Any) -> Any:
  """Inverse of `stack_layer_params`: `layers` [N, ...] -> `layers_0` ... `layers_{N-1}`."""
  if not hasattr(params, 'items'):
    return params
  scanned = SCANNED in params and 'self_attn' in params[SCANNED]
  out = {k: unstack_layer_params(v) for k, v in params.items()
         if not (scanned and k == SCANNED)}
  if scanned:
    stacked = params[SCANNED]
    count = jax.tree_util.tree_leaves(stacked)[0].shape[0]
    for i in range(count):
      out[f'layers_{i}'] = jax.tree.map(lambda leaf, i=i: leaf[i], stacked)
  return out
