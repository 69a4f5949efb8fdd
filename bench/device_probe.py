"""Where an accelerator spends its first minutes, step by step (not a test).

  python bench/device_probe.py --out probe.json

The first stage of `bench/accelerator_check.sh`: before the long benchmarks,
times each step of starting the engine on a device, separately, so a stage
that runs out of time can be told apart from one that hangs:
  1. the first device op (backend start, allocator);
  2. a small jitted matmul: compile, then one run;
  3. LlamaGen GPT-XL's random bf16 parameters, as the benchmarks make them
     (`bench/random_weights.py`, one small program per distinct shape);
  4. its prefill + one 1-token forward at 384 px shapes: compile, run;
  5. a vanilla decode of one image with CFG (576 tokens): compile, run;
  6. with --time_model_init, the compile of the model's own `init_params` as one
     program (last: on the first H200 run it took over 80 s).
Each step is printed as it ends and the JSON is rewritten after it.
"""

from __future__ import annotations

import json
import os
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import random_weights  # pylint: disable=g-import-not-at-top  (bench/random_weights.py)
import resume  # pylint: disable=g-import-not-at-top  (bench/resume.py)

_OUT = flags.DEFINE_string('out', None, 'JSON results.')
_MODEL = flags.DEFINE_enum('model', 'GPT-XL', ['GPT-XL', 'GPT-B'], 'LlamaGen GPT size.')
_TIME_MODEL_INIT = flags.DEFINE_bool('time_model_init', False,
                                     "Also compile the model's init_params (slow on GPU).")


def main(argv):
  del argv
  started = time.perf_counter()
  results = {'steps': []}

  def step(name, fn):
    begin = time.perf_counter()
    value = fn()
    row = {'step': name, 'seconds': time.perf_counter() - begin,
           'since_start_s': time.perf_counter() - started}
    results['steps'].append(row)
    print(json.dumps(row), flush=True)
    write()
    return value

  def write():
    if _OUT.value:
      resume.write_json(_OUT.value, results)

  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specdec_jax.models import llamagen  # pylint: disable=g-import-not-at-top
  results.update(jax=jax.__version__, device=str(jax.devices()[0]))

  step('first_op', lambda: jax.block_until_ready(jnp.ones((1024, 1024), jnp.bfloat16)))
  x = jnp.ones((4096, 4096), jnp.bfloat16)
  matmul = step('matmul_compile', lambda: jax.jit(lambda a: a @ a).lower(x).compile())
  step('matmul_run', lambda: jax.block_until_ready(matmul(x)))

  config = llamagen.gpt_config(_MODEL.value, image_size=384, dtype='bfloat16')
  model = llamagen.LlamaGenGPT(config)
  params = step('random_params', lambda: jax.block_until_ready(
      random_weights.random_params(model.init_params, 0, jnp.bfloat16)))

  def prefill_and_forward(params):
    cond = model.cfg_cond(params, jnp.array([1]))
    cache = model.prefill(params, model.init_cache(2, 600), cond).cache
    return model.forward(params, cache, jnp.zeros((2, 1), jnp.int32)).logits

  forward = step('forward_compile', lambda: jax.jit(prefill_and_forward).lower(params).compile())
  step('forward_run', lambda: jax.block_until_ready(forward(params)))
  step('forward_run_again', lambda: jax.block_until_ready(forward(params)))

  from specdec_jax import decode, logits  # pylint: disable=g-import-not-at-top
  cond = model.cfg_cond(params, jnp.array([1]))
  decoded = step('vanilla_decode', lambda: decode.generate(
      model, params, cond, num_tokens=config.block_size, key=jax.random.key(0),
      sampling=logits.Sampling(cfg_scale=2.0)))
  results['steps'][-1].update(compile_s=decoded.compile_seconds, run_s=decoded.run_seconds,
                              num_tokens=config.block_size)
  print(json.dumps(results['steps'][-1]), flush=True)
  write()
  if _TIME_MODEL_INIT.value:
    step('model_init_compile', lambda: jax.jit(model.init_params).lower(
        jax.random.key(0)).compile())


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
