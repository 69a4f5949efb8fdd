r"""Peak host memory of the streaming Chameleon converter against checkpoint size.

Writes a random bf16 Chameleon checkpoint in the Hugging Face layout (two
safetensors shards + index + config.json, like Lumina-mGPT-7B), runs
`python -m specdec_jax.converters.chameleon` on it in a subprocess and reports
that subprocess's peak resident memory (`ru_maxrss`) next to the checkpoint
size, as a table and as JSON (peak = the subprocess's own VmHWM). A subprocess
that only imports the converter and starts JAX gives the baseline to
subtract. Not run in CI.

Usage:
  python bench/convert_memory.py --size_gb 2 [--workdir /tmp/x] [--json out.json]

The issue's target: peak at most about 1.3x the checkpoint size for 7B
(14 GB), i.e. the converter never holds two copies of the weights.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import torch

import resume  # bench/resume.py
from specdec_jax.converters import hf_streaming

FLAGS = flags.FLAGS
flags.DEFINE_float('size_gb', 2.0, 'Approximate checkpoint size in GB (bf16 weights).')
flags.DEFINE_string('workdir', None, 'Where to write the checkpoints (default: a temp dir).')
flags.DEFINE_string('json', None, 'Also write the results to this JSON file.')
flags.DEFINE_string('dtype', 'bfloat16', 'Converted param dtype.')
flags.DEFINE_bool('keep', False, 'Keep the written checkpoints.')
flags.DEFINE_bool('reuse', False, 'Reuse a checkpoint already in --workdir/hf.')

HIDDEN, HEADS, FFN, VOCAB = 1024, 8, 2816, 8832


def hf_config(num_layers: int) -> dict:
  return dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=num_layers,
              num_attention_heads=HEADS, num_key_value_heads=HEADS,
              intermediate_size=FFN, rms_norm_eps=1e-5, rope_theta=10000.0,
              max_position_embeddings=4096, swin_norm=False)


def layer_bytes() -> int:
  head_dim = HIDDEN // HEADS
  params = 4 * HIDDEN * HIDDEN + 3 * HIDDEN * FFN + 2 * HIDDEN + 4 * HEADS * head_dim
  return 2 * params


def random_tensors(config: dict):
  """Yields `(name, bf16 tensor)` in the HF Chameleon layout, one at a time."""
  gen = torch.Generator().manual_seed(0)
  e, f, heads = config['hidden_size'], config['intermediate_size'], config['num_attention_heads']
  d = e // heads
  rand = lambda *shape: (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)
  yield 'model.embed_tokens.weight', rand(config['vocab_size'], e)
  for i in range(config['num_hidden_layers']):
    p = f'model.layers.{i}.'
    for n in 'qkvo':
      yield f'{p}self_attn.{n}_proj.weight', rand(e, e)
    for n in ('q_norm', 'k_norm'):
      yield f'{p}self_attn.{n}.weight', rand(heads, d)
      yield f'{p}self_attn.{n}.bias', rand(heads, d)
    yield p + 'mlp.gate_proj.weight', rand(f, e)
    yield p + 'mlp.up_proj.weight', rand(f, e)
    yield p + 'mlp.down_proj.weight', rand(e, f)
    yield p + 'input_layernorm.weight', rand(e)
    yield p + 'post_attention_layernorm.weight', rand(e)
  yield 'model.norm.weight', rand(e)
  yield 'lm_head.weight', rand(config['vocab_size'], e)


# Runs a module as __main__ and writes its own peak RSS (VmHWM, reset by exec,
# so the parent's size does not leak in as it does with RUSAGE_CHILDREN).
_MEASURE = """
import atexit, os, runpy, sys
report_path = sys.argv[1]
def report():
  with open('/proc/self/status') as f:
    peak = [l for l in f if l.startswith('VmHWM')][0].split()[1]
  with open(report_path, 'w') as f:
    f.write(str(int(peak) * 1024))
