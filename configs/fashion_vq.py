"""VQ tokenizer of the bundled model family: Fashion-MNIST padded to 32x32.

  python -m specdec_jax.app.train.vq --config configs/fashion_vq.py --workdir runs/fashion_vq

LlamaGen's VQ architecture at small width: ch 32, ch_mult (1, 2) (one
stride-2 step: a 16x16 = 256-token grid), 256 x 8 L2-normalised codebook.
"""

import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  config.seed = 0
  # `models.vq.small_vq_config` overrides.
  config.vq = ml_collections.ConfigDict(dict(
      codebook_size=256, codebook_dim=8, codebook_l2_norm=True, ch=32, ch_mult=(1, 2),
      num_res_blocks=1, z_channels=64, attn_levels=(1,), norm_groups=32))
  config.batch_size = 64
  config.num_steps = 8000
  config.learning_rate = 1e-3
  config.warmup_steps = 200
  config.weight_decay = 0.0
  config.b1 = 0.9
  config.b2 = 0.95
  config.clip_norm = 1.0  # 0 disables
  config.dead_code_every = 200  # restart unused codes every N steps; 0 disables
  config.eval_batch_size = 500
  config.fast_compile = False  # True: ~30% shorter XLA compiles, slower steps (smoke runs)
  config.log_every = 100
  config.save_every = 1000
  config.max_examples = 0  # first N images of each split (smoke runs); 0 = all
  config.data_dir = ''  # '' = $FASHION_MNIST_DIR or Debian's dataset-fashion-mnist
  return config
