"""Deviceless TPU compilation of `decode.generate`'s program from abstract parameters.

Legend: B images, R cache rows (2B with CFG), S cache slots, n image tokens,
V vocabulary, k chain drafts.

With libtpu installed, `jax.experimental.topologies.get_topology_desc` describes
TPU devices that need not exist; a jitted function lowered with abstract
arguments (`jax.ShapeDtypeStruct` carrying a `NamedSharding` on a mesh of those
devices) compiles for them on a CPU-only host. No weights are made: parameter
shapes come from `jax.eval_shape` of the model's init.

What is compiled is the engine's own traced program, `decode._decode(plan,
...)`, the function `decode._prepare` jits: prefill, first token, first
drafts, then the `lax.while_loop`. The plan comes from `decode.plan_for`, the
function `_prepare` builds it with (the same validation and capacity rules).

Per iteration costs: XLA's cost analysis counts a while loop's body once (it
does not know the trip count), so the program's cost is the prefill part plus
one iteration. `compile_decode(..., loop=False)` compiles the same program
with the decode loop's `lax.while_loop` replaced by its initial state (the
body is traced but unused, so XLA drops it); the difference of the two costs
is one iteration (body and condition).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from specdec_jax import decode
from specdec_jax import kv_cache as kv
from specdec_jax import sharding

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
  """Per-chip numbers from Google Cloud's TPU v5e, v5p and v6e architecture pages.

  HBM is taken as 16 / 95 / 32 GiB (the pages say GB); a runtime keeps a
  little of it for itself, so a program within a few percent of it is tight.
  """

  name: str
  hbm_bytes: int
  peak_flops: float  # bf16 FLOP/s
  hbm_bandwidth: float  # bytes/s


CHIPS = {
    'v5e': Chip('v5e', 16 * GiB, 197e12, 819e9),
    'v5p': Chip('v5p', 95 * GiB, 459e12, 2765e9),
    'v6e': Chip('v6e', 32 * GiB, 918e12, 1638e9),
}


def chip_of(topology_name: str) -> Chip:
  return CHIPS[topology_name.split(':')[0]]


def tpu_devices(topology_name: str):
  """The devices of a TPU topology, e.g. 'v5e:2x2' (needs libtpu; raises otherwise)."""
  # libtpu takes a machine-wide lock file unless told that several processes
  # may load it; deviceless compilation uses no chip, so concurrent runs are fine.
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  return topologies.get_topology_desc(topology_name=topology_name, platform='tpu').devices


def abstract_params(model, mesh, rules, dtype=jnp.bfloat16):
  """ShapeDtypeStructs of the model's parameters, floats cast to dtype, sharded by rules."""
  shapes = jax.eval_shape(model.init_params, jax.random.key(0))
  specs = sharding.param_specs(shapes, rules, mesh)

  def leaf(x, spec):
    kind = dtype if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype
    return jax.ShapeDtypeStruct(x.shape, kind, sharding=NamedSharding(mesh, spec))

  return jax.tree.map(leaf, shapes, specs)


def abstract_like(tree, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x),
                                                        sharding=s), tree, shardings)


