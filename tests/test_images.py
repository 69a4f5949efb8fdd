"""PNG grids decode back to the same pixels; their labels sit where the layout says."""

import json
import os
import tempfile
import zlib

from absl.testing import absltest
import numpy as np

from specdec_jax.app import fashion_mnist
from specdec_jax.app import font
from specdec_jax.app import methods as methods_lib
from specdec_jax.app import images


def decode_png(data: bytes) -> np.ndarray:
  """Minimal decoder for the files encode_png writes (8-bit, filter 0)."""
  assert data[:8] == b'\x89PNG\r\n\x1a\n'
  pos, idat, header = 8, b'', None
  while pos < len(data):
    length = int.from_bytes(data[pos:pos + 4], 'big')
    kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
    crc = int.from_bytes(data[pos + 8 + length:pos + 12 + length], 'big')
    assert zlib.crc32(kind + body) & 0xffffffff == crc
    if kind == b'IHDR':
      header = body
    elif kind == b'IDAT':
      idat += body
    pos += 12 + length
  width, height = int.from_bytes(header[:4], 'big'), int.from_bytes(header[4:8], 'big')
  channels = {0: 1, 2: 3}[header[9]]
  raw = zlib.decompress(idat)
  stride = width * channels + 1
  rows = [raw[i * stride + 1:(i + 1) * stride] for i in range(height)]
  assert all(raw[i * stride] == 0 for i in range(height))
  return np.frombuffer(b''.join(rows), np.uint8).reshape(height, width, channels)


class ImagesTest(absltest.TestCase):

  def test_grid_layout(self):
    tiles = np.stack([np.full((2, 3, 1), i, np.uint8) for i in range(5)])
    grid = images.make_grid(tiles, columns=2, padding=1, fill=255)
    self.assertEqual(grid.shape, (3 * 3 + 1, 2 * 4 + 1, 1))
    self.assertEqual(int(grid[1, 1, 0]), 0)
    self.assertEqual(int(grid[1, 5, 0]), 1)
    self.assertEqual(int(grid[7, 1, 0]), 4)
    self.assertEqual(int(grid[7, 5, 0]), 255)  # empty cell

  def test_png_round_trip_grey_and_rgb(self):
    rng = np.random.default_rng(0)
    for shape in ((5, 7, 1), (4, 6, 3)):
      image = rng.integers(0, 256, shape, dtype=np.uint8)
      with tempfile.TemporaryDirectory() as tmp:
        path = images.save_png(os.path.join(tmp, 'sub', 'x.png'), image, scale=2)
        decoded = decode_png(open(path, 'rb').read())
        np.testing.assert_array_equal(decoded, image.repeat(2, 0).repeat(2, 1))
        self.assertEqual(os.listdir(os.path.dirname(path)), ['x.png'])  # no temp left

  def test_bad_input(self):
    with self.assertRaisesRegex(ValueError, 'uint8'):
      images.encode_png(np.zeros((2, 2), np.float32))
    with self.assertRaisesRegex(ValueError, 'uint8'):
      images.make_grid(np.zeros((2, 2, 2), np.uint8), 2)


# 'Hi' in the 5x7 font: H, a blank column, i; no descender rows.
HI = """
#...#...#..
#...#......
#...#..##..
#####...#..
#...#...#..
#...#...#..
#...#..###.
...........
...........
"""


def ink(pattern: str) -> np.ndarray:
  return np.array([[c == '#' for c in row] for row in pattern.split()], bool)


