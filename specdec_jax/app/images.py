"""Image grids written as PNG files, with no imaging dependency.

Legend: N images, H, W pixels, C in {1, 3} channels.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from specdec_jax.app import files


def make_grid(images: np.ndarray, columns: int, padding: int = 2, fill: int = 255) -> np.ndarray:
  """Tiles uint8[N, H, W, C] into uint8[rows*(H+p)+p, columns*(W+p)+p, C]."""
  images = np.asarray(images)
  if images.ndim != 4 or images.dtype != np.uint8:
    raise ValueError(f'make_grid expects uint8 [N, H, W, C], got {images.dtype} {images.shape}.')
  if columns < 1:
    raise ValueError(f'columns must be >= 1, got {columns}.')
  count, height, width, channels = images.shape
  rows = max(1, -(-count // columns))
  grid = np.full((rows * (height + padding) + padding, columns * (width + padding) + padding,
                  channels), fill, np.uint8)
  for index, image in enumerate(images):
    r, c = divmod(index, columns)
    top, left = padding + r * (height + padding), padding + c * (width + padding)
    grid[top:top + height, left:left + width] = image
  return grid


def encode_png(image: np.ndarray) -> bytes:
  """PNG bytes of uint8 [H, W] / [H, W, 1] (grey) or [H, W, 3] (RGB)."""
  image = np.asarray(image)
  if image.ndim == 3 and image.shape[-1] == 1:
    image = image[..., 0]
  if image.dtype != np.uint8 or image.ndim not in (2, 3) or (
      image.ndim == 3 and image.shape[-1] != 3):
    raise ValueError(f'encode_png expects uint8 [H, W], [H, W, 1] or [H, W, 3], '
                     f'got {image.dtype} {image.shape}.')
  height, width = image.shape[:2]
  color_type = 0 if image.ndim == 2 else 2
  rows = image.reshape(height, -1)
  raw = b''.join(b'\x00' + row.tobytes() for row in rows)  # filter type 0 per row

  def chunk(kind: bytes, data: bytes) -> bytes:
    return (struct.pack('>I', len(data)) + kind + data
            + struct.pack('>I', zlib.crc32(kind + data) & 0xffffffff))

  header = struct.pack('>IIBBBBB', width, height, 8, color_type, 0, 0, 0)
  return (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', header)
          + chunk(b'IDAT', zlib.compress(raw, 9)) + chunk(b'IEND', b''))


def save_png(path: str, image: np.ndarray, scale: int = 1) -> str:
  """Writes a PNG atomically (temporary file + rename); `scale` repeats pixels."""
  image = np.asarray(image)
  if scale > 1:
    image = image.repeat(scale, axis=0).repeat(scale, axis=1)
  files.write_atomic(path, encode_png(image))
  return path
