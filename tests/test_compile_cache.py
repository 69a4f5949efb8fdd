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


_KEYS = ('jax_enable_compilation_cache', 'jax_compilation_cache_dir',
         'jax_persistent_cache_min_compile_time_secs',
         'jax_persistent_cache_min_entry_size_bytes')


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
      self.assertEqual(compile_cache.folder_for('~/cc'), pathlib.Path('/home/u/cc'))  # not ./~

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


class EnableTest(absltest.TestCase):
  """What enable() switches (pinned by a mutation audit)."""

  def setUp(self):
    super().setUp()
    before = {key: getattr(jax.config, key) for key in _KEYS}
    self.addCleanup(lambda: [jax.config.update(k, v) for k, v in before.items()])

  def test_off_turns_the_cache_off_even_with_a_jax_folder_set(self):
    """compilation_cache=off wins over JAX_COMPILATION_CACHE_DIR: nothing is written."""
    with tempfile.TemporaryDirectory() as tmp:
      jax.config.update('jax_compilation_cache_dir', tmp)
      jax.config.update('jax_enable_compilation_cache', True)
      self.assertIsNone(compile_cache.enable('off'))
      self.assertFalse(jax.config.jax_enable_compilation_cache)

  def test_a_named_folder_is_made_with_its_parents_and_switched_on(self):
    with tempfile.TemporaryDirectory() as tmp:
      folder = pathlib.Path(tmp) / 'not' / 'yet' / 'there'
      self.assertEqual(compile_cache.enable(str(folder)), folder)
      self.assertTrue(folder.is_dir())
      self.assertTrue(jax.config.jax_enable_compilation_cache)
      self.assertEqual(jax.config.jax_compilation_cache_dir, str(folder))

  def test_the_default_folder_is_made_under_a_missing_xdg_cache_home(self):
    with tempfile.TemporaryDirectory() as tmp:
      xdg = os.path.join(tmp, 'fresh', 'cache')
      with mock.patch.dict(os.environ, {'XDG_CACHE_HOME': xdg}), jax_cache_dir(None):
        folder = compile_cache.enable('')
      self.assertEqual(folder, pathlib.Path(xdg) / 'specdec_jax')
      self.assertTrue(folder.is_dir())

  def test_a_read_only_default_folder_turns_the_cache_off_a_named_one_is_refused(self):
    """A read-only home (containers, clusters) stopped every command with a
    traceback at the default cache's mkdir; now the default cache is turned off
    with a warning. A folder the user named is still a usage error."""
    unwritable = '/sys/specdec_jax_cache'  # no folder can be made in /sys, even as root
    if not os.path.isdir('/sys'):
      self.skipTest('needs Linux /sys')
    jax.config.update('jax_enable_compilation_cache', True)
    with mock.patch.dict(os.environ, {'XDG_CACHE_HOME': unwritable}), jax_cache_dir(None):
      with self.assertLogs(level='WARNING') as logs:
        self.assertIsNone(compile_cache.enable(''))
      self.assertFalse(jax.config.jax_enable_compilation_cache)
      self.assertTrue(any('persistent compilation cache off: no folder can be made in /sys'
                          in line for line in logs.output), logs.output)
    with self.assertRaisesRegex(cli.ConfigError, f"config.compilation_cache='{unwritable}': "
                                'no folder can be made in /sys'):
      compile_cache.enable(unwritable)


if __name__ == '__main__':
  absltest.main()
