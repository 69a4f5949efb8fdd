"""Overhead of verification next to a model forward, for every rule.

Times the jitted, batched `verify_chain` for V = 16384 (LlamaGen's codebook),
k in {4, 8} drafts and batch in {1, 16} rows, for every acceptance rule, and
one forward over k+1 tokens of a small transformer (12 layers, width 512,
about 50M parameters, 256 cached tokens), the forward and every rule timed in
interleaved rounds (best of --repeats each, `timing.best_ms_interleaved`).
Prints a table and writes JSON.

  python bench/verify_overhead.py --out bench/results/verify_overhead.json
"""

import functools
import os
import sys

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from specdec_jax import kv_cache as kv
from specdec_jax import logits as logits_lib
from specdec_jax import rules
from specdec_jax import verify
from specdec_jax.app import compile_cache
from specdec_jax.models import layers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import resume  # pylint: disable=g-import-not-at-top  (bench/resume.py)
import timing  # pylint: disable=g-import-not-at-top,wrong-import-position  (bench/timing.py)

FLAGS = flags.DEFINE_string('out', 'bench/results/verify_overhead.json', 'Where to write JSON.')
_REPEATS = flags.DEFINE_integer('repeats', 20, 'Interleaved rounds per configuration.')
_VOCAB = flags.DEFINE_integer('vocab', 16384, 'Vocabulary size.')

WIDTH, NUM_LAYERS, HEADS, CACHED = 512, 12, 8, 256


def make_rules(vocab, key):
  neighbors = jax.random.randint(key, (vocab, 1000), 0, vocab, dtype=jnp.int32)
  embeddings = jax.random.normal(key, (vocab, 8))
  return {
      'Lossless': rules.Lossless(),
      'UniformRelaxed': rules.UniformRelaxed(omega=2.0),
      'CoolSD': rules.CoolSD(delta=2.0),
      'Lantern(k=1000)': rules.Lantern(neighbors=neighbors, k=1000, delta=0.1),
      'LanternPP(k=10)': rules.LanternPP(neighbors=neighbors, k=10, lam=5.0),
      'ContentAware': rules.ContentAware(lam=0.2, tv_threshold=0.5),
      'Grouped': rules.Grouped(embeddings=embeddings),
  }


def transformer_forward(batch, num_new):
  """(call, parameter count): one forward of T = num_new tokens for `batch` rows with a
  256-token cache."""
  block = layers.DecoderLayer(num_heads=HEADS, num_kv_heads=HEADS, head_dim=WIDTH // HEADS,
                              ffn_dim=4 * WIDTH)
  cache = kv.init_cache(num_layers=NUM_LAYERS, batch_size=batch, capacity=CACHED + 16,
                        num_kv_heads=HEADS, head_dim=WIDTH // HEADS)
  cache = kv.set_lengths(cache, jnp.full((batch,), CACHED, jnp.int32))
  x = jnp.ones((batch, num_new, WIDTH))
  angles = layers.rope_1d_angles(kv.window_positions(cache, num_new), WIDTH // HEADS)
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  keys = jax.random.split(jax.random.key(0), NUM_LAYERS)
  params = [block.init(k, x, cos, sin, cache, i) for i, k in enumerate(keys)]
  num_params = sum(p.size for p in jax.tree.leaves(params))

  @jax.jit
  def forward(params, x, cache):
    for i, p in enumerate(params):
      x, cache = block.apply(p, x, cos, sin, cache, i)
    return x, cache

  return (lambda: forward(params, x, cache)), num_params


def main(argv):
  del argv
  compile_cache.enable()
  vocab, repeats = _VOCAB.value, _REPEATS.value
  key = jax.random.key(0)
  all_rules = make_rules(vocab, key)
  rows = []
  print(f'backend: {jax.default_backend()}, devices: {jax.devices()}')
  for k in (4, 8):
    for batch in (1, 16):
      forward, num_params = transformer_forward(batch, k + 1)
      logits = jax.random.normal(key, (batch, k + 1, vocab)) * 3
      target_probs = logits_lib.process_logits(logits, top_k=2000)
      noise = jax.random.normal(key, (batch, k, vocab))
      draft_probs = logits_lib.process_logits(logits[:, :k] + noise, top_k=2000)
      drafts = jax.random.categorical(key, jnp.log(draft_probs)).astype(jnp.int32)
      keys = jax.random.split(key, batch)
      calls = {'forward': forward}
      for name, rule in all_rules.items():
        run = jax.jit(jax.vmap(functools.partial(verify.verify_chain, rule.for_window(k))))
        calls[name] = functools.partial(run, keys, drafts, draft_probs, target_probs)
      best = timing.best_ms_interleaved(calls, repeats)
      forward_ms = best.pop('forward')
      for name, verify_ms in best.items():
        rows.append(dict(rule=name, k=k, batch=batch, vocab=vocab, verify_ms=verify_ms,
                         forward_ms=forward_ms, ratio=verify_ms / forward_ms,
                         forward_params=num_params, backend=jax.default_backend()))
        print(f'{name:18s} k={k} B={batch:2d}  verify {verify_ms:8.3f} ms  '
              f'forward {forward_ms:8.3f} ms  ratio {verify_ms / forward_ms:6.3f}', flush=True)
  resume.write_json(
      FLAGS.value,
      dict(rows=rows, forward_model=dict(layers=NUM_LAYERS, width=WIDTH, heads=HEADS,
                                         cached_tokens=CACHED)))
  print(f'wrote {FLAGS.value}')


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
