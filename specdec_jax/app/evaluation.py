"""Quality measures for generated images (Frechet distance, class accuracy, NLL) and
the main command's results table.

Legend: N samples, F feature width, L tokens per image, V vocabulary.
"""

from __future__ import annotations

import numpy as np


def feature_statistics(features) -> tuple[np.ndarray, np.ndarray]:
  """(mean [F], covariance [F, F]) of features [N, F] in float64."""
  features = np.asarray(features, np.float64)
  if features.ndim != 2 or features.shape[0] < 2:
    raise ValueError(f'features must be [N >= 2, F], got {features.shape}.')
  # np.cov of one feature column is 0-d; atleast_2d keeps [F, F] for F = 1.
  return features.mean(0), np.atleast_2d(np.cov(features, rowvar=False))


def _sqrtm_psd(matrix: np.ndarray) -> np.ndarray:
  values, vectors = np.linalg.eigh((matrix + matrix.T) / 2)
  return (vectors * np.sqrt(np.clip(values, 0, None))) @ vectors.T


def frechet_distance(mean1, cov1, mean2, cov2) -> float:
  """||m1 - m2||^2 + tr(C1 + C2 - 2 (C1^1/2 C2 C1^1/2)^1/2), the FID formula.

  Uses the symmetric form, so the square roots are of positive semidefinite
  matrices (eigendecomposition, no complex parts). mean1, mean2: [F];
  cov1, cov2: [F, F] (`feature_statistics`).
  """
  mean1, mean2 = np.asarray(mean1, np.float64), np.asarray(mean2, np.float64)
  cov1, cov2 = np.asarray(cov1, np.float64), np.asarray(cov2, np.float64)
  if mean1.shape != mean2.shape or cov1.shape != cov2.shape or cov1.shape != mean1.shape * 2:
    raise ValueError(f'frechet_distance: shapes disagree: means {mean1.shape}, {mean2.shape}; '
                     f'covariances {cov1.shape}, {cov2.shape}.')
  root1 = _sqrtm_psd(cov1)
  cross = _sqrtm_psd(root1 @ cov2 @ root1)
  value = np.sum((mean1 - mean2) ** 2) + np.trace(cov1) + np.trace(cov2) - 2 * np.trace(cross)
  return float(max(value, 0.0))


def features_frechet(features_a, features_b) -> float:
  """Frechet distance between two feature sets [N, F] and [M, F] (their Gaussians)."""
  return frechet_distance(*feature_statistics(features_a), *feature_statistics(features_b))


def class_accuracy(predicted_logits, labels) -> float:
  """Fraction of images whose argmax class equals the requested label
  (predicted_logits [N, C], labels int[N])."""
  predicted = np.argmax(np.asarray(predicted_logits), axis=-1)
  labels = np.asarray(labels)
  if predicted.shape != labels.shape:
    raise ValueError(f'{predicted.shape[0]} predictions for {labels.shape[0]} labels.')
  return float(np.mean(predicted == labels))


def image_nlls(token_log_probs) -> np.ndarray:
  """Each image's mean per-token negative log-likelihood, float64[N], from log p [N, L]."""
  log_probs = np.asarray(token_log_probs, np.float64)
  if log_probs.ndim != 2:
    raise ValueError(f'image_nlls: log probs must be [N, L], got shape {log_probs.shape}.')
  return -np.mean(log_probs, axis=1)


def standard_error(values) -> float:
  """Standard error of the mean of independent values [N] (N >= 2)."""
  values = np.asarray(values, np.float64)
  if values.ndim != 1 or values.size < 2:
    raise ValueError(f'standard_error: needs a vector of at least 2 values, got shape '
                     f'{values.shape}.')
  return float(np.std(values, ddof=1) / np.sqrt(values.size))


def paired_gap_standard_error(values, reference) -> float:
  """Standard error of mean(values) - mean(reference) over images paired by index
  (values, reference [N], N >= 2): image i of both sets has the same label, so the
  s.e. of the mean of the N independent differences. It leaves out the spread
  between classes, which the gap does not contain, and any shared randomness."""
  values, reference = np.asarray(values, np.float64), np.asarray(reference, np.float64)
  if values.shape != reference.shape:
    raise ValueError(f'paired_gap_standard_error: the sets pair image by image; got shapes '
                     f'{values.shape} and {reference.shape}.')
  return standard_error(values - reference)


def format_table(results: dict, classifier_accuracy: float) -> str:
  header = (f'{"method":14s} {"tokens/fwd":>10s} {"latency":>9s} {"speedup":>8s} '
            f'{"nll_gap":>8s} {"+-s.e.":>7s} {"fd target":>9s} {"fd data":>8s} '
            f'{"class acc":>9s}')
  lines = [header, '-' * len(header)]
  for name, row in results.items():
    lines.append(f'{name:14s} {row["tokens_per_forward"]:10.2f} '
                 f'{1e3 * row["latency_s"]:7.0f}ms {row["speedup"]:7.2f}x '
                 f'{row["nll_gap"]:+8.4f} {row["nll_gap_se"]:7.4f} '
                 f'{row["frechet_to_target"]:9.2f} {row["frechet"]:8.2f} '
                 f'{row["class_accuracy"]:9.2f}')
  lines.append(f'(latency: one image, batch 1; nll_gap +- its standard error (images '
               f'paired by index); fd target: Frechet distance to vanilla\'s images '
               f'(vanilla_seed1: the noise floor), fd data: to the test split; classifier '
               f'test accuracy on real images: {classifier_accuracy:.3f})')
  return '\n'.join(lines)
