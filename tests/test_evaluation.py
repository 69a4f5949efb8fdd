"""Closed-form checks of the quality measures and the Fashion-MNIST loader."""

import gzip
import os
import pathlib
import tempfile

from absl.testing import absltest
import jax
import numpy as np

from specdec_jax.app import evaluation
from specdec_jax.app import fashion_mnist
from specdec_jax.models import classifier


class FrechetTest(absltest.TestCase):

  def test_gaussians_closed_form(self):
    # Diagonal covariances: FD = |m1 - m2|^2 + sum (s1 - s2)^2.
    m1, m2 = np.array([0.0, 1.0, -2.0]), np.array([0.5, 1.0, 0.0])
    s1, s2 = np.array([1.0, 2.0, 0.5]), np.array([3.0, 1.0, 0.5])
    expected = np.sum((m1 - m2) ** 2) + np.sum((s1 - s2) ** 2)
    got = evaluation.frechet_distance(m1, np.diag(s1 ** 2), m2, np.diag(s2 ** 2))
    self.assertAlmostEqual(got, expected, places=8)
    # Rotating both distributions by the same orthogonal matrix changes nothing.
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(3, 3)))
    rotated = evaluation.frechet_distance(q @ m1, q @ np.diag(s1 ** 2) @ q.T,
                                          q @ m2, q @ np.diag(s2 ** 2) @ q.T)
    self.assertAlmostEqual(rotated, expected, places=8)

  def test_identical_samples_give_zero_and_shift_gives_squared_norm(self):
    features = np.random.default_rng(1).normal(size=(500, 8))
    mean, cov = evaluation.feature_statistics(features)
    self.assertAlmostEqual(evaluation.frechet_distance(mean, cov, mean, cov), 0.0, places=6)
    shifted = evaluation.feature_statistics(features + 2.0)
    self.assertAlmostEqual(evaluation.frechet_distance(mean, cov, *shifted), 4.0 * 8, places=6)

  def test_features_frechet_of_two_sets(self):
    rng = np.random.default_rng(3)
    a = rng.normal(size=(4000, 3))
    self.assertAlmostEqual(evaluation.features_frechet(a, a), 0.0, places=6)
    # Shifted by (1, 2, 0): the distance of the Gaussians is the squared shift, 5, up to
    # the sampling noise of two independent 4000-sample estimates (well below 0.5).
    b = rng.normal(size=(4000, 3)) + np.array([1.0, 2.0, 0.0])
    self.assertLess(abs(evaluation.features_frechet(a, b) - 5.0), 0.5)

  def test_bad_shapes(self):
    with self.assertRaisesRegex(ValueError, 'shapes'):
      evaluation.frechet_distance(np.zeros(2), np.eye(2), np.zeros(3), np.eye(3))
    with self.assertRaisesRegex(ValueError, 'features'):
      evaluation.feature_statistics(np.zeros((1, 4)))

  def test_accuracy(self):
    logits = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    self.assertAlmostEqual(evaluation.class_accuracy(logits, [1, 1, 1]), 2 / 3)

  def test_image_nlls_and_standard_error(self):
    log_probs = np.log([[0.5, 0.25], [1.0, 0.5]])
    np.testing.assert_allclose(evaluation.image_nlls(log_probs),
                               [(np.log(2) + np.log(4)) / 2, np.log(2) / 2])
    self.assertAlmostEqual(evaluation.standard_error([1.0, 2.0, 3.0, 4.0]),
                           np.std([1, 2, 3, 4], ddof=1) / 2)
    with self.assertRaisesRegex(ValueError, r'\[N, L\]'):
      evaluation.image_nlls(np.zeros(3))
    with self.assertRaisesRegex(ValueError, 'at least 2'):
      evaluation.standard_error([1.0])

  def test_standard_error_interval_coverage(self):
    """mean +- 1.96 s.e. covers the true mean of 2000 samples of 50 normals about
    95% of the time: 1900 expected, binomial s.d. 9.7, so [1860, 1940] holds with
    probability above 0.999. Negative control: the right formula with the wrong
    scale (s.d. 1 for samples of s.d. 3) covers about 49%."""
    rng = np.random.default_rng(0)
    samples = rng.normal(0.0, 3.0, size=(2000, 50))
    covered = sum(abs(np.mean(x)) <= 1.96 * evaluation.standard_error(x) for x in samples)
    self.assertBetween(covered, 1860, 1940)
    wrong = sum(abs(np.mean(x)) <= 1.96 * 1.0 / np.sqrt(50) for x in samples)
    self.assertLess(wrong, 1860)

  def test_paired_gap_standard_error_covers_the_gap_as_stated(self):
    """Two sets of 100 images, 10 per class in the same order (the main command's
    labels), each NLL a class effect (s.d. 0.5) plus per-image noise (s.d. 0.3), the
    same law in both: gap +- 1.96 paired s.e. covers 0 in about 95% of 2000 trials
    (1900 expected, binomial s.d. 9.7; [1860, 1940] holds with probability above
    0.999). Negative control: the s.e. of two independent means (hypot of the sets'
    own s.e.s, which hold the class spread the gap does not) covers almost always."""
    rng = np.random.default_rng(0)
    class_effect = np.repeat(rng.normal(0.0, 0.5, size=(2000, 10)), 10, axis=1)  # [T, 100]
    values = class_effect + rng.normal(0.0, 0.3, size=(2000, 100))
    reference = class_effect + rng.normal(0.0, 0.3, size=(2000, 100))
    gaps = values.mean(1) - reference.mean(1)
    paired = np.array([evaluation.paired_gap_standard_error(v, r)
                       for v, r in zip(values, reference)])
    self.assertBetween(int(np.sum(np.abs(gaps) <= 1.96 * paired)), 1860, 1940)
    independent = np.hypot([evaluation.standard_error(v) for v in values],
                           [evaluation.standard_error(r) for r in reference])
    self.assertGreater(int(np.sum(np.abs(gaps) <= 1.96 * independent)), 1940)
    self.assertAlmostEqual(evaluation.paired_gap_standard_error([1.0, 2.0, 4.0], [0.0, 0.0, 1.0]),
                           evaluation.standard_error([1.0, 2.0, 3.0]))
    with self.assertRaisesRegex(ValueError, 'pair image by image'):
      evaluation.paired_gap_standard_error([1.0, 2.0], [1.0, 2.0, 3.0])

  def test_classifier_shapes(self):
    model = classifier.Classifier()
    images = np.zeros((2, 32, 32, 1), np.uint8)
    params = model.init(jax.random.key(0), images)
    logits, features = model.apply(params, images)
    self.assertEqual(logits.shape, (2, 10))
    self.assertEqual(features.shape, (2, 128))
    # uint8 pixels are the tokenizers' [-1, 1] images (as training saw them).
    pixels = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 1)).astype(np.uint8)
    np.testing.assert_allclose(model.apply(params, pixels)[1],
                               model.apply(params, pixels / 127.5 - 1.0)[1], rtol=1e-5, atol=1e-6)


