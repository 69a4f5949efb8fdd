"""The 1-D rotary embedding (`layers.rope_1d_angles`, `apply_rope_half`,
`apply_rope_interleaved`) against its closed form (RoFormer, Su et al. 2021,
eq. 34): pair j of a head, read as the complex number z_j, becomes
z_j * exp(i * position * theta^(-2j/D)). The half layout (Hugging Face's
`rotate_half`, Chameleon) pairs x[j] with x[j + D/2]; the interleaved layout
(LlamaGen, Meta) pairs x[2j] with x[2j + 1]. The engine tests reach these
only through whole models; these pin the base, the frequencies and the signs."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.models import layers

HEAD_DIM = 8


def _closed_form(x, positions, theta, layout):
  """x float64[B, T, H, D], positions int[B, T] -> the rotated x (NumPy, complex)."""
  half = x.shape[-1] // 2
  freqs = theta ** (-2.0 * np.arange(half) / x.shape[-1])  # [D/2]
  rotation = np.exp(1j * positions[..., None, None] * freqs)  # [B, T, 1, D/2]
  if layout == 'half':
    z = (x[..., :half] + 1j * x[..., half:]) * rotation
    return np.concatenate([z.real, z.imag], axis=-1)
  z = (x[..., 0::2] + 1j * x[..., 1::2]) * rotation
  return np.stack([z.real, z.imag], axis=-1).reshape(x.shape)


APPLY = {'half': layers.apply_rope_half, 'interleaved': layers.apply_rope_interleaved}


class RopeClosedFormTest(parameterized.TestCase):

  def test_angles_are_position_times_inverse_frequency(self):
    angles = np.asarray(layers.rope_1d_angles(jnp.array([[0, 1, 7]]), HEAD_DIM, theta=500.0))
    expected = np.array([0, 1, 7])[:, None] * 500.0 ** (-np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    np.testing.assert_allclose(angles[0], expected, rtol=1e-6)

  @parameterized.product(layout=('half', 'interleaved'), theta=(10000.0, 500.0))
  def test_rotation_matches_the_complex_closed_form(self, layout, theta):
    x = np.asarray(jax.random.normal(jax.random.key(0), (2, 5, 3, HEAD_DIM)), np.float64)
    positions = np.array([[0, 1, 2, 9, 40], [3, 3, 17, 100, 1000]])
    angles = layers.rope_1d_angles(jnp.asarray(positions), HEAD_DIM, theta)
    got = APPLY[layout](jnp.asarray(x, jnp.float32), jnp.cos(angles), jnp.sin(angles))
    np.testing.assert_allclose(np.asarray(got), _closed_form(x, positions, theta, layout),
                               atol=2e-5)

  @parameterized.parameters('half', 'interleaved')
  def test_scores_depend_only_on_the_relative_position(self, layout):
    q, k = jax.random.normal(jax.random.key(1), (2, 1, 1, 1, HEAD_DIM))

    def score(query_position, key_position):
      positions = jnp.array([[query_position, key_position]])
      angles = layers.rope_1d_angles(positions, HEAD_DIM)
      rotated = APPLY[layout](jnp.concatenate([q, k], axis=1), jnp.cos(angles), jnp.sin(angles))
      return float(jnp.sum(rotated[0, 0] * rotated[0, 1]))

    self.assertAlmostEqual(score(5, 2), score(103, 100), places=4)
    self.assertNotAlmostEqual(score(5, 2), score(5, 3), places=2)

  def test_the_two_layouts_differ(self):
    """Negative control: the layouts are not interchangeable for a generic head."""
    x = jax.random.normal(jax.random.key(2), (1, 2, 1, HEAD_DIM))
    angles = layers.rope_1d_angles(jnp.array([[1, 2]]), HEAD_DIM)
    half = layers.apply_rope_half(x, jnp.cos(angles), jnp.sin(angles))
    interleaved = layers.apply_rope_interleaved(x, jnp.cos(angles), jnp.sin(angles))
    self.assertGreater(float(jnp.max(jnp.abs(half - interleaved))), 0.1)


if __name__ == '__main__':
  absltest.main()