class RemoveEarlierFiguresTest(absltest.TestCase):

  def test_only_grids_an_earlier_run_listed_are_removed(self):
    with tempfile.TemporaryDirectory() as parent:
      out = os.path.join(parent, 'out')
      os.makedirs(out)
      open(os.path.join(parent, 'x.png'), 'w').close()  # '../x' below: outside the folder
      for name in ('vanilla', 'uniform', 'coolsd', 'mine'):
        open(os.path.join(out, f'{name}.png'), 'w').close()
      images.remove_earlier_figures(out, kept=['vanilla'])  # no results.json: a user's folder
      self.assertCountEqual(os.listdir(out), ['vanilla.png', 'uniform.png', 'coolsd.png',
                                              'mine.png'])
      with open(os.path.join(out, 'results.json'), 'w') as f:
        json.dump({'method_order': ['vanilla', 'uniform', '../x']}, f)
      images.remove_earlier_figures(out, kept=['vanilla'])
      self.assertCountEqual(os.listdir(out), ['vanilla.png', 'coolsd.png', 'mine.png',
                                              'results.json'])
      self.assertTrue(os.path.exists(os.path.join(parent, 'x.png')))


class FontTest(absltest.TestCase):

  def test_known_string_renders_to_its_pixels(self):
    np.testing.assert_array_equal(font.render('Hi'), ink(HI))
    self.assertEqual(font.text_width('Hi'), 2 * font.ADVANCE - 1)
    self.assertEqual(font.render('').shape, (font.HEIGHT, 0))

  def test_descenders_use_the_rows_below_the_baseline(self):
    below = slice(font.CAP_HEIGHT, font.HEIGHT)
    for char in 'gjpqy,_':
      self.assertTrue(font.render(char)[below].any(), char)
    for char in 'ABZabz09-/()':
      self.assertFalse(font.render(char)[below].any(), char)

  def test_every_glyph_is_distinct_and_the_labels_are_covered(self):
    bitmaps = {char: bitmap.tobytes() for char, bitmap in font.GLYPHS.items()}
    self.assertLen(set(bitmaps.values()), len(bitmaps))
    for glyph in font.GLYPHS.values():
      self.assertEqual(glyph.shape, (font.HEIGHT, font.GLYPH_WIDTH))
    for char in [c for c in font.GLYPHS if c != ' ']:
      self.assertTrue(font.GLYPHS[char].any(), char)
    for label in methods_lib.METHOD_NAMES + fashion_mnist.CLASS_NAMES:
      self.assertLen(font.render(label)[0], font.text_width(label))

  def test_missing_glyph_is_named(self):
    with self.assertRaisesRegex(ValueError, r"no glyph for \['~'\] in 'a~b'"):
      font.render('a~b')


class LabeledFigureTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(0)
    # Images are mid-grey noise, never 0 (ink) nor 255 (fill): text is told apart.
    self.columns = {'ab': rng.integers(1, 255, (3, 10, 14, 1), dtype=np.uint8),
                    'wide title': rng.integers(1, 255, (6, 10, 14, 1), dtype=np.uint8)}
    self.rows = ('x', 'Hi', 'y')
    self.figure = images.labeled_figure(self.columns, self.rows, padding=2, gap=6)

  def test_title_band_and_grid_sizes(self):
    grid_height = 3 * (10 + 2) + 2
    label_band = font.text_width('Hi') + 2 * images.LABEL_MARGIN
    title_block = font.text_width('wide title') + 2 * images.LABEL_MARGIN  # wider than its grid
    self.assertEqual(images.TITLE_BAND, font.HEIGHT + 2 * images.LABEL_MARGIN)
    first_grid = 1 * (14 + 2) + 2  # one image per row
    self.assertEqual(self.figure.shape, (images.TITLE_BAND + grid_height,
                                         label_band + first_grid + 6 + title_block, 1))
    band = self.figure[:images.TITLE_BAND, :, 0]
    self.assertTrue(np.isin(band, (0, 255)).all())  # only text in the band, no image pixels
    self.assertEqual(int((band == 0).sum()),
                     int(font.render('ab').sum() + font.render('wide title').sum()))
    self.assertTrue(np.isin(self.figure[images.TITLE_BAND:, :label_band, 0], (0, 255)).all())

  def test_titles_are_centred_above_their_grids(self):
    label_band = font.text_width('Hi') + 2 * images.LABEL_MARGIN
    first = images.make_grid(self.columns['ab'], columns=1)
    np.testing.assert_array_equal(
        self.figure[images.TITLE_BAND:, label_band:label_band + first.shape[1]], first)
    top, left = images.LABEL_MARGIN, label_band + (first.shape[1] - font.text_width('ab')) // 2
    np.testing.assert_array_equal(
        self.figure[top:top + font.HEIGHT, left:left + font.text_width('ab'), 0] == 0,
        font.render('ab'))
    second = images.make_grid(self.columns['wide title'], columns=2)
    block_left = label_band + first.shape[1] + 6
    block = font.text_width('wide title') + 2 * images.LABEL_MARGIN
    grid_left = block_left + (block - second.shape[1]) // 2
    np.testing.assert_array_equal(
        self.figure[images.TITLE_BAND:, grid_left:grid_left + second.shape[1]], second)
    title = self.figure[top:top + font.HEIGHT, block_left + images.LABEL_MARGIN:][:, :block - 6]
    np.testing.assert_array_equal(title[..., 0] == 0, font.render('wide title'))

  def test_row_labels_sit_beside_their_rows(self):
    row_pitch = 10 + 2  # image height + padding
    for index, label in enumerate(self.rows):
      # Capitals centred on the row's images (a 10-row image: 1 row above them).
      top = images.TITLE_BAND + 2 + index * row_pitch + (10 - font.CAP_HEIGHT) // 2
      window = self.figure[top:top + font.HEIGHT,
                           images.LABEL_MARGIN:images.LABEL_MARGIN + font.text_width(label), 0]
      np.testing.assert_array_equal(window == 0, font.render(label))
    self.assertEqual(int((self.figure[images.TITLE_BAND:, :images.LABEL_MARGIN] == 0).sum()), 0)

  def test_bad_columns(self):
    with self.assertRaisesRegex(ValueError, 'multiple of len.row_labels. = 2'):
      images.labeled_figure({'a': np.zeros((3, 10, 10, 1), np.uint8)}, ('x', 'y'))
    with self.assertRaisesRegex(ValueError, r"same H.*'b': \(2, 10, 9, 1\)"):
      images.labeled_figure({'a': np.zeros((2, 10, 10, 1), np.uint8),
                             'b': np.zeros((2, 10, 9, 1), np.uint8)}, ('x', 'y'))
    with self.assertRaisesRegex(ValueError, 'at least one column and one row label'):
      images.labeled_figure({'a': np.zeros((2, 10, 10, 1), np.uint8)}, ())
    with self.assertRaisesRegex(ValueError, 'images of 4 rows are shorter than a label'):
      images.labeled_figure({'a': np.zeros((2, 4, 10, 1), np.uint8)}, ('x', 'y'))
    with self.assertRaisesRegex(ValueError, 'scale must be an integer >= 1, got 0'):
      images.upscale(np.zeros((2, 2), np.uint8), 0)

  def test_write_figures_writes_labelled_pngs(self):
    with tempfile.TemporaryDirectory() as tmp:
      paths = images.write_figures(tmp, self.columns, self.rows, side_by_side_per_row=1, scale=2)
      self.assertEqual(sorted(os.listdir(tmp)), ['ab.png', 'side_by_side.png', 'wide title.png'])
      self.assertEqual(paths[-1], os.path.join(tmp, 'side_by_side.png'))
      first_per_row = {'ab': self.columns['ab'], 'wide title': self.columns['wide title'][::2]}
      np.testing.assert_array_equal(
          decode_png(open(paths[-1], 'rb').read()),
          images.upscale(images.labeled_figure(first_per_row, self.rows), 2))
      np.testing.assert_array_equal(
          decode_png(open(os.path.join(tmp, 'wide title.png'), 'rb').read()),
          images.upscale(images.labeled_figure({'wide title': self.columns['wide title']},
                                               self.rows), 2))


if __name__ == '__main__':
  absltest.main()
