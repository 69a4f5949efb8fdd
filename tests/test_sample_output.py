"""The sampler's work split (`sample_plan`) and output folder (`sample_output`), without JAX runs."""

import dataclasses
import json
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
from unittest import mock

from absl import logging as absl_logging
from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

import specdec_jax
from specdec_jax.app import files
from specdec_jax.app import images as images_lib
from specdec_jax.app import sample_folder
from specdec_jax.app import sample_output
from specdec_jax.app import sample_plan


@dataclasses.dataclass(frozen=True)
class FakeDevice:
  id: int
  process_index: int


def sharded_rows(num_processes: int, devices_per_process: int, per_device: int) -> dict:
  """A [G] batch over data devices, process-major, as devices_indices_map gives it."""
  out = {}
  for p in range(num_processes):
    for d in range(devices_per_process):
      start = (p * devices_per_process + d) * per_device
      out[FakeDevice(p * 100 + d, p)] = (slice(start, start + per_device),)
  return out


class PlanTest(parameterized.TestCase):

  @parameterized.parameters((1, 2, 2, 23, 8), (2, 2, 2, 23, 8), (3, 1, 4, 30, 5), (2, 4, 1, 7, 3))
  def test_every_image_is_planned_once_whatever_the_topology(self, processes, devices,
                                                             per_device, num_images, chunk):
    rows = sample_plan.rows_by_process(sharded_rows(processes, devices, per_device),
                                       processes * devices * per_device)
    pending = list(range(sample_plan.num_chunks(num_images, chunk)))
    seen = []
    for chunks in sample_plan.rounds(pending, list(range(processes)), processes):
      for step in range(sample_plan.steps_per_chunk(chunk, devices * per_device)):
        plan = sample_plan.step_plan(chunks, step, rows, num_images, chunk)
        for p, process_rows in enumerate(rows):
          index = plan.index[process_rows]
          real = index[index >= 0]
          seen += real.tolist()
          if len(real):  # a process's rows hold images of its own chunk only
            self.assertIn(real[0], sample_plan.chunk_range(chunks[p], num_images, chunk))
            self.assertIn(real[-1], sample_plan.chunk_range(chunks[p], num_images, chunk))
    self.assertEqual(sorted(seen), list(range(num_images)))

  def test_dummy_rows_and_labels(self):
    plan = sample_plan.StepPlan(np.asarray([7, 8, sample_plan.DUMMY, 0]))
    np.testing.assert_array_equal(plan.condition_ids(3), [1, 2, 0, 0])
    np.testing.assert_array_equal(plan.key_indices(), [7, 8, 0, 0])

  def test_rounds_skip_committed_chunks(self):
    self.assertEqual(sample_plan.rounds([1, 3, 4], [0, 1], 2), [[1, 3], [4, None]])
    self.assertEqual(sample_plan.rounds([1, 3], [0, 2], 3), [[1, None, 3]])

  def test_uneven_processes_are_refused(self):
    rows = {FakeDevice(0, 0): (slice(0, 2),), FakeDevice(1, 0): (slice(2, 4),),
            FakeDevice(2, 1): (slice(4, 6),)}  # process 0 holds 4 rows, process 1 two
    with self.assertRaisesRegex(ValueError, r'\[4, 2\].*same number of devices'):
      sample_plan.rows_by_process(rows, 6)

  def test_rows_replicated_over_processes_belong_to_the_lowest(self):
    rows = {FakeDevice(0, 0): (slice(0, 2),), FakeDevice(1, 1): (slice(0, 2),),
            FakeDevice(2, 0): (slice(2, 4),), FakeDevice(3, 1): (slice(2, 4),)}
    self.assertEqual(sample_plan.rows_by_process(rows, 4), [[0, 1, 2, 3], []])


class OutputTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.out = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.out)

  def commit(self, chunk, start, count):
    index = np.arange(start, start + count)
    images = np.full((count, 4, 4, 3), chunk, np.uint8)
    records = [dict(index=int(i), label=0) for i in index]
    sample_output.commit_chunk(self.out, chunk, index, images, records, process=0)

  def test_npz_is_deterministic_and_readable(self):
    arrays = dict(arr_0=np.arange(24, dtype=np.uint8).reshape(2, 2, 2, 3))
    first = sample_output.npz_bytes(arrays)
    with mock.patch('time.time', return_value=2e9):  # another clock gives the same bytes
      self.assertEqual(sample_output.npz_bytes(arrays), first)
    path = os.path.join(self.out, 'a.npz')
    pieces = iter([arrays['arr_0'][:1], arrays['arr_0'][1:]])
    sample_output.write_npz(path, dict(arr_0=((2, 2, 2, 3), np.uint8, pieces)))
    self.assertEqual(pathlib.Path(path).read_bytes(), first)  # streamed pieces, same file
    with np.load(path) as loaded:
      np.testing.assert_array_equal(loaded['arr_0'], arrays['arr_0'])

  def test_a_chunk_counts_once_its_manifest_is_written(self):
    with mock.patch.object(sample_output, 'write_json', side_effect=KeyboardInterrupt):
      with self.assertRaises(KeyboardInterrupt):  # killed just before the manifest
        self.commit(0, 0, 3)
    self.assertFalse(sample_output.committed(self.out, 0, range(0, 3)))
    self.commit(0, 0, 3)
    self.assertTrue(sample_output.committed(self.out, 0, range(0, 3)))
    self.assertFalse(sample_output.committed(self.out, 0, range(0, 4)))  # other chunking
    self.assertEqual(sorted(p.name for p in pathlib.Path(self.out, 'images').iterdir()),
                     ['000000.png', '000001.png', '000002.png'])

  def test_interrupted_write_leaves_only_a_temporary_file_which_is_removed(self):
    target = pathlib.Path(self.out, 'chunks', 'chunk_00000.npz')
    with mock.patch('os.replace', side_effect=KeyboardInterrupt):
      with self.assertRaises(KeyboardInterrupt):
        files.write_atomic(target, b'data')
    self.assertFalse(target.exists())
    self.assertEmpty(list(target.parent.iterdir()))  # its temporary file is removed too
    # A process killed outright (no cleanup) leaves one; the next start removes it.
    pathlib.Path(target.parent, '.chunk_00000.npz.x1.tmp').write_bytes(b'dat')
    self.assertEqual(sample_output.remove_temporaries(self.out), 1)
    self.assertEmpty(list(target.parent.iterdir()))

  def test_merge_checks_hashes_and_indices(self):
    self.commit(0, 0, 3)
    self.commit(1, 3, 2)
    records = sample_output.merge(self.out, [range(0, 3), range(3, 5)])
    self.assertEqual([r['index'] for r in records], [0, 1, 2, 3, 4])
    with np.load(os.path.join(self.out, sample_output.SAMPLES)) as loaded:
      np.testing.assert_array_equal(loaded['arr_0'][:, 0, 0, 0], [0, 0, 0, 1, 1])
    npz = pathlib.Path(self.out, 'chunks', 'chunk_00001.npz')
    data = bytearray(npz.read_bytes())
    data[-1] ^= 1  # same size, other bytes
    npz.write_bytes(bytes(data))
    with self.assertRaisesRegex(ValueError, "chunk_00001.npz does not match its manifest's "
                                'SHA-256; rerun the same command'):
      sample_output.merge(self.out, [range(0, 3), range(3, 5)])
    with self.assertRaisesRegex(ValueError, r'covers images 0..2, not 0..3'):
      sample_output.read_chunk(self.out, 0, range(0, 4))

  def test_records_of_other_indices_are_refused(self):
    """A chunk whose images hold the right indices but whose metric records name
    other images (indices 5, 6 for images 0, 1) is not read."""
    sample_output.commit_chunk(self.out, 0, np.arange(2), np.zeros((2, 4, 4, 3), np.uint8),
                               [dict(index=5), dict(index=6)], process=0, write_png=False)
    with self.assertRaisesRegex(ValueError, r'\(2 records\), expected range\(0, 2\)'):
      sample_output.read_chunk(self.out, 0, range(0, 2))

  def test_a_committed_chunk_is_one_whose_files_match_its_manifest(self):
    """A missing or emptied data file or a truncated manifest uncommits the chunk,
    saying why; a chunk never written says NOT_WRITTEN."""
    chunks = pathlib.Path(self.out, 'chunks')
    self.assertEqual(sample_output.chunk_problem(self.out, 0, range(0, 3)),
                     sample_output.NOT_WRITTEN)
    for chunk in range(4):
      self.commit(chunk, 3 * chunk, 3)
    (chunks / 'chunk_00000.npz').unlink()
    (chunks / 'chunk_00001.jsonl').write_bytes(b'')
    manifest = (chunks / 'chunk_00002.json').read_bytes()
    (chunks / 'chunk_00002.json').write_bytes(manifest[:len(manifest) // 2])
    problems = [sample_output.chunk_problem(self.out, c, range(3 * c, 3 * c + 3))
                for c in range(4)]
    self.assertEqual(problems[0], 'chunk_00000.npz is missing')
    self.assertRegex(problems[1], r'chunk_00001.jsonl has 0 bytes, its manifest says \d+')
    self.assertRegex(problems[2], r'manifest chunk_00002.json is damaged \(JSONDecodeError')
    self.assertIsNone(problems[3])
    self.assertEqual([sample_output.committed(self.out, c, range(3 * c, 3 * c + 3))
                      for c in range(4)], [False, False, False, True])

  def test_a_manifest_with_wrong_field_types_uncommits_the_chunk(self):
    """Valid JSON with a field of the wrong type (a hand edit) is a damaged manifest,
    not a TypeError or KeyError that stops every restart."""
    chunks = pathlib.Path(self.out, 'chunks')
    for chunk, edit in enumerate(({'npz': None}, {'stop': '3'}, {'jsonl': {}})):
      self.commit(chunk, 3 * chunk, 3)
      path = chunks / f'chunk_{chunk:05d}.json'
      path.write_text(json.dumps({**json.loads(path.read_text()), **edit}))
      problem = sample_output.chunk_problem(self.out, chunk, range(3 * chunk, 3 * chunk + 3))
      self.assertRegex(problem, 'is damaged|its manifest says None')

  def test_missing_or_damaged_pngs_are_written_from_the_chunk(self):
    """A chunk committed without PNGs (write_png off) gets them, the bytes its
    images encode to, and its manifest records them; damaged ones are rewritten."""
    index = np.arange(3, 6)
    images = np.random.default_rng(0).integers(0, 256, (3, 4, 4, 3), dtype=np.uint8)
    sample_output.commit_chunk(self.out, 1, index, images, [dict(index=int(i)) for i in index],
                               process=0, write_png=False)
    self.assertFalse(pathlib.Path(self.out, 'images').exists())
    self.assertEqual(sample_output.repair_pngs(self.out, 1), 3)
    for i, image in zip(index, images):
      self.assertEqual(sample_output.png_path(self.out, i).read_bytes(),
                       images_lib.encode_png(image))
    self.assertEqual(sample_output.repair_pngs(self.out, 1), 0)  # all there now
    self.assertLen(sample_output.read_manifest(self.out, 1)['pngs'], 3)
    sample_output.png_path(self.out, 3).unlink()
    sample_output.png_path(self.out, 5).write_bytes(b'\x89PNG truncated')
    self.assertEqual(sample_output.repair_pngs(self.out, 1), 2)
    self.assertEqual(sample_output.png_path(self.out, 5).read_bytes(),
                     images_lib.encode_png(images[2]))
    self.assertTrue(sample_output.committed(self.out, 1, range(3, 6)))

  def test_folder_of_another_configuration_is_refused_with_what_differs(self):
    fingerprint = dict(method='eagle', seed=0, hparams=dict(draft_length=4), classes=(1, 2))
    self.assertFalse(sample_folder.check_folder(self.out, fingerprint))  # new folder
    self._write_folder(fingerprint)
    self.assertTrue(sample_folder.check_folder(self.out, dict(fingerprint)))  # a restart
    changed = dict(fingerprint, method='coolsd', hparams=dict(draft_length=6))
    with self.assertRaises(sample_folder.FolderMismatchError) as caught:
      sample_folder.check_folder(self.out, changed)
    message = str(caught.exception)
    self.assertIn("method: 'eagle' (folder) -> 'coolsd' (now)", message)
    self.assertIn('hparams.draft_length: 4 (folder) -> 6 (now)', message)
    self.assertNotIn('seed', message)
    self.assertIn('new --config.out_dir', message)
    self.assertEqual(json.loads(pathlib.Path(self.out, 'config.json').read_text())[
        'fingerprint']['method'], 'eagle')

  def test_a_folder_without_images_starts_over_with_the_new_configuration(self):
    """A run that stopped before its first chunk (e.g. a bad setting found after the
    folder was written) left only config.json: a corrected run starts over there; any
    image file, even a temporary one, keeps the folder refused."""
    first = dict(method='sjd_pac', hparams=dict(pac_branches=40))
    sample_output.write_json(os.path.join(self.out, sample_output.CONFIG),
                             dict(fingerprint=first))
    fixed = dict(first, hparams=dict(pac_branches=2))
    with self.assertLogs(level='WARNING') as logged:
      self.assertFalse(sample_folder.check_folder(self.out, fixed))
    self.assertIn('wrote no image', logged.output[0])
    self.assertIn('hparams.pac_branches: 40 (folder) -> 2 (now)', logged.output[0])
    for written in ('images/000000.png.tmp', 'chunks/chunk_00000.npz', 'samples.npz'):
      folder = pathlib.Path(tempfile.mkdtemp(dir=self.out))
      sample_output.write_json(folder / sample_output.CONFIG, dict(fingerprint=first))
      (folder / written).parent.mkdir(exist_ok=True)
      (folder / written).write_bytes(b'')
      with self.assertRaisesRegex(sample_folder.FolderMismatchError, 'pac_branches'):
        sample_folder.check_folder(folder, fixed)

  def test_images_without_config_json_are_refused(self):
    """Chunks or images but no config.json: an unknown configuration's set, never
    merged under this run's configuration (an empty folder is new)."""
    self.assertFalse(sample_folder.check_folder(self.out, dict(method='eagle')))
    for written in ('chunks/chunk_00000.npz', 'images/000000.png', 'summary.json'):
      folder = pathlib.Path(tempfile.mkdtemp(dir=self.out))
      (folder / written).parent.mkdir(exist_ok=True)
      (folder / written).write_bytes(b'')
      with self.assertRaisesRegex(sample_folder.FolderMismatchError,
                                  'holds images but no config.json: they come from an unknown '
                                  'configuration. Remove the folder or choose another'):
        sample_folder.check_folder(folder, dict(method='eagle'))
      self.assertFalse((folder / sample_output.CONFIG).exists())

  def _write_folder(self, fingerprint):
    """config.json and one committed chunk (a folder that holds images)."""
    sample_output.write_json(os.path.join(self.out, sample_output.CONFIG),
                             dict(fingerprint=fingerprint))
    sample_output.commit_chunk(self.out, 0, np.arange(2), np.zeros((2, 4, 4, 3), np.uint8),
                               [{}, {}], process=0)

  def test_other_code_is_refused_unless_tolerated_and_then_recorded(self):
    fingerprint = dict(method='eagle', code=dict(specdec_jax='0.1.0', jax='0.10.2'))
    self._write_folder(fingerprint)
    upgraded = dict(fingerprint, code=dict(specdec_jax='0.2.0', jax='0.10.2'))
    with self.assertRaisesRegex(sample_folder.FolderMismatchError,
                                r"code.specdec_jax: '0.1.0' \(folder\) -> '0.2.0' \(now\)"):
      sample_folder.check_folder(self.out, upgraded)
    with self.assertRaisesRegex(sample_folder.FolderMismatchError, 'method'):  # only 'code'
      sample_folder.check_folder(self.out, dict(upgraded, method='sjd'), tolerated=('code',))
    self.assertTrue(sample_folder.check_folder(self.out, upgraded, ('code',), record=True))
    stored = json.loads(pathlib.Path(self.out, sample_output.CONFIG).read_text())
    self.assertEqual(stored['fingerprint'], fingerprint)  # the folder's first code
    self.assertEqual(stored['accepted_changes'],
                     [["code.specdec_jax: '0.1.0' (folder) -> '0.2.0' (now)"]])

  def test_a_larger_num_images_extends_the_set_and_a_smaller_one_is_refused(self):
    fingerprint = dict(method='eagle', num_images=6, seed=0)
    self._write_folder(fingerprint)
    path = pathlib.Path(self.out, sample_output.CONFIG)
    sample_output.write_json(path, dict(json.loads(path.read_text()),
                                        config=dict(method='eagle', num_images=6, out_dir='x')))
    with self.assertRaisesRegex(sample_folder.FolderMismatchError,
                                r'(?s)num_images: 6 \(folder\) -> 4 \(now\).*A larger num_images'):
      sample_folder.check_folder(self.out, dict(fingerprint, num_images=4))
    with self.assertRaisesRegex(sample_folder.FolderMismatchError, 'seed: 0'):  # and another change
      sample_folder.check_folder(self.out, dict(fingerprint, num_images=10, seed=1), record=True)
    self.assertEqual(json.loads(path.read_text())['fingerprint'], fingerprint)
    # The absl logger's own level is restored, not set_verbosity(get_verbosity()), which
    # turns an unset level into WARNING for every later test in the process.
    absl_logger = absl_logging.get_absl_logger()
    level = absl_logger.level
    absl_logging.set_verbosity(absl_logging.INFO)  # another test may have raised it
    try:
      with self.assertLogs(level='INFO') as logged:
        self.assertTrue(sample_folder.check_folder(self.out, dict(fingerprint, num_images=10),
                                                   record=True))
    finally:
      absl_logger.setLevel(level)
    self.assertIn('extending the set (num_images: 6 -> 10)', logged.output[0])
    stored = json.loads(path.read_text())
    self.assertEqual(stored['fingerprint'], dict(fingerprint, num_images=10))
    self.assertEqual(stored['config'], dict(method='eagle', num_images=10, out_dir='x'))
    self.assertEqual(stored['extended'], [['num_images: 6 -> 10']])
    self.assertTrue(sample_folder.check_folder(self.out, dict(fingerprint, num_images=10)))
    with self.assertRaisesRegex(sample_folder.FolderMismatchError, 'num_images: 10'):
      sample_folder.check_folder(self.out, fingerprint)  # no way back to the smaller set

  def test_an_unchanged_restart_records_no_extension(self):
    """A restart with the folder's num_images (record=True) leaves config.json as it
    was: no `extended` entry (only a larger num_images extends the set)."""
    fingerprint = dict(method='eagle', num_images=6, seed=0)
    self._write_folder(fingerprint)
    path = pathlib.Path(self.out, sample_output.CONFIG)
    before = path.read_bytes()
    self.assertTrue(sample_folder.check_folder(self.out, dict(fingerprint), record=True))
    self.assertNotIn('extended', json.loads(path.read_text()))
    self.assertEqual(path.read_bytes(), before)

  def test_a_setting_added_by_newer_code_is_accepted_only_at_its_default(self):
    """A folder written before a hyperparameter existed lacks it: with the code's change
    allowed and the setting at its default it continues (recorded); otherwise refused."""
    old = dict(method='sjd_pac', hparams=dict(pac_depth=2), code=dict(specdec_jax='0.1.0'))
    self._write_folder(old)
    new = dict(old, hparams=dict(pac_depth=2, pac_siblings='target'),
               code=dict(specdec_jax='0.2.0'))
    defaults = dict(method='eagle', hparams=dict(pac_depth=2, pac_siblings='target'))
    added = "hparams.pac_siblings: not in the folder -> 'target' (now"
    with self.assertRaisesRegex(sample_folder.FolderMismatchError, re.escape(added)):
      sample_folder.check_folder(self.out, new, defaults=defaults)  # code not tolerated
    with self.assertRaisesRegex(sample_folder.FolderMismatchError, re.escape(added)):
      sample_folder.check_folder(self.out, new, ('code',))  # no defaults to compare with
    residual = dict(new, hparams=dict(pac_depth=2, pac_siblings='residual'))
    with self.assertRaisesRegex(sample_folder.FolderMismatchError, re.escape(
        "hparams.pac_siblings: not in the folder -> 'residual' (now)")):
      sample_folder.check_folder(self.out, residual, ('code',), defaults=defaults)
    self.assertTrue(sample_folder.check_folder(self.out, new, ('code',), record=True,
                                               defaults=defaults))
    stored = json.loads(pathlib.Path(self.out, sample_output.CONFIG).read_text())
    self.assertEqual(stored['fingerprint'], old)  # the folder's own settings stay
    self.assertEqual(stored['accepted_changes'], [[
        "code.specdec_jax: '0.1.0' (folder) -> '0.2.0' (now)",
        "hparams.pac_siblings: not in the folder -> 'target' (now, its default)"]])
    dropped = dict(old, hparams={}, code=dict(specdec_jax='0.2.0'))
    with self.assertRaisesRegex(sample_folder.FolderMismatchError,
                                re.escape('hparams.pac_depth: 2 (folder) -> not in this run')):
      sample_folder.check_folder(self.out, dropped, ('code',), defaults=defaults)

  def test_code_identity_names_this_package_and_jax(self):
    identity = sample_folder.code_identity()
    self.assertEqual(identity['specdec_jax'], specdec_jax.__version__)
    self.assertEqual(identity['jax'], jax.__version__)
    if (pathlib.Path(specdec_jax.__file__).parents[1] / '.git').exists():  # a checkout
      self.assertRegex(identity['git_commit'], r'^[0-9a-f]{40}\+?$')

  def test_git_commit_marks_edited_tracked_files(self):
    """In a checkout, git_commit() is HEAD's hash, with '+' once a tracked file of
    the package is edited."""
    root = pathlib.Path(self.out).resolve()
    init = root / 'specdec_jax' / '__init__.py'
    init.parent.mkdir()
    init.write_text('')
    if shutil.which('git') is None:
      self.skipTest('git is not installed')
    # A clean git: no repository or index named by the environment (a hook's), no user
    # config (signing, hooks).
    env = {k: v for k, v in os.environ.items() if not k.startswith('GIT_')}
    env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM='1')
    git = lambda *args: subprocess.run(
        ['git', '-C', str(root), '-c', 'user.name=t', '-c', 'user.email=t@t',
         '-c', 'commit.gpgsign=false', *args],
        check=True, capture_output=True, text=True, env=env).stdout.strip()
    git('init', '-q')
    git('add', '.')
    git('commit', '-qm', 'x')
    head = git('rev-parse', 'HEAD')
    with mock.patch.object(specdec_jax, '__file__', str(init)):
      self.assertEqual(sample_folder.git_commit(), head)
      init.write_text('edited = True\n')
      self.assertEqual(sample_folder.git_commit(), head + '+')

  def test_unreadable_config_json_is_refused(self):
    pathlib.Path(self.out, sample_output.CONFIG).write_text('{"fingerp')
    with self.assertRaisesRegex(sample_folder.FolderMismatchError, 'config.json is unreadable'):
      sample_folder.check_folder(self.out, dict(method='eagle'))


if __name__ == '__main__':
  absltest.main()
