"""Matplotlib set-up shared by the bench scripts that write PNG figures."""

from __future__ import annotations


def subplots(*grid: int, figsize: tuple[float, float] = (6.4, 4.0)):
  """(figure, axes) from `plt.subplots(*grid)` on the file-only Agg backend."""
  import matplotlib  # pylint: disable=g-import-not-at-top  (optional; only plotting needs it)
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt.subplots(*grid, figsize=figsize)


def save(figure, path: str, dpi: int = 120) -> None:
  """Writes the figure to `path` (tight layout) and frees it."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  figure.tight_layout()
  figure.savefig(path, dpi=dpi)
  plt.close(figure)