def write_idx(path, array):
  header = bytes([0, 0, 8, array.ndim]) + b''.join(
      int(n).to_bytes(4, 'big') for n in array.shape)
  with gzip.open(path, 'wb') as f:
    f.write(header + array.astype(np.uint8).tobytes())


class FashionMnistTest(absltest.TestCase):

  def test_reads_idx_and_rejects_truncated_or_wrong_hash(self):
    with tempfile.TemporaryDirectory() as tmp:
      tmp = pathlib.Path(tmp)
      images = np.random.default_rng(0).integers(0, 255, (5, 28, 28))
      labels = np.arange(5)
      for split in ('train', 'test'):
        write_idx(tmp / fashion_mnist.FILES[f'{split}_images'][0], images)
        write_idx(tmp / fashion_mnist.FILES[f'{split}_labels'][0], labels)
      got_images, got_labels = fashion_mnist.load('train', str(tmp), verify_hash=False)
      np.testing.assert_array_equal(got_images, images)
      np.testing.assert_array_equal(got_labels, labels)
      with self.assertRaisesRegex(ValueError, 'SHA-256'):
        fashion_mnist.load('test', str(tmp))
      with gzip.open(tmp / fashion_mnist.FILES['test_images'][0], 'wb') as f:
        f.write(bytes([0, 0, 8, 3]) + (5).to_bytes(4, 'big') + (28).to_bytes(4, 'big') * 2
                + b'\x00' * 100)
      with self.assertRaisesRegex(ValueError, 'truncated'):
        fashion_mnist.load('test', str(tmp), verify_hash=False)
      padded = fashion_mnist.pad_to_32(got_images)
      self.assertEqual(padded.shape, (5, 32, 32, 1))
      np.testing.assert_array_equal(padded[:, 2:30, 2:30, 0], images)
      self.assertEqual(int(padded[:, :2].max()), 0)

  def test_missing_data_says_how_to_install(self):
    with tempfile.TemporaryDirectory() as tmp:
      with self.assertRaisesRegex(FileNotFoundError, 'apt-get install -y dataset-fashion-mnist'):
        fashion_mnist.load('train', tmp)

  def test_installed_package_matches_official_hashes(self):
    if not os.path.isdir(fashion_mnist.DEFAULT_DIR):
      self.skipTest('dataset-fashion-mnist is not installed (.ci/run installs it).')
    images, labels = fashion_mnist.load('test')
    self.assertEqual(images.shape, (10000, 28, 28))
    np.testing.assert_array_equal(np.bincount(labels), [1000] * 10)


