"""`sample_processes` in one process: `agreed` returns the step's result or raises
its own error, and the folder lock refuses a second holder. (Two processes, where a
step fails on one of them only: tests/test_sample.py.)"""

import os
import signal
import subprocess
import sys
import tempfile
import time
from unittest import mock

from absl.testing import absltest
import jax

from specdec_jax.app import cli
from specdec_jax.app import files
from specdec_jax.app import sample_processes


class AgreedTest(absltest.TestCase):

  def test_returns_the_steps_result(self):
    self.assertEqual(sample_processes.agreed('add', lambda: 1 + 1), 2)
    self.assertEqual(sample_processes.agreed('add', lambda: 3, process_0_only=True), 3)

  def test_the_failing_process_raises_its_own_error(self):
    def fail():
      raise OSError('disk full')
    with self.assertRaisesRegex(OSError, 'disk full'):
      sample_processes.agreed('merge the chunks', fail, process_0_only=True)


class InitializeDistributedTest(absltest.TestCase):
  """Bad --num_processes / --process_id / coordinator settings are one-line usage
  errors (jax.distributed raised a ValueError traceback for each)."""

  def test_out_of_range_counts_are_refused_before_jax_distributed(self):
    with mock.patch.object(jax.distributed, 'initialize') as initialize:
      for num_processes, process_id, message in (
          (0, 0, r'--num_processes=0: must be at least 1'),
          (2, 5, r'--process_id=5: must be in \[0, 2\)'),
          (2, 2, r'--process_id=2: must be in \[0, 2\)'),
          (2, -1, r'--process_id=-1: must be in \[0, 2\)'),
          (None, -1, r'--process_id=-1: must be at least 0')):
        with self.assertRaisesRegex(cli.ConfigError, message):
          sample_processes.initialize_distributed('auto', 'localhost:1', num_processes,
                                                  process_id)
      initialize.assert_not_called()
      sample_processes.initialize_distributed('auto', 'localhost:1', 2, 1)
      initialize.assert_called_once_with(coordinator_address='localhost:1', num_processes=2,
                                         process_id=1)

  def test_jax_distributed_refusing_is_a_usage_error_of_the_command(self):
    """No coordinator and no cluster to detect one: jax.distributed's own ValueError,
    through the sampler's command line."""
    with tempfile.TemporaryDirectory() as tmp:
      result = subprocess.run(
          [sys.executable, '-m', 'specdec_jax.sample', '--num_processes=2', '--process_id=0',
           f'--config.out_dir={tmp}/set'],
          env=dict(os.environ, JAX_PLATFORMS='cpu'), capture_output=True, text=True,
          timeout=300)
      self.assertEqual(result.returncode, 2, result.stderr[-3000:])
      self.assertIn('jax.distributed.initialize refused the settings: ', result.stderr)
      self.assertNotIn('Traceback', result.stderr)
      self.assertFalse(os.path.exists(f'{tmp}/set'))


class LockFolderTest(absltest.TestCase):

  def test_a_sigterm_dropped_by_a_callback_still_stops_the_job(self):
    """The handler's SystemExit raised inside JAX's garbage-collector callback was printed
    and dropped, and the job ran to its end with exit 0 (seen in CI): the sampler asks
    `exit_if_stopped` before each step."""
    previous = signal.getsignal(signal.SIGTERM)
    try:
      sample_processes.exit_if_stopped()  # no signal yet: nothing
      sample_processes.exit_on_sigterm()
      try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler raises here ...
      except SystemExit:
        pass  # ... and a callback drops it
      with self.assertRaises(SystemExit) as stopped:
        sample_processes.exit_if_stopped()
      self.assertEqual(stopped.exception.code, 128 + signal.SIGTERM)
    finally:
      signal.signal(signal.SIGTERM, previous)
      sample_processes._STOPPED_BY.clear()  # pylint: disable=protected-access

  def test_an_error_a_sigterm_caused_still_exits_143(self):
    """SIGTERM during the lazy import of tensorstore: the extension turned the
    handler's SystemExit into `ImportError: initialization failed`, exit 1 (seen in CI)."""
    previous = signal.getsignal(signal.SIGTERM)
    try:
      with self.assertRaises(SystemExit) as stopped:
        with sample_processes.sigterm_stops_the_job():
          try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler raises here ...
          except SystemExit:
            raise ImportError('initialization failed') from None  # ... as the import did
      self.assertEqual(stopped.exception.code, 128 + signal.SIGTERM)
      with self.assertRaisesRegex(ValueError, 'a bug'):  # without a SIGTERM: the error
        sample_processes._STOPPED_BY.clear()  # pylint: disable=protected-access
        with sample_processes.sigterm_stops_the_job():
          raise ValueError('a bug')
    finally:
      signal.signal(signal.SIGTERM, previous)
      sample_processes._STOPPED_BY.clear()  # pylint: disable=protected-access

  def test_a_job_stopped_by_sigterm_releases_its_lock(self):
    """scancel, preemption and `timeout` send SIGTERM: the lock went with the
    process before, and refused a requeued job on another host."""
    with tempfile.TemporaryDirectory() as tmp:
      out_dir = os.path.join(tmp, 'set')
      job = subprocess.Popen(
          [sys.executable, '-m', 'specdec_jax.sample', '--config.method=vanilla',
           '--config.num_images=1000', '--config.compilation_cache=off',
           f'--config.out_dir={out_dir}'],
          env=dict(os.environ, JAX_PLATFORMS='cpu'), stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT, text=True)
      try:
        lock = os.path.join(out_dir, 'job.lock')
        deadline = time.monotonic() + 240
        while not os.path.exists(lock) and job.poll() is None and time.monotonic() < deadline:
          time.sleep(0.2)
        self.assertTrue(os.path.exists(lock), 'the job never took its lock')
        job.send_signal(signal.SIGTERM)
        log = job.communicate(timeout=240)[0]
      finally:
        job.kill()
      self.assertEqual(job.returncode, 128 + signal.SIGTERM, log[-2000:])
      self.assertFalse(os.path.exists(lock), log[-2000:])

  def test_a_held_folder_is_refused(self):
    folder = tempfile.mkdtemp()
    lock = sample_processes.lock_folder(folder, break_lock=False)
    try:
      with self.assertRaisesRegex(files.FolderLockedError, 'in use'):
        sample_processes.lock_folder(folder, break_lock=False)
    finally:
      lock.release()
    sample_processes.lock_folder(folder, break_lock=False).release()  # free again

  def test_a_folder_that_cannot_be_locked_raises_the_error(self):
    path = os.path.join(tempfile.mkdtemp(), 'a_file')
    with open(path, 'w') as f:
      f.write('not a folder')
    with self.assertRaises(OSError):
      sample_processes.lock_folder(path, break_lock=False)


if __name__ == '__main__':
  absltest.main()
