"""The sampler's restarts without a model or a decode (pinned by a mutation audit):
what the folder's fingerprint holds, stop_after_chunks, write_png on a restart,
and the summary of a rerun that decoded images or nothing."""

import json
import os
import pathlib
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest
import jax
import numpy as np

from specdec_jax.app import sample
from specdec_jax.app import sample_folder
from specdec_jax.app import sample_model
from specdec_jax.app import sample_output
from specdec_jax.configs import sample_fashion

CONDITIONS = sample_model.Conditions('label', classes=np.arange(10, dtype=np.int32),
                                     identity=dict(classes=list(range(10))))


class SampleRestartsTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.out = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.out)

  def config(self, **changes):
    config = sample_fashion.get_config()
    config.update(dict(num_images=9, chunk_size=3, batch_per_device=3, method='vanilla',
                       out_dir=self.out))
    config.update(changes)
    return config

  def write_folder(self, fingerprint, write_png=True):
    """config.json and one committed chunk (images 0..2)."""
    sample_output.write_json(os.path.join(self.out, sample_output.CONFIG),
                             dict(fingerprint=fingerprint))
    index = np.arange(3)
    images = np.random.default_rng(0).integers(0, 256, (3, 4, 4, 3), dtype=np.uint8)
    sample_output.commit_chunk(self.out, 0, index, images, [dict(index=int(i)) for i in index],
                               process=0, write_png=write_png)

  def test_a_restart_that_changes_the_images_is_refused(self):
    """The fingerprint holds every setting an image depends on: the per-device batch
    (sample_plan: image i depends on it), the seed, the method, the attention
    phases, the backend. A setting that changes no image (write_png) is accepted."""
    first = sample.fingerprint(self.config(), {}, CONDITIONS)
    self.write_folder(first)
    self.assertTrue(sample_folder.check_folder(self.out, sample.fingerprint(
        self.config(write_png=False, break_lock=True), {}, CONDITIONS)))
    for changes, named in ((dict(batch_per_device=2), 'batch_per_device: 3'),
                           (dict(seed=1), 'seed: 0'), (dict(method='sjd'), 'method'),
                           (dict(attention_phases=1), 'attention_phases')):
      with self.assertRaisesRegex(sample_folder.FolderMismatchError, named):
        sample_folder.check_folder(self.out, sample.fingerprint(self.config(**changes), {},
                                                                CONDITIONS))
    with mock.patch.object(jax, 'default_backend', return_value='tpu'):
      on_tpu = sample.fingerprint(self.config(), {}, CONDITIONS)
    with self.assertRaisesRegex(sample_folder.FolderMismatchError,
                                f"platform: '{jax.default_backend()}' \\(folder\\) -> 'tpu'"):
      sample_folder.check_folder(self.out, on_tpu)

  def test_a_restart_without_write_png_writes_no_png(self):
    """write_png=False: a committed chunk's missing PNGs stay missing (they are
    written from the .npz only when write_png is on)."""
    fingerprint = dict(method='vanilla')
    self.write_folder(fingerprint, write_png=False)
    self.assertEqual(sample.prepare_folder(self.config(write_png=False), fingerprint), [1, 2])
    self.assertFalse(pathlib.Path(self.out, 'images').exists())
    self.assertEqual(sample.prepare_folder(self.config(write_png=True), fingerprint), [1, 2])
    self.assertLen(list(pathlib.Path(self.out, 'images').glob('*.png')), 3)

  def test_stop_after_chunks_stops_after_exactly_that_many_chunks(self):
    """One process, one chunk per round: stop_after_chunks=n decodes n rounds."""
    for stop in (1, 2):
      rounds = []
      sampler = mock.Mock(fingerprint=dict(method='vanilla'), writers=[0], global_batch=3)
      sampler.run_round.side_effect = lambda chunks: rounds.append(list(chunks)) or 0.0
      out = os.path.join(self.out, f'stop_{stop}')
      with mock.patch.object(sample, 'Sampler', return_value=sampler):
        self.assertIsNone(sample._run_locked(  # pylint: disable=protected-access
            self.config(out_dir=out, stop_after_chunks=stop), 0.0))
      self.assertEqual(rounds, [[c] for c in range(stop)])

  def test_a_rerun_that_decoded_images_writes_its_own_measurements(self):
    """Only a rerun that decoded nothing keeps the earlier run's throughput; one that
    redid chunks reports its own."""
    path = pathlib.Path(self.out, sample_output.SUMMARY)
    earlier = dict(images_this_run=9, images_per_s=1.0, wall_s=100.0, num_images=9)
    path.write_text(json.dumps(earlier))
    redone = dict(images_this_run=3, images_per_s=5.0, tokens_per_s=9.0, wall_s=7.0, num_images=9)
    sample_output.write_summary(self.out, dict(redone))
    self.assertEqual(json.loads(path.read_text()), redone)
    nothing = dict(images_this_run=0, images_per_s=0.0, wall_s=1.0, num_images=9)
    sample_output.write_summary(self.out, nothing)
    self.assertEqual(json.loads(path.read_text()), redone)  # the measurements of the last decode

  def test_a_rerun_that_decoded_nothing_keeps_every_measured_field(self):
    """Every field the decoding run measured (its rates, times, compile time and
    topology) survives a rerun that decoded nothing; the other fields are the rerun's."""
    path = pathlib.Path(self.out, sample_output.SUMMARY)
    measured = ('images_per_s', 'tokens_per_s', 'wall_s', 'decode_loop_s', 'compile_s',
                'processes', 'devices', 'global_batch', 'host')
    earlier = {key: f'earlier {key}' for key in measured}
    path.write_text(json.dumps(dict(earlier, images_this_run=9, num_images=9)))
    rerun = {key: f'rerun {key}' for key in measured}
    sample_output.write_summary(self.out, dict(rerun, images_this_run=0, num_images=12))
    self.assertEqual(json.loads(path.read_text()),
                     dict(earlier, images_this_run=9, num_images=12))

  def test_conditions_record_the_class_ids_not_their_rows(self):
    """With classes (3, 7), condition rows 0, 1, 0, 1 are labels 3, 7, 3, 7 (the
    `label` of metrics.jsonl); prompts (t2i, no classes) record the row."""
    conditions = sample_model.Conditions('label', classes=np.asarray([3, 7], np.int32))
    np.testing.assert_array_equal(conditions.values(np.asarray([0, 1, 0, 1])), [3, 7, 3, 7])
    prompts = sample_model.Conditions('prompt')
    np.testing.assert_array_equal(prompts.values(np.asarray([0, 1, 0, 1])), [0, 1, 0, 1])

  def test_a_run_that_decoded_nothing_and_found_no_summary_writes_null_rates(self):
    """Runs that committed every chunk but stopped before merging leave no summary
    (stop_after_chunks, SIGTERM at the last round): the merging rerun measured no
    rate, so it writes null, not 0 images/s."""
    summary = dict(images_this_run=0, images_per_s=0.0, tokens_per_s=0.0, wall_s=1.0)
    sample_output.write_summary(self.out, summary)
    written = json.loads(pathlib.Path(self.out, sample_output.SUMMARY).read_text())
    self.assertIsNone(written['images_per_s'])
    self.assertIsNone(written['tokens_per_s'])
    self.assertEqual(written, summary)


if __name__ == '__main__':
  absltest.main()
