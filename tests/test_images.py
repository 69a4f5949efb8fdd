"""PNG grids decode back to the same pixels."""

import os
import tempfile
import zlib

from absl.testing import absltest
import numpy as np

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


if __name__ == '__main__':
  absltest.main()
