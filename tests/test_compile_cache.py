"""app.compile_cache: where the entry points' persistent compilation cache lives.

That the entry points fill it, and that 'off' keeps it empty, is tested on the
commands themselves (tests/test_sample.py, tests/test_generate.py).
"""

import contextlib
import os
import pathlib
import tempfile
from unittest import mock

from absl.testing import absltest
import jax

from specdec_jax.app import cli
from specdec_jax.app import compile_cache


@contextlib.contextmanager
def jax_cache_dir(value):
  """JAX's own cache folder setting (JAX_COMPILATION_CACHE_DIR) set to `value`."""
  before = jax.config.jax_compilation_cache_dir
  jax.config.update('jax_compilation_cache_dir', value)
  try:
    yield
  finally:
    jax.config.update('jax_compilation_cache_dir', before)


class FolderTest(absltest.TestCase):

  def test_settings(self):
    with mock.patch.dict(os.environ, {'XDG_CACHE_HOME': '/x/cache'}), jax_cache_dir(None):
      self.assertEqual(compile_cache.folder_for(''), pathlib.Path('/x/cache/specdec_jax'))
      self.assertIsNone(compile_cache.folder_for('off'))
      self.assertEqual(compile_cache.folder_for('/elsewhere'), pathlib.Path('/elsewhere'))
    with mock.patch.dict(os.environ, {'HOME': '/home/u'}):
      os.environ.pop('XDG_CACHE_HOME', None)
      self.assertEqual(compile_cache.default_folder(), pathlib.Path('/home/u/.cache/specdec_jax'))

  def test_jax_own_setting_wins_over_the_default(self):
    with jax_cache_dir('/from/env'):
      self.assertEqual(compile_cache.folder_for(''), pathlib.Path('/from/env'))
      self.assertEqual(compile_cache.folder_for('/mine'), pathlib.Path('/mine'))

  def test_a_file_in_the_way_is_a_config_error(self):
    """--config.compilation_cache=<a file> names the flag and the file (it was a bare
    FileExistsError traceback)."""
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, 'a_file')
      pathlib.Path(path).write_text('')
      with self.assertRaisesRegex(cli.ConfigError, f"config.compilation_cache='{path}': "
                                  f'{path} is a file, not a folder'):
        compile_cache.enable(path)
      with self.assertRaisesRegex(cli.ConfigError, f'{path}, a folder above it, is a file'):
        compile_cache.enable(os.path.join(path, 'cache'))

  def test_a_read_only_default_folder_turns_the_cache_off_a_named_one_is_refused(self):
    """A read-only home (containers, clusters) stopped every command with a
    traceback at the default cache's mkdir; now the default cache is turned off
    with a warning. A folder the user named is still a usage error."""
    unwritable = '/sys/specdec_jax_cache'  # no folder can be made in /sys, even as root
    if not os.path.isdir('/sys'):
      self.skipTest('needs Linux /sys')
    enabled = jax.config.jax_enable_compilation_cache
    try:
      with mock.patch.dict(os.environ, {'XDG_CACHE_HOME': unwritable}), jax_cache_dir(None):
        with self.assertLogs(level='WARNING') as logs:
          self.assertIsNone(compile_cache.enable(''))
        self.assertFalse(jax.config.jax_enable_compilation_cache)
        self.assertIn('persistent compilation cache off: no folder can be made in /sys',
                      logs.output[0])
      with self.assertRaisesRegex(cli.ConfigError, f"config.compilation_cache='{unwritable}': "
                                  'no folder can be made in /sys'):
        compile_cache.enable(unwritable)
    finally:
      jax.config.update('jax_enable_compilation_cache', enabled)


if __name__ == '__main__':
  absltest.main()
