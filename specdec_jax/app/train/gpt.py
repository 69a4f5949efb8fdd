"""Trains a class-conditional LlamaGen GPT on VQ token grids (target or draft GPT).

  python -m specdec_jax.app.train.gpt --config configs/fashion_target.py \
      --workdir runs/family/target
  python -m specdec_jax.app.train.gpt --config configs/fashion_draft_gpt.py \
      --workdir runs/family/draft_gpt

Reads `tokens.npz` written by `specdec_jax.app.train.vq`. Next-token cross-entropy
with teacher forcing (`models.llamagen.forward_logits`); class dropout
replaces a label by the null class `num_classes` with probability
`class_dropout`, so classifier-free guidance works at sampling time.

Outputs in --workdir: Orbax checkpoints, `gpt_history.json`, `model/` (the
final GPT, loadable with `specdec_jax.converters.llamagen.load_llamagen`),
`gpt_eval.json` (test-split NLL per token, conditional and unconditional) and
`manifest.json`.

Legend: B batch, N image tokens (block_size), V vocabulary, K classes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import zipfile
import zlib

from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec_jax.app import cli
from specdec_jax.app import files
from specdec_jax.app import training
from specdec_jax.app.train import command
from specdec_jax.app.train import vq as train_vq
from specdec_jax.configs import fashion_target as fashion_target_config
from specdec_jax.converters import common
from specdec_jax.models import llamagen


MODEL_DIR = 'model'


# ------------------------------------------------------------------ data ---


def load_tokens(path: str) -> dict:
  """Reads `tokens.npz` of the VQ trainer; tokens become int32.

  Returns:
    dict with train_tokens / test_tokens int32[N, L], train_labels /
    test_labels int32[N], vocab_size int, grid (h, w), and `data_info` (the
    file's sha256 plus the VQ run's data hashes when its manifest sits beside it).
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f'tokens file {path!r} not found: train a tokenizer first (`python -m '
        'specdec_jax.app.train.kmeans_tokenizer`, the bundle\'s, or `train.vq`) and point '
        '--config.tokens_path at its <workdir>/tokens.npz.')
  data = _read_npz(path)
  for name in ('train_tokens', 'train_labels', 'test_tokens', 'test_labels', 'vocab_size'):
    if name not in data:
      raise cli.ConfigError(f'tokens file {path!r} lacks {name!r}: it was not written by a '
                            'tokenizer trainer; point --config.tokens_path at its tokens.npz.')
  out = {k: data[k].astype(np.int32) for k in
         ('train_tokens', 'train_labels', 'test_tokens', 'test_labels')}
  out['vocab_size'] = int(data['vocab_size'])
  out['grid'] = tuple(int(g) for g in data.get('grid', ()))
  info = {'tokens_file': os.path.abspath(path), 'tokens_sha256': files.sha256(path)}
  vq_manifest = os.path.join(os.path.dirname(path), 'manifest.json')
  if os.path.isfile(vq_manifest):
    with open(vq_manifest) as f:
      info['vq_run_data'] = json.load(f).get('data')
  out['data_info'] = info
  return out


def _read_npz(path: str) -> dict:
  """{name: array} of an .npz file; cli.ConfigError for another or a corrupt file."""
  reason = 'one array, not an .npz archive'
  try:
    loaded = np.load(path)
    if isinstance(loaded, np.lib.npyio.NpzFile):
      with loaded:
        return {k: loaded[k] for k in loaded.files}
  except ValueError:  # numpy's guess: pickled data
    reason = 'neither an .npz archive nor an .npy array'
  except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as error:  # a corrupt archive
    reason = str(error).strip().splitlines()[0][:120] if str(error).strip() else repr(error)
  raise cli.ConfigError(f'tokens file {path!r} is not a tokens.npz ({reason}); point '
                        '--config.tokens_path at the <workdir>/tokens.npz of a tokenizer run.')


def class_dropout(key: jax.Array, labels: jax.Array, rate: float, null_class: int) -> jax.Array:
  """Replaces each label by `null_class` with probability `rate` (CFG training).

  Args:
    key: PRNG key.
    labels: int32[B] class ids.
    rate: drop probability in [0, 1].
    null_class: the id of the unconditional class (`num_classes`).
  Returns:
    int32[B].
  """
  drop = jax.random.bernoulli(key, rate, labels.shape)
  return jnp.where(drop, null_class, labels).astype(jnp.int32)


# ----------------------------------------------------------------- model ---


_POSITIVE = cli.integer(1)
_POSITIVE_FIELDS = ('dim', 'n_layer', 'n_head', 'n_kv_head', 'multiple_of', 'ffn_dim')


