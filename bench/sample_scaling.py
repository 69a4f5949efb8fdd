"""Images/s of the evaluation-set sampler with 1 and 2 local processes (bundled family, CPU).

  nice -n 19 python bench/sample_scaling.py --num_images=48 --method=eagle

Each setting runs `python -m specdec_jax.sample` as P processes on this
machine (jax.distributed on localhost, gloo CPU collectives), each process
with `--devices_per_process` CPU devices, into a fresh folder, and reads the
job's summary.json: images/s over the decode loop without compilation, and
the whole job's wall time (start-up, model loading and compilation
included). All settings write the same images (checked: samples.npz SHA-256).
Prints a table and writes JSON to bench/results/sample_scaling/.
"""

import datetime
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

import resume  # bench/resume.py

REPO = pathlib.Path(__file__).resolve().parents[1]
flags.DEFINE_list('processes', ['1', '2'], 'Process counts to measure.')
flags.DEFINE_integer('devices_per_process', 1, 'CPU devices of each process.')
flags.DEFINE_integer('num_images', 48, 'Images per run.')
flags.DEFINE_integer('batch_per_device', 4, 'Images per device per decode call.')
flags.DEFINE_integer('chunk_size', 8, 'Images per chunk.')
flags.DEFINE_string('method', 'eagle', 'Method (configs/sample_fashion.py names).')
flags.DEFINE_string('out', str(REPO / 'bench' / 'results' / 'sample_scaling'),
                    'Folder for the JSON results.')
FLAGS = flags.FLAGS


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def measure(num_processes: int, out_dir: str) -> dict:
  """Runs the job as num_processes local processes; returns its summary plus wall time."""
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS=f'--xla_force_host_platform_device_count={FLAGS.devices_per_process}')
  command = [sys.executable, '-m', 'specdec_jax.sample',
             '--config', str(REPO / 'configs' / 'sample_fashion.py'),
             f'--config.method={FLAGS.method}', f'--config.num_images={FLAGS.num_images}',
             f'--config.batch_per_device={FLAGS.batch_per_device}',
             f'--config.chunk_size={FLAGS.chunk_size}', '--config.write_png=False',
             # Every setting compiles afresh, so job wall times compare like with like.
             '--config.compilation_cache=off', f'--config.out_dir={out_dir}']
  if num_processes > 1:
    command += [f'--coordinator_address=127.0.0.1:{_free_port()}',
                f'--num_processes={num_processes}']
  start = time.perf_counter()
  jobs = [subprocess.Popen(command + ([f'--process_id={p}'] if num_processes > 1 else []),
                           cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True) for p in range(num_processes)]
  logs = [job.communicate()[0] for job in jobs]
  wall = time.perf_counter() - start
  for job, log in zip(jobs, logs):
    if job.returncode:
      raise RuntimeError(f'the job failed (exit {job.returncode}):\n{log[-3000:]}')
  summary = json.loads(pathlib.Path(out_dir, 'summary.json').read_text())
  return dict(processes=num_processes, devices=summary['devices'],
              images_per_s=summary['images_per_s'], tokens_per_s=summary['tokens_per_s'],
              decode_loop_s=summary['decode_loop_s'], compile_s=summary['compile_s'],
              job_wall_s=wall, mean_tokens_per_forward=summary['mean_tokens_per_forward'],
              samples_sha256=summary['samples_sha256'])


def main(argv):
  del argv
  if not FLAGS.processes or min(int(p) for p in FLAGS.processes) < 1:
    raise app.UsageError(f'--processes must name process counts of at least 1, '
                         f'got {FLAGS.processes}.')
  load = os.getloadavg()
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for count in (int(p) for p in FLAGS.processes):
      rows.append(measure(count, os.path.join(tmp, f'p{count}')))
      print(f'{count} process(es): {rows[-1]["images_per_s"]:.2f} images/s', flush=True)
  same = len({r['samples_sha256'] for r in rows}) == 1
  header = f'{"processes":>9s} {"devices":>7s} {"images/s":>9s} {"tokens/s":>9s} ' \
           f'{"loop s (with compile)":>21s} {"compile s":>9s} {"job wall s":>10s}'
  print(header)
  for r in rows:
    print(f'{r["processes"]:9d} {r["devices"]:7d} {r["images_per_s"]:9.2f} '
          f'{r["tokens_per_s"]:9.0f} {r["decode_loop_s"]:21.1f} {r["compile_s"]:9.1f} '
          f'{r["job_wall_s"]:10.1f}')
  print(f'same samples.npz in every setting: {same}')
  result = dict(
      bench='sample_scaling', date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
      method=FLAGS.method, num_images=FLAGS.num_images,
      batch_per_device=FLAGS.batch_per_device, chunk_size=FLAGS.chunk_size,
      devices_per_process=FLAGS.devices_per_process, rows=rows, same_images=same,
      machine=dict(cpus=os.cpu_count(), load_average_at_start=load,
                   note='shared machine: other jobs ran at the same time, so absolute '
                        'numbers are noisy; the processes of one run share these cores'))
  os.makedirs(FLAGS.out, exist_ok=True)
  path = os.path.join(FLAGS.out, f'{FLAGS.method}_{FLAGS.num_images}.json')
  resume.write_json(path, result)
  print(f'wrote {path}')


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
