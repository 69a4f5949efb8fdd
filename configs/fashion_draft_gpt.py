"""Independent draft GPT of the bundled model family (drafts for the target).

  python -m specdec_jax.app.train.gpt --config configs/fashion_draft_gpt.py \
      --workdir runs/family/draft_gpt

Same LlamaGen architecture and tokens as configs/fashion_target.py, at dim 64,
2 layers, 4 heads (about 0.14 M parameters: 140,288).
"""

from specdec_jax.configs import fashion_target


def get_config():
  config = fashion_target.get_config()
  config.model.dim = 64
  config.model.n_layer = 2
  config.model.n_head = 4
  config.batch_size = 64
  config.num_steps = 10000
  config.learning_rate = 2e-3
  config.weight_decay = 0.0
  return config
