"""`python -m specdec_jax.generate`: runs the main command, `specdec_jax.app.generate`.

A documented command name only: the core layer imports nothing from the
application, so this file runs the application module as the program and
does nothing when imported. Import `specdec_jax.app.generate` for its API.
"""

import runpy

if __name__ == '__main__':
  runpy.run_module('specdec_jax.app.generate', run_name='__main__', alter_sys=True)
