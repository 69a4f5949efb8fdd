"""The first images of sampler output folders, one labelled row block per folder (not a test).

  python bench/sample_grid.py --out grid.png runs/pareto/vanilla runs/pareto/csd_0.2

Each folder is a `python -m specdec_jax.sample` output (its samples.npz,
uint8[N, H, W, 3]). Image i of a set has class i % num_classes in the
sampler's class order, so --per_class images of each of --classes classes are
shown per folder: rows are folders x per_class, columns classes. Writes a PNG
with the folders' names (or --labels) on the left.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import plotting  # bench/plotting.py


def class_rows(images: np.ndarray, classes: int, per_class: int) -> np.ndarray:
  """uint8[per_class, classes, H, W]: image c + classes * r at [r, c] (grayscale)."""
  needed = classes * per_class
  if len(images) < needed:
    raise ValueError(f'sample_grid: a set has {len(images)} images, {needed} are needed '
                     f'({per_class} per class of {classes}).')
  return images[:needed, ..., 0].reshape(per_class, classes, *images.shape[1:3])


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('folders', nargs='+', help='Sampler output folders.')
  parser.add_argument('--out', required=True, help='PNG path.')
  parser.add_argument('--classes', type=int, default=10)
  parser.add_argument('--per_class', type=int, default=3)
  parser.add_argument('--labels', default='', help="Comma-separated row labels (default: "
                      "the folders' names).")
  args = parser.parse_args(argv)
  labels = args.labels.split(',') if args.labels else [
      os.path.basename(os.path.normpath(f)) for f in args.folders]
  if len(labels) != len(args.folders):
    raise SystemExit(f'--labels has {len(labels)} entries for {len(args.folders)} folders.')
  figure, axes = plotting.subplots(len(args.folders), 1,
                                   figsize=(args.classes * 0.9, len(args.folders) * 0.9
                                            * args.per_class + 0.3))
  axes = np.atleast_1d(axes)
  for axis, folder, label in zip(axes, args.folders, labels):
    with np.load(os.path.join(folder, 'samples.npz')) as data:
      rows = class_rows(data['arr_0'], args.classes, args.per_class)
    per_class, classes, height, width = rows.shape
    axis.imshow(rows.transpose(0, 2, 1, 3).reshape(per_class * height, classes * width),
                cmap='gray', vmin=0, vmax=255)
    axis.set_xticks([])
    axis.set_yticks([])
    axis.set_ylabel(label, fontsize=8)
  plotting.save(figure, args.out)
  print('wrote', args.out)


if __name__ == '__main__':
  main()
