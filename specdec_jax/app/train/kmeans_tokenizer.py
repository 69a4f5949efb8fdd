"""Fits the bundled family's patch k-means tokenizer and writes the token grids.

  python -m specdec_jax.app.train.kmeans_tokenizer --config configs/fashion_tokenizer.py \
      --workdir runs/family/tokenizer

Lloyd's k-means on non-overlapping p x p pixel patches (pixels in [-1, 1])
sampled from the training split, seeded by k-means++ (Arthur and
Vassilvitskii, 2007: each new centre drawn with probability proportional to
the squared distance to the nearest chosen one); a centre left empty by an
iteration is moved to the patch farthest from its centre (so every code
stays in use). The tokenizer is
`models.patch_tokenizer.PatchTokenizer`.

Outputs in --workdir (the same files `specdec_jax.app.train.vq` writes, so the
GPT and drafter trainers read either):
  tokenizer/     the tokenizer (`converters.vq.load_tokenizer`).
  tokens.npz     train_tokens / test_tokens int16[N, L] (int32 past 32768 codes), labels,
                 grid, vocab_size.
  vq_eval.json   test-split MSE, PSNR, codebook usage and perplexity.
  manifest.json  command, config, data hashes, metrics.

Legend: M sampled patches, D patch dimension, V codebook size.
"""

from __future__ import annotations

import os
import time

from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.app import cli
from specdec_jax.app import fashion_mnist
from specdec_jax.app import files
from specdec_jax.app.train import command
from specdec_jax.app.train import vq as train_vq
from specdec_jax.configs import fashion_tokenizer as fashion_tokenizer_config
from specdec_jax.converters import common
from specdec_jax.models import patch_tokenizer


@jax.jit
def lloyd_step(centres: jax.Array, patches: jax.Array):
  """One Lloyd iteration: float[V, D], float[M, D] -> (new centres, inertia, counts int[V]).

  Empty clusters take the patches farthest from their centres (one each)."""
  assignment = patch_tokenizer.nearest_patch(patches, centres)  # [M]
  chosen = centres[assignment]
  squared = jnp.sum(jnp.square(patches - chosen), -1)  # [M]
  num = centres.shape[0]
  counts = jnp.zeros((num,), jnp.int32).at[assignment].add(1)
  sums = jnp.zeros_like(centres).at[assignment].add(patches)
  means = sums / jnp.maximum(counts, 1)[:, None].astype(centres.dtype)
  # Refill empty clusters with the worst-fitted patches.
  far = jnp.argsort(-squared)[:num]  # [V] farthest patches first
  empty_rank = jnp.cumsum(counts == 0) - 1  # rank among empty clusters
  refill = patches[far[jnp.clip(empty_rank, 0, num - 1)]]
  new = jnp.where((counts == 0)[:, None], refill, means)
  return new, jnp.mean(squared), counts


def kmeans_plus_plus(points: np.ndarray, num_codes: int, seed: int) -> np.ndarray:
  """k-means++ seeding: float32[M, D] -> float32[V, D] centres (distinct points)."""
  generator = np.random.default_rng(seed)
  chosen = [int(generator.integers(len(points)))]
  nearest = np.sum(np.square(points - points[chosen[0]]), -1)
  for _ in range(num_codes - 1):
    total = nearest.sum()
    if total <= 0:  # fewer distinct points than codes (checked by the caller)
      raise ValueError('k-means++: every point coincides with a chosen centre.')
    index = int(generator.choice(len(points), p=nearest / total))
    chosen.append(index)
    nearest = np.minimum(nearest, np.sum(np.square(points - points[index]), -1))
  return points[chosen].astype(np.float32)


INITS = ('kmeans++', 'random')


class TooFewPatchesError(ValueError):
  """Fewer (distinct) patches than codes."""


def fit_kmeans(patches: np.ndarray, num_codes: int, iterations: int, seed: int,
               init: str = 'kmeans++') -> tuple:
  """k-means codebook float32[V, D] of patches float[M, D]; returns (codebook, history).

  init: 'kmeans++' seeding, or 'random' (distinct random patches).
  """
  if init not in INITS:
    raise ValueError(f'k-means init must be one of {INITS}, got {init!r}.')
  if len(patches) < num_codes:
    raise TooFewPatchesError(f'k-means needs at least {num_codes} patches, got '
                             f'{len(patches)}.')
  unique = np.unique(patches, axis=0)
  if len(unique) < num_codes:
    raise TooFewPatchesError(f'only {len(unique)} distinct patches for {num_codes} codes.')
  if init == 'kmeans++':
    centres = kmeans_plus_plus(np.asarray(patches, np.float32), num_codes, seed)
  else:
    generator = np.random.default_rng(seed)
    centres = unique[generator.choice(len(unique), num_codes, replace=False)]
  centres = jnp.asarray(centres, jnp.float32)
  data = jnp.asarray(patches, jnp.float32)
  history = []
  for iteration in range(iterations):
    centres, inertia, counts = lloyd_step(centres, data)
    history.append(dict(iteration=iteration + 1, inertia=float(inertia),
                        empty=int(jnp.sum(counts == 0))))
    logging.info('kmeans: iteration %d/%d inertia %.5f empty clusters %d', iteration + 1,
                 iterations, history[-1]['inertia'], history[-1]['empty'])
  return np.asarray(centres, np.float32), history


