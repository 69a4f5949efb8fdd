"""VQ trainer details against their definitions (`app.train.vq`): dead codes are
restarted after every dead_code_every-th step (steps k, 2k, ... counted from 1,
not before the first update), and test PSNR is 10 log10(255^2 / MSE) of the uint8
reconstructions."""

from absl.testing import absltest
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from specdec_jax.app import training
from specdec_jax.app.train import vq as train_vq


class DeadCodeScheduleTest(absltest.TestCase):

  def test_restarts_after_every_kth_step_only(self):
    config = ml_collections.ConfigDict(dict(vq=dict(
        codebook_size=32, codebook_dim=4, ch=16, ch_mult=(1,), num_res_blocks=1,
        z_channels=16, attn_levels=(), norm_groups=8)))
    tokenizer = train_vq.tokenizer_from_config(config)
    params = tokenizer.init(0, (8, 8))
    settings = dict(learning_rate=1e-3, total_steps=10, warmup_steps=0, weight_decay=0.0,
                    b1=0.9, b2=0.95, clip_norm=None)
    optimizer, step = train_vq.optimizer_and_step(
        tokenizer, tuple(sorted(settings.items())), 3,
        tuple(sorted(train_vq.FAST_COMPILE.items())))
    state = training.init_state(params, optimizer)
    images = np.random.default_rng(0).integers(0, 255, (4, 8, 8, 1)).astype(np.uint8)
    restarted = []
    for i in range(3):
      state, metrics = step(state, (jnp.asarray(images),), jax.random.key(i))
      restarted.append(float(metrics['restarted']))
    # 32 codes, 4 x 64 latents of near-constant random images: some codes are dead.
    self.assertEqual([r > 0 for r in restarted], [False, False, True])


class StubTokenizer:
  """Decodes image i (its first token is i) to the fixed [-1, 1] array decoded[i]."""

  vocab_size = 4

  def __init__(self, decoded):
    self.decoded = decoded

  def latent_grid(self, height, width):
    return (height, width)

  def decode(self, params, tokens, grid):
    del params, grid
    return jnp.asarray(self.decoded[np.asarray(tokens)[:, 0]])

  def preprocess(self, images):
    return jnp.asarray(images, jnp.float32) / 127.5 - 1.0

  def to_uint8(self, x):
    return jnp.clip(jnp.round((x + 1.0) * 127.5), 0, 255).astype(jnp.uint8)


class ReconstructionMetricsTest(absltest.TestCase):

  def test_psnr_and_mse_closed_form(self):
    rng = np.random.default_rng(0)
    images = rng.integers(20, 230, (3, 4, 4, 1)).astype(np.uint8)
    recon_uint8 = (images.astype(np.int32) + rng.integers(-9, 10, images.shape)).astype(np.uint8)
    decoded = recon_uint8.astype(np.float32) / 127.5 - 1.0
    tokens = np.array([[0, 1], [1, 1], [2, 0]], np.int32)  # first token: the image index
    metrics = train_vq.reconstruction_metrics(StubTokenizer(decoded), None, images, tokens,
                                              batch_size=2)
    mse_uint8 = np.mean((recon_uint8.astype(np.float64) - images) ** 2)
    np.testing.assert_allclose(metrics['test_psnr_db'], 10 * np.log10(255.0 ** 2 / mse_uint8),
                               rtol=1e-6)
    np.testing.assert_allclose(
        metrics['test_mse'], np.mean((decoded - (images / 127.5 - 1.0)) ** 2), rtol=1e-5)
    self.assertAlmostEqual(metrics['codebook_usage'], 0.75)


if __name__ == '__main__':
  absltest.main()
