"""pytest setup for the whole suite: JAX's persistent compilation cache stays out of
the user's cache folder.

The entry points (main command, sampler) use $XDG_CACHE_HOME/specdec_jax by
default, or JAX_COMPILATION_CACHE_DIR; the tests that start them as
subprocesses inherit this environment, so they neither read nor fill the
user's cache. Runs before any test module imports JAX.
"""

import atexit
import os
import shutil
import tempfile

_CACHE_HOME = tempfile.mkdtemp(prefix='specdec_jax_test_cache_')
os.environ['XDG_CACHE_HOME'] = _CACHE_HOME
os.environ.pop('JAX_COMPILATION_CACHE_DIR', None)
atexit.register(shutil.rmtree, _CACHE_HOME, ignore_errors=True)
