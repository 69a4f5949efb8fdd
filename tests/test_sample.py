"""`python -m specdec_jax.sample` end to end on a tiny random bundle (CPU, 2 devices per process).

The same images, byte for byte, from one process or two (jax.distributed on
localhost with the gloo CPU collectives), and after a run stopped partway is
restarted with another process count.
"""

import dataclasses
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from unittest import mock

from absl.testing import absltest
import jax
import ml_collections
import numpy as np

import specdec_jax
from specdec_jax import decode
from specdec_jax import logits
from specdec_jax.app import cli
from specdec_jax.app import family as family_lib
from specdec_jax.app import host
from specdec_jax.app import methods as methods_lib
from specdec_jax.app import sample
from specdec_jax.app import sample_folder
from specdec_jax.app import sample_model
from specdec_jax.app import sample_output
from specdec_jax.configs import sample_fashion
from specdec_jax.configs import sample_llamagen_c2i
from specdec_jax.converters import common
from specdec_jax.models import llamagen
from tests.test_generate import tiny_bundle

REPO = pathlib.Path(__file__).resolve().parents[1]
NUM_IMAGES, CHUNK = 12, 4
_TMP = tempfile.TemporaryDirectory()
BUNDLE = os.path.join(_TMP.name, 'bundle')
REFERENCE = os.path.join(_TMP.name, 'one_process')
CACHE_HOME = os.path.join(_TMP.name, 'xdg_cache')


REFERENCE_LOG = []


def setUpModule():
  tiny_bundle(BUNDLE)
  REFERENCE_LOG.extend(run_job(REFERENCE, num_processes=1))


def tearDownModule():
  _TMP.cleanup()


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def job_env(**changes) -> dict:
  """A job's environment: CPU, 2 devices, the compilation cache in this module's
  temporary folder (never the user's)."""
  env = dict(os.environ, JAX_PLATFORMS='cpu', XDG_CACHE_HOME=CACHE_HOME,
             XLA_FLAGS='--xla_force_host_platform_device_count=2', **changes)
  env.pop('JAX_COMPILATION_CACHE_DIR', None)
  return env


def job_command(out_dir: str, *extra: str) -> list[str]:
  return [sys.executable, '-m', 'specdec_jax.sample',
          '--config', str(REPO / 'configs' / 'sample_fashion.py'),
          f'--config.model.bundle_dir={BUNDLE}', f'--config.num_images={NUM_IMAGES}',
          '--config.batch_per_device=2', f'--config.chunk_size={CHUNK}',
          '--config.method=vanilla', '--config.fast_compile=True',
          f'--config.out_dir={out_dir}', *extra]


def start_job(out_dir: str, num_processes: int, *extra: str,
              per_process: dict | None = None) -> list[subprocess.Popen]:
  """Starts the job as `num_processes` local processes of 2 CPU devices each
  (per_process: {process: more flags for it alone})."""
  command = job_command(out_dir, *extra)
  if num_processes > 1:
    command += [f'--coordinator_address=127.0.0.1:{free_port()}',
                f'--num_processes={num_processes}']
  return [subprocess.Popen(command + ([f'--process_id={p}'] if num_processes > 1 else [])
                           + list((per_process or {}).get(p, ())),
                           cwd=REPO, env=job_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True) for p in range(num_processes)]


def run_job(out_dir: str, num_processes: int, *extra: str) -> list[str]:
  """Runs the job (`start_job`); returns the processes' logs (fails the test on a
  nonzero exit)."""
  jobs = start_job(out_dir, num_processes, *extra)
  logs = [job.communicate(timeout=300)[0] for job in jobs]
  for job, log in zip(jobs, logs):
    if job.returncode != 0:
      raise AssertionError(f'exit {job.returncode}:\n{log[-3000:]}')
  return logs


def read_indices(out_dir: str) -> list[int]:
  lines = pathlib.Path(out_dir, sample_output.METRICS).read_text().splitlines()
  return [json.loads(line)['index'] for line in lines]


