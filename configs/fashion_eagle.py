"""EAGLE-1 drafter of the bundled model family, trained on the target's features.

  python -m specdec_jax.app.train.drafter --config configs/fashion_eagle.py \
      --workdir runs/family/eagle

Drafter shape: LANTERN's LlamaGen drafter for the target (fc 2E -> E, one
decoder layer without input norm, the target's frozen embedding and head,
2D RoPE with one fewer condition token). Loss, feature noise, AdamW's betas and
clipping by value as EAGLE-1 (Li et al., ICML 2024, arXiv 2401.15077); where
this differs from EAGLE's released training: no weight decay (its AdamW kept
PyTorch's default 0.01), its schedule (linear warm-up and decay; here warm-up then
cosine, or with train_minutes > 0, as the shipped head, warm-up, constant rate and a
linear decay over the last fifth), and a higher learning rate than its 3e-5 because
the model is small and trained briefly.
"""

import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.target_dir = 'runs/family/target/model'  # written by specdec_jax.app.train.gpt
  config.tokens_path = 'runs/family/tokenizer/tokens.npz'  # by train.kmeans_tokenizer
  config.data_source = 'dataset'  # 'dataset' (tokens.npz) or 'target' (target samples)
  config.num_target_samples = 20000  # data_source='target'
  config.sample_batch_size = 250
  config.sample_temperature = 1.0
  config.sample_cfg_scale = 1.0
  config.embedding_source = 'tok_embeddings'  # or 'output' (LANTERN's fallback)
  config.drafter = ml_collections.ConfigDict()  # `models.eagle.DrafterConfig` overrides
  config.uncond_prob = 0.1  # a sequence uses the null class (CFG-style mixing)
  config.noise_std = 0.2  # uniform width noise_std * 512 / positions
  config.reg_weight = 1.0  # v_w, SmoothL1 on features
  config.cls_weight = 0.1  # p_w, soft cross-entropy against the target
  config.batch_size = 32
  config.train_minutes = 0.0  # > 0: wall-time schedule (training.TimeBudget); num_steps caps
  config.num_steps = 10000
  config.learning_rate = 3e-4
  config.warmup_steps = 300
  config.weight_decay = 0.0
  config.b1 = 0.9
  config.b2 = 0.95
  config.grad_clip_value = 0.5  # clip by value, as EAGLE; 0 disables
  config.clip_norm = 0.0  # global-norm clipping on top; 0 disables
  config.eval_examples = 1000
  config.eval_batch_size = 250
  config.fast_compile = False  # True: ~30% shorter XLA compiles, slower steps (smoke runs)
  config.log_every = 100
  config.save_every = 1000
  return config
