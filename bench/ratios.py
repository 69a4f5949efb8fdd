"""Tokens per forward relative to a reference row, shared by the Jacobi benches."""

from __future__ import annotations


def with_ratio(row: dict, reference: dict) -> dict:
  """row + `ratio_to_sjd`, its tokens per forward over the reference's, and
  `ratio_stderr`, the ratio's delta-method s.e. from both rows' `stderr`
  (0 for the reference itself)."""
  ratio = row['tokens_per_forward'] / reference['tokens_per_forward']
  relative = ((row['stderr'] / row['tokens_per_forward']) ** 2
              + (reference['stderr'] / reference['tokens_per_forward']) ** 2) ** 0.5
  return dict(row, ratio_to_sjd=ratio, ratio_stderr=0.0 if row is reference else ratio * relative)
