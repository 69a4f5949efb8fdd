"""Every bench script's `--help` lists its flags and exits with status 0, and a bad
flag is one line with status 2, as the library's commands do (absl exits 1 for
both)."""

import os
import pathlib
import subprocess
import sys

from absl.testing import absltest

_BENCH = pathlib.Path(__file__).resolve().parents[1] / 'bench'
_SCRIPTS = sorted(p for p in _BENCH.glob('*.py') if 'app.run(main' in p.read_text())


def _run_all(flag: str) -> dict:
  """{script name: (exit status, output)} of `script flag`, started all at once."""
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  jobs = {p.name: subprocess.Popen([sys.executable, str(p), flag], cwd=_BENCH.parent, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
          for p in _SCRIPTS}
  outputs = {name: job.communicate(timeout=300)[0] for name, job in jobs.items()}
  return {name: (jobs[name].returncode, output) for name, output in outputs.items()}


class BenchHelpTest(absltest.TestCase):

  def test_help_exits_0(self):
    self.assertGreater(len(_SCRIPTS), 20)
    for name, (code, output) in _run_all('--help').items():
      with self.subTest(name):
        self.assertEqual(code, 0, output[-2000:])
        self.assertIn(f'{name}:', output)  # its own flags are listed

  def test_a_bad_flag_is_one_line_with_status_2(self):
    result = subprocess.run([sys.executable, str(_BENCH / 'draft_length.py'), '--roundz=1'],
                            cwd=_BENCH.parent, env=dict(os.environ, JAX_PLATFORMS='cpu'),
                            capture_output=True, text=True, timeout=300, check=False)
    self.assertEqual(result.returncode, 2, result.stderr[-2000:])
    self.assertIn("Unknown command line flag 'roundz'", result.stderr)
    self.assertLen(result.stderr.strip().splitlines(), 1, result.stderr)

if __name__ == '__main__':
  absltest.main()
