r"""Peak host memory of the LlamaGen GPT converter against the checkpoint size.

Writes a random fp32 LlamaGen c2i checkpoint in the original layout
(`torch.save({'model': state_dict})`, keys and shapes from
`converters.llamagen.expected_shapes`) at a preset's shape, runs

  python -m specdec_jax.converters.llamagen --input <ckpt> --output <dir> ...

in a subprocess and reports that process's peak resident memory next to the
checkpoint size. The peak is the process's own high-water mark (`VmHWM` in
/proc/self/status, read at exit), so neither the writer nor this script
counts; a second subprocess that only imports the converter and starts JAX
gives the baseline. The checkpoint is written by a subprocess too.

  python bench/convert_memory_llamagen.py --preset GPT-B              # 0.44 GB, quick
  python bench/convert_memory_llamagen.py --preset GPT-XL --json out.json  # 3.1 GB

The issue's target: peak at most about 1.5x the checkpoint size at GPT-XL.
Not run in CI.
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

import resume  # bench/resume.py

_PRESET = flags.DEFINE_string('preset', 'GPT-XL', 'LlamaGen preset: GPT-B, GPT-L, GPT-XL, ...')
_IMAGE_SIZE = flags.DEFINE_integer('image_size', 256, 'Sets block_size = (image_size/16)^2.')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Converted dtype.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Scratch folder (default: a temp dir).')
_JSON = flags.DEFINE_string('json', None, 'Also write the results to this JSON file.')
_KEEP = flags.DEFINE_bool('keep', False, 'Keep the checkpoint and the converted output.')
_WRITE_ONLY = flags.DEFINE_string('write_only', None, 'Internal: write the random '
                                  'checkpoint to this path and exit.')

CONVERTER = 'specdec_jax.converters.llamagen'

# Runs a module as __main__ in this interpreter and writes the process's own
# peak RSS (VmHWM, in bytes) to argv[1] when it exits. 'baseline' only imports
# the converter and starts JAX.
_PEAK_WRAPPER = r'''
import atexit, runpy, sys
out_path, module = sys.argv[1], sys.argv[2]

def _write_peak():
  with open('/proc/self/status') as status:
    kib = next(int(line.split()[1]) for line in status if line.startswith('VmHWM:'))
  with open(out_path, 'w') as out:
    out.write(str(kib * 1024))

atexit.register(_write_peak)
sys.argv = [module] + sys.argv[3:]
if module == 'baseline':
  import jax, orbax.checkpoint, torch
  import specdec_jax.converters.llamagen
  jax.numpy.zeros(1).block_until_ready()
else:
  runpy.run_module(module, run_name='__main__')
'''


def gpt_config(preset: str, image_size: int):
  from specdec_jax.models import llamagen  # pylint: disable=g-import-not-at-top
  return llamagen.gpt_config(preset, image_size=image_size, model_type='c2i')


def write_checkpoint(path: pathlib.Path, preset: str, image_size: int) -> int:
  """Writes random fp32 weights in LlamaGen's key layout; returns the parameter count."""
  import torch  # pylint: disable=g-import-not-at-top
  from specdec_jax.converters import llamagen as converter  # pylint: disable=g-import-not-at-top

  generator = torch.Generator().manual_seed(0)
  state = {}
  for key, shape in converter.expected_shapes(gpt_config(preset, image_size)).items():
    if key.endswith('norm.weight'):
      state[key] = torch.ones(shape)
    else:
      state[key] = torch.randn(shape, generator=generator) * 0.02
  torch.save({'model': state}, str(path))
  return sum(t.numel() for t in state.values())


def peak_rss(module: str, args: list[str], scratch: pathlib.Path) -> int:
  """Runs `python -m module args` in a subprocess; returns its peak RSS in bytes."""
  report = scratch / f'peak_{module.replace(".", "_")}.txt'
  subprocess.run([sys.executable, '-c', _PEAK_WRAPPER, str(report), module] + args,
                 check=True)
  return int(report.read_text())


def folder_bytes(path: pathlib.Path) -> int:
  return sum(p.stat().st_size for p in path.rglob('*') if p.is_file())


def main(argv):
  del argv
  if _WRITE_ONLY.value:
    count = write_checkpoint(pathlib.Path(_WRITE_ONLY.value), _PRESET.value, _IMAGE_SIZE.value)
    print(count)
    return
  scratch = pathlib.Path(_WORKDIR.value or tempfile.mkdtemp(prefix='convert_memory_llamagen_'))
  scratch.mkdir(parents=True, exist_ok=True)
  checkpoint = scratch / f'{_PRESET.value}_c2i_{_IMAGE_SIZE.value}.pt'
  output = scratch / 'converted'
  shutil.rmtree(output, ignore_errors=True)
  try:
    print(f'writing a random {_PRESET.value} c2i checkpoint to {checkpoint}', flush=True)
    start = time.time()
    written = subprocess.run(
        [sys.executable, __file__, '--write_only', str(checkpoint), '--preset', _PRESET.value,
         '--image_size', str(_IMAGE_SIZE.value)], check=True, capture_output=True, text=True)
    num_params = int(written.stdout.strip().splitlines()[-1])
    checkpoint_bytes = checkpoint.stat().st_size
    print(f'  {num_params / 1e6:.1f} M parameters, {checkpoint_bytes / 1e9:.2f} GB in '
          f'{time.time() - start:.0f} s', flush=True)

    baseline = peak_rss('baseline', [], scratch)
    start = time.time()
    peak = peak_rss(CONVERTER, ['--input', str(checkpoint), '--output', str(output),
                                '--config', _PRESET.value, '--model_type', 'c2i',
                                '--image_size', str(_IMAGE_SIZE.value), '--dtype', _DTYPE.value],
                    scratch)
    seconds = time.time() - start
    result = {
        'preset': _PRESET.value,
        'image_size': _IMAGE_SIZE.value,
        'num_params': num_params,
        'checkpoint_bytes': checkpoint_bytes,
        'converted_dtype': _DTYPE.value,
        'output_bytes': folder_bytes(output),
        'baseline_peak_rss_bytes': baseline,
        'peak_rss_bytes': peak,
        'peak_over_checkpoint': peak / checkpoint_bytes,
        'peak_minus_baseline_over_checkpoint': (peak - baseline) / checkpoint_bytes,
        'convert_seconds': seconds,
        'method': 'VmHWM of the converter subprocess, read at exit',
    }
  finally:
    if not _KEEP.value:
      shutil.rmtree(scratch, ignore_errors=True)

  rows = [('checkpoint (.pt, fp32)', checkpoint_bytes),
          ('converted output', result['output_bytes']),
          ('baseline peak RSS (imports)', baseline), ('converter peak RSS', peak),
          ('peak - baseline', peak - baseline)]
  print(f'\n{_PRESET.value} c2i, {num_params / 1e6:.1f} M parameters')
  print(f'{"quantity":<32} {"GB":>8}')
  for label, value in rows:
    print(f'{label:<32} {value / 1e9:>8.3f}')
  print(f'{"peak / checkpoint":<32} {result["peak_over_checkpoint"]:>8.2f}')
  print(f'{"(peak - baseline) / checkpoint":<32} '
        f'{result["peak_minus_baseline_over_checkpoint"]:>8.2f}')
  print(f'{"conversion time (s)":<32} {seconds:>8.1f}')
  if _JSON.value:
    resume.write_json(_JSON.value, result)
  print(json.dumps(result, indent=2))


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
