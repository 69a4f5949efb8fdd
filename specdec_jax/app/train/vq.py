"""Trains the small VQ tokenizer of the bundled model family on Fashion-MNIST.

  python -m specdec_jax.app.train.vq --config configs/fashion_vq.py --workdir runs/fashion_vq

Outputs in --workdir:
  checkpoints/          Orbax training checkpoints (resumable).
  vq_history.json       logged training metrics.
  tokenizer/            the final tokenizer, loadable with
                        `specdec_jax.converters.vq.load_tokenizer`.
  vq_eval.json          test-split reconstruction MSE (images in [-1, 1]) and
                        PSNR (uint8 images), codebook usage.
  tokens.npz            token grids of both splits for the GPT trainers:
                        train_tokens / test_tokens int16[N, L], train_labels /
                        test_labels int32[N], grid int[2], vocab_size int.
  manifest.json         command line, config, data hashes, steps, metrics, date.

Losses are `models.vq.vq_losses` (reconstruction + codebook + commitment,
straight-through). Dead codes: every `dead_code_every` steps, codebook rows
that no latent of the current batch chose are re-initialised from random
latents of that batch (a cheap restart that keeps the whole codebook in use).

`config.max_examples` limits both splits (smoke runs); `config.fast_compile`
trades step speed for shorter compiles (tests). The helpers under "shared by
the trainers" (manifest, committed state, compile options) are used by
`train.gpt` and `train.drafter` too.

Legend: B batch, H/W image size, C channels, h/w token grid, L = h*w tokens,
V codebook size, Cq codebook dim.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import sys
from typing import Any

from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec_jax.app import cli
from specdec_jax.app import fashion_mnist
from specdec_jax.app import files
from specdec_jax.app import training
from specdec_jax.app.train import command
from specdec_jax.configs import fashion_vq as fashion_vq_config
from specdec_jax.converters import common
from specdec_jax.models import vq


TOKENIZER_DIR = 'tokenizer'
TOKENS_FILE = 'tokens.npz'

# XLA options that compile about 30% faster on CPU and run slower: for tests
# and smoke runs (`--config.fast_compile=True`).
# Level 0 stays here: training steps hold no top-k + top-p filter, where it changed
# the decode's laws (specdec_jax/xla_options.py, whose FAST_COMPILE dropped it).
FAST_COMPILE = {'xla_backend_optimization_level': 0, 'xla_llvm_disable_expensive_passes': True}


def token_dtype(vocab_size: int):
  """The smallest integer dtype tokens.npz stores ids of a vocabulary in (int16 or int32)."""
  return np.int16 if vocab_size <= np.iinfo(np.int16).max + 1 else np.int32


def write_tokens(workdir: str, vocab_size: int, grid, train_tokens, train_labels, test_tokens,
                 test_labels) -> str:
  """Writes <workdir>/tokens.npz (`files.atomic_file`) and returns its
  path: both splits' token grids [N, L] in `token_dtype`, their int32 labels, the grid
  and vocab_size."""
  dtype = token_dtype(vocab_size)
  tokens_path = os.path.join(workdir, TOKENS_FILE)
  with files.atomic_file(tokens_path) as f:
    np.savez(f, train_tokens=train_tokens.astype(dtype),
             train_labels=np.asarray(train_labels, np.int32),
             test_tokens=test_tokens.astype(dtype),
             test_labels=np.asarray(test_labels, np.int32),
             grid=np.asarray(grid), vocab_size=np.asarray(vocab_size))
  return tokens_path


# ------------------------------------------------- shared by the trainers ---


def write_manifest(workdir: str, *, config: Any, steps: int, metrics: dict,
                   data: dict | None = None, extra: dict | None = None) -> str:
  """Writes `manifest.json` (command line, config, data hashes, steps, metrics, date).

  Shared by the trainers of the bundled model family (VQ, GPTs, drafter).

  Args:
    workdir: the output folder.
    config: the ml_collections ConfigDict (or dict) of the run.
    steps: training steps done.
    metrics: final metrics (JSON-serialisable scalars).
    data: what the run trained on (file hashes, sizes); None for synthetic data.
    extra: anything else worth recording (parameter counts, output folders).
  Returns:
    The manifest path.
  """
  manifest = {
      'command': list(sys.argv),
      'config': config.to_dict() if hasattr(config, 'to_dict') else dict(config),
      'data': data if data is not None else {'synthetic': True},
      'steps': int(steps),
      'metrics': metrics,
      'date': datetime.datetime.now(datetime.timezone.utc).isoformat(),
  }
  manifest.update(extra or {})
  path = os.path.join(workdir, 'manifest.json')
  files.write_atomic(path, json.dumps(manifest, indent=1, default=str).encode())
  return path


def step_compiler_options(config) -> dict | None:
  """XLA options for a trainer's step: FAST_COMPILE if `config.fast_compile`."""
  return dict(FAST_COMPILE) if config.get('fast_compile', False) else None


# ----------------------------------------------------------------- model ---


