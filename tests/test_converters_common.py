"""Tests for converters/common.py (and the checkpoint_read, checkpoint_keys,
checkpoint_write modules it re-exports): reading, unwrapping, validation,
atomic writes.

Torch files need torch (those tests are skipped without it); safetensors
files are written from numpy and read without torch.
"""

import argparse
import json
import os
import pathlib
import shutil
import signal
import tempfile
import threading
from unittest import mock

from absl.testing import absltest
import jax.numpy as jnp
import numpy as np

from specdec_jax.converters import checkpoint_read
from specdec_jax.converters import checkpoint_write
from specdec_jax.converters import common
from specdec_jax.converters import hf_streaming
from tests import torch_reference as ref


def _tempdir(test):
  # absltest's create_tempdir needs parsed absl flags, which pytest does not do.
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return pathlib.Path(path)


def _tiny_state():
  """Two float32 numpy arrays in a LlamaGen-like layout."""
  rng = np.random.default_rng(0)
  return {
      'tok_embeddings.weight': rng.standard_normal((8, 4)).astype(np.float32),
      'norm.weight': rng.standard_normal(4).astype(np.float32),
  }


def _torch_state():
  return {k: ref.as_torch(v) for k, v in _tiny_state().items()}


class _Unlisted:
  """A class the safe torch loader does not allow."""


class LoadStateDictTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = _tempdir(self)

  @ref.requires_torch
  def test_llamagen_training_dict_with_namespace_args(self):
    state = _torch_state()
    ema = {k: v + 1 for k, v in state.items()}
    path = self.dir / 'c2i.pt'
    ref.torch.save({'model': state, 'ema': ema, 'optimizer': {'state': {}},
                'steps': 10, 'args': argparse.Namespace(gpt_model='GPT-B')}, path)
    loaded = common.load_state_dict(path)
    self.assertEqual(set(loaded), set(state))
    np.testing.assert_array_equal(loaded['norm.weight'], state['norm.weight'].numpy())
    loaded_ema = common.load_state_dict(path, use_ema=True)
    np.testing.assert_array_equal(loaded_ema['norm.weight'], ema['norm.weight'].numpy())

  @ref.requires_torch
  def test_raw_fsdp_dict_and_prefixes(self):
    state = {'module.' + k: v for k, v in _torch_state().items()}
    path = self.dir / 'consolidated.pth'
    ref.torch.save(state, path)
    loaded = common.load_state_dict(path)
    self.assertEqual(set(loaded), {'tok_embeddings.weight', 'norm.weight'})
    # A prefix only some keys carry is part of their names: nothing is stripped.
    mixed = {'module.layers.0.w': np.zeros(1), 'norm.weight': np.zeros(1)}
    self.assertEqual(set(common.unwrap_checkpoint(mixed)), set(mixed))

  @ref.requires_torch
  def test_deepspeed_and_state_dict_wrappers(self):
    for wrapper in ('module', 'state_dict'):
      path = self.dir / f'{wrapper}.bin'
      ref.torch.save({wrapper: _torch_state(), 'global_step': 3}, path)
      self.assertEqual(set(common.load_state_dict(path)),
                       {'tok_embeddings.weight', 'norm.weight'})

  def test_safetensors_bf16_upcast_and_zero_copy(self):
    # Read without torch.
    state = {k: v.astype(jnp.bfloat16) for k, v in _tiny_state().items()}
    path = self.dir / 'model.safetensors'
    hf_streaming.write_safetensors(path, state)
    upcast = common.load_state_dict(path)
    self.assertEqual(upcast['norm.weight'].dtype, np.float32)
    np.testing.assert_array_equal(upcast['norm.weight'], state['norm.weight'].astype(np.float32))
    raw = common.load_state_dict(path, upcast_bf16=False)
    self.assertEqual(raw['norm.weight'].dtype, jnp.bfloat16)
    np.testing.assert_array_equal(raw['norm.weight'].astype(np.float32),
                                  upcast['norm.weight'])

  def test_missing_file(self):
    with self.assertRaisesRegex(common.CheckpointReadError, 'nope.pt.*does not exist'):
      common.load_state_dict(self.dir / 'nope.pt')

  @ref.requires_torch
  def test_truncated_torch_file(self):
    path = self.dir / 'trunc.pt'
    ref.torch.save({'model': _torch_state()}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with self.assertRaisesRegex(common.CheckpointReadError,
                                r"trunc\.pt.*torch\.save zip archive.*truncated"):
      common.load_state_dict(path)

  @ref.requires_torch
  def test_corrupt_torch_file_is_not_answered_with_trust_pickle(self):
    """Random bytes are no pickle the full unpickler could read: the error says the
    file is corrupt and does not advise --trust_pickle (nor retries with it)."""
    path = self.dir / 'corrupt.pt'
    path.write_bytes(np.random.default_rng(0).bytes(2000))
    for trust_pickle in (False, True):
      with self.assertRaises(common.CheckpointReadError) as raised:
        common.load_state_dict(path, trust_pickle=trust_pickle)
      self.assertRegex(str(raised.exception), r'corrupt\.pt.*truncated or corrupt')
      self.assertNotIn('trust_pickle', str(raised.exception))

  @ref.requires_torch
  def test_refused_objects_are_answered_with_trust_pickle(self):
    path = self.dir / 'objects.pt'
    ref.torch.save({'model': _torch_state(), 'extra': _Unlisted()}, path)
    with self.assertRaisesRegex(common.CheckpointReadError, 'pass trust_pickle=True'):
      common.load_state_dict(path)
    self.assertEqual(sorted(common.load_state_dict(path, trust_pickle=True)),
                     sorted(_tiny_state()))

  def test_truncated_safetensors_file(self):
    path = self.dir / 'trunc.safetensors'
    hf_streaming.write_safetensors(path, _tiny_state())
    data = path.read_bytes()
    path.write_bytes(data[:-16])
    with self.assertRaisesRegex(common.CheckpointReadError,
                                r'trunc\.safetensors.*safetensors file'):
      common.load_state_dict(path)

  def test_unknown_suffix(self):
    path = self.dir / 'weights.npz'
    path.write_bytes(b'x')
    with self.assertRaisesRegex(common.CheckpointReadError, r"'\.npz'"):
      common.load_state_dict(path)

  @ref.requires_torch
  def test_mmap_reads_lazily_and_legacy_files_fall_back(self):
    path = self.dir / 'big.bin'
    ref.torch.save({'model': _torch_state()}, path)
    with mock.patch.object(ref.torch, 'load', wraps=ref.torch.load) as load:
      state = common.unwrap_checkpoint(common.load_raw_checkpoint(path, mmap=True))
    self.assertTrue(load.call_args.kwargs['mmap'])
    np.testing.assert_array_equal(common.to_numpy(state['norm.weight']),
                                  _tiny_state()['norm.weight'])
    # The pre-zip format cannot be memory-mapped: read whole, with a warning.
    legacy = self.dir / 'legacy.bin'
    ref.torch.save({'model': _torch_state()}, legacy, _use_new_zipfile_serialization=False)
    with mock.patch.object(checkpoint_read.logging, 'warning') as warning:
      state = common.unwrap_checkpoint(common.load_raw_checkpoint(legacy, mmap=True))
    self.assertIn('legacy', warning.call_args.args[0])
    self.assertEqual(set(state), set(_tiny_state()))

  def test_numpy_bf16_is_upcast_on_request(self):
    array = np.arange(3, dtype=np.float32).astype(jnp.bfloat16)
    self.assertEqual(common.to_numpy(array).dtype, np.float32)
    self.assertIs(common.to_numpy(array, upcast_bf16=False), array)

  def test_use_ema_without_ema(self):
    with self.assertRaisesRegex(common.CheckpointReadError, 'no "ema"'):
      common.unwrap_checkpoint({'model': _tiny_state()}, use_ema=True)

  def test_ema_weights_left_behind_are_named(self):
    """A training dict with 'model' and 'ema' converts 'model' by default: the log says
    the EMA weights exist (LlamaGen releases both in one file)."""
    with self.assertLogs(level='INFO') as logs:
      common.unwrap_checkpoint({'model': _tiny_state(), 'ema': _tiny_state()})
    self.assertRegex(logs.output[-1], r"converting the 'model' weights; .* \"ema\" weights "
                                      r'\(use_ema=True converts those\)')

  def test_wrappers_without_tensors_are_passed_over_and_nested_ones_opened(self):
    weights = _tiny_state()
    cases = {'a config under model': {'model': {'name': 'GPT-B', 'vocab': 16384},
                                      'state_dict': weights},
             'state_dict/model': {'state_dict': {'model': weights}, 'epoch': 3},
             'module/module': {'module': {'module': weights}}}
    for name, checkpoint in cases.items():
      with self.subTest(name):
        self.assertEqual(set(common.unwrap_checkpoint(checkpoint)), set(weights))
    with self.assertRaisesRegex(common.CheckpointReadError, "holds no tensors.*'decay'"):
      common.unwrap_checkpoint({'model': weights, 'ema': {'decay': 0.999}}, use_ema=True)

  def test_prefixes_are_stripped_in_any_order_and_an_ema_count_is_dropped(self):
    weights = _tiny_state()
    for prefix in ('_orig_mod.module.', 'module._orig_mod.', 'module.module.'):
      with self.subTest(prefix):
        prefixed = {prefix + k: v for k, v in weights.items()}
        self.assertEqual(set(common.unwrap_checkpoint(prefixed)), set(weights))
    # torch.optim.swa_utils.AveragedModel: `module.*` weights and an update count.
    ema = {'module.' + k: v for k, v in weights.items()} | {'n_averaged': np.array(3)}
    self.assertEqual(set(common.unwrap_checkpoint({'model': weights, 'ema': ema}, use_ema=True)),
                     set(weights))

  def test_no_weights_found(self):
    with self.assertRaisesRegex(common.CheckpointReadError, 'steps'):
      common.unwrap_checkpoint({'steps': 3, 'args': None})


class ValidateKeysTest(absltest.TestCase):

  def test_exact_match_passes(self):
    common.validate_keys({'a': (2, 3)}, {'a': (2, 3)}, what='tiny')

  def test_message_lists_every_problem_and_config(self):
    found = {'a': (2, 3), 'b': (4,), 'extra': (1,)}
    expected = {'a': (2, 3), 'b': (5,), 'missing.one': (7, 7)}
    with self.assertRaises(common.CheckpointMismatchError) as ctx:
      common.validate_keys(found, expected, what='LlamaGen GPT-B c2i, 256 tokens',
                           hint='Try --config GPT-L.')
    message = str(ctx.exception)
    self.assertIsInstance(ctx.exception, ValueError)
    self.assertIn('LlamaGen GPT-B c2i, 256 tokens', message)
    self.assertIn('1 missing, 1 unexpected, 1 mis-shaped', message)
    self.assertIn('missing.one (expected shape (7, 7))', message)
    self.assertIn('extra (shape (1,))', message)
    self.assertIn('b: expected (5,), found (4,)', message)
    self.assertIn('Try --config GPT-L.', message)
    self.assertNotIn('    a', message)


class WriteParamsTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = _tempdir(self)
    self.source = self.dir / 'src.bin'
    self.source.write_bytes(b'abc')
    self.params = {'layer': {'kernel': np.arange(12, dtype=np.float32).reshape(3, 4)},
                   'ids': np.arange(3, dtype=np.int32)}

  def test_round_trip_with_meta_and_cast(self):
    out = common.write_params_atomic(
        self.dir / 'out', self.params, config={'dim': 4}, source_files=[self.source],
        converter='test', extra_meta={'note': 'x'})
    self.assertEqual(sorted(os.listdir(self.dir)), ['out', 'src.bin'])
    params, meta = common.load_params(out)
    np.testing.assert_array_equal(params['layer']['kernel'], self.params['layer']['kernel'])
    np.testing.assert_array_equal(params['ids'], self.params['ids'])
    self.assertEqual(meta['config'], {'dim': 4})
    self.assertEqual(meta['converter'], 'test')
    self.assertEqual(meta['note'], 'x')
    self.assertEqual(meta['source_files'][0]['sha256'],
                     'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad')
    with open(out / common.META_FILENAME) as f:
      self.assertEqual(json.load(f)['dtype'], 'float32')
    bf16, _ = common.load_params(out, dtype='bfloat16')
    self.assertEqual(bf16['layer']['kernel'].dtype, jnp.bfloat16)
    self.assertEqual(bf16['ids'].dtype, np.int32)

  def test_with_ocdbt(self):
    out = common.write_params_atomic(self.dir / 'out', self.params, config={},
                                     source_files=[], use_ocdbt=True)
    params, _ = common.load_params(out)
    np.testing.assert_array_equal(params['layer']['kernel'], self.params['layer']['kernel'])

  def test_per_entry_layout_and_consume(self):
    """Each top-level entry is its own Orbax item; consume empties the caller's dict."""
    expected = {k: v for k, v in self.params.items()}
    out = common.write_params_atomic(self.dir / 'out', self.params, config={},
                                     source_files=[], consume=True)
    self.assertEqual(self.params, {})
    self.assertEqual(sorted(os.listdir(out / common.PARAMS_SUBDIR)), ['ids', 'layer'])
    params, meta = common.load_params(out)
    self.assertEqual(meta['params_layout'], common.PER_KEY_LAYOUT)
    self.assertEqual(meta['num_params'], 15)  # counted before consuming
    np.testing.assert_array_equal(params['layer']['kernel'], expected['layer']['kernel'])
    np.testing.assert_array_equal(params['ids'], expected['ids'])

  def test_refuses_overwrite_unless_asked(self):
    out = common.write_params_atomic(self.dir / 'out', self.params, config={},
                                     source_files=[])
    with self.assertRaisesRegex(FileExistsError, 'already exists.*--overwrite'):
      common.write_params_atomic(out, self.params, config={}, source_files=[])
    new = {'layer': {'kernel': np.zeros((3, 4), np.float32)}, 'ids': self.params['ids']}
    common.write_params_atomic(out, new, config={}, source_files=[], overwrite=True)
    params, _ = common.load_params(out)
    np.testing.assert_array_equal(params['layer']['kernel'], 0)
    self.assertEqual(sorted(os.listdir(self.dir)), ['out', 'src.bin'])

  def test_overwrite_replaces_only_a_checkpoint_or_an_empty_folder(self):
    """--overwrite deleted any folder (`--output .` deleted the working folder's files)."""
    others = self.dir / 'ckpts'
    (others / 'other_model').mkdir(parents=True)
    (others / 'notes.txt').write_text('keep me')
    with self.assertRaisesRegex(ValueError, 'holds files but no specdec_meta.json.*not a '
                                            'converted checkpoint.*another --output'):
      common.write_params_atomic(others, self.params, config={}, source_files=[],
                                 overwrite=True)
    self.assertEqual(sorted(os.listdir(others)), ['notes.txt', 'other_model'])
    (self.dir / 'empty').mkdir()
    common.write_params_atomic(self.dir / 'empty', self.params, config={}, source_files=[],
                               overwrite=True)
    self.assertIn(common.META_FILENAME, os.listdir(self.dir / 'empty'))

  def test_leftovers_of_a_killed_conversion_are_reported(self):
    """A killed converter cannot remove its temporary folder; the next write into the same
    --output names it (with its size) instead of leaving it unnoticed."""
    stale = self.dir / '.out.tmp-0badc0de'
    stale.mkdir()
    (stale / 'part').write_bytes(b'x' * 2_000_000)
    (self.dir / '.other.tmp-12345678').mkdir()  # another output's: not named
    with self.assertLogs(level='WARNING') as logs:
      common.write_params_atomic(self.dir / 'out', self.params, config={}, source_files=[])
    named = [line for line in logs.output if 'interrupted write' in line]  # Orbax logs too
    self.assertLen(named, 1)
    self.assertRegex(named[0], r'\.out\.tmp-0badc0de \(2\.0 MB\) was left by an earlier, '
                               r'interrupted write into .*out;')
    self.assertTrue(stale.exists())  # it may be another running conversion's: only named

  def test_a_leftover_changing_under_the_report_does_not_fail_the_write(self):
    """The folder may be another write's, running now: a file gone between listing and
    stat leaves the folder named without its size, and the write goes on."""
    (self.dir / '.out.tmp-0badc0de').mkdir()
    vanished = mock.Mock(is_file=lambda: True, stat=mock.Mock(side_effect=FileNotFoundError))
    with mock.patch.object(pathlib.Path, 'rglob', return_value=[vanished]):
      with self.assertLogs(level='WARNING') as logs:
        common.write_params_atomic(self.dir / 'out', self.params, config={}, source_files=[])
    self.assertTrue(any(line.endswith('.out.tmp-0badc0de was left by an earlier, interrupted '
                                      f'write into {self.dir / "out"}; delete it unless another '
                                      'write into that folder is running now.')
                        for line in logs.output), logs.output)

  def test_failed_replacement_keeps_the_old_output(self):
    # With --overwrite the old folder is moved aside, then the new one renamed in: if that
    # second rename fails, the old output goes back to its name (no .old-* folder left).
    out = common.write_params_atomic(self.dir / 'out', self.params, config={},
                                     source_files=[])
    real_rename = os.rename

    def rename(src, dst):
      if pathlib.Path(src).name.startswith('.out.tmp'):
        raise OSError('rename refused')
      return real_rename(src, dst)

    new = {'layer': {'kernel': np.zeros((3, 4), np.float32)}, 'ids': self.params['ids']}
    with mock.patch.object(checkpoint_write.os, 'rename', side_effect=rename):
      with self.assertRaisesRegex(OSError, 'rename refused'):
        common.write_params_atomic(out, new, config={}, source_files=[], overwrite=True)
    params, _ = common.load_params(out)
    np.testing.assert_array_equal(params['layer']['kernel'], self.params['layer']['kernel'])
    self.assertEqual(sorted(os.listdir(self.dir)), ['out', 'src.bin'])

  def test_failure_mid_write_leaves_nothing(self):
    # The metadata is written after the Orbax save: failing there means params
    # already sit in the temporary folder, which must be removed.
    with mock.patch.object(checkpoint_write.json, 'dump', side_effect=OSError('disk full')):
      with self.assertRaisesRegex(OSError, 'disk full'):
        common.write_params_atomic(self.dir / 'out', self.params, config={},
                                   source_files=[self.source])
    self.assertEqual(sorted(os.listdir(self.dir)), ['src.bin'])

  def test_failure_removes_the_parent_folders_it_created(self):
    # --output new/deeper/out: the write creates new/ and new/deeper/; failing, it removes
    # them again, but not a created folder that something else wrote into meanwhile.
    (self.dir / 'kept').mkdir()
    for parents, left in (('new/deeper', ['kept', 'src.bin']),
                          ('kept/new', ['kept', 'src.bin'])):
      with mock.patch.object(checkpoint_write.json, 'dump', side_effect=OSError('disk full')):
        with self.assertRaisesRegex(OSError, 'disk full'):
          common.write_params_atomic(self.dir / parents / 'out', self.params, config={},
                                     source_files=[])
      self.assertEqual(sorted(os.listdir(self.dir)), left, parents)
    self.assertEqual(os.listdir(self.dir / 'kept'), [])  # an existing parent stays

    def dump_and_write_beside(*unused_args, **unused_kwargs):
      (self.dir / 'busy' / 'other.txt').write_text('x')  # another process's file
      raise OSError('disk full')

    with mock.patch.object(checkpoint_write.json, 'dump', side_effect=dump_and_write_beside):
      with self.assertRaisesRegex(OSError, 'disk full'):
        common.write_params_atomic(self.dir / 'busy' / 'sub' / 'out', self.params, config={},
                                   source_files=[])
    self.assertEqual(sorted(os.listdir(self.dir)), ['busy', 'kept', 'src.bin'])
    self.assertEqual(os.listdir(self.dir / 'busy'), ['other.txt'])  # sub/ gone, busy/ kept

  def test_interrupt_during_a_background_save_leaves_nothing(self):
    """Orbax writes in a background thread that outlives a Ctrl-C in the main one; the
    temporary folder is removed only after that thread has ended (before: removed at
    once, then recreated by the still-running save)."""

    class BackgroundSave:  # Orbax's async save, writing only when let go
      def __init__(self, **unused_kwargs):
        self.go, self.threads = threading.Event(), []

      def save(self, path, unused_item):
        def write():
          self.go.wait(timeout=30)
          path.mkdir(parents=True, exist_ok=True)
          (path / 'array').write_bytes(b'x')
        self.threads.append(threading.Thread(target=write))
        self.threads[-1].start()
        raise KeyboardInterrupt  # Ctrl-C right after the first entry's save is issued

      def wait_until_finished(self):
        self.go.set()
        for thread in self.threads:
          thread.join()

      close = wait_until_finished

    saves = []
    fake = lambda **kwargs: saves.append(BackgroundSave(**kwargs)) or saves[-1]
    with mock.patch('orbax.checkpoint.StandardCheckpointer', side_effect=fake):
      with self.assertRaises(KeyboardInterrupt):
        common.write_params_atomic(self.dir / 'out', self.params, config={}, source_files=[])
    saves[0].wait_until_finished()  # the background save ends (if it has not yet)
    self.assertEqual(sorted(os.listdir(self.dir)), ['src.bin'])

  def test_a_ctrl_c_during_a_save_takes_effect_once_the_entry_is_written(self):
    """Ctrl-C inside Orbax's `save` would leave its writer threads running untracked;
    it is held until the entry's save has ended (before: raised inside `save`)."""
    if threading.current_thread() is not threading.main_thread():
      self.skipTest('signal handlers can only be set in the main thread')
    # Python's own Ctrl-C handler, as a converter command has it (pytest-xdist's workers
    # replace it, and the hold only applies under it).
    self.addCleanup(signal.signal, signal.SIGINT,
                    signal.signal(signal.SIGINT, signal.default_int_handler))
    calls = []

    class Checkpointer:
      def __init__(self, **unused_kwargs):
        pass

      def save(self, unused_path, unused_item):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of the save
        calls.append('save ended')

      def wait_until_finished(self):
        calls.append('waited')

      def close(self):
        calls.append('closed')

    with mock.patch('orbax.checkpoint.StandardCheckpointer', Checkpointer):
      with self.assertRaises(KeyboardInterrupt):
        common.write_params_atomic(self.dir / 'out', self.params, config={}, source_files=[])
    self.assertEqual(calls, ['save ended', 'waited', 'closed'])  # the first entry only
    self.assertIs(signal.getsignal(signal.SIGINT), signal.default_int_handler)
    self.assertEqual(sorted(os.listdir(self.dir)), ['src.bin'])

  def test_unwritable_output_is_refused_before_writing(self):
    (self.dir / 'a_file').write_text('x')
    for out in (self.dir / 'a_file' / 'out', self.dir / 'a_file' / 'deeper' / 'out'):
      with self.assertRaisesRegex(ValueError, r'cannot be written: no folder can be created in '
                                              r".*a_file'"):
        common.check_output_dir(out)
    with self.assertRaisesRegex(ValueError, 'is a file, not a folder'):
      common.check_output_dir(self.dir / 'a_file', overwrite=True)
    self.assertEqual(common.check_output_dir(self.dir / 'new' / 'out'),
                     self.dir / 'new' / 'out')
    self.assertEqual(sorted(os.listdir(self.dir)), ['a_file', 'src.bin'])  # no probe left

  def test_a_folder_of_another_model_names_what_it_holds(self):
    """Each loader reads its own kind of folder; Chameleon's and Janus's raised a bare
    KeyError or TypeError on another model's, a VQ folder read as 'a None checkpoint'."""
    from specdec_jax.converters import chameleon  # pylint: disable=g-import-not-at-top
    from specdec_jax.converters import janus  # pylint: disable=g-import-not-at-top
    from specdec_jax.converters import llamagen  # pylint: disable=g-import-not-at-top
    from specdec_jax.converters import vq as vq_converter  # pylint: disable=g-import-not-at-top
    gpt = common.write_params_atomic(self.dir / 'gpt', self.params, config={},
                                     source_files=[], extra_meta={'model': 'llamagen_gpt'})
    vq = common.write_params_atomic(self.dir / 'vq', self.params, config={},
                                    source_files=[], extra_meta={'kind': 'llamagen_vq16'})
    with mock.patch.object(common, 'load_params') as reads:  # refused before the weights
      with self.assertRaisesRegex(common.CheckpointReadError, r"holds a 'llamagen_gpt' "
                                  r'checkpoint, not a tokenizer'):
        vq_converter.load_tokenizer(gpt)
    reads.assert_not_called()
    for load, folder, message in (
        (chameleon.load_converted, gpt, r"holds a 'llamagen_gpt' checkpoint, not a Lumina-mGPT "
                                        r'\(Chameleon\) model; convert with python -m '
                                        r'specdec_jax.converters.chameleon'),
        (janus.load_converted, gpt, r"holds a 'llamagen_gpt' checkpoint, not a Janus-Pro"),
        (llamagen.load_llamagen, vq, r"holds a 'llamagen_vq16' tokenizer checkpoint, not a "
                                     r'LlamaGen GPT')):
      with self.assertRaisesRegex(common.CheckpointReadError, message):
        load(folder)

  def test_missing_meta_is_a_clear_error(self):
    with self.assertRaisesRegex(common.CheckpointReadError, 'specdec_meta.json'):
      common.load_params(self.dir)


class HelpersTest(absltest.TestCase):

  def test_cast_params_only_floats(self):
    params = {'w': np.ones(2, np.float32), 'i': np.ones(2, np.int32)}
    cast = common.cast_params(params, 'bfloat16')
    self.assertEqual(cast['w'].dtype, jnp.bfloat16)
    self.assertEqual(cast['i'].dtype, np.int32)

  def test_progress_logs(self):
    with mock.patch.object(checkpoint_write.logging, 'info') as info:
      progress = common.Progress(88, num_logs=4)
      for i in range(88):
        progress.step(f't{i}')
    messages = [call.args[0] % call.args[1:] for call in info.call_args_list]
    self.assertIn('converting 88/88 tensors (t87)', messages)
    self.assertIn('converting 22/88 tensors (t21)', messages)

  def test_lossless_output_dtype(self):
    """'stored' keeps one dtype as it is and widens a mix (float32 holds every bf16 and
    f16 value); explicit dtypes are kept; anything else is refused by name."""
    self.assertEqual(common.output_dtype('stored', ['bfloat16', 'int64']), 'bfloat16')
    self.assertEqual(common.output_dtype(None, ['float32']), 'float32')
    self.assertEqual(common.output_dtype('stored', ['bfloat16', 'float32']), 'float32')
    self.assertEqual(common.output_dtype('stored', ['bfloat16', 'float16']), 'float32')
    self.assertEqual(common.output_dtype('stored', ['torch.float64', 'float32']), 'float64')
    self.assertEqual(common.output_dtype('stored', ['int32']), 'float32')
    self.assertEqual(common.output_dtype('bfloat16', ['float32']), 'bfloat16')
    with self.assertRaisesRegex(ValueError, "--dtype must be one of .*'stored'.*got 'fp8'"):
      common.output_dtype('fp8', ['float32'])

  def test_drop_keys(self):
    state = {'a': 1, 'freqs_cis': 2, 'layers.0.attention.kv_cache.k_cache': 3}
    self.assertEqual(common.drop_keys(state, ('freqs_cis', 'kv_cache')), {'a': 1})


if __name__ == '__main__':
  absltest.main()
