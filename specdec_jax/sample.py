"""`python -m specdec_jax.sample`: runs the evaluation-set sampler, `specdec_jax.app.sample`.

The core layer imports nothing from the application, so this file only runs
the application module as the program; it names it in `_SHIM_FOR`, which
tests/test_layers.py recognises. Import `specdec_jax.app.sample` for its API.
"""

from specdec_jax import _moved

_SHIM_FOR = 'specdec_jax.app.sample'

if __name__ == '__main__':
  _moved.run_as_main(_SHIM_FOR)