def check_config(config, where: str = 'config') -> None:
  """Raises cli.ConfigError for a `num_classes` or `model` no GPT can be built
  with (checked before the tokens are read; `train` checks them against the data)."""
  if not _POSITIVE.ok(config.num_classes):
    raise cli.ConfigError(f'{where}.num_classes={config.num_classes!r}: must be '
                          f'{_POSITIVE.accepted} (the labels in the tokens file).')
  for field in _POSITIVE_FIELDS:
    value = config.model.get(field)
    if value is not None and not _POSITIVE.ok(value):
      raise cli.ConfigError(f'{where}.model.{field}={value!r}: must be {_POSITIVE.accepted}.')
  gpt_config_from(config, config.model.get('vocab_size') or 1, 1, where)


def gpt_config_from(config, vocab_size: int, num_tokens: int,
                    where: str = 'config') -> llamagen.GPTConfig:
  """The c2i GPTConfig of `config.model` for a token set (vocab, N); cli.ConfigError
  when `config.model` does not make one."""
  fields = dict(config.model.to_dict())
  if fields.get('vocab_size', 0) not in (0, vocab_size):
    raise cli.ConfigError(f'{where}.model.vocab_size={fields["vocab_size"]} does not match the '
                          f'tokens file (vocab {vocab_size}); leave it 0 to take the data\'s.')
  fields.update(vocab_size=vocab_size, block_size=num_tokens, model_type='c2i',
                num_classes=config.num_classes, dtype='float32')
  try:
    return llamagen.GPTConfig(**fields)
  except (TypeError, ValueError, ZeroDivisionError) as error:
    raise cli.ConfigError(f'{where}.model makes no GPT: {error} Set {where}.model.* '
                          'accordingly.') from None


def check_labels(num_classes: int, data: dict, field: str = 'config.num_classes',
                 fix: str = '') -> None:
  """Raises cli.ConfigError when the tokens file holds labels outside [0, num_classes)
  (the model's embedding would clamp them: it would train on wrong classes)."""
  labels = np.concatenate([data['train_labels'], data['test_labels']])
  if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
    raise cli.ConfigError(
        f'{field}={num_classes}: must cover the labels in the tokens file '
        f'({labels.min()}..{labels.max()}); {fix or f"set it to {labels.max() + 1} or more"}.')


def init_like_llamagen(shapes, seed: int, zero_init: tuple[str, ...] = ('output',)):
  """Parameters drawn as LlamaGen's `initialize_weights` does, on the host.

  Dense kernels and embeddings ~ N(0, 0.02) (`initializer_range`), biases 0,
  RMSNorm weights 1, and the modules named in `zero_init` all zero (LlamaGen
  zeroes its `output` head). numpy draws them: compiling Flax's initialisers
  on CPU takes longer than training a tiny model for a few steps.

  Args:
    shapes: the param tree with array or jax.ShapeDtypeStruct leaves.
    seed: numpy seed.
    zero_init: top-level module names initialised to zero.
  Returns:
    The param tree of float32 jax arrays.
  """
  generator = np.random.default_rng(seed)

  def draw(path, leaf):
    names = [str(getattr(p, 'key', p)) for p in path]
    if names[0] in zero_init or names[-1] == 'bias':
      value = np.zeros(leaf.shape, np.float32)
    elif names[-1] in ('kernel', 'embedding'):
      value = 0.02 * generator.standard_normal(leaf.shape, np.float32)
    elif names[-1] in ('weight', 'scale'):  # RMSNorm
      value = np.ones(leaf.shape, np.float32)
    else:
      raise ValueError(f'init_like_llamagen: no rule for parameter {"/".join(names)}.')
    return jnp.asarray(value)

  return jax.tree_util.tree_map_with_path(draw, shapes)


def token_nll(params, gpt: llamagen.GPTConfig, labels: jax.Array,
              tokens: jax.Array) -> jax.Array:
  """Per-token negative log-likelihood float32[B, N] under teacher forcing."""
  logits = llamagen.forward_logits(params, gpt, labels, tokens[:, :-1])  # [B, N, V]
  return optax.softmax_cross_entropy_with_integer_labels(logits, tokens)


_token_nll_jit = jax.jit(token_nll, static_argnums=1)


def make_step(gpt: llamagen.GPTConfig, optimizer, dropout_rate: float,
              compiler_options: dict | None = None):
  """The jitted (state, (tokens int32[B, N], labels int32[B]), key) step."""

  def step(state, batch, key):
    tokens, labels = batch
    labels = class_dropout(key, labels, dropout_rate, gpt.num_classes)

    def loss_fn(params):
      nll = token_nll(params, gpt, labels, tokens)  # [B, N]
      return jnp.mean(nll), nll

    (loss, nll), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(loss=loss, first_token_nll=jnp.mean(nll[:, 0]),
                   grad_norm=optax.tree.norm(grads))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return jax.jit(step, compiler_options=compiler_options)