def tokenizer_from_config(config) -> vq.VQTokenizer:
  """`VQTokenizer(small_vq_config(**config.vq))` (lists become tuples); cli.ConfigError
  when `config.vq` makes no tokenizer."""
  fields = {k: tuple(v) if isinstance(v, (list, tuple)) else v
            for k, v in config.vq.to_dict().items()}
  try:
    return vq.VQTokenizer(vq.small_vq_config(**fields))
  except (TypeError, ValueError, ZeroDivisionError) as error:
    raise cli.ConfigError(f'config.vq makes no tokenizer: {error} Set config.vq.* '
                          'accordingly.') from None


def restart_dead_codes(params: Any, tokens: jax.Array, latents: jax.Array,
                       key: jax.Array) -> tuple[Any, jax.Array]:
  """Re-initialises codebook rows that no latent chose from random batch latents.

  Args:
    params: tokenizer params (`quantize/embedding` [V, Cq] is replaced).
    tokens: int32[B, L] codes chosen in the batch.
    latents: [B, L, Cq] pre-quant latents (L2-normalised if the codebook is).
    key: PRNG key picking the replacement latents.
  Returns:
    (params, number of rows restarted).
  """
  table = params['quantize']['embedding']  # [V, Cq]
  counts = jnp.zeros(table.shape[0], jnp.int32).at[tokens.reshape(-1)].add(1)  # [V]
  flat = latents.reshape(-1, latents.shape[-1])  # [B*L, Cq]
  picks = jax.random.randint(key, (table.shape[0],), 0, flat.shape[0])
  dead = counts == 0
  new_table = jnp.where(dead[:, None], flat[picks].astype(table.dtype), table)
  params = dict(params, quantize=dict(params['quantize'], embedding=new_table))
  return params, jnp.sum(dead)


def make_step(tokenizer: vq.VQTokenizer, optimizer, dead_code_every: int,
              compiler_options: dict | None = None):
  """The jitted (state, images uint8[B, H, W, C], key) -> (state, metrics) step."""
  config = tokenizer.config

  def step(state, batch, key):
    images = batch[0]

    def loss_fn(params):
      return vq.vq_losses(tokenizer, params, images)

    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    tokens = aux['tokens']  # [B, L]
    usage = jnp.mean(jnp.zeros(config.codebook_size).at[tokens.reshape(-1)].set(1.0))
    restarted = jnp.zeros((), jnp.int32)
    if dead_code_every > 0:
      def restart(params):
        latents = tokenizer.encode_latents(params, images)  # [B, h, w, Cq]
        if config.codebook_l2_norm:
          latents = vq.l2_normalize(latents)
        latents = jax.lax.stop_gradient(latents.reshape(tokens.shape + (-1,)))
        return restart_dead_codes(params, tokens, latents, key)

      due = (state.step + 1) % dead_code_every == 0
      params, restarted = jax.lax.cond(
          due, restart, lambda p: (p, jnp.zeros((), jnp.int32)), params)
    metrics = dict(loss=loss, reconstruction=aux['reconstruction'],
                   codebook=aux['codebook'], batch_code_usage=usage,
                   restarted=restarted.astype(jnp.float32))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return jax.jit(step, compiler_options=compiler_options)


@functools.lru_cache(maxsize=4)
def optimizer_and_step(tokenizer: vq.VQTokenizer, optimizer_settings: tuple,
                       dead_code_every: int, compiler_options: tuple = ()):
  """(optimizer, jitted step), cached so a resumed run in the same process reuses
  the compiled step.

  Args:
    tokenizer: the VQTokenizer.
    optimizer_settings: sorted (name, value) pairs of `training.adamw` arguments.
    dead_code_every: see `make_step`.
    compiler_options: sorted (name, value) pairs of XLA options.
  """
  optimizer = training.adamw(**dict(optimizer_settings))
  return optimizer, make_step(tokenizer, optimizer, dead_code_every,
                              dict(compiler_options) or None)


# ------------------------------------------------------------ evaluation ---


def encode_all(tokenizer: vq.VQTokenizer, params: Any, images: np.ndarray,
               batch_size: int) -> np.ndarray:
  """uint8[N, H, W, C] -> int32[N, L] token grids (raster order)."""
  out = [np.asarray(tokenizer.encode(params, images[i:i + batch_size]))
         for i in range(0, len(images), batch_size)]
  return np.concatenate(out).astype(np.int32)


