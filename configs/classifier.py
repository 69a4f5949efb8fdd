"""Evaluation classifier on Fashion-MNIST (28x28, official train/test split: the family's images).

  python -m specdec_jax.app.train.classifier --config configs/classifier.py \
      --workdir runs/family/classifier
"""

import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.batch_size = 128
  config.train_minutes = 0.0  # > 0: wall-time schedule (training.TimeBudget); num_steps caps
  config.num_steps = 3000
  config.learning_rate = 2e-3
  config.warmup_steps = 100
  config.weight_decay = 1e-4
  config.log_every = 100
  config.save_every = 1000
  config.data_dir = ''  # '' = $FASHION_MNIST_DIR or Debian's dataset-fashion-mnist
  return config