def evaluate_nll(params, gpt: llamagen.GPTConfig, tokens: np.ndarray, labels: np.ndarray,
                 batch_size: int) -> dict:
  """Mean test NLL per token (nats): conditional, and with the null class."""
  totals = {'test_nll': 0.0, 'test_nll_uncond': 0.0}
  for i in range(0, len(tokens), batch_size):
    chunk, chunk_labels = tokens[i:i + batch_size], labels[i:i + batch_size]
    totals['test_nll'] += float(jnp.sum(_token_nll_jit(params, gpt, chunk_labels, chunk)))
    null = np.full_like(chunk_labels, gpt.num_classes)
    totals['test_nll_uncond'] += float(jnp.sum(_token_nll_jit(params, gpt, null, chunk)))
  metrics = {k: v / tokens.size for k, v in totals.items()}
  metrics['test_bits_per_token'] = metrics['test_nll'] / np.log(2.0)
  metrics['uniform_nll'] = float(np.log(gpt.vocab_size))
  return metrics


def export(workdir: str, gpt: llamagen.GPTConfig, params, source_files=(), **meta) -> str:
  """Writes the GPT like the LlamaGen converter does (load with `load_llamagen`)."""
  return str(common.write_params_atomic(
      os.path.join(workdir, MODEL_DIR), jax.device_get(params),
      config=dataclasses.asdict(gpt), source_files=list(source_files),
      converter='specdec_jax.app.train.gpt', extra_meta=dict(model='llamagen_gpt', **meta),
      overwrite=True))


# ----------------------------------------------------------------- train ---


def training_inputs(data: dict) -> dict:
  """{name: sha256} of the token grids a run trains on (`load_tokens` output), for
  the resume check (`training.fit`'s inputs)."""
  return {'train_tokens_sha256': files.tree_sha256(
      [data['train_tokens'], data['train_labels'], data['vocab_size']])}


def train(config, workdir: str, data: dict):
  """Trains on `data` (as returned by `load_tokens`) and evaluates on its test split.

  Returns:
    (final TrainState, GPTConfig, eval metrics dict).
  """
  check_config(config)
  check_labels(config.num_classes, data)
  train_tokens = data['train_tokens']
  gpt = gpt_config_from(config, data['vocab_size'], train_tokens.shape[1])
  model = llamagen.LlamaGenGPT(gpt)
  params = init_like_llamagen(jax.eval_shape(model.init_params, jax.random.key(0)),
                              config.seed)
  num_params = int(sum(np.size(x) for x in jax.tree_util.tree_leaves(params)))
  logging.info('gpt: %d parameters (%d layers, dim %d), vocab %d, %d tokens', num_params,
               gpt.n_layer, gpt.dim, gpt.vocab_size, gpt.block_size)
  budget = training.time_budget_from(config)
  optimizer = training.adamw(config.learning_rate, total_steps=config.num_steps,
                             warmup_steps=config.warmup_steps,
                             weight_decay=config.weight_decay, b1=config.b1, b2=config.b2,
                             clip_norm=config.clip_norm or None,
                             time_budget=budget is not None)
  state = training.init_state(params, optimizer)
  state, history = training.fit(
      make_step(gpt, optimizer, config.class_dropout, train_vq.step_compiler_options(config)),
      state,
      training.epoch_batches((train_tokens, data['train_labels']), config.batch_size,
                             config.seed),
      num_steps=config.num_steps, workdir=workdir, key=jax.random.key(config.seed + 1),
      log_every=config.log_every, save_every=config.save_every, name='gpt', budget=budget,
      config=config, inputs=training_inputs(data))
  metrics = evaluate_nll(state.params, gpt, data['test_tokens'], data['test_labels'],
                         config.eval_batch_size)
  metrics['steps'] = int(state.step)
  files.write_json(os.path.join(workdir, 'gpt_eval.json'), metrics)
  logging.info('gpt: test NLL %.4f nats/token (uncond %.4f, uniform %.4f)',
               metrics['test_nll'], metrics['test_nll_uncond'], metrics['uniform_nll'])
  tokens_file = data.get('data_info', {}).get('tokens_file')
  model_dir = export(workdir, gpt, state.params,
                     source_files=[tokens_file] if tokens_file else [], steps=int(state.step))
  train_vq.write_manifest(
      workdir, config=config, steps=int(state.step), data=data.get('data_info'),
      metrics=dict(metrics, final_train=history[-1] if history else {}),
      extra={'model_dir': model_dir, 'num_params': num_params,
             'gpt_config': dataclasses.asdict(gpt)})
  return state, gpt, metrics


def main(argv):
  del argv
  check_config(flags.FLAGS.config)  # before the tokens are read
  train(flags.FLAGS.config, flags.FLAGS.workdir, load_tokens(flags.FLAGS.config.tokens_path))




if __name__ == '__main__':
  command.run(main, os.path.abspath(fashion_target_config.__file__))