def reconstruction_metrics(tokenizer: vq.VQTokenizer, params: Any, images: np.ndarray,
                           tokens: np.ndarray, batch_size: int) -> dict:
  """MSE in [-1, 1] space, PSNR of uint8 reconstructions, codebook usage."""
  grid = tokenizer.latent_grid(images.shape[1], images.shape[2])
  squared, squared_uint8 = 0.0, 0.0
  for i in range(0, len(images), batch_size):
    chunk = images[i:i + batch_size]
    decoded = tokenizer.decode(params, tokens[i:i + batch_size], grid)
    target = np.asarray(tokenizer.preprocess(chunk))
    squared += float(np.sum(np.square(np.asarray(decoded) - target)))
    as_uint8 = np.asarray(tokenizer.to_uint8(decoded)).astype(np.float64)
    squared_uint8 += float(np.sum(np.square(as_uint8 - chunk.astype(np.float64))))
  mse = squared / images.size
  mse_uint8 = squared_uint8 / images.size
  counts = np.bincount(tokens.reshape(-1), minlength=tokenizer.vocab_size)
  frequencies = counts / counts.sum()
  used = frequencies[frequencies > 0]
  return dict(
      test_mse=mse,
      test_psnr_db=float(10 * np.log10(255.0 ** 2 / max(mse_uint8, 1e-12))),
      codebook_usage=float(np.mean(counts > 0)),
      codebook_perplexity=float(np.exp(-np.sum(used * np.log(used)))),
  )


# ----------------------------------------------------------------- train ---


def train(config, workdir: str, train_data: tuple, test_data: tuple,
          data_info: dict | None = None):
  """Trains, evaluates, exports the tokenizer and writes the token grids.

  Args:
    config: see `configs/fashion_vq.py`.
    workdir: output folder (resumes from its checkpoints).
    train_data: (images uint8[N, H, W, C], labels int[N]).
    test_data: the same for the test split.
    data_info: data hashes for the manifest (None: synthetic data).
  Returns:
    (final TrainState, eval metrics dict).
  """
  tokenizer = tokenizer_from_config(config)
  image_size = tuple(train_data[0].shape[1:3])
  grid = tokenizer.latent_grid(*image_size)
  params = tokenizer.init(config.seed, image_size)
  settings = dict(learning_rate=config.learning_rate, total_steps=config.num_steps,
                  warmup_steps=config.warmup_steps, weight_decay=config.weight_decay,
                  b1=config.b1, b2=config.b2, clip_norm=config.clip_norm or None)
  optimizer, step = optimizer_and_step(
      tokenizer, tuple(sorted(settings.items())), config.dead_code_every,
      tuple(sorted((step_compiler_options(config) or {}).items())))
  state = training.init_state(params, optimizer)
  state, history = training.fit(
      step, state,
      training.epoch_batches((train_data[0],), config.batch_size, config.seed),
      num_steps=config.num_steps, workdir=workdir, key=jax.random.key(config.seed),
      log_every=config.log_every, save_every=config.save_every, name='vq', config=config,
      inputs={'train_images_sha256': files.tree_sha256(train_data[0])})

  logging.info('vq: encoding %d train and %d test images', len(train_data[0]),
               len(test_data[0]))
  train_tokens = encode_all(tokenizer, state.params, train_data[0], config.eval_batch_size)
  test_tokens = encode_all(tokenizer, state.params, test_data[0], config.eval_batch_size)
  metrics = reconstruction_metrics(tokenizer, state.params, test_data[0], test_tokens,
                                   config.eval_batch_size)
  metrics['train_codebook_usage'] = float(
      np.mean(np.bincount(train_tokens.reshape(-1), minlength=tokenizer.vocab_size) > 0))
  metrics['steps'] = int(state.step)
  files.write_json(os.path.join(workdir, 'vq_eval.json'), metrics)
  logging.info('vq: test MSE %.4f, PSNR %.2f dB, codebook usage %.3f',
               metrics['test_mse'], metrics['test_psnr_db'], metrics['codebook_usage'])

  tokens_path = write_tokens(workdir, tokenizer.vocab_size, grid, train_tokens, train_data[1],
                             test_tokens, test_data[1])

  export = common.write_params_atomic(
      os.path.join(workdir, TOKENIZER_DIR), jax.device_get(state.params),
      config=tokenizer.config, source_files=[], converter='specdec_jax.app.train.vq',
      extra_meta={'kind': 'fashion_vq', 'steps': int(state.step)}, overwrite=True)
  write_manifest(
      workdir, config=config, steps=int(state.step), data=data_info,
      metrics=dict(metrics, final_train=history[-1] if history else {}),
      extra={'tokenizer_dir': str(export), 'tokens_sha256': files.sha256(tokens_path),
             'num_params': vq.param_count(state.params)})
  return state, metrics


def main(argv):
  del argv
  config = flags.FLAGS.config
  tokenizer_from_config(config)  # refuses a config.vq no tokenizer has, before the data loads
  directory = config.data_dir or None
  limit = config.max_examples or None  # smoke runs only; 0 = the full splits
  train_images, train_labels = fashion_mnist.load('train', directory)
  test_images, test_labels = fashion_mnist.load('test', directory)
  info = {'fashion_mnist_sha256': fashion_mnist.hashes(directory),
          'examples_per_split': limit or 'all'}
  train(config, flags.FLAGS.workdir,
        (fashion_mnist.pad_to_32(train_images[:limit]), train_labels[:limit]),
        (fashion_mnist.pad_to_32(test_images[:limit]), test_labels[:limit]),
        data_info=info)




if __name__ == '__main__':
  command.run(main, os.path.abspath(fashion_vq_config.__file__))
