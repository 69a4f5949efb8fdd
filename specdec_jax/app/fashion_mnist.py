"""Fashion-MNIST from Debian's `dataset-fashion-mnist` package (MIT licence).

60,000 training and 10,000 test images, 28x28 grayscale, 10 classes. The
loader finds the installed IDX files, checks their SHA-256 against the
package's, and returns uint8 arrays; `pad_to_32` centres them in 32x32 so a
stride-2 VQ gives a 16x16 = 256-token grid.

Legend: N images, H = W = 28 (or 32 after padding).
"""

from __future__ import annotations

import gzip
import os
import pathlib
import zlib

import numpy as np

from specdec_jax.app import files

DEFAULT_DIR = '/usr/share/datasets/fashion-mnist'
ENV_VAR = 'FASHION_MNIST_DIR'
CLASS_NAMES = ('T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal', 'Shirt',
               'Sneaker', 'Bag', 'Ankle boot')
NUM_CLASSES = len(CLASS_NAMES)

# SHA-256 of the files shipped by dataset-fashion-mnist 0.0~git20200523.55506a9-1.
FILES = {
    'train_images': ('train-images-idx3-ubyte.gz',
                     'b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7'),
    'train_labels': ('train-labels-idx1-ubyte.gz',
                     '0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056'),
    'test_images': ('t10k-images-idx3-ubyte.gz',
                    'cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa'),
    'test_labels': ('t10k-labels-idx1-ubyte.gz',
                    '8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05'),
}
INSTALL_HINT = ('Install it with `sudo apt-get install -y dataset-fashion-mnist` (Debian/Ubuntu, '
                '30 MB), or point the FASHION_MNIST_DIR environment variable at a folder holding '
                'the four official *-ubyte.gz files.')


class DataFileError(ValueError):
  """A data file that is not the official one (corrupt, truncated, another data set)."""


def data_dir(directory: str | None = None) -> pathlib.Path:
  """The folder with the IDX files: the argument, $FASHION_MNIST_DIR, or Debian's."""
  path = pathlib.Path(directory or os.environ.get(ENV_VAR) or DEFAULT_DIR)
  missing = [name for name, _ in FILES.values() if not (path / name).exists()]
  if missing:
    raise FileNotFoundError(f'Fashion-MNIST not found in {path} (missing {", ".join(missing)}). '
                            + INSTALL_HINT)
  return path


def read_idx(path: pathlib.Path) -> np.ndarray:
  """Parses a gzipped IDX file (magic 0x0801 labels, 0x0803 images)."""
  try:
    with gzip.open(path, 'rb') as f:
      data = f.read()
  except (gzip.BadGzipFile, EOFError, zlib.error) as error:
    raise DataFileError(f'{path} is not a readable gzip file ({error}). '
                        + INSTALL_HINT) from None
  if len(data) < 8 or data[:2] != b'\x00\x00' or data[2] != 0x08:
    raise DataFileError(f'{path} is not an unsigned-byte IDX file (bad magic {data[:4]!r}).')
  ndim = data[3]
  shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big') for i in range(ndim))
  offset = 4 + 4 * ndim
  expected = int(np.prod(shape))
  if len(data) - offset != expected:
    raise DataFileError(f'{path} is truncated or corrupt: header says {shape} '
                        f'({expected} bytes), file holds {len(data) - offset}.')
  return np.frombuffer(data, np.uint8, offset=offset).reshape(shape)


def load(split: str, directory: str | None = None, verify_hash: bool = True):
  """Returns (images uint8[N, 28, 28], labels int32[N]) of 'train' or 'test'."""
  if split not in ('train', 'test'):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}.")
  path = data_dir(directory)
  arrays = []
  for part in ('images', 'labels'):
    name, digest = FILES[f'{split}_{part}']
    if verify_hash and files.sha256(path / name) != digest:
      raise DataFileError(f'{path / name} does not match the SHA-256 of the official file '
                          f'({digest}); it is corrupt or a different data set. ' + INSTALL_HINT)
    arrays.append(read_idx(path / name))
  images, labels = arrays
  if images.shape[0] != labels.shape[0]:
    raise DataFileError(f'{path}: {split} has {images.shape[0]} images but {labels.shape[0]} '
                        'labels; it is corrupt or a different data set. ' + INSTALL_HINT)
  return images, labels.astype(np.int32)


def pad_to_32(images: np.ndarray) -> np.ndarray:
  """Centres uint8[N, 28, 28] images in uint8[N, 32, 32, 1] (zero border)."""
  if images.ndim != 3 or images.shape[1:] != (28, 28):
    raise ValueError(f'pad_to_32 expects [N, 28, 28], got {images.shape}.')
  return np.pad(images, ((0, 0), (2, 2), (2, 2)))[..., None]


def hashes(directory: str | None = None) -> dict:
  """SHA-256 of each file, for training manifests."""
  path = data_dir(directory)
  return {name: files.sha256(path / name) for name, _ in FILES.values()}
