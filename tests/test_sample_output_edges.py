"""The output folder's edges (pinned by a mutation audit): what counts as images,
stray temporaries at the folder's top, and the streamed .npz's row count."""

import os
import pathlib
import shutil
import tempfile

from absl.testing import absltest
import numpy as np

from specdec_jax.app import sample_folder
from specdec_jax.app import sample_output


class OutputEdgesTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.out = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.out)

  def test_a_merged_metrics_file_alone_counts_as_images(self):
    """metrics.jsonl (every image's metrics) is a merged set's output: without
    config.json it is refused, and a config.json of another configuration is not
    silently replaced."""
    self.assertFalse(sample_output.holds_images(self.out))
    pathlib.Path(self.out, sample_output.METRICS).write_text('{"index": 0}\n')
    self.assertTrue(sample_output.holds_images(self.out))
    with self.assertRaisesRegex(sample_folder.FolderMismatchError, 'holds images but no'):
      sample_folder.check_folder(self.out, dict(method='eagle'))
    sample_output.write_json(os.path.join(self.out, sample_output.CONFIG),
                             dict(fingerprint=dict(method='eagle')))
    with self.assertRaisesRegex(sample_folder.FolderMismatchError, 'method'):
      sample_folder.check_folder(self.out, dict(method='sjd'))

  def test_temporaries_are_removed_from_every_folder_of_the_set(self):
    """A run killed while merging leaves `.samples.npz.*.tmp` (the whole set, GBs)
    at the top; one killed writing a PNG leaves one under images/."""
    root = pathlib.Path(self.out)
    strays = [root / f'.{sample_output.SAMPLES}.ab12.tmp', root / f'.{sample_output.CONFIG}.cd.tmp',
              root / 'chunks' / '.chunk_00000.npz.x.tmp', root / 'images' / '.000001.png.y.tmp']
    for path in strays:
      path.parent.mkdir(exist_ok=True)
      path.write_bytes(b'partial')
    kept = root / sample_output.CONFIG
    kept.write_text('{}')
    self.assertEqual(sample_output.remove_temporaries(self.out), len(strays))
    self.assertEqual([p for p in strays if p.exists()], [])
    self.assertTrue(kept.exists())

  def test_streamed_npz_refuses_fewer_or_more_rows_than_announced(self):
    """The merge announces N rows in the .npy header before streaming the chunks: a
    short or long stream must fail, not leave a samples.npz whose header lies."""
    piece = np.zeros((2, 2, 2, 3), np.uint8)
    for pieces, written in (([piece], 2), ([piece, piece, piece], 6)):
      path = pathlib.Path(self.out, 'samples.npz')
      with self.assertRaisesRegex(ValueError, f'arr_0: {written} rows written, 4 announced'):
        sample_output.write_npz(path, dict(arr_0=((4, 2, 2, 3), np.uint8, iter(pieces))))
      self.assertFalse(path.exists())  # atomic: nothing under the name
      self.assertEqual(os.listdir(self.out), [])  # and no temporary left


if __name__ == '__main__':
  absltest.main()
