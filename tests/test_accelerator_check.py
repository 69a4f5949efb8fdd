"""`bench/accelerator_check.sh`, the prepared GPU run, works before a GPU is lent.

Device time is short (minutes per session), so a script broken by a change
elsewhere must fail here, not on the device. `SMOKE=1` runs the same stages'
scripts at tiny shapes on this CPU: `bench/engine.py --preset=tiny` and
`bench/methods_at_scale.py --preset=tiny` (every method of the main command).
Checked: the script exits 0, every stage it runs exits 0 (while it prints
the Python stacks every 5 s), the JSON it writes
holds finite timings for every method, and `STAGES` runs only the stages it
names (the negative control: names that are not a stage's, near misses
included, run nothing and write nothing).
"""

import json
import math
import os
import subprocess
import sys
import tempfile

from absl.testing import absltest
import pytest

from specdec_jax.app import methods as methods_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(out: str, stages: str | None = None,
         python: str = sys.executable) -> subprocess.CompletedProcess:
  # Stacks every 5 s (the device run: 30 s), so each stage prints them while JAX
  # compiles on other threads: `faulthandler.dump_traceback_later`, which read
  # them without the GIL, crashed a stage that way (exit 139).
  # JAX_DISABLE_MOST_OPTIMIZATIONS: XLA:CPU at level 0 compiles the stages' programs about
  # 30% faster (the smoke: 170 s -> 126 s); it checks that the script runs, not speed or laws.
  env = dict(os.environ, SMOKE='1', OUT=out, PYTHON=python, JAX_PLATFORMS='cpu',
             BENCH_TRACEBACK_EVERY_S='5', SMOKE_BUDGET_S='500',  # every method, however slow
             JAX_DISABLE_MOST_OPTIMIZATIONS='1')
  env.pop('STAGES', None)
  if stages is not None:
    env['STAGES'] = stages
  return subprocess.run(['bash', os.path.join(ROOT, 'bench', 'accelerator_check.sh')], env=env,
                        capture_output=True, text=True, timeout=900, check=False)


@pytest.mark.slow
class AcceleratorCheckSmokeTest(absltest.TestCase):

  def test_every_stage_runs_and_writes_finite_results(self):
    with tempfile.TemporaryDirectory() as out:
      result = _run(out, stages='engine-tiny methods-tiny')  # STAGES naming both runs both
      self.assertEqual(result.returncode, 0, result.stderr[-2000:])
      with open(os.path.join(out, 'log.txt')) as f:
        log = f.read()
      with open(os.path.join(out, 'stages.log')) as f:
        stages_log = f.read()
      for stage in ('engine-tiny', 'methods-tiny'):
        self.assertIn(f'== {stage} exit 0 after', log, stages_log[-3000:])
      self.assertIn('--- Python stacks at', stages_log)
      with open(os.path.join(out, 'engine_tiny.json')) as f:
        engine = json.load(f)
      for field in ('forward_ms_T1', 'forward_ms_T5', 'vanilla_ms_per_token',
                    'chain_ms_per_iteration', 'jacobi_ms_per_iteration'):
        self.assertTrue(math.isfinite(engine[field]) and engine[field] > 0, field)
      with open(os.path.join(out, 'methods_tiny.json')) as f:
        methods = json.load(f)
      self.assertEqual(methods['skipped'], [])
      ran = {row['method']: row for row in methods['methods']}
      expected = set(methods_lib.METHOD_NAMES) - {'vanilla_seed1'}
      self.assertEqual(set(ran), expected)
      for name, row in ran.items():
        self.assertTrue(math.isfinite(row['speedup']) and row['speedup'] > 0, name)
        self.assertGreaterEqual(row['tokens_per_forward'], 1.0, name)

  def test_without_stages_every_stage_starts(self):
    """STAGES unset, as on the device: each stage starts (`true` for Python: the stages'
    scripts themselves run in the test above)."""
    with tempfile.TemporaryDirectory() as out:
      result = _run(out, python='true')
      self.assertEqual(result.returncode, 0, result.stderr[-2000:])
      with open(os.path.join(out, 'log.txt')) as f:
        log = f.read()
      for stage in ('engine-tiny', 'methods-tiny'):
        self.assertIn(f'== {stage} exit 0 after', log)

  def test_stages_runs_only_the_named_stages(self):
    """Names that are not the stages' (near misses: a prefix, a longer name) run none
    of them; the test above, naming both, runs both."""
    with tempfile.TemporaryDirectory() as out:
      result = _run(out, stages='methods engine-tiny-x')
      self.assertEqual(result.returncode, 0, result.stderr[-2000:])
      self.assertEqual(sorted(os.listdir(out)), ['environment.txt'])  # no stage, no log


if __name__ == '__main__':
  absltest.main()
