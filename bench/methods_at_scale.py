"""The main command's methods at LlamaGen-XL shapes, random bf16 weights (not a test).

  python bench/methods_at_scale.py --out bench/results/accelerator/methods_xl.json   # GPU
  python bench/methods_at_scale.py --preset=tiny --out /tmp/methods_tiny.json          # CPU check

Each method of `configs/generate.py` (the main command's catalogue,
`app.methods_lib.build_methods`, with its hyperparameters) decodes one image
with CFG at the target's shapes: LlamaGen GPT-XL c2i at 384 px (576 tokens,
vocab 16384) with an EAGLE-1 head of its width and GPT-B as the draft model;
the LANTERN neighbour table and GSD's embeddings come from a random 8-wide
codebook and the target's random embeddings. Random weights accept few
drafts, so what this measures is the cost side: ms per image, per iteration
and per committed token, against vanilla's ms per token (the SD loop's own
overhead at this size), plus compile times. Methods run in order until
--budget_s is spent (the rest are listed as skipped); JSON is rewritten
after every method.
"""

from __future__ import annotations

import dataclasses
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

_PRESET = flags.DEFINE_enum('preset', 'llamagen-xl', ['llamagen-xl', 'tiny'],
                            'Shapes: LlamaGen-XL (accelerators) or a tiny GPT (a CPU check).')
_OUT = flags.DEFINE_string('out', None, 'JSON results.')
_BUDGET = flags.DEFINE_float('budget_s', 240.0, 'Stop starting new methods after this long.')
_REPEATS = flags.DEFINE_integer('repeats', 2, 'Timed decodes per method (best is kept).')
_METHODS = flags.DEFINE_list('methods', [], "Methods to run, in the catalogue's order "
                             '(default: all but the reruns under another seed, which cost '
                             "what their method costs, e.g. 'vanilla_seed1').")


@dataclasses.dataclass
class ScaleFamily:
  """What `build_methods` reads of a model family, at random weights."""

  target: object
  target_params: object
  codebook: object  # [V, 8] random codes (LANTERN's latent space)

  def neighbors(self, k: int):
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    from specdec_jax.models import neighbors as neighbors_lib  # pylint: disable=g-import-not-at-top
    return jnp.asarray(neighbors_lib.neighbor_table(np.asarray(self.codebook), k,
                                                    vocab_size=self.target.vocab_size))

  def token_embeddings(self):
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    return jnp.asarray(self.target_params['tok_embeddings']['embedding'], jnp.float32)


def build(preset: str):
  """(target, eagle head, draft GPT, num_tokens, dtype name)."""
  from specdec_jax.models import eagle, llamagen  # pylint: disable=g-import-not-at-top
  if preset == 'tiny':
    config = llamagen.gpt_config('GPT-B', image_size=64, dtype='float32')
    config = dataclasses.replace(config, n_layer=2, dim=64, n_head=2, n_kv_head=2,
                                 vocab_size=512)
    draft_config = dataclasses.replace(config, n_layer=1)
    dtype = 'float32'
  else:
    config = llamagen.gpt_config('GPT-XL', image_size=384, dtype='bfloat16')
    draft_config = llamagen.gpt_config('GPT-B', image_size=384, dtype='bfloat16')
    dtype = 'bfloat16'
  target = llamagen.LlamaGenGPT(config)
  head = eagle.EagleDrafter(eagle.llamagen_drafter_config(config))
  return target, head, llamagen.LlamaGenGPT(draft_config), config.block_size, dtype


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specdec_jax import decode, logits  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import methods as methods_lib  # pylint: disable=g-import-not-at-top
  from specdec_jax.configs import generate as generate_config  # pylint: disable=g-import-not-at-top

  unknown = sorted(set(_METHODS.value) - set(methods_lib.METHOD_NAMES))
  if unknown:
    raise app.UsageError(f'--methods: unknown {unknown}; the catalogue has '
                         f'{", ".join(methods_lib.METHOD_NAMES)}.')

  started = time.perf_counter()
  target, head, draft, num_tokens, dtype = build(_PRESET.value)
  target_params = random_weights.random_params(target.init_params, 0, dtype)
  head_params = random_weights.random_params(head.init_params, 1, dtype)
  draft_params = random_weights.random_params(draft.init_params, 2, dtype)
  codebook = jax.random.normal(jax.random.key(3), (target.vocab_size, 8))
  family = ScaleFamily(target, target_params, codebook)
  config = generate_config.get_config()
  wanted = (lambda m: m.name in _METHODS.value) if _METHODS.value else (
      lambda m: m.seed_offset == 0)
  methods = [m for m in methods_lib.build_methods(config, family) if wanted(m)]
  sampling = logits.Sampling(**config.sampling.to_dict())
  cond = target.cfg_cond(target_params, jnp.array([1]))
  drafters = {'eagle': (head, head_params), 'draft_model': (draft, draft_params)}
  results = {'preset': _PRESET.value, 'device': str(jax.devices()[0]), 'dtype': dtype,
             'num_tokens': num_tokens, 'sampling': config.sampling.to_dict(),
             'methods': [], 'skipped': []}

  def write():
    if _OUT.value:
      resume.write_json(_OUT.value, results)

  results['setup_s'] = time.perf_counter() - started
  print(f'setup (parameters, neighbour table, methods) {results["setup_s"]:.1f} s', flush=True)
  vanilla_ms_per_token = None
  for method in methods:
    if time.perf_counter() - started > _BUDGET.value:
      results['skipped'].append(method.name)
      continue
    print(f'{time.perf_counter() - started:.1f} s: {method.name}', flush=True)
    kwargs = dict(mode=method.mode, rule=method.rule)
    if method.drafter is not None:
      kwargs['draft'], kwargs['draft_params'] = drafters[method.drafter]
    call = lambda: decode.generate(target, target_params, cond, num_tokens=num_tokens,
                                   key=jax.random.key(method.seed_offset), sampling=sampling,
                                   **kwargs)
    first = call()
    best = min(call().run_seconds for _ in range(_REPEATS.value))
    steps = int(first.metrics.verify_steps[0])
    row = dict(method=method.name, compile_s=first.compile_seconds, image_ms=1e3 * best,
               iterations=steps, ms_per_iteration=1e3 * best / steps,
               ms_per_token=1e3 * best / num_tokens,
               tokens_per_forward=first.metrics.summary()['tokens_per_target_forward'])
    if method.name == 'vanilla':
      vanilla_ms_per_token = row['ms_per_token']
    if vanilla_ms_per_token:
      row['iteration_over_vanilla_token'] = row['ms_per_iteration'] / vanilla_ms_per_token
      row['speedup'] = vanilla_ms_per_token / row['ms_per_token']
    results['methods'].append(row)
    print(json.dumps(row), flush=True)
    write()
  results['wall_s'] = time.perf_counter() - started
  write()


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
