"""The wheel installs only `specdec_jax` at the top level and works outside the repo."""

import os
import pathlib
import subprocess
import sys
import tempfile
import zipfile

from absl.testing import absltest

REPO = pathlib.Path(__file__).resolve().parents[1]


class PackagingTest(absltest.TestCase):

  def test_wheel_has_no_generic_top_level_names_and_imports_outside_repo(self):
    with tempfile.TemporaryDirectory() as tmp:
      tmp = pathlib.Path(tmp)
      subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation',
                      '-q', '-w', str(tmp / 'dist'), str(REPO)], check=True)
      wheel = next((tmp / 'dist').glob('specdec_jax-*.whl'))
      names = zipfile.ZipFile(wheel).namelist()
      top_level = {n.split('/')[0] for n in names if not n.split('/')[0].endswith('.dist-info')}
      self.assertEqual(top_level, {'specdec_jax'})
      expected = [f'specdec_jax/{sub}/__init__.py'
                  for sub in ('models', 'converters', 'configs', 'app', 'app/train')]
      expected += [f'specdec_jax/{m}.py' for m in ('generate', 'sample', 'app/toy', 'app/font',
                                                    'app/train/family', 'models/tiny')]
      self.assertEmpty([n for n in expected if n not in names])
      # The old paths of moved modules are gone (no shims, no toy models in the core).
      old = [n for n in names if n.startswith('specdec_jax/train/') or n in {
          f'specdec_jax/{m}.py' for m in ('_moved', 'toy', 'family', 'demo', 'models/toy')}]
      self.assertEmpty(old)

      # Install the wheel alone into a fresh target folder; dependencies come
      # from this environment. Import from a folder outside the repository.
      target = tmp / 'site'
      subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-deps', '-q', '--target',
                      str(target), str(wheel)], check=True)
      self.assertFalse((target / 'models').exists())
      code = ('import specdec_jax, specdec_jax.rules, specdec_jax.verify, specdec_jax.models, '
              'specdec_jax.converters, specdec_jax.configs, specdec_jax.app.generate; '
              'print(specdec_jax.__file__)')
      env = dict(os.environ, PYTHONPATH=str(target))
      out = subprocess.run([sys.executable, '-I', '-c',
                            f'import sys; sys.path.insert(0, {str(target)!r}); {code}'],
                           cwd=tmp, env=env, check=True, capture_output=True, text=True)
      self.assertTrue(out.stdout.strip().startswith(str(target)), out.stdout)

      # The bundled model family ships as package data and loads from the wheel.
      if (REPO / 'specdec_jax' / 'assets' / 'fashion_mnist' / 'manifest.json').exists():
        self.assertIn('specdec_jax/assets/fashion_mnist/manifest.json', names)
        code = ('import sys; sys.path.insert(0, {!r}); from specdec_jax.app import family; '
                'f = family.load(); print(family.BUNDLE_DIR, f.num_tokens)').format(str(target))
        out = subprocess.run([sys.executable, '-I', '-c', code], cwd=tmp, env=env, check=True,
                             capture_output=True, text=True)
        self.assertTrue(out.stdout.strip().startswith(str(target)), out.stdout)


if __name__ == '__main__':
  absltest.main()