atexit.register(report)
module, sys.argv = sys.argv[2], [sys.argv[2]] + sys.argv[3:]
if module == 'baseline':
  import jax, specdec_jax.converters.chameleon, orbax.checkpoint
  jax.numpy.zeros(1).block_until_ready()
else:
  runpy.run_module(module, run_name='__main__')
"""


def peak_rss_bytes(module: str, args: list[str], workdir: pathlib.Path) -> int:
  """Runs `python -m module args` in a subprocess; returns its peak RSS in bytes."""
  report = workdir / 'peak_rss.txt'
  subprocess.run([sys.executable, '-c', _MEASURE, str(report), module] + args, check=True)
  return int(report.read_text())


def main(argv):
  del argv
  embed_bytes = 2 * 2 * VOCAB * HIDDEN
  num_layers = max(1, round((FLAGS.size_gb * 1e9 - embed_bytes) / layer_bytes()))
  config = hf_config(num_layers)
  root = pathlib.Path(FLAGS.workdir or tempfile.mkdtemp(prefix='convert_memory_'))
  src, out = root / 'hf', root / 'jax'
  shutil.rmtree(out, ignore_errors=True)
  if FLAGS.reuse and (src / hf_streaming.SAFETENSORS_INDEX).is_file():
    shards = [src / s for s in hf_streaming.open_checkpoint(src).shards]
  else:
    shutil.rmtree(src, ignore_errors=True)
    total = embed_bytes + num_layers * layer_bytes() + 2 * HIDDEN
    print(f'writing {total / 1e9:.2f} GB random checkpoint ({num_layers} layers) to {src}')
    start = time.time()
    shards = hf_streaming.write_sharded_safetensors(
        random_tensors(config), src, max_shard_bytes=int(total * 0.7))
    with open(src / 'config.json', 'w') as f:
      json.dump(config, f)
    print(f'  wrote {len(shards)} shards in {time.time() - start:.0f} s')
  checkpoint_bytes = sum(p.stat().st_size for p in shards)

  baseline = peak_rss_bytes('baseline', [], root)
  start = time.time()
  peak = peak_rss_bytes('specdec_jax.converters.chameleon',
                        ['--input_dir', str(src), '--output', str(out), '--dtype', FLAGS.dtype],
                        root)
  seconds = time.time() - start
  output_bytes = sum(p.stat().st_size for p in out.rglob('*') if p.is_file())

  result = {
      'checkpoint_bytes': checkpoint_bytes,
      'num_shards': len(shards),
      'largest_shard_bytes': max(p.stat().st_size for p in shards),
      'converted_dtype': FLAGS.dtype,
      'output_bytes': output_bytes,
      'baseline_rss_bytes': baseline,
      'peak_rss_bytes': peak,
      'peak_over_checkpoint': peak / checkpoint_bytes,
      'peak_minus_baseline_over_checkpoint': (peak - baseline) / checkpoint_bytes,
      'convert_seconds': seconds,
  }
  rows = [('checkpoint (safetensors)', checkpoint_bytes),
          ('largest shard', result['largest_shard_bytes']),
          ('converted output', output_bytes), ('baseline RSS (imports only)', baseline),
          ('peak RSS during conversion', peak), ('peak - baseline', peak - baseline)]
  print(f'\n{"quantity":<30} {"GB":>8}')
  for label, value in rows:
    print(f'{label:<30} {value / 1e9:>8.3f}')
  print(f'{"peak / checkpoint":<30} {result["peak_over_checkpoint"]:>8.2f}')
  print(f'{"(peak - baseline) / checkpoint":<30} '
        f'{result["peak_minus_baseline_over_checkpoint"]:>8.2f}')
  print(f'{"conversion time (s)":<30} {seconds:>8.1f}')
  print(json.dumps(result, indent=2))
  if FLAGS.json:
    resume.write_json(FLAGS.json, result)
  if not FLAGS.keep:
    shutil.rmtree(root, ignore_errors=True)


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