def sample_patches(images: np.ndarray, patch: int, count: int, seed: int) -> np.ndarray:
  """`count` random patches float32[count, D] of uint8[N, H, W, C] images."""
  tokenizer_patches = patch_tokenizer.image_to_patches(
      jnp.asarray(images, jnp.float32) / 127.5 - 1.0, patch)
  flat = np.asarray(tokenizer_patches).reshape(-1, tokenizer_patches.shape[-1])
  generator = np.random.default_rng(seed)
  index = generator.choice(len(flat), min(count, len(flat)), replace=False)
  return flat[index]


def train(config, workdir: str, train_data: tuple, test_data: tuple,
          data_info: dict | None = None):
  """Fits the codebook, encodes both splits, evaluates and exports.

  Args:
    config: see `configs/fashion_tokenizer.py`.
    workdir: output folder.
    train_data, test_data: (images uint8[N, H, W, C], labels int[N]).
    data_info: data hashes for the manifest.
  Returns:
    (PatchTokenizer, params, eval metrics dict).
  """
  init = config.get('init', 'random')
  if init not in INITS:
    raise cli.ConfigError(f'config.init={init!r}: must be one of {INITS}.')
  if config.num_patches < config.codebook_size:
    raise cli.ConfigError(f'config.num_patches={config.num_patches} is below '
                          f'config.codebook_size={config.codebook_size}: k-means needs at least '
                          'one patch per code; raise num_patches or lower codebook_size.')
  os.makedirs(workdir, exist_ok=True)
  start = time.time()
  tokenizer = patch_tokenizer.PatchTokenizer(patch_tokenizer.PatchTokenizerConfig(
      codebook_size=config.codebook_size, patch_size=config.patch_size,
      in_channels=train_data[0].shape[-1]))
  grid = tokenizer.latent_grid(*train_data[0].shape[1:3])
  patches = sample_patches(train_data[0], config.patch_size, config.num_patches, config.seed)
  logging.info('kmeans: %d codes on %d patches of %d values', config.codebook_size,
               len(patches), patches.shape[1])
  try:
    codebook, history = fit_kmeans(patches, config.codebook_size, config.iterations,
                                   config.seed, init)
  except TooFewPatchesError as error:
    raise cli.ConfigError(f'kmeans: {str(error).rstrip(".")} ({len(train_data[0])} training '
                          'images): raise config.max_examples (0 = every image) or lower '
                          'config.codebook_size.') from error
  params = patch_tokenizer.init_params(tokenizer.config, codebook)
  fit_seconds = time.time() - start

  logging.info('kmeans: encoding %d train and %d test images', len(train_data[0]),
               len(test_data[0]))
  train_tokens = train_vq.encode_all(tokenizer, params, train_data[0], config.eval_batch_size)
  test_tokens = train_vq.encode_all(tokenizer, params, test_data[0], config.eval_batch_size)
  metrics = train_vq.reconstruction_metrics(tokenizer, params, test_data[0], test_tokens,
                                            config.eval_batch_size)
  metrics.update(final_inertia=history[-1]['inertia'], fit_seconds=fit_seconds,
                 total_seconds=time.time() - start)
  files.write_json(os.path.join(workdir, 'vq_eval.json'), metrics)
  logging.info('kmeans: test PSNR %.2f dB, codebook usage %.3f, perplexity %.1f',
               metrics['test_psnr_db'], metrics['codebook_usage'],
               metrics['codebook_perplexity'])
  tokens_path = train_vq.write_tokens(workdir, tokenizer.vocab_size, grid, train_tokens,
                                      train_data[1], test_tokens, test_data[1])
  export = common.write_params_atomic(
      os.path.join(workdir, train_vq.TOKENIZER_DIR), params,
      config=tokenizer.config.to_dict(), source_files=[],
      converter='specdec_jax.app.train.kmeans_tokenizer',
      extra_meta={'kind': 'patch_kmeans', 'iterations': config.iterations}, overwrite=True)
  train_vq.write_manifest(
      workdir, config=config, steps=config.iterations, data=data_info, metrics=metrics,
      extra={'tokenizer_dir': str(export), 'tokens_sha256': files.sha256(tokens_path),
             'kmeans_history': history})
  return tokenizer, params, metrics


def load_splits(config) -> tuple:
  """((train images, labels), (test images, labels), data info) at 28x28x1."""
  directory = config.get('data_dir') or None
  train_images, train_labels = fashion_mnist.load('train', directory)
  test_images, test_labels = fashion_mnist.load('test', directory)
  limit = config.get('max_examples') or None
  info = {'fashion_mnist_sha256': fashion_mnist.hashes(directory),
          'examples_per_split': limit or 'all'}
  return ((train_images[:limit, ..., None], train_labels[:limit]),
          (test_images[:limit, ..., None], test_labels[:limit]), info)


def main(argv):
  del argv
  config = flags.FLAGS.config
  train_data, test_data, info = load_splits(config)
  train(config, flags.FLAGS.workdir, train_data, test_data, info)


if __name__ == '__main__':
  command.run(main, os.path.abspath(fashion_tokenizer_config.__file__))