class FrechetFormulaTest(absltest.TestCase):
  """Closed forms the data-driven cases cannot tell apart (their covariances
  commute, and N is large)."""

  def test_frechet_of_non_commuting_covariances(self):
    # tr sqrt(M) = sqrt(tr M + 2 sqrt(det M)) for a 2x2 M = C1 C2 with positive eigenvalues.
    c1, c2 = np.array([[2.0, 1.0], [1.0, 2.0]]), np.diag([1.0, 4.0])
    m = c1 @ c2
    expected = np.trace(c1) + np.trace(c2) - 2 * np.sqrt(np.trace(m) + 2 * np.sqrt(np.linalg.det(m)))
    self.assertAlmostEqual(evaluation.frechet_distance(np.zeros(2), c1, np.zeros(2), c2),
                           expected, places=10)  # 0.7711; tr(C1^1/2 C2^1/2) would give 0.804

  def test_feature_covariance_is_unbiased(self):
    mean, cov = evaluation.feature_statistics([[0.0, 1.0], [2.0, 1.0], [4.0, 4.0]])
    np.testing.assert_allclose(mean, [2.0, 2.0])
    np.testing.assert_allclose(cov, [[4.0, 3.0], [3.0, 3.0]])  # ddof = 1, as pytorch-fid

  def test_one_feature_is_a_1x1_covariance_and_a_one_dimensional_frechet(self):
    """F = 1: (m1 - m2)^2 + (s1 - s2)^2 in standard deviations, not a shape error."""
    a, b = np.array([[0.0], [2.0], [4.0]]), np.array([[1.0], [2.0]])
    mean, cov = evaluation.feature_statistics(a)
    self.assertEqual((mean.shape, cov.shape), ((1,), (1, 1)))
    self.assertAlmostEqual(evaluation.features_frechet(a, b),
                           (2.0 - 1.5) ** 2 + (2.0 - np.sqrt(0.5)) ** 2, places=10)


class FormatTableTest(absltest.TestCase):

  def test_each_value_sits_under_its_header(self):
    row = dict(tokens_per_forward=3.25, latency_s=0.047, speedup=1.5, nll_gap=0.0123,
               nll_gap_se=0.0456, frechet_to_target=2.0, frechet=9.0, class_accuracy=0.75)
    header, _, line, *_ = evaluation.format_table({'coolsd': row}, 0.9).splitlines()
    names = ('tokens/fwd', 'latency', 'speedup', 'nll_gap', '+-s.e.', 'fd target', 'fd data',
             'class acc')
    values = ('3.25', '47ms', '1.50x', '+0.0123', '0.0456', '2.00', '9.00', '0.75')
    for name, value in zip(names, values):
      end = header.index(name) + len(name)  # right-aligned columns
      self.assertEqual(line[end - len(value):end], value, name)


if __name__ == '__main__':
  absltest.main()
