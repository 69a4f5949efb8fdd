"""Target GPT of the bundled model family: LlamaGen c2i on Fashion-MNIST tokens.

  python -m specdec_jax.train.gpt --config configs/fashion_target.py --workdir runs/fashion_target

LlamaGen architecture (2D RoPE, SwiGLU, RMSNorm) at dim 192, 8 layers, 6
heads: about 3.6 M parameters (14 MB in float32). 256 image tokens (16x16
grid of the VQ in configs/fashion_vq.py), 10 classes plus the null class.
"""

import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.tokens_path = 'runs/fashion_vq/tokens.npz'  # written by specdec_jax.train.vq
  config.num_classes = 10
  # `models.llamagen.GPTConfig` fields; vocab_size 0 = the tokens file's codebook size.
  config.model = ml_collections.ConfigDict(dict(
      dim=192, n_layer=8, n_head=6, multiple_of=64, vocab_size=0, norm_eps=1e-5,
      rope_base=10000.0))
  config.class_dropout = 0.1  # label -> null class, so CFG works
  config.batch_size = 64
  config.num_steps = 20000
  config.learning_rate = 1e-3
  config.warmup_steps = 500
  config.weight_decay = 0.05
  config.b1 = 0.9
  config.b2 = 0.95
  config.clip_norm = 1.0  # 0 disables
  config.eval_batch_size = 250
  config.fast_compile = False  # True: ~30% shorter XLA compiles, slower steps (smoke runs)
  config.log_every = 100
  config.save_every = 1000
  return config
