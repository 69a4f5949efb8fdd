"""`python -m specdec_jax.sample`: the evaluation-set sampler, `specdec_jax.app.sample`.

The core layer imports nothing from the application, so this entry point only
runs the application module as the program (it is a shim in the sense of
tests/test_layers.py: it names its module in `_SHIM_FOR`).
"""

from specdec_jax import _moved

_SHIM_FOR = 'specdec_jax.app.sample'

if __name__ == '__main__':
  _moved.run_as_main(_SHIM_FOR)
else:
  _moved.alias(__name__, _SHIM_FOR)
