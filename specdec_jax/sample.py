"""`python -m specdec_jax.sample`: runs the evaluation-set sampler, `specdec_jax.app.sample`.

A documented command name only: the core layer imports nothing from the
application, so this file runs the application module as the program and
does nothing when imported. Import `specdec_jax.app.sample` for its API.
"""

import runpy

if __name__ == '__main__':
  runpy.run_module('specdec_jax.app.sample', run_name='__main__', alter_sys=True)
