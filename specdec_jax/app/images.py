"""Image grids, labelled with method and class names, written as PNG files.

No imaging dependency: labels are drawn with the pixel font of
`specdec_jax.app.font`, PNGs encoded with zlib.

Legend: N images, R rows (one per class), n = N / R images per row, H, W
pixels, C in {1, 3} channels.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Sequence
import zlib

from absl import logging
import numpy as np

from specdec_jax.app import files
from specdec_jax.app import font

LABEL_MARGIN = 3  # paper around a label, pixels
# Height of the band of titles above the images (font.HEIGHT holds descenders).
TITLE_BAND = font.HEIGHT + 2 * LABEL_MARGIN
INK = 0  # labels: black on the white fill


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


def draw_text(canvas: np.ndarray, text: str, top: int, left: int, ink: int = INK) -> None:
  """Writes `text` into canvas uint8[H, W, C] in place, its cell's top-left at (top, left)."""
  mask = font.render(text)
  canvas[top:top + mask.shape[0], left:left + mask.shape[1]][mask] = ink


def labeled_figure(columns: dict[str, np.ndarray], row_labels: Sequence[str],
                   padding: int = 2, gap: int = 6, fill: int = 255) -> np.ndarray:
  """Image grids side by side, each titled above, the rows named at the left.

  Args:
    columns: title -> uint8[N, H, W, C], the same H, W, C for every title; its
      N images fill R = len(row_labels) rows of n = N / R images (row r holds
      images r*n .. r*n + n - 1), as `make_grid(images, n, padding)` tiles them.
    row_labels: the R row names (class names), written left of the first grid.
    padding, fill: as `make_grid`; gap: white columns between two grids.

  Returns:
    uint8[TITLE_BAND + R*(H+p)+p, label band + the grids' widths + gaps, C]: a
    grid narrower than its title is centred in a block as wide as the title.
  """
  rows = len(row_labels)
  if not columns or not rows:
    raise ValueError(f'labeled_figure needs at least one column and one row label; got '
                     f'{len(columns)} columns and row_labels {list(row_labels)}.')
  shapes = {title: np.shape(images) for title, images in columns.items()}
  first_shape = next(iter(shapes.values()))
  bad = {title: shape for title, shape in shapes.items()
         if len(shape) != 4 or shape[0] % rows or shape[1:] != first_shape[1:]}
  if bad:
    raise ValueError(f'labeled_figure: every column must be uint8[N, H, W, C] with the same H, '
                     f'W, C and N a multiple of len(row_labels) = {rows}; got {bad}.')
  if first_shape[1] < font.HEIGHT:
    raise ValueError(f'labeled_figure: images of {first_shape[1]} rows are shorter than a label '
                     f'({font.HEIGHT} rows); upscale them first.')
  grids = [make_grid(images, columns=images.shape[0] // rows, padding=padding, fill=fill)
           for images in columns.values()]
  height, channels = grids[0].shape[0], grids[0].shape[2]
  label_band = max(font.text_width(label) for label in row_labels) + 2 * LABEL_MARGIN
  widths = [max(grid.shape[1], font.text_width(title) + 2 * LABEL_MARGIN)
            for title, grid in zip(columns, grids)]
  canvas = np.full((TITLE_BAND + height, label_band + sum(widths) + gap * (len(grids) - 1),
                    channels), fill, np.uint8)
  row_pitch = (height - padding) // rows  # H + padding
  for index, label in enumerate(row_labels):  # centred on its row of images
    top = TITLE_BAND + padding + index * row_pitch + (row_pitch - padding - font.CAP_HEIGHT) // 2
    draw_text(canvas, label, top, LABEL_MARGIN)
  left = label_band
  for title, grid, width in zip(columns, grids, widths):
    grid_left = left + (width - grid.shape[1]) // 2
    canvas[TITLE_BAND:, grid_left:grid_left + grid.shape[1]] = grid
    draw_text(canvas, title, LABEL_MARGIN, left + (width - font.text_width(title)) // 2)
    left += width + gap
  return canvas


def write_figures(out_dir: str, images_by_method: dict[str, np.ndarray],
                  row_labels: Sequence[str], side_by_side_per_row: int,
                  scale: int = 1) -> list[str]:
  """Writes `<method>.png` for each method and `side_by_side.png`; returns their paths.

  images_by_method: method -> uint8[N, H, W, C], its images in rows of
  row_labels (as `labeled_figure`). `<method>.png` shows all of them;
  `side_by_side.png` the first `side_by_side_per_row` of each row of every
  method, methods left to right in the dict's order.
  """
  paths = []
  for name, images in images_by_method.items():
    paths.append(save_png(os.path.join(out_dir, f'{name}.png'),
                          labeled_figure({name: images}, row_labels), scale=scale))
  rows = len(row_labels)
  first = {name: images.reshape(rows, -1, *images.shape[1:])[:, :side_by_side_per_row]
                     .reshape(-1, *images.shape[1:])
           for name, images in images_by_method.items()}
  paths.append(save_png(os.path.join(out_dir, 'side_by_side.png'),
                        labeled_figure(first, row_labels), scale=scale))
  return paths


def remove_earlier_figures(out_dir: str, kept: Sequence[str]) -> None:
  """Removes the `<method>.png` grids of an earlier main-command run in out_dir (the
  methods its `results.json` lists) that are not in `kept`, so the folder shows what
  its results list. Files the command did not list are left alone."""
  try:
    with open(os.path.join(out_dir, 'results.json')) as f:
      earlier = json.load(f).get('method_order', [])
  except (OSError, ValueError, AttributeError):  # none, unreadable, or not the command's
    return
  for name in earlier:
    if name in kept or not isinstance(name, str) or os.sep in name:
      continue
    path = os.path.join(out_dir, f'{name}.png')
    if os.path.isfile(path):
      os.remove(path)
      logging.info('removed %s: an earlier run\'s method, not in this run', path)


def upscale(image: np.ndarray, scale: int) -> np.ndarray:
  """Repeats each pixel of uint8[H, W(, C)] scale x scale times (PNG viewing size)."""
  image = np.asarray(image)
  if scale < 1 or int(scale) != scale:
    raise ValueError(f'scale must be an integer >= 1, got {scale!r}.')
  return image.repeat(int(scale), axis=0).repeat(int(scale), axis=1)


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
  files.write_atomic(path, encode_png(upscale(image, scale)))
  return path
