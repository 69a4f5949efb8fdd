"""Runs a test script in a fresh CPU interpreter (the simulated device count is fixed
when JAX starts, so mesh tests set XLA_FLAGS there)."""

import os
import subprocess
import sys


def run_cpu_script(script: str, timeout: int = 600) -> subprocess.CompletedProcess:
  """`python -c script` with JAX_PLATFORMS=cpu and no inherited XLA_FLAGS."""
  env = dict(os.environ)
  env.pop('XLA_FLAGS', None)
  env['JAX_PLATFORMS'] = 'cpu'
  return subprocess.run([sys.executable, '-c', script], env=env, capture_output=True,
                        text=True, timeout=timeout)
