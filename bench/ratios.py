"""Tokens per forward relative to a reference row, shared by the Jacobi benches.

Every method of a bench decodes the same labels with the same key, so a row and
its reference are paired image by image (an image's class and its key move
both methods' tokens per forward the same way). Rows that
keep their per-image values (`per_image`) get paired standard errors; rows
without them (JSON written before they were kept) get the independent-samples
formula, which overstates the error of a positively correlated pair.
"""

from __future__ import annotations

import numpy as np


def paired_ratio_stderr(values, reference_values) -> float:
  """Delta-method s.e. of mean(x) / mean(y) over paired samples x[i], y[i]:
  std(x - R y) / (sqrt(n) mean(y)), R the ratio of the means."""
  x, y = np.asarray(values, np.float64), np.asarray(reference_values, np.float64)
  ratio = x.mean() / y.mean()
  return float(np.std(x - ratio * y, ddof=1) / (np.sqrt(x.size) * y.mean()))


def paired_difference_stderr(values, reference_values) -> float:
  """s.e. of mean(x) - mean(y) over paired samples: std(x - y) / sqrt(n)."""
  difference = np.asarray(values, np.float64) - np.asarray(reference_values, np.float64)
  return float(np.std(difference, ddof=1) / np.sqrt(difference.size))


def is_paired(row: dict, reference: dict, field: str = 'per_image') -> bool:
  return (field in row and field in reference
          and len(row[field]) == len(reference[field]) > 1)


def with_ratio(row: dict, reference: dict) -> dict:
  """row + `ratio_to_sjd`, its tokens per forward over the reference's, and
  `ratio_stderr` (0 for the reference itself): paired over the rows' `per_image`
  tokens per forward where both have them, else from both rows' `stderr` as if
  independent; `ratio_stderr_paired` says which."""
  ratio = row['tokens_per_forward'] / reference['tokens_per_forward']
  paired = is_paired(row, reference)
  if row is reference:
    stderr = 0.0
  elif paired:
    stderr = paired_ratio_stderr(row['per_image'], reference['per_image'])
  else:
    stderr = ratio * ((row['stderr'] / row['tokens_per_forward']) ** 2
                      + (reference['stderr'] / reference['tokens_per_forward']) ** 2) ** 0.5
  return dict(row, ratio_to_sjd=ratio, ratio_stderr=stderr, ratio_stderr_paired=paired)
