"""The bundled Fashion-MNIST model family, trained in one resumable command.

  python -m specdec_jax.app.train.family --workdir runs/family

Stages, in order (each skipped when its outputs exist): patch k-means
tokenizer, evaluation classifier, target GPT, draft GPT, EAGLE-1 head, bundle.
Every trainer runs on a wall-time budget (`train_minutes`: warm-up, constant
rate, linear decay over the last fifth), so the whole family takes about
`sum(train_minutes)` plus a few minutes of encoding, evaluation and
compilation on 2 CPU cores. `num_steps` is only a cap.

Shapes (chosen by measurement on 2 CPU cores, `bench/target_shapes.py`;
README "Bundled model"): a deep, narrow target (dim 64, 16 layers, 2 heads)
so that at batch 1 with CFG one target forward costs many EAGLE-head
forwards (one decoder layer) and verifying k + 1 = 5 tokens costs little
more than one.
"""

import ml_collections

from specdec_jax.configs import classifier
from specdec_jax.configs import fashion_draft_gpt
from specdec_jax.configs import fashion_eagle
from specdec_jax.configs import fashion_target
from specdec_jax.configs import fashion_tokenizer

STAGES = ('tokenizer', 'classifier', 'target', 'draft_gpt', 'eagle', 'bundle')


def get_config():
  config = ml_collections.ConfigDict()
  config.bundle_dir = ''  # '' = specdec_jax/assets/fashion_mnist (the package's bundle)
  # A subset runs only those, in pipeline order (outputs of the others must exist, and the
  # bundle refuses a stage trained on outputs that have since changed).
  config.stages = STAGES

  config.tokenizer = fashion_tokenizer.get_config()

  config.classifier = classifier.get_config()
  config.classifier.train_minutes = 3.0
  config.classifier.num_steps = 100_000

  config.target = fashion_target.get_config()
  config.target.train_minutes = 42.0
  config.target.num_steps = 1_000_000
  config.target.save_every = 250

  config.draft_gpt = fashion_draft_gpt.get_config()
  config.draft_gpt.train_minutes = 6.0
  config.draft_gpt.num_steps = 1_000_000

  config.eagle = fashion_eagle.get_config()
  config.eagle.train_minutes = 28.0
  config.eagle.num_steps = 1_000_000
  config.eagle.save_every = 250
  return config