class SampleJobTest(absltest.TestCase):

  def assert_same_set(self, out_dir: str):
    reference = pathlib.Path(REFERENCE, sample_output.SAMPLES).read_bytes()
    self.assertEqual(pathlib.Path(out_dir, sample_output.SAMPLES).read_bytes(), reference)
    self.assertEqual(pathlib.Path(out_dir, sample_output.METRICS).read_text(),
                     pathlib.Path(REFERENCE, sample_output.METRICS).read_text())
    self.assertEqual(read_indices(out_dir), list(range(NUM_IMAGES)))  # no gaps, no duplicates
    self.assertLen(list(pathlib.Path(out_dir, 'images').glob('*.png')), NUM_IMAGES)

  def test_reference_set_layout(self):
    with np.load(os.path.join(REFERENCE, sample_output.SAMPLES)) as samples:
      self.assertEqual(list(samples), ['arr_0'])
      images = samples['arr_0']
    self.assertEqual(images.dtype, np.uint8)
    self.assertEqual(images.shape, (NUM_IMAGES, 32, 32, 3))  # grayscale repeated to RGB
    np.testing.assert_array_equal(images[..., 0], images[..., 2])
    self.assertGreater(len(np.unique(images.reshape(NUM_IMAGES, -1), axis=0)), NUM_IMAGES // 2)
    summary = json.loads(pathlib.Path(REFERENCE, sample_output.SUMMARY).read_text())
    self.assertEqual(summary['num_images'], NUM_IMAGES)
    self.assertEqual(summary['mean_tokens_per_forward'], 1.0)  # vanilla
    self.assertGreater(summary['images_per_s'], 0)
    self.assertEqual(summary['host'], host.describe())  # written on this machine
    record = json.loads(pathlib.Path(REFERENCE, sample_output.METRICS).read_text().split('\n')[5])
    self.assertEqual((record['index'], record['label']), (5, 5))  # classes in turn

  def test_two_processes_write_the_images_of_one(self):
    out_dir = os.path.join(_TMP.name, 'two_processes')
    logs = run_job(out_dir, 2)
    self.assert_same_set(out_dir)
    self.assertIn('over 2 processes, 4 devices', logs[0])
    self.assertIn('images/s, ETA', logs[0])
    writers = [json.loads(pathlib.Path(out_dir, 'chunks', f'chunk_{c:05d}.json').read_text())[
        'process'] for c in range(NUM_IMAGES // CHUNK)]
    self.assertEqual(writers, [0, 1, 0])  # each process wrote its own chunks

  def test_run_stopped_partway_resumes_with_another_process_count(self):
    out_dir = os.path.join(_TMP.name, 'resumed')
    run_job(out_dir, 2, '--config.stop_after_chunks=1')
    committed = sorted(p.name for p in pathlib.Path(out_dir, 'chunks').glob('*.json'))
    self.assertEqual(committed, ['chunk_00000.json', 'chunk_00001.json'])  # one round of two
    self.assertFalse(os.path.exists(os.path.join(out_dir, sample_output.SAMPLES)))
    # What a kill during the next chunk leaves: a temporary file and a chunk's data
    # without its manifest. Neither may count.
    stray = pathlib.Path(out_dir, 'chunks', '.chunk_00002.npz.abc.tmp')
    stray.write_bytes(b'partial')
    pathlib.Path(out_dir, 'chunks', 'chunk_00002.npz').write_bytes(b'partial')
    # One thread per XLA:CPU op changes no image, so the folder takes it.
    logs = run_job(out_dir, 1, '--config.xla_cpu_single_thread=True')
    self.assertIn('(1 to do)', logs[0])
    self.assertIn('removed 1 temporary files', logs[0])
    self.assertFalse(stray.exists())
    self.assert_same_set(out_dir)


  def test_sigterm_to_one_process_stops_every_process_after_one_round(self):
    """jax.distributed's preemption service replaces the SIGTERM handler: a job of
    several processes went on to the end and exited 0 (scancel then SIGKILLed it,
    leaving its lock). Now all stop together, release the lock and exit 143."""
    out_dir, more = os.path.join(_TMP.name, 'sigterm'), f'--config.num_images={8 * NUM_IMAGES}'
    jobs = start_job(out_dir, 2, more)
    try:
      first = pathlib.Path(out_dir, 'chunks', 'chunk_00000.json')
      deadline = time.monotonic() + 240
      while not first.exists() and jobs[0].poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
      jobs[1].send_signal(signal.SIGTERM)  # one process only, as `timeout` on one host
      logs = [job.communicate(timeout=240)[0] for job in jobs]
    finally:
      for job in jobs:
        job.kill()
    for job, log in zip(jobs, logs):
      self.assertEqual(job.returncode, 128 + signal.SIGTERM, log[-2000:])
      self.assertIn('a process received SIGTERM', log)
    committed = len(list(pathlib.Path(out_dir, 'chunks').glob('*.json')))
    self.assertLess(committed, 8 * NUM_IMAGES // CHUNK)  # stopped early
    self.assertEqual(committed % 2, 0)  # after the same round (two chunks a round)
    self.assertFalse(os.path.exists(os.path.join(out_dir, 'job.lock')))
    run_job(out_dir, 1, more)  # a rerun finishes the set
    with np.load(os.path.join(out_dir, sample_output.SAMPLES)) as samples, np.load(
        os.path.join(REFERENCE, sample_output.SAMPLES)) as reference:
      np.testing.assert_array_equal(samples['arr_0'][:NUM_IMAGES], reference['arr_0'])

  def test_sigterm_stops_a_one_process_distributed_job(self):
    """jax.distributed with one process starts the preemption service too: SIGTERM
    did not stop such a job."""
    out_dir = os.path.join(_TMP.name, 'sigterm_one')
    job = subprocess.Popen(job_command(
        out_dir, f'--config.num_images={8 * NUM_IMAGES}', '--distributed=true', '--process_id=0',
        f'--coordinator_address=127.0.0.1:{free_port()}', '--num_processes=1'), cwd=REPO,
        env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
      first = pathlib.Path(out_dir, 'chunks', 'chunk_00000.json')
      deadline = time.monotonic() + 240
      while not first.exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
      job.send_signal(signal.SIGTERM)
      log = job.communicate(timeout=240)[0]
    finally:
      job.kill()
    self.assertEqual(job.returncode, 128 + signal.SIGTERM, log[-2000:])
    self.assertIn('a process received SIGTERM', log)
    self.assertFalse(os.path.exists(os.path.join(out_dir, 'job.lock')))

  def test_a_finished_set_extended_to_more_images_keeps_its_chunks(self):
    out_dir = os.path.join(_TMP.name, 'extended')
    run_job(out_dir, 1, '--config.num_images=6')  # chunks 0..3 and 4..5
    first_chunk = pathlib.Path(out_dir, 'chunks', 'chunk_00000.npz').stat().st_mtime_ns
    logs = run_job(out_dir, 1)  # NUM_IMAGES: chunk 1 becomes 4..7, chunk 2 is new
    self.assertIn('extending the set (num_images: 6 -> 12)', logs[0])
    self.assertIn('chunk 1 (images 4..7) will be redone', logs[0])
    self.assertIn('(2 to do)', logs[0])
    self.assertEqual(pathlib.Path(out_dir, 'chunks', 'chunk_00000.npz').stat().st_mtime_ns,
                     first_chunk)  # kept, not decoded again
    self.assert_same_set(out_dir)
    stored = json.loads(pathlib.Path(out_dir, sample_output.CONFIG).read_text())
    self.assertEqual(stored['fingerprint']['num_images'], NUM_IMAGES)
    self.assertEqual(stored['extended'], [[f'num_images: 6 -> {NUM_IMAGES}']])

  def test_an_extension_stopped_part_way_shows_no_finished_set(self):
    """The 6-image set's samples, metrics and summary stayed beside a config.json
    naming 12 images, and a reader (bench/pareto_sampled.py) took them for the set."""
    out_dir = os.path.join(_TMP.name, 'extension_stopped')
    run_job(out_dir, 1, '--config.num_images=6')
    merged = [pathlib.Path(out_dir, name) for name in (
        sample_output.SUMMARY, sample_output.SAMPLES, sample_output.METRICS)]
    self.assertTrue(all(path.exists() for path in merged))
    logs = run_job(out_dir, 1, '--config.stop_after_chunks=1')  # extends to NUM_IMAGES
    self.assertIn('removed the merged set of an earlier run', logs[0])
    self.assertFalse(any(path.exists() for path in merged))
    run_job(out_dir, 1)
    self.assert_same_set(out_dir)
    logs = run_job(out_dir, 1)  # a finished set is kept as it is
    self.assertNotIn('removed the merged set', logs[0])
    self.assert_same_set(out_dir)

  def test_a_step_that_fails_on_process_0_stops_every_process_at_once(self):
    """Process 0's merge fails: process 1 leaves with a message at once, instead of
    waiting at the next barrier until the runtime's heartbeat aborts the job (about
    5 minutes here, and a core dump instead of either message)."""
    out_dir = os.path.join(_TMP.name, 'merge_fails')
    run_job(out_dir, 2, '--config.stop_after_chunks=1')
    os.mkdir(os.path.join(out_dir, sample_output.SAMPLES))  # the merge cannot write it
    jobs = start_job(out_dir, 2)
    try:
      logs = [job.communicate(timeout=150)[0] for job in jobs]
    finally:
      for job in jobs:
        job.kill()
    self.assertEqual(jobs[0].returncode, 1, logs[0][-2000:])
    self.assertIn('IsADirectoryError', logs[0])
    self.assertEqual(jobs[1].returncode, 2, logs[1][-2000:])
    self.assertIn('error: process 0 could not merge the chunks (its log holds the error); '
                  'process 1 stops too.', logs[1])

  def test_processes_given_different_settings_stop_before_decoding(self):
    """Process 1 with another cfg_scale wrote its chunks under its own (a mixed set, with
    exit 0); with another seed both crashed in a key placement naming neither."""
    out_dir = os.path.join(_TMP.name, 'different_settings')
    jobs = start_job(out_dir, 2, per_process={
        1: ('--config.sampling.cfg_scale=3.0', '--config.seed=1')})
    try:
      logs = [job.communicate(timeout=150)[0] for job in jobs]
    finally:
      for job in jobs:
        job.kill()
    for job, log in zip(jobs, logs):
      self.assertEqual(job.returncode, 2, log[-2000:])
      self.assertIn('error: the processes were given different settings: sampling.cfg_scale, '
                    'seed differ between them', log)
    self.assertFalse(os.path.exists(out_dir))  # nothing decoded or recorded; the folder removed

  def test_damaged_chunks_are_redone_and_missing_pngs_rewritten(self):
    """A committed chunk whose .npz vanished or whose manifest was cut short is
    redone (logged), a whole chunk's lost PNG is rewritten from its .npz, and the
    set is the same, byte for byte."""
    out_dir = os.path.join(_TMP.name, 'damaged')
    shutil.copytree(REFERENCE, out_dir)
    chunks = pathlib.Path(out_dir, 'chunks')
    (chunks / 'chunk_00001.npz').unlink()
    manifest = chunks / 'chunk_00002.json'
    manifest.write_bytes(manifest.read_bytes()[:40])
    pathlib.Path(out_dir, 'images', '000001.png').unlink()  # of chunk 0, which is whole
    for name in (sample_output.SAMPLES, sample_output.METRICS):
      pathlib.Path(out_dir, name).unlink()
    log = run_job(out_dir, 1)[0]
    self.assertIn('chunk 1 (images 4..7) will be redone: chunk_00001.npz is missing', log)
    self.assertIn('chunk 2 (images 8..11) will be redone: its manifest chunk_00002.json is '
                  'damaged (JSONDecodeError', log)
    self.assertIn('(2 to do)', log)
    self.assertIn('wrote 1 missing or damaged PNGs', log)
    self.assert_same_set(out_dir)
    for name in ('000001.png', '000005.png'):
      self.assertEqual(pathlib.Path(out_dir, 'images', name).read_bytes(),
                       pathlib.Path(REFERENCE, 'images', name).read_bytes())

  def test_second_job_on_a_busy_folder_is_refused_at_once(self):
    """The second job (a requeue while the first runs) stops within seconds, naming
    the lock and its holder, and touches nothing; the first job's set is whole."""
    out_dir = os.path.join(_TMP.name, 'busy')
    lock = pathlib.Path(out_dir, 'job.lock')
    first = subprocess.Popen(job_command(out_dir), cwd=REPO, env=job_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
      while not lock.exists():
        self.assertIsNone(first.poll(), 'the first job ended before taking the lock')
        time.sleep(0.02)
      os.kill(first.pid, signal.SIGSTOP)  # busy for sure while the second job starts
      started = time.perf_counter()
      second = subprocess.run(job_command(out_dir), cwd=REPO, env=job_env(),
                              capture_output=True, text=True, timeout=120)
      seconds = time.perf_counter() - started
    finally:
      os.kill(first.pid, signal.SIGCONT)
    log = first.communicate(timeout=300)[0]
    self.assertEqual(first.returncode, 0, log[-3000:])
    self.assertEqual(second.returncode, cli.EXIT_CONFIG_ERROR, second.stderr[-3000:])
    self.assertIn(f'{lock} is held by pid {first.pid} on host {socket.gethostname()}',
                  second.stderr)
    self.assertIn('--config.break_lock=True', second.stderr)
    self.assertNotIn('Traceback', second.stderr)
    self.assertLess(seconds, 60)  # start-up only: it stops before loading the model
    self.assert_same_set(out_dir)
    self.assertFalse(lock.exists())  # released when the first job ended

  def test_reference_run_used_the_compilation_cache_in_xdg_cache_home(self):
    folder = pathlib.Path(CACHE_HOME, 'specdec_jax')
    self.assertIn(f'persistent compilation cache: {folder}', REFERENCE_LOG[0])
    self.assertNotEmpty(list(folder.iterdir()))


class SampleErrorsTest(absltest.TestCase):
  """Configurations no run can use are refused early, saying what to change."""

  def config(self, **changes):
    config = sample_fashion.get_config()
    config.model.bundle_dir = BUNDLE
    config.update(dict(num_images=NUM_IMAGES, batch_per_device=2, chunk_size=CHUNK,
                       method='vanilla', out_dir=os.path.join(_TMP.name, 'errors')))
    config.update(changes)
    return config

  def test_image_i_is_the_engine_decode_with_key_i(self):
    """The job's keys are the engine's own per-image convention: a plain
    decode.generate of images 0..3 with one key(seed) gives the same images."""
    config = self.config(num_images=4, batch_per_device=4, seed=7,
                         out_dir=os.path.join(_TMP.name, 'engine_keys'))
    sample.run(config)
    family = family_lib.load(BUNDLE)
    labels = np.arange(4, dtype=np.int32)
    result = decode.generate(
        family.target, family.target_params,
        family.target.cfg_cond(family.target_params, labels), num_tokens=family.num_tokens,
        key=jax.random.key(7), sampling=logits.Sampling(**config.sampling.to_dict()))
    with np.load(os.path.join(config.out_dir, sample_output.SAMPLES)) as samples:
      np.testing.assert_array_equal(samples['arr_0'][..., :1], family.decode(result.tokens))

  def test_unguided_sampling_writes_the_engine_images(self):
    """cfg_scale = 1.0 (FID's no-guidance setting) decodes one row per image: image i
    is the engine's unguided decode with key i."""
    config = self.config(num_images=4, batch_per_device=4, seed=7,
                         out_dir=os.path.join(_TMP.name, 'unguided'))
    config.sampling.cfg_scale = 1.0
    self.assertEqual(sample.run(config)['num_images'], 4)
    family = family_lib.load(BUNDLE)
    result = decode.generate(
        family.target, family.target_params, np.arange(4, dtype=np.int32),
        num_tokens=family.num_tokens, key=jax.random.key(7),
        sampling=logits.Sampling(**config.sampling.to_dict()))
    with np.load(os.path.join(config.out_dir, sample_output.SAMPLES)) as samples:
      np.testing.assert_array_equal(samples['arr_0'][..., :1], family.decode(result.tokens))

  def test_a_restart_with_other_code_is_refused_unless_allowed(self):
    out_dir = os.path.join(_TMP.name, 'upgraded')
    shutil.copytree(REFERENCE, out_dir)
    config = self.config(out_dir=out_dir, fast_compile=True)  # the reference's settings
    upgraded = dict(sample_folder.code_identity(), specdec_jax='9.9.9')
    with mock.patch.object(sample_folder, 'code_identity', return_value=upgraded):
      with self.assertRaisesRegex(sample_folder.FolderMismatchError,
                                  rf"code.specdec_jax: '{specdec_jax.__version__}' \(folder\) "
                                  r"-> '9.9.9' \(now\)"):
        sample.run(config)
      config.allow_code_change = True
      self.assertEqual(sample.run(config)['code']['specdec_jax'], '9.9.9')
    stored = json.loads(pathlib.Path(out_dir, sample_output.CONFIG).read_text())
    self.assertEqual(stored['fingerprint']['code']['specdec_jax'], specdec_jax.__version__)
    self.assertLen(stored['accepted_changes'], 1)
    self.assertEqual(pathlib.Path(out_dir, sample_output.SAMPLES).read_bytes(),
                     pathlib.Path(REFERENCE, sample_output.SAMPLES).read_bytes())

  def test_a_folder_from_before_a_new_hyperparameter_continues_at_its_default(self):
    """The reference folder as an older version wrote it (no hparams.pac_siblings):
    an upgraded restart with allow_code_change continues it, leaving the images as
    they were; without it the restart names both changes."""
    out_dir = os.path.join(_TMP.name, 'before_pac_siblings')
    shutil.copytree(REFERENCE, out_dir)
    path = pathlib.Path(out_dir, sample_output.CONFIG)
    stored = json.loads(path.read_text())
    del stored['fingerprint']['hparams']['pac_siblings']
    path.write_text(json.dumps(stored))
    config = self.config(out_dir=out_dir, fast_compile=True)  # the reference's settings
    upgraded = dict(sample_folder.code_identity(), specdec_jax='9.9.9')
    with mock.patch.object(sample_folder, 'code_identity', return_value=upgraded):
      with self.assertRaisesRegex(sample_folder.FolderMismatchError,
                                  r"hparams.pac_siblings: not in the folder -> 'target'"):
        sample.run(config)
      config.allow_code_change = True
      sample.run(config)
    accepted = json.loads(path.read_text())['accepted_changes']
    self.assertIn("hparams.pac_siblings: not in the folder -> 'target' (now, its default)",
                  accepted[0])
    self.assertEqual(pathlib.Path(out_dir, sample_output.SAMPLES).read_bytes(),
                     pathlib.Path(REFERENCE, sample_output.SAMPLES).read_bytes())

  def test_a_folder_recording_the_older_model_identity_continues(self):
    """Folders sampled before the identity left out conversion dates and paths hold the
    whole metadata files' hashes: the same checkpoints, recognised; another model's
    hashes are still refused."""
    out_dir = os.path.join(_TMP.name, 'older_identity')
    shutil.copytree(REFERENCE, out_dir)
    config = self.config(out_dir=out_dir, fast_compile=True)  # the reference's settings
    path = pathlib.Path(out_dir, sample_output.CONFIG)
    stored = json.loads(path.read_text())
    older = sample_model.identity(config.model, whole_files=True)
    self.assertNotEqual(older, stored['fingerprint']['model'])
    for model, refused in ((dict(older, target='0' * 64), True), (older, False)):
      path.write_text(json.dumps(dict(stored, fingerprint=dict(stored['fingerprint'],
                                                                model=model))))
      if refused:
        with self.assertRaisesRegex(sample_folder.FolderMismatchError, "model.target: '0000"):
          sample.run(config)
      else:
        self.assertEqual(sample.run(config)['num_images'], NUM_IMAGES)

  def test_a_checkpoint_converted_again_elsewhere_is_the_same_model(self):
    """The identity hashed the whole metadata file, with the conversion date and the
    source's path: converting the same file again stopped every restart."""
    params = {'w': np.ones((2, 2), np.float32)}
    folders = []
    for name in ('first', 'second'):
      source = pathlib.Path(_TMP.name, 'sources', name, 'model.pt')
      source.parent.mkdir(parents=True)
      source.write_bytes(b'the same weights')
      folders.append(common.write_params_atomic(
          os.path.join(_TMP.name, 'converted', name), params, config={'dim': 2},
          source_files=[source], extra_meta=dict(model='llamagen_gpt')))
    model = lambda folder: ml_collections.ConfigDict(dict(
        kind='llamagen', checkpoint=str(folder), vq=str(folder), eagle='', draft_model='',
        scan_layers=False))
    meta_path = folders[1] / 'specdec_meta.json'
    written_by = json.loads(meta_path.read_text())['written_by']
    self.assertEqual(written_by['specdec_jax'], specdec_jax.__version__)
    # The command line that converted it (here this test process's).
    self.assertEqual(written_by['command'],
                     ' '.join([pathlib.Path(sys.executable).name, *sys.argv]))
    # Another version or command converting the same file is the same model.
    text = meta_path.read_text()
    meta_path.write_text(text.replace(f'"specdec_jax": "{specdec_jax.__version__}"',
                                      '"specdec_jax": "9.9.9"'))
    self.assertNotEqual(meta_path.read_text(), text)
    same = [sample_model.identity(model(folder), 'float32') for folder in folders]
    self.assertEqual(same[0], same[1])
    older = [sample_model.identity(model(folder), 'float32', True) for folder in folders]
    self.assertNotEqual(older[0], older[1])
    (folders[1] / 'specdec_meta.json').write_text((folders[1] / 'specdec_meta.json').read_text()
                                                 .replace('"dim": 2', '"dim": 3'))
    self.assertNotEqual(sample_model.identity(model(folders[1]), 'float32'), same[0])

  def test_every_preset_passes_and_every_field_is_checked(self):
    for preset in (sample_fashion, sample_llamagen_c2i):
      cli.check_fields(preset.get_config(), sample.CONFIG_CHECKS)
    config = self.config()
    config.hparams.draft_length = 0
    with self.assertRaisesRegex(cli.ConfigError,
                                'config.hparams.draft_length=0: must be an integer >= 1'):
      sample.check_config(config)
    config = self.config()
    config.sampling.top_p = 1.5
    with self.assertRaisesRegex(cli.ConfigError, r'config.sampling.top_p=1.5: must be .*<= 1.0'):
      sample.check_config(config)

  def test_a_draft_length_beyond_the_image_stops_before_decoding(self):
    config = self.config(method='eagle', out_dir=os.path.join(_TMP.name, 'long_drafts'))
    config.hparams.draft_length = 256
    with mock.patch.object(decode, 'generate') as generate:
      with self.assertRaisesRegex(cli.ConfigError, 'config.hparams.draft_length=256: must be '
                                  'below the 256 tokens per image'):
        sample.run(config)
    generate.assert_not_called()

  def test_folder_written_by_another_configuration(self):
    with self.assertRaises(sample_folder.FolderMismatchError) as caught:
      sample.run(self.config(out_dir=REFERENCE, method='sjd', seed=3))
    message = str(caught.exception)
    self.assertIn("method: 'vanilla' (folder) -> 'sjd' (now)", message)
    self.assertIn('seed: 0 (folder) -> 3 (now)', message)
    self.assertIn('--config.out_dir', message)

  def test_unknown_method_and_bad_sizes(self):
    with self.assertRaisesRegex(cli.ConfigError,
                                r"config.method='medusa': must be one of \(.*'coolsd'"):
      sample.check_config(self.config(method='medusa'))
    for field in ('num_images', 'batch_per_device', 'chunk_size'):
      with self.assertRaisesRegex(cli.ConfigError,
                                  f'config.{field}=0: must be an integer >= 1'):
        sample.check_config(self.config(**{field: 0}))

  def test_drafting_method_without_its_drafter(self):
    config = self.config(method='coolsd')
    config.model.update(kind='llamagen', checkpoint=os.path.join(BUNDLE, 'target'),
                        vq=os.path.join(BUNDLE, 'tokenizer'), bundle_dir='')
    family, identity = sample_model.load(config.model)
    self.assertEqual(set(identity), {'kind', 'checkpoint', 'vq', 'dtype', 'scan_layers'})
    self.assertEqual((identity['dtype'], identity['scan_layers']), ('float32', False))
    with self.assertRaisesRegex(ValueError, "'coolsd' drafts with 'eagle'.*--config.model.eagle"):
      sample_model.build_method(config, family)
    self.assertEqual(sample_model.build_method(self.config(method='csd'), family).name, 'csd')
    # The same refusal before JAX starts or any model loads, naming every method without one.
    with self.assertRaisesRegex(cli.ConfigError, r"'coolsd' drafts with 'eagle'.*--config\.model"
                                r"\.eagle.*\('vanilla', 'sjd', 'scd', 'sjd_pac', 'gsd', 'csd'\)"):
      sample.check_config(config)
    config.model.eagle = os.path.join(BUNDLE, 'eagle')
    sample_model.check_method_drafter(config)

  def test_converted_parameters_are_placed_on_the_mesh_once(self):
    """The converters' loaders give NumPy arrays; every decode step uploaded the target and
    the drafter again (generate copies host leaves onto the mesh on every call)."""
    config = self.config(method='eagle', num_images=4, chunk_size=4,
                         out_dir=os.path.join(_TMP.name, 'placed_once'))
    config.model.update(kind='llamagen', checkpoint=os.path.join(BUNDLE, 'target'),
                        vq=os.path.join(BUNDLE, 'tokenizer'), eagle=os.path.join(BUNDLE, 'eagle'),
                        bundle_dir='')
    calls = []
    generate = decode.generate
    with mock.patch.object(sample.decode, 'generate',
                           lambda target, params, *a, **k: calls.append(
                               (params, k['draft_params'])) or generate(target, params, *a, **k)):
      self.assertEqual(sample.run(config)['num_images'], 4)
    self.assertLen(calls, 2)  # 2 steps of 2 images
    for params in calls[0]:  # target, drafter: device arrays, not the loaders' NumPy ones
      self.assertTrue(all(isinstance(x, jax.Array) for x in jax.tree.leaves(params)))
    for first, second in zip(*calls):  # the same placed arrays in every step
      self.assertTrue(all(a is b for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second))))

  def test_checkpoints_that_do_not_fit_are_config_errors_naming_the_field(self):
    """A tokenizer for another vocabulary decoded black images with exit 0; a drafter
    or folder of the wrong kind was a traceback (README: one line, exit status 2)."""
    config = self.config()
    config.model.update(kind='llamagen', checkpoint=os.path.join(BUNDLE, 'target'),
                        vq=os.path.join(BUNDLE, 'tokenizer'), bundle_dir='')

    def write_gpt(name, **fields):
      gpt = llamagen.GPTConfig(**dict(dict(dim=32, n_layer=1, n_head=2, vocab_size=32,
                                           num_classes=10, block_size=256, multiple_of=32),
                                      **fields))
      folder = os.path.join(_TMP.name, 'unfit', name)
      common.write_params_atomic(
          folder, llamagen.LlamaGenGPT(gpt).init_params(jax.random.key(0)),
          config=dataclasses.asdict(gpt), source_files=[], extra_meta=dict(model='llamagen_gpt'))
      return folder

    for changes, message in (
        (dict(checkpoint=os.path.join(BUNDLE, 'tokenizer')),
         r"config.model.checkpoint=.*holds a 'patch_kmeans' tokenizer checkpoint, not a LlamaGen"),
        (dict(checkpoint=write_gpt('vocab48', vocab_size=48)),
         r'config.model.vq=.* has 32 codebook entries, but the GPT .* vocabulary of 48'),
        (dict(checkpoint=write_gpt('dim64', dim=64), eagle=os.path.join(BUNDLE, 'eagle')),
         r'config.model.eagle=.*head_kernel'),
        (dict(draft_model=write_gpt('t2i', model_type='t2i', caption_dim=8, cls_token_num=3)),
         r"config.model.draft_model=.*model_type 't2i' differs from the target's 'c2i'"),
        (dict(draft_model=write_gpt('grid8', block_size=64)),
         r"config.model.draft_model=.*grid_size 8 differs from the target's 16")):
      with self.subTest(message):
        with self.assertRaisesRegex(cli.ConfigError, message):
          sample_model.load(ml_collections.ConfigDict(dict(config.model.to_dict(), **changes)))
    # Another error while loading is a bug, not the checkpoint's: its traceback stays.
    with mock.patch.object(sample_model.llamagen_converter, 'load_llamagen',
                           side_effect=ValueError('a bug')):
      with self.assertRaisesRegex(ValueError, '^a bug$'):
        sample_model.load(config.model)

  def test_the_early_drafter_table_is_the_methods_own(self):
    family = family_lib.load(BUNDLE)
    for name in sample_model.METHODS:
      built = sample_model.build_method(self.config(method=name), family)
      self.assertEqual(built.drafter, methods_lib.DRAFTERS.get(name), name)

  def test_paths_the_model_kind_does_not_read_are_refused(self):
    """The bundle decoded with its own EAGLE head when config.model.eagle named
    another drafter (even a missing one), silently; a llamagen model ignored
    bundle_dir the same way."""
    for field in ('checkpoint', 'vq', 'eagle', 'draft_model'):
      config = self.config(method='eagle')
      config.model[field] = os.path.join(_TMP.name, 'mine')
      with self.assertRaisesRegex(cli.ConfigError, rf"config.model.{field}='.*mine' is not read "
                                  "by kind 'fashion'.*kind=llamagen"):
        sample.check_config(config)
    # The bundle decodes in float32 as trained: a dtype was ignored, and not recorded.
    for field, value in (('dtype', 'bfloat16'), ('scan_layers', True)):
      config = self.config(method='eagle')
      config.model[field] = value
      with self.assertRaisesRegex(cli.ConfigError, rf"config.model.{field}={value!r} is not "
                                  "read by kind 'fashion'.*float32"):
        sample.check_config(config)
    config = sample_llamagen_c2i.get_config()
    config.model.bundle_dir = BUNDLE
    with self.assertRaisesRegex(cli.ConfigError, "config.model.bundle_dir=.* is not read by "
                                "kind 'llamagen'"):
      sample.check_config(config)

  def test_llamagen_preset_without_converted_checkpoints(self):
    config = sample_llamagen_c2i.get_config()
    with self.assertRaisesRegex(cli.ConfigError,
                                "model.checkpoint='ckpts/gpt_xl_c2i'.*does not exist"):
      sample.check_config(config)
    config.model.checkpoint = os.path.join(BUNDLE, 'target')
    config.model.vq = os.path.join(_TMP.name, 'nowhere')
    with self.assertRaisesRegex(cli.ConfigError, 'config.model.vq='):
      sample.check_config(config)

  def test_prompts_for_a_class_conditional_model(self):
    family, _ = sample_model.load(self.config().model)
    with self.assertRaisesRegex(ValueError, 'class-conditional.*config.classes'):
      sample_model.conditions(self.config(prompts='prompts.txt'), family)
    with self.assertRaisesRegex(ValueError, r'\[10\], outside \[0, 10\)'):
      sample_model.conditions(self.config(classes=(1, 10)), family)


class SampleReviewFixesTest(absltest.TestCase):
  """Token counts, reruns, seeds and paths the sampler must get right."""

  def config(self, **changes):
    return SampleErrorsTest.config(self, **changes)

  def test_tokens_per_forward_counts_committed_tokens(self):
    """A last step's drafts accepted past the image's last token are not credited:
    tokens_per_forward is committed tokens per verify step, as the main command's."""
    metrics = dict(verify_steps=np.asarray([50, 65]), accepted_tokens=np.asarray([146, 130]),
                   committed_tokens=np.asarray([195, 195]), target_forwards=np.asarray([51, 66]),
                   draft_forwards=np.asarray([200, 260]),
                   accepted_per_position=np.zeros((2, 4), np.int32))
    conditions = sample_model.Conditions('label', classes=np.arange(10, dtype=np.int32))
    records = sample.image_records(np.asarray([0, 1]), conditions, metrics)
    self.assertEqual([r['tokens_per_forward'] for r in records], [195 / 50, 195 / 65])
    self.assertEqual([r['committed_tokens'] for r in records], [195, 195])

  def test_rerun_of_a_finished_set_keeps_its_measured_throughput(self):
    out_dir = os.path.join(_TMP.name, 'finished_rerun')
    shutil.copytree(REFERENCE, out_dir)
    before = json.loads(pathlib.Path(out_dir, sample_output.SUMMARY).read_text())
    summary = sample.run(self.config(out_dir=out_dir, fast_compile=True))  # nothing to do
    after = json.loads(pathlib.Path(out_dir, sample_output.SUMMARY).read_text())
    for field in sample_output.MEASURED:
      self.assertEqual(after[field], before[field], field)
      self.assertEqual(summary[field], before[field], field)
    self.assertEqual(after['images_this_run'], NUM_IMAGES)
    self.assertGreater(after['images_per_s'], 0)

  def test_seed_must_fit_a_key(self):
    """jax.random.key(2**32 + s) is key(s): such a seed would repeat another set."""
    sample.check_config(self.config(seed=2**32 - 1))
    with self.assertRaisesRegex(cli.ConfigError, r'config.seed=4294967296: must be an integer '
                                '>= 0 and <= 4294967295'):
      sample.check_config(self.config(seed=2**32))

  def test_out_dir_that_is_a_file_or_read_only_is_a_config_error(self):
    path = os.path.join(_TMP.name, 'a_file')
    pathlib.Path(path).write_text('')
    for out_dir, problem in ((path, f'{path} is a file, not a folder'),
                             (os.path.join(path, 'set'), f'{path}, a folder above it, is a file'),
                             ('/sys/specdec_set', r'no folder can be made in /sys \(.+\)')):
      with self.assertRaisesRegex(cli.ConfigError,
                                  f'config.out_dir={out_dir!r}: {problem}. Name a folder'):
        sample.run(self.config(out_dir=out_dir))

  def test_a_refused_class_leaves_no_folder(self):
    """A check that needs the model (a class it lacks) refuses the config after the
    lock took the folder: the folders the run made are removed."""
    parent = os.path.join(_TMP.name, 'refused')
    with self.assertRaisesRegex(cli.ConfigError, r'config.classes has \[10\]'):
      sample.run(self.config(classes=(10,), out_dir=os.path.join(parent, 'set')))
    self.assertFalse(os.path.exists(parent))


class SampleT2ITest(absltest.TestCase):
  """A text-conditional LlamaGen takes a prompt file of caption features (in process)."""

  def test_prompts_condition_images_in_turn(self):
    gpt = llamagen.GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=32, block_size=16,
                             multiple_of=32, model_type='t2i', caption_dim=8, cls_token_num=3)
    target = llamagen.LlamaGenGPT(gpt)
    checkpoint = os.path.join(_TMP.name, 't2i')
    common.write_params_atomic(checkpoint, target.init_params(jax.random.key(0)),
                               config=dataclasses.asdict(gpt), source_files=[],
                               extra_meta=dict(model='llamagen_gpt'))
    prompts = os.path.join(_TMP.name, 'prompts.npz')
    mask = np.asarray([[1, 1, 1], [1, 0, 0], [1, 1, 0]], bool)  # T5 layout: valid first
    np.savez(prompts, features=np.random.default_rng(0).normal(size=(3, 3, 8)) * mask[..., None],
             mask=mask)
    config = sample_fashion.get_config()
    config.model.update(kind='llamagen', checkpoint=checkpoint,
                        vq=os.path.join(BUNDLE, 'tokenizer'))
    config.update(dict(num_images=5, batch_per_device=2, chunk_size=4, method='vanilla',
                       prompts=prompts, out_dir=os.path.join(_TMP.name, 't2i_samples')))
    no_prompts = config.copy_and_resolve_references()
    no_prompts.prompts = ''
    with self.assertRaisesRegex(ValueError, 'text-conditional.*config.prompts'):
      sample.run(no_prompts)
    summary = sample.run(config)
    self.assertEqual(summary['num_images'], 5)
    lines = pathlib.Path(config.out_dir, sample_output.METRICS).read_text().splitlines()
    self.assertEqual([json.loads(line)['prompt'] for line in lines], [0, 1, 2, 0, 1])
    with np.load(os.path.join(config.out_dir, sample_output.SAMPLES)) as samples:
      images = samples['arr_0']
    self.assertEqual(images.shape, (5, 8, 8, 3))  # 4 x 4 tokens of 2 x 2 patches
    # Images 0 and 3 share a prompt but not a key.
    self.assertFalse(np.array_equal(images[0], images[3]))
    stored = json.loads(pathlib.Path(config.out_dir, sample_output.CONFIG).read_text())
    self.assertIn('prompts_sha256', stored['fingerprint']['conditions'])


if __name__ == '__main__':
  absltest.main()