def nbytes(tree) -> int:
  return int(sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def per_device_bytes(tree) -> int:
  """Bytes one device holds of an abstract tree (its shard of every leaf)."""
  total = 0
  for x in jax.tree.leaves(tree):
    shard = x.sharding.shard_shape(x.shape) if getattr(x, 'sharding', None) else x.shape
    total += math.prod(shard) * jnp.dtype(x.dtype).itemsize  # Python ints: no int32 overflow
  return total


@dataclasses.dataclass
class Program:
  """One decode, ready to lower: the plan and its abstract arguments."""

  plan: Any
  args: tuple
  target_cache: Any  # abstract target KV cache (per-device bytes via its shardings)
  draft_cache: Any


def libtpu_version() -> str | None:
  """The installed libtpu's version (its compiler decides the memory figures: the
  same commit's XL vanilla program took 0.66 GB on 2026-12-01 and 1.29 GB under
  libtpu 0.0.42.1 on 2026-12-06, docs/tpu.md), None without libtpu."""
  try:
    return importlib.metadata.version('libtpu')
  except importlib.metadata.PackageNotFoundError:
    return None


def build_program(target, target_params, cond, *, num_tokens: int, mode, sampling, rule=None,
                  draft=None, draft_params=None, mesh, attention_phases: int = 1) -> Program:
  """The plan (`decode.plan_for`, as `decode.generate` builds it) and abstract arguments.

  target_params / draft_params are abstract and already sharded; cond is a
  concrete (small) array tree so the models' own checks run on it.
  attention_phases: as `decode.generate`'s (the sampler's default is 3); the
  abstract target cache is the last phase's, the whole capacity.
  """
  key = jax.random.key(0)
  plan = decode.plan_for(target, target_params, cond, num_tokens, key, mode, sampling, rule,
                         draft, draft_params, None, None, mesh, attention_phases)
  rule = None if mode.rule_mode is None or rule is None else rule.for_window(mode.slots)
  # Rows over 'data' in whole images (an image's CFG rows are adjacent).
  pairs = plan.rows_per_image
  cond = abstract_like(cond, jax.tree.map(
      lambda x: sharding.batch_sharding(x, mesh, pairs), cond))
  keys = jax.eval_shape(lambda: jax.random.split(key, plan.num_images))
  keys = jax.ShapeDtypeStruct(keys.shape, keys.dtype, sharding=NamedSharding(mesh, P()))

  def abstract_cache(model, slots):
    cache = jax.eval_shape(lambda: model.init_cache(plan.num_images * pairs, slots))
    return abstract_like(cache, sharding.cache_shardings(cache, mesh, pairs))

  draft_cache = None
  if draft is not None and plan.draft_capacity > 1:
    draft_cache = abstract_cache(draft, plan.draft_capacity)
  # The Sampling is a traced argument (its floats are loop inputs), replicated.
  replicated = NamedSharding(mesh, P())
  traced_sampling = abstract_like(sampling, jax.tree.map(lambda _: replicated, sampling))
  args = (target_params, draft_params, cond, cond, keys, rule, traced_sampling)
  return Program(plan, args, abstract_cache(target, plan.target_capacity), draft_cache)


@contextlib.contextmanager
def _without_decode_loop():
  """Replaces the decode loop's while_loop (only that one) by its initial state."""
  original = jax.lax.while_loop

  def while_loop(cond_fun, body_fun, init_val):
    if getattr(body_fun, '__qualname__', '') == '_decode.<locals>.body':
      body_fun(init_val)  # traced so the loop state's shapes are checked, then dropped
      return init_val
    return original(cond_fun, body_fun, init_val)

  jax.lax.while_loop = while_loop
  try:
    yield
  finally:
    jax.lax.while_loop = original


def compile_decode(program: Program, loop: bool = True, compiler_options=None):
  """(compiled, lower seconds, compile seconds) of the program (loop=False: no while_loop)."""
  start = time.perf_counter()
  decode_fn = decode._decode  # pylint: disable=protected-access
  jitted = jax.jit(lambda *a: decode_fn(*a), static_argnums=0)
  with contextlib.nullcontext() if loop else _without_decode_loop():
    lowered = jitted.lower(program.plan, *program.args)
  lowered_at = time.perf_counter()
  compiled = lowered.compile(compiler_options)
  return compiled, lowered_at - start, time.perf_counter() - lowered_at


def memory(compiled) -> dict:
  """Per-device HBM of a compiled program: arguments + outputs + temps - aliased."""
  stats = compiled.memory_analysis()
  fields = ('argument_size_in_bytes', 'output_size_in_bytes', 'temp_size_in_bytes',
            'alias_size_in_bytes', 'generated_code_size_in_bytes')
  out = {name: int(getattr(stats, name)) for name in fields}
  out['hbm_bytes'] = (out['argument_size_in_bytes'] + out['output_size_in_bytes']
                      + out['temp_size_in_bytes'] - out['alias_size_in_bytes'])
  return out


def cost(compiled) -> dict:
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):  # older JAX: one dict per computation
    analysis = analysis[0]
  return {'flops': float(analysis.get('flops', 0.0)),
          'bytes_accessed': float(analysis.get('bytes accessed', 0.0)),
          'transcendentals': float(analysis.get('transcendentals', 0.0))}


def kv_bytes(cache) -> int:
  """Per-device bytes of a cache's key and value buffers."""
  if cache is None:
    return 0
  return per_device_bytes((cache.keys, cache.values))


def layer_kv_bytes(cache: kv.KVCache) -> int:
  """Global bytes of one layer's key buffer [R, K, D, S] (one slice of a stacked
  cache's [N, R, K, D, S])."""
  if cache.stacked:
    return nbytes(cache.keys) // cache.keys.shape[0]
  return nbytes(cache.keys[0])
