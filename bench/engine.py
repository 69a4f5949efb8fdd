"""Benchmark of the decode engine (not a test): forward latency, SD iterations, whole images.

Usage:
  python bench/engine.py --preset=tiny --out=/tmp/engine.json
  python bench/engine.py --preset=llamagen-xl --out=xl.json      # GPU
  python bench/engine.py --preset=lumina-7b --out=lumina.json    # GPU

Legend: R cache rows (2 = one image with CFG), k drafts, T tokens per forward.

Measures, with random weights at the preset's shapes (`bench/random_weights.py`):
  * ms per target forward at T=1 and T=k+1 (a jitted fori_loop of forwards
    at cache lengths L and L + 1 in turn, as a decode writes, so host
    dispatch is excluded);
  * ms per SD iteration (Jacobi window k+1, and chain drafting with a small
    independent draft model), from whole decodes divided by verify steps;
  * vanilla whole-image latency and the engine's compile time;
  * the weight-read floor: parameter bytes / measured device copy bandwidth
    (a jitted copy of a large buffer reads and writes it once), and the ratio
    of the T=1 forward to that floor.
Prints a table and writes JSON.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from specdec_jax import decode  # pylint: disable=g-import-not-at-top
from specdec_jax import kv_cache as kv
from specdec_jax import logits
from specdec_jax import rules
from specdec_jax.app import compile_cache  # pylint: disable=g-import-not-at-top
from specdec_jax.models import tiny as toy
import random_weights  # pylint: disable=g-import-not-at-top  (bench/random_weights.py)
import resume  # pylint: disable=g-import-not-at-top  (bench/resume.py)
import timing  # pylint: disable=g-import-not-at-top  (bench/timing.py)

_PRESET = flags.DEFINE_enum('preset', 'tiny', ['tiny', 'llamagen-xl', 'lumina-7b'],
                            'Model shapes (tiny runs on CPU).')
_OUT = flags.DEFINE_string('out', None, 'Where to write the JSON results.')
_K = flags.DEFINE_integer('k', 4, 'Drafts per SD iteration (window k+1).')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed repetitions (median reported).')


@dataclasses.dataclass(frozen=True)
class Preset:
  name: str
  num_tokens: int
  dtype: Any = jnp.float32
  forward_iters: int = 20
  copy_bytes: int = 64 << 20



def _generic(width, layers, heads, kv_heads, ffn, vocab, classes, dtype):
  return toy.TinyTransformer(toy.TinyConfig(
      vocab_size=vocab, num_classes=classes, width=width, num_layers=layers, num_heads=heads,
      num_kv_heads=kv_heads, ffn_dim=ffn, dtype=dtype))


def build(preset: str):
  """(target, draft or None, make_cond(target_params) -> cond rows [cond; uncond], Preset)."""
  if preset == 'tiny':
    target = _generic(128, 4, 4, 4, 344, 1024, 10, jnp.float32)
    draft = _generic(64, 1, 2, 2, 172, 1024, 10, jnp.float32)
    return target, draft, lambda _: toy.cfg_class_rows(jnp.array([3]), 10), Preset('tiny', 64)
  bf16 = jnp.bfloat16
  if preset == 'llamagen-xl':
    # LlamaGen GPT-XL c2i at 384 px: 36 layers, width 1280, 20 heads, FFN 3584,
    # vocab 16384, one class token, 576 image tokens; GPT-B as the draft model.
    try:
      from specdec_jax.models import llamagen  # pylint: disable=g-import-not-at-top
      target = llamagen.LlamaGenGPT(llamagen.gpt_config('GPT-XL', image_size=384,
                                                        dtype='bfloat16'))
      draft = llamagen.LlamaGenGPT(llamagen.gpt_config('GPT-B', image_size=384,
                                                       dtype='bfloat16'))
      make_cond = lambda params: target.cfg_cond(params, jnp.array([207]))
    except ImportError as error:
      logging.info('models/llamagen.py unavailable (%s); generic Llama shapes.', error)
      target = _generic(1280, 36, 20, 20, 3584, 16384, 1000, bf16)
      draft = _generic(768, 12, 12, 12, 2048, 16384, 1000, bf16)
      make_cond = lambda _: toy.cfg_class_rows(jnp.array([207]), 1000)
    return target, draft, make_cond, Preset('llamagen-xl', 576, bf16, 50, 2 << 30)
  # Lumina-mGPT 7B (Chameleon): 32 layers, width 4096, vocab 65536; a 32-token
  # prompt stands in for the caption; 2352 image tokens (768 px, 48 x 49).
  from specdec_jax.models import chameleon  # pylint: disable=g-import-not-at-top
  target = chameleon.ChameleonModel(chameleon.lumina_7b(dtype=bf16, param_dtype=bf16))
  prompt = chameleon.ChameleonPrompt(jnp.ones((2, 32), jnp.int32))
  return target, None, lambda _: prompt, Preset('lumina-7b', 2352, bf16, 20, 2 << 30)


def _median_seconds(fn, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def copy_bandwidth(num_bytes: int, repeats: int) -> float:
  """Bytes per second of a jitted device copy (counts the read and the write)."""
  buffer = jnp.ones((num_bytes // 4,), jnp.float32)
  copy = jax.jit(lambda x: x + 1.0)
  jax.block_until_ready(copy(buffer))
  return 2 * num_bytes / _median_seconds(lambda: copy(buffer), repeats)


def forward_ms(model, params, cond, width: int, capacity: int, iters: int, repeats: int):
  """ms per forward of `width` tokens at cache lengths L and L + 1 in turn (L the
  prefix; prefill done): each forward writes at another position than the last,
  as a decode's do. At one fixed length XLA hoists the position-dependent work
  (RoPE rows, masks, write offsets) out of the loop (before 2026-12-04 this
  timed that cheaper forward)."""
  rows = jax.tree.leaves(cond)[0].shape[0]

  @jax.jit
  def run(params):
    cache = model.prefill(params, model.init_cache(rows, capacity), cond).cache
    length = cache.lengths
    tokens = jnp.zeros((rows, width), jnp.int32)

    def body(index, carry):
      cache, total = carry
      out = model.forward(params, kv.set_lengths(cache, length + index % 2), tokens)
      return out.cache, total + out.logits[0, -1, 0]

    return jax.lax.fori_loop(0, iters, body, (cache, jnp.float32(0)))[1]

  jax.block_until_ready(run(params))
  # The prefill as `run` does it: its cache only (XLA drops the unused LM head in both).
  prefill_only = jax.jit(lambda p: model.prefill(p, model.init_cache(rows, capacity),
                                                 cond).cache)
  jax.block_until_ready(prefill_only(params))
  total = _median_seconds(lambda: run(params), repeats)
  prefill = _median_seconds(lambda: prefill_only(params), repeats)
  return 1e3 * max(total - prefill, 0.0) / iters


def main(argv):
  del argv
  compile_cache.enable(compile_cache.OFF)  # its compile times are measurements
  started = time.perf_counter()
  target, draft, make_cond, preset = build(_PRESET.value)
  k, repeats = _K.value, _REPEATS.value
  key = jax.random.key(0)
  target_params = random_weights.random_params(target.init_params, 0, preset.dtype)
  cond = make_cond(target_params)
  param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(target_params))
  capacity = target.prefix_length(cond) + preset.num_tokens + k + 1
  sampling = logits.Sampling(cfg_scale=4.0, top_k=0)
  results = {'preset': preset.name, 'device': str(jax.devices()[0]), 'host': timing.host(),
             'flags': timing.flag_values(),
             'num_tokens': preset.num_tokens, 'k': k, 'rows': 2,
             'param_bytes': int(param_bytes), 'dtype': jnp.dtype(preset.dtype).name}

  def record(**values):  # progress: logged, and the JSON rewritten, after each measurement
    results.update(values)
    results['wall_s'] = time.perf_counter() - started
    logging.info('%.1f s: %s', results['wall_s'], values)
    if _OUT.value:
      resume.write_json(_OUT.value, results)

  record(setup_s=time.perf_counter() - started)

  bandwidth = copy_bandwidth(preset.copy_bytes, repeats)
  record(copy_bandwidth_GBps=bandwidth / 1e9, weight_read_floor_ms=1e3 * param_bytes / bandwidth)
  for width in (1, k + 1):
    record(**{f'forward_ms_T{width}': forward_ms(target, target_params, cond, width, capacity,
                                                 preset.forward_iters, repeats)})
  record(forward_T1_over_floor=results['forward_ms_T1'] / results['weight_read_floor_ms'])

  def whole(mode, **kwargs):
    first = decode.generate(target, target_params, cond, num_tokens=preset.num_tokens, key=key,
                            mode=mode, sampling=sampling, **kwargs)
    seconds = _median_seconds(lambda: decode.generate(
        target, target_params, cond, num_tokens=preset.num_tokens, key=key, mode=mode,
        sampling=sampling, **kwargs).tokens, repeats)
    steps = float(first.metrics.summary()['verify_steps'])
    return first.compile_seconds, seconds, steps, first.metrics.summary()

  compile_s, seconds, steps, _ = whole(decode.Vanilla())
  record(vanilla_compile_s=compile_s, vanilla_image_s=seconds,
         vanilla_ms_per_token=1e3 * seconds / preset.num_tokens)
  compile_s, seconds, steps, summary = whole(decode.Jacobi(k + 1), rule=rules.Lossless())
  record(jacobi_compile_s=compile_s, jacobi_image_s=seconds,
         jacobi_ms_per_iteration=1e3 * seconds / steps,
         jacobi_tokens_per_forward=summary['tokens_per_target_forward'])
  if draft is not None:
    draft_params = random_weights.random_params(draft.init_params, 1, preset.dtype)
    compile_s, seconds, steps, summary = whole(
        decode.ChainDraft(k, 'model'), rule=rules.Lossless(), draft=draft,
        draft_params=draft_params)
    record(chain_compile_s=compile_s, chain_image_s=seconds,
           chain_ms_per_iteration=1e3 * seconds / steps,
           chain_tokens_per_forward=summary['tokens_per_target_forward'])

  width = max(len(name) for name in results)
  for name, value in results.items():
    shown = f'{value:.4g}' if isinstance(value, float) else str(value)
    print(f'{name:<{width}}  {shown}')


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
