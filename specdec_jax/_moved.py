"""Old module paths kept working after the application moved to `specdec_jax.app`.

A shim at an old path (it names its new module in `_SHIM_FOR`, which
tests/test_layers.py recognises) calls `alias` when imported: the old name then
*is* the new module, the same object (so patching one patches the other), and a
DeprecationWarning names the new path. Run as a program (`python -m old.path`),
the shim calls `run_as_main` instead, which runs the new module as `__main__`,
so its absl flags are defined once, as before.
"""

import importlib
import runpy
import sys
import types
import warnings


def alias(old_name: str, new_name: str) -> types.ModuleType:
  """Makes `old_name` an alias of module `new_name` and warns the importer."""
  # stacklevel 3: past this function and the shim, to the module that imports the
  # old path (the import machinery's own frames are skipped by `warnings`).
  warnings.warn(f'{old_name} moved to {new_name}; import it from there.',
                DeprecationWarning, stacklevel=3)
  module = importlib.import_module(new_name)
  sys.modules[old_name] = module
  return module


def run_as_main(new_name: str) -> None:
  """Runs module `new_name` as the program, with the command line unchanged."""
  runpy.run_module(new_name, run_name='__main__', alter_sys=True)
