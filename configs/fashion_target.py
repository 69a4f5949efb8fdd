"""Target GPT of the bundled model family: LlamaGen c2i on Fashion-MNIST tokens.

  python -m specdec_jax.app.train.gpt --config configs/fashion_target.py \
      --workdir runs/family/target

LlamaGen architecture (2D RoPE, SwiGLU, RMSNorm) at dim 64, 16 layers, 2
heads of 32 dims: about 0.9 M parameters (3.6 MB in float32). 196 image
tokens (the 14x14 grid of configs/fashion_tokenizer.py), 10 classes plus the
null class.
Deep and narrow on purpose: at batch 1 on a CPU a forward's cost grows with
the number of layers and little with the rows it verifies, so an EAGLE head
(one layer) drafts for about 1/16 of a target forward and a 5-token verify
costs about two 1-token forwards (README, "Bundled model").
"""

import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.tokens_path = 'runs/family/tokenizer/tokens.npz'  # train.kmeans_tokenizer or train.vq
  config.num_classes = 10
  # `models.llamagen.GPTConfig` fields; vocab_size 0 = the tokens file's codebook size.
  config.model = ml_collections.ConfigDict(dict(
      dim=64, n_layer=16, n_head=2, multiple_of=32, vocab_size=0, norm_eps=1e-5,
      rope_base=10000.0))
  config.class_dropout = 0.1  # label -> null class, so CFG works
  config.batch_size = 32
  config.num_steps = 20000  # with train_minutes > 0: a cap
  config.train_minutes = 0.0  # > 0: wall-time schedule (training.TimeBudget)
  config.learning_rate = 1e-3
  config.warmup_steps = 200
  config.weight_decay = 0.05
  config.b1 = 0.9
  config.b2 = 0.95
  config.clip_norm = 1.0  # 0 disables
  config.eval_batch_size = 250
  config.fast_compile = False  # True: ~30% shorter XLA compiles, slower steps (smoke runs)
  config.log_every = 100
  config.save_every = 1000
  return config
