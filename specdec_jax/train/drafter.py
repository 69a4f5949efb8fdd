"""Moved to `specdec_jax.app.train.drafter`.

This old path keeps the command `python -m specdec_jax.train.drafter` working
(it runs the new module) and stays an alias, with a DeprecationWarning, for old
imports.
"""

from specdec_jax import _moved

_SHIM_FOR = 'specdec_jax.app.train.drafter'

if __name__ == '__main__':
  _moved.run_as_main(_SHIM_FOR)
else:
  _moved.alias(__name__, _SHIM_FOR)
