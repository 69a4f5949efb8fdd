"""Tokenizer of the bundled model family: k-means on 2x2 patches of Fashion-MNIST.

  python -m specdec_jax.app.train.kmeans_tokenizer --config configs/fashion_tokenizer.py \
      --workdir runs/family/tokenizer

28x28 images -> a 14x14 = 196-token grid over a 256-entry patch codebook.
"""

import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.codebook_size = 256
  config.patch_size = 2
  config.num_patches = 200_000  # sampled from the training split for the fit
  config.iterations = 20  # Lloyd iterations
  config.init = 'kmeans++'  # or 'random' (distinct random patches; configs without `init`)
  config.eval_batch_size = 1000
  config.max_examples = 0  # first N images of each split (smoke runs); 0 = all
  config.data_dir = ''  # '' = $FASHION_MNIST_DIR or Debian's dataset-fashion-mnist
  return config
