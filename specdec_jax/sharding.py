"""Meshes, partition rules and sharding annotations for the decode loop.

Legend: B cache rows, S cache slots, K key/value heads, D head dim, E width,
F feed-forward width, V vocabulary.

One mesh with axes ('data', 'model'): images (each with its adjacent CFG
rows) are split over 'data', attention heads and feed-forward/vocabulary
columns over 'model' (Megatron-style tensor parallelism: column-parallel
q/k/v/gate/up/head, row-parallel o/down). Target and draft parameters live on the same mesh, each
with its own rules, because one jitted `lax.while_loop` runs on one device
set (see docs/sharding.md).

Axis types are `AxisType.Auto`: the model code (shared Flax layers) carries no
sharding-in-types annotations, and with `Explicit` axes every contraction
whose output sharding is ambiguous would need an `out_sharding`. With `Auto`,
GSPMD propagates the shardings of the parameters and of the loop state, which
the decode loop pins with `with_sharding_constraint` every iteration.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from specdec_jax import kv_cache as kv

DATA, MODEL = 'data', 'model'

# (regex on the '/'-joined parameter path, spec). First match wins; unmatched
# parameters are replicated. Kernels are [in, out] (Flax Dense).
LLAMA_RULES: tuple = (
    (r'(q_proj|k_proj|v_proj|gate|up|w1|w3|wq|wk|wv)/kernel$', P(None, MODEL)),
    (r'(o_proj|down|w2|wo)/kernel$', P(MODEL, None)),
    (r'(lm_head|output|vision_head)/kernel$', P(None, MODEL)),  # vision_head: Janus-Pro's
    # Vocabulary-parallel (rows over 'model'): split along the width, the lookup of a
    # window of tokens fails to compile for TPU when images are also split over 'data'
    # (docs/sharding.md).
    (r'(embed_tokens|tok_embeddings|embedding|embed_classes|gen_embed)/embedding$',
     P(MODEL, None)),
    (r'.*', P()),
)


def make_mesh(data: int, model: int, devices: Sequence[Any] | None = None) -> Mesh:
  """A ('data', 'model') mesh of data x model devices (Auto axis types)."""
  available = len(devices) if devices is not None else jax.device_count()
  if data < 1 or model < 1 or data * model > available:
    raise ValueError(f'make_mesh: data x model = {data} x {model} needs {data * model} '
                     f'devices (>= 1 each), {available} available.')
  return jax.make_mesh((data, model), (DATA, MODEL), axis_types=(AxisType.Auto,) * 2,
                       devices=devices)


def fit_spec(shape: Sequence[int], spec: P, mesh: Mesh) -> P:
  """Drops mesh axes from dims they do not divide (those dims are replicated).

  An entry may name one axis or a tuple of axes (the dim is split over their
  product, e.g. `P(('data', 'model'), None)`). Raises ValueError for an axis the
  mesh does not have.
  """
  entries = list(spec) + [None] * (len(shape) - len(spec))
  fitted = []
  for size, axis in zip(shape, entries[:len(shape)]):
    if axis is not None:
      names = axis if isinstance(axis, tuple) else (axis,)
      unknown = [name for name in names if name not in mesh.shape]
      if unknown:
        raise ValueError(f'PartitionSpec {spec} names mesh axes {unknown} that the mesh '
                         f'(axes {tuple(mesh.axis_names)}) does not have; name only '
                         'its axes (docs/sharding.md).')
      if size % math.prod(mesh.shape[name] for name in names) != 0:
        axis = None
    fitted.append(axis)
  return P(*fitted)


def _path_name(path) -> str:
  parts = []
  for entry in path:
    for attr in ('key', 'name', 'idx'):
      if hasattr(entry, attr):
        parts.append(str(getattr(entry, attr)))
        break
  return '/'.join(parts)


def param_specs(params, rules: Sequence = LLAMA_RULES, mesh: Mesh | None = None):
  """PartitionSpecs for a parameter tree by regex rules on its paths.

  A rule's spec describes one layer's tensor; a leaf with more dimensions (a
  scanned model's stacked `[N, in, out]` kernel, `models.layers`) gets the
  spec on its trailing dimensions and its leading layer axes replicated.
  """
  compiled = [(re.compile(pattern), spec) for pattern, spec in rules]

  def spec_for(path, leaf):
    name = _path_name(path)
    for pattern, spec in compiled:
      if pattern.search(name):
        extra = np.ndim(leaf) - len(spec)
        if len(spec) and extra > 0:
          spec = P(*([None] * extra), *spec)
        return fit_spec(np.shape(leaf), spec, mesh) if mesh is not None else spec
    return P()

  return jax.tree_util.tree_map_with_path(spec_for, params)


def shard_params(params, mesh: Mesh, rules: Sequence = LLAMA_RULES):
  """Places parameters on the mesh by the rules; a leaf placed so already is kept
  as it is (place once, then pass the result: `decode.generate` calls this on
  every call with a mesh, and host or single-device leaves are copied each time)."""
  specs = param_specs(params, rules, mesh)

  def place(x, spec):
    sharding = NamedSharding(mesh, spec)
    if isinstance(x, jax.Array) and x.sharding.is_equivalent_to(sharding, x.ndim):
      return x
    return jax.device_put(x, sharding)

  return jax.tree.map(place, params, specs)


def cache_shardings(cache: kv.KVCache, mesh: Mesh, rows_per_image: int = 1) -> kv.KVCache:
  """NamedShardings of a cache: rows over 'data' in whole images, heads over 'model'.

  rows_per_image: 2 with CFG (an image's rows are adjacent, `drafting.as_rows`);
  rows are split over 'data' only if it divides the number of images, so an
  image's conditional and unconditional rows always share a device (else the
  rows are replicated: CFG would move logits between devices every step).
  """
  rows = _rows_axis(cache.batch_size, mesh, rows_per_image)

  def named(x, spec):
    return NamedSharding(mesh, fit_spec(x.shape, spec, mesh))

  if cache.stacked:  # one array each, keys [N, B, K, D, S], values [N, B, K, S, D] (scanned)
    keys = named(cache.keys, P(None, rows, MODEL, None, None))
    values = named(cache.values, P(None, rows, MODEL, None, None))
  else:  # keys [B, K, D, S], values [B, K, S, D] per layer
    keys = tuple(named(x, P(rows, MODEL, None, None)) for x in cache.keys)
    values = tuple(named(x, P(rows, MODEL, None, None)) for x in cache.values)
  return kv.KVCache(
      keys=keys,
      values=values,
      lengths=named(cache.lengths, P(rows)),
      key_valid=named(cache.key_valid, P(rows, None)),
      position_offset=named(cache.position_offset, P(rows)),
      shared_length=cache.shared_length)


def _rows_axis(num_rows: int, mesh: Mesh, rows_per_image: int) -> str | None:
  """'data' if it splits num_rows cache rows in whole images, else None (replicated)."""
  return DATA if (num_rows // rows_per_image) % mesh.shape[DATA] == 0 else None


def batch_sharding(x: jax.Array, mesh: Mesh, rows_per_image: int = 1) -> NamedSharding:
  """Leading (image/row) axis over 'data' in whole images, everything else replicated."""
  rows = _rows_axis(x.shape[0], mesh, rows_per_image) if np.ndim(x) >= 1 else None
  return NamedSharding(mesh, P(rows) if rows else P())


def constrain_cache(cache: kv.KVCache, mesh: Mesh | None,
                    rows_per_image: int = 1) -> kv.KVCache:
  """with_sharding_constraint of a cache inside jit (no-op without a mesh)."""
  if mesh is None or cache is None:
    return cache
  return jax.lax.with_sharding_constraint(cache,
                                          cache_shardings(cache, mesh, rows_per_image))


def constrain_batch(tree, mesh: Mesh | None):
  """Pins every array of a pytree to batch-over-'data' (no-op without a mesh)."""
  if mesh is None:
    return tree
  return jax.tree.map(
      lambda x: jax.lax.with_sharding_constraint(x, batch_sharding(x, mesh))
      if getattr(x, 'ndim', 0) >= 1 else x, tree)


def vocab_parallel_sampling(sampling, target, mesh):
  """A `logits.Sampling` with topk_blocks = the mesh's 'model' size m when left at 1
  and m divides V (`decode.generate` applies it).

  With a vocab-parallel LM head each device then sorts its own V/m logits and
  only k candidates per block move, not the [..., V] row (docs/tpu.md).
  """
  if mesh is None or sampling.topk_blocks != 1 or 'model' not in mesh.axis_names:
    return sampling
  model_size = int(mesh.shape['model'])
  if model_size > 1 and int(target.vocab_size) % model_size == 0:
    return dataclasses.replace(sampling, topk_blocks=model_size)
  return sampling


def _splits_images(mesh: Mesh | None, num_images: int) -> bool:
  """Whether the mesh's 'data' axis (size > 1) splits num_images."""
  if mesh is None or DATA not in mesh.axis_names:
    return False
  parts = int(mesh.shape[DATA])
  return parts > 1 and num_images % parts == 0


def vmap_per_image(fn, in_axes: tuple, mesh: Mesh | None):
  """`jax.vmap(fn, in_axes)` over images, each device mapping its own images.

  in_axes: per argument, 0 (mapped: leading axis B) or None (shared, e.g. a
  rule). With images split over 'data' the vmapped function runs under
  `shard_map` over 'data' (other axes automatic), so nothing it does (e.g. a
  `lax.top_k` inside a rule, see `top_k_per_image`) makes the partitioner
  gather the batch. fn's outputs must all be mapped. Without a mesh, or when
  'data' does not split B, it is plain `jax.vmap`.
  """
  mapped = jax.vmap(fn, in_axes)

  def run(*args):
    batch = next(a.shape[0] for a, axis in zip(args, in_axes) if axis == 0)
    if not _splits_images(mesh, batch):
      return mapped(*args)
    in_specs = tuple(P(DATA) if axis == 0 else P() for axis in in_axes)
    return jax.shard_map(mapped, mesh=mesh, in_specs=in_specs, out_specs=P(DATA),
                         axis_names={DATA}, check_vma=False)(*args)

  return run


def top_k_per_image(x: jax.Array, k: int, mesh: Mesh | None) -> tuple[jax.Array, jax.Array]:
  """`lax.top_k` of x [B, ..., n] over its last axis, each device on its own images.

  XLA's partitioner gathers a TopK's batch (XLA:CPU does; TPU does not), so
  with images split over 'data' a plain `lax.top_k` all-gathers x on every
  call. Here it runs under `shard_map` over 'data' (the other axes stay
  automatic): each device takes the top-k of its own images, nothing moves.
  Without a mesh, or when 'data' does not split B, it is plain `lax.top_k`.
  Returns (values [B, ..., k], indices int32[B, ..., k]), as `lax.top_k`.
  """
  if not _splits_images(mesh, x.shape[0]):
    return jax.lax.top_k(x, k)
  spec = P(DATA)
  local = jax.shard_map(lambda y: tuple(jax.lax.top_k(y, k)), mesh=mesh, in_specs=spec,
                        out_specs=(spec, spec), axis_names={DATA}, check_vma=False)
  return local(x)
