"""Trains an EAGLE-1 drafter head against a frozen LlamaGen c2i target.

  python -m specdec_jax.app.train.drafter --config configs/fashion_eagle.py \
      --workdir runs/family/eagle

EAGLE-1 training (Li et al., ICML 2024, arXiv 2401.15077):
a teacher-forced target pass gives the features f_i (the target's last hidden
state after its final norm; f_i predicts image token x_i) and the target's
logits at every position. The drafter reads the pairs (Emb(x_i), f_i) and
predicts f^_{i+1}:

  L = v_w * SmoothL1(f^_{i+1}, f_{i+1})                (mean over E, then positions)
    + p_w * CE(softmax(head(f_{i+1})), head(f^_{i+1}))  (soft cross-entropy)

with v_w = 1, p_w = 0.1, uniform feature noise on the drafter's inputs
f <- f + (U[0, 1) - 0.5) * noise_std * 512 / num_positions (training only),
AdamW(0.9, 0.95) and gradient clipping by value. CFG-style mixing: each
sequence uses the null class (the unconditional branch) with probability
`uncond_prob`, for the target's features and hence for the drafter.

The drafter's embedding and LM head are frozen copies of the target's: they
are not in the trained state at all (only `fc` and the decoder layers are),
so no optimiser step can move them.

Data: token sequences of `tokens.npz` (`data_source='dataset'`) or sequences
sampled from the target with the engine's vanilla loop (`'target'`, cached in
<workdir>/target_samples.npz).

Outputs in --workdir: Orbax checkpoints of the trained part,
`drafter_history.json`, `drafter/` (embedding + fc + layers, without the head;
load with `specdec_jax.converters.lantern_drafter.load_drafter(dir,
target_params['output']['kernel'])`), `drafter_eval.json` (held-out losses,
top-1 agreement with the target and the expected one-token acceptance
sum_x min(t, d), before and after training) and `manifest.json`.

Legend: B batch, N image tokens, M = N - 1 drafter positions, E width,
V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec_jax.app import cli
from specdec_jax.app import files
from specdec_jax.app import run_record
from specdec_jax.app import training
from specdec_jax.app.train import command
from specdec_jax.app.train import gpt as train_gpt
from specdec_jax.app.train import target_samples
from specdec_jax.app.train import vq as train_vq
from specdec_jax.configs import fashion_eagle as fashion_eagle_config
from specdec_jax.converters import common
from specdec_jax.converters import llamagen as llamagen_converter
from specdec_jax.models import eagle
from specdec_jax.models import llamagen

DRAFTER_DIR = 'drafter'
FROZEN = ('embed_tokens', 'lm_head')


# -------------------------------------------------------- target features ---


def target_features(target: llamagen.LlamaGenGPT, target_params: Any, labels: jax.Array,
                    tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Teacher-forced target pass over whole sequences.

  Args:
    target: the c2i LlamaGen GPT.
    target_params: its params.
    labels: int32[B] class ids (num_classes = null class).
    tokens: int32[B, N] image tokens.
  Returns:
    (features [B, N, E] after the final norm, logits f32[B, N, V]); index i
    is the position that predicts token i (index 0: the class token).
  """
  batch, num_tokens = tokens.shape
  prefix_length = target.prefix_length(labels)
  cache = target.init_cache(batch, prefix_length + num_tokens - 1)
  prefix = target.prefill(target_params, cache, labels)
  rest = target.forward(target_params, prefix.cache, tokens[:, :-1])
  features = jnp.concatenate([prefix.hidden[:, -1:], rest.hidden], axis=1)
  logits = jnp.concatenate([prefix.logits[:, -1:], rest.logits], axis=1)
  return features, logits


def feature_noise(key: jax.Array, features: jax.Array, noise_std: float) -> jax.Array:
  """EAGLE's uniform augmentation: f + (U[0, 1) - 0.5) * noise_std * 512 / M.

  Args:
    key: PRNG key.
    features: [B, M, E].
    noise_std: EAGLE's "std" (0.2); the width is scaled by 512 / M.
  """
  width = noise_std * 512.0 / features.shape[1]
  uniform = jax.random.uniform(key, features.shape, jnp.float32)
  return features + ((uniform - 0.5) * width).astype(features.dtype)


def smooth_l1(x: jax.Array) -> jax.Array:
  """torch SmoothL1Loss elementwise with beta = 1: 0.5 x^2 if |x| < 1 else |x| - 0.5."""
  absolute = jnp.abs(x)
  return jnp.where(absolute < 1.0, 0.5 * x * x, absolute - 0.5)


def eagle_loss(drafter: eagle.EagleDrafter, params: Any, tokens: jax.Array,
               features: jax.Array, target_logits: jax.Array, *, reg_weight: float = 1.0,
               cls_weight: float = 0.1, noise_key: jax.Array | None = None,
               noise_std: float = 0.0) -> tuple[jax.Array, dict]:
  """EAGLE-1 loss of one batch of teacher-forced sequences.

  Args:
    drafter: the EagleDrafter.
    params: full drafter params (frozen embedding and head included).
    tokens: int32[B, N] image tokens.
    features: [B, N, E] target features (see `target_features`).
    target_logits: f32[B, N, V] target logits at the same positions.
    reg_weight: v_w.
    cls_weight: p_w.
    noise_key: PRNG key for the feature noise; None (evaluation) adds none.
    noise_std: EAGLE's noise "std".
  Returns:
    (loss, metrics: reg, cls, top1 agreement with the target's argmax,
    acceptance = mean sum_x min(t(x), d(x)) at temperature 1).
  """
  inputs = features[:, :-1]  # [B, M, E]: f_i pairs with token i
  if noise_key is not None:
    inputs = feature_noise(noise_key, inputs, noise_std)
  batch, num_positions = tokens.shape[0], tokens.shape[1] - 1
  cache = drafter.init_cache(batch, num_positions)
  out = drafter.forward(params, cache, tokens[:, :-1], inputs)
  predicted = out.hidden.astype(jnp.float32)  # [B, M, E], f^_{i+1}
  wanted = jax.lax.stop_gradient(features[:, 1:]).astype(jnp.float32)
  reg = jnp.mean(smooth_l1(predicted - wanted))
  target_probs = jax.nn.softmax(jax.lax.stop_gradient(target_logits[:, 1:]), axis=-1)
  draft_log_probs = jax.nn.log_softmax(out.logits, axis=-1)  # [B, M, V]
  cls = jnp.mean(-jnp.sum(target_probs * draft_log_probs, axis=-1))
  loss = reg_weight * reg + cls_weight * cls
  metrics = dict(
      loss=loss, reg=reg, cls=cls,
      top1=jnp.mean(jnp.argmax(out.logits, -1) == jnp.argmax(target_logits[:, 1:], -1)),
      acceptance=jnp.mean(jnp.sum(jnp.minimum(target_probs, jnp.exp(draft_log_probs)), -1)))
  return loss, metrics


# ------------------------------------------------------------- the model ---


def drafter_config_from(config, target_config: llamagen.GPTConfig) -> eagle.DrafterConfig:
  """LANTERN's LlamaGen drafter shape for the target, with `config.drafter` overrides."""
  overrides = dict(config.drafter.to_dict()) if 'drafter' in config else {}
  for field in ('num_layers', 'hidden_size', 'num_heads', 'num_kv_heads', 'intermediate_size'):
    if field in overrides and not cli.integer(1).ok(overrides[field]):
      raise cli.ConfigError(f'config.drafter.{field}={overrides[field]!r}: must be an integer '
                            '>= 1.')
  try:
    drafter_config = eagle.llamagen_drafter_config(target_config, dtype='float32', **overrides)
  except (TypeError, ValueError, ZeroDivisionError) as error:
    raise cli.ConfigError(f'config.drafter={overrides} makes no drafter for the target: '
                          f'{error} Set config.drafter.* accordingly.') from None
  if drafter_config.cls_token_num:
    # At inference such a drafter first consumes the condition positions
    # (`EagleDrafter.prefix_pairs`); `eagle_loss` trains on image pairs only.
    raise cli.ConfigError(
        f'train.drafter: the target has {target_config.cls_token_num} condition positions; '
        'this trainer covers class-conditional targets (one), whose drafter has no prefix. '
        'Train caption-conditioned drafters with their condition prefix (LANTERN\'s '
        'training code) and convert them with specdec_jax.converters.lantern_drafter.')
  return drafter_config


def frozen_params(target_params: Any, embedding_source: str = 'tok_embeddings') -> dict:
  """The drafter's frozen parts, taken from the target: embedding and LM head."""
  return {'embed_tokens': {'embedding': eagle.embedding_from_llamagen(target_params,
                                                                      embedding_source)},
          'lm_head': {'kernel': target_params['output']['kernel']}}


def init_trainable(drafter: eagle.EagleDrafter, seed: int) -> dict:
  """fc and decoder-layer params (N(0, 0.02) kernels, zero biases, unit norms)."""
  shapes = jax.eval_shape(drafter.init_params, jax.random.key(0))
  trainable = {k: v for k, v in shapes.items() if k not in FROZEN}
  return train_gpt.init_like_llamagen(trainable, seed, zero_init=())


def optimizer_from(config) -> optax.GradientTransformation:
  """AdamW(b1, b2) with warm-up/cosine decay, after clipping gradients by value."""
  adamw = training.adamw(config.learning_rate, total_steps=config.num_steps,
                         warmup_steps=config.warmup_steps, weight_decay=config.weight_decay,
                         b1=config.b1, b2=config.b2, clip_norm=config.clip_norm or None,
                         time_budget=training.time_budget_from(config) is not None)
  if config.grad_clip_value:
    return optax.chain(optax.clip(config.grad_clip_value), adamw)
  return adamw


def make_step(target: llamagen.LlamaGenGPT, drafter: eagle.EagleDrafter, optimizer, config,
              compiler_options: dict | None = None):
  """(state, batch, key) -> (state, metrics); the target and frozen params are bound.

  The returned function closes over nothing large: it calls a jitted step
  that takes the target params and frozen drafter parts as arguments.
  """
  num_classes = target.config.num_classes

  def step(state, frozen, target_params, batch, key):
    tokens, labels = batch
    dropout_key, noise_key = jax.random.split(key)
    labels = train_gpt.class_dropout(dropout_key, labels, config.uncond_prob, num_classes)
    features, logits = jax.lax.stop_gradient(
        target_features(target, target_params, labels, tokens))

    def loss_fn(trainable):
      return eagle_loss(drafter, dict(trainable, **frozen), tokens, features, logits,
                        reg_weight=config.reg_weight, cls_weight=config.cls_weight,
                        noise_key=noise_key, noise_std=config.noise_std)

    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return jax.jit(step, compiler_options=compiler_options)


@functools.partial(jax.jit, static_argnums=(0, 1, 6, 7))
def _eval_batch(target, drafter, target_params, params, tokens, labels, reg_weight, cls_weight):
  features, logits = target_features(target, target_params, labels, tokens)
  return eagle_loss(drafter, params, tokens, features, logits, reg_weight=reg_weight,
                    cls_weight=cls_weight)[1]


def evaluate(target: llamagen.LlamaGenGPT, drafter: eagle.EagleDrafter, target_params: Any,
             params: Any, tokens: np.ndarray, labels: np.ndarray, batch_size: int,
             config) -> dict:
  """Held-out EAGLE metrics without noise (conditional labels), averaged over sequences."""
  sums, count = {}, 0
  for i in range(0, len(tokens), batch_size):
    rows = len(tokens[i:i + batch_size])
    metrics = _eval_batch(target, drafter, target_params, params, tokens[i:i + batch_size],
                          labels[i:i + batch_size], config.reg_weight, config.cls_weight)
    for k, v in metrics.items():
      sums[k] = sums.get(k, 0.0) + float(v) * rows
    count += rows
  return {k: v / count for k, v in sums.items()}


# ----------------------------------------------------------------- train ---


def train(config, workdir: str, target: llamagen.LlamaGenGPT, target_params: Any, data: dict):
  """Trains the drafter against the frozen target and exports it.

  Args:
    config: see `configs/fashion_eagle.py`.
    workdir: output folder (resumes from its checkpoints).
    target: the c2i LlamaGen GPT.
    target_params: its params (not modified).
    data: `train.gpt.load_tokens` output (test split for evaluation; train
      split for training when data_source == 'dataset').
  Returns:
    (final TrainState of the trained part, DrafterConfig, eval metrics).
  """
  if target.config.model_type != 'c2i':
    raise cli.ConfigError(f'train: the target must be a c2i LlamaGen GPT, got model_type '
                          f'{target.config.model_type!r} (config.target_dir).')
  if data['vocab_size'] != target.config.vocab_size:
    raise cli.ConfigError(f'train: tokens vocab {data["vocab_size"]} != target vocab '
                          f'{target.config.vocab_size}; set config.tokens_path to the VQ run '
                          'the target was trained on.')
  train_gpt.check_labels(target.config.num_classes, data, "the target's num_classes",
                         'set config.tokens_path to the tokens the target was trained on')
  inputs = dict(train_gpt.training_inputs(data),
                target_params_sha256=files.tree_sha256(target_params))
  run_record.check_resume(workdir, config, inputs)  # before the cached samples are read
  target_params = jax.tree_util.tree_map(jnp.asarray, target_params)
  drafter_config = drafter_config_from(config, target.config)
  drafter = eagle.EagleDrafter(drafter_config)
  frozen = frozen_params(target_params, config.embedding_source)
  trainable = init_trainable(drafter, config.seed)
  optimizer = optimizer_from(config)
  state = training.init_state(trainable, optimizer)

  tokens, labels = target_samples.training_sequences(config, workdir, target, target_params,
                                                     data, inputs['target_params_sha256'])
  sequences_info = {'source': config.data_source, 'count': int(len(tokens))}
  if config.data_source == 'target':
    sequences_info['sha256'] = files.sha256(os.path.join(workdir, target_samples.SAMPLES_FILE))
  num_eval = min(config.eval_examples, len(data['test_tokens']))
  eval_data = (data['test_tokens'][:num_eval], data['test_labels'][:num_eval])
  initial = evaluate(target, drafter, target_params, dict(trainable, **frozen), *eval_data,
                     config.eval_batch_size, config)
  jitted = make_step(target, drafter, optimizer, config, train_vq.step_compiler_options(config))
  state, history = training.fit(
      lambda state, batch, key: jitted(state, frozen, target_params, batch, key), state,
      training.epoch_batches((tokens, labels), config.batch_size, config.seed),
      num_steps=config.num_steps, workdir=workdir, key=jax.random.key(config.seed + 1),
      log_every=config.log_every, save_every=config.save_every, name='drafter',
      budget=training.time_budget_from(config), config=config, inputs=inputs)
  final = evaluate(target, drafter, target_params, dict(state.params, **frozen), *eval_data,
                   config.eval_batch_size, config)
  metrics = dict(final, initial=initial, steps=int(state.step), eval_examples=num_eval)
  files.write_json(os.path.join(workdir, 'drafter_eval.json'), metrics)
  logging.info('drafter: held-out loss %.4f -> %.4f, top-1 %.3f -> %.3f, acceptance %.3f -> %.3f',
               initial['loss'], final['loss'], initial['top1'], final['top1'],
               initial['acceptance'], final['acceptance'])

  exported = dict(jax.device_get(state.params), embed_tokens=jax.device_get(
      frozen['embed_tokens']))
  tokens_file = data.get('data_info', {}).get('tokens_file')
  out = common.write_params_atomic(
      os.path.join(workdir, DRAFTER_DIR), exported, config=dataclasses.asdict(drafter_config),
      source_files=[tokens_file] if tokens_file else [], converter='specdec_jax.app.train.drafter',
      extra_meta={'model': 'eagle_drafter', 'steps': int(state.step),
                  'target_dir': config.get('target_dir', '')}, overwrite=True)
  train_vq.write_manifest(
      workdir, config=config, steps=int(state.step), data=data.get('data_info'),
      metrics=dict(metrics, final_train=history[-1] if history else {}),
      extra={'drafter_dir': str(out), 'target_dir': config.get('target_dir', ''),
             'training_sequences': sequences_info,
             'num_trained_params': int(sum(np.size(x) for x in
                                           jax.tree_util.tree_leaves(state.params)))})
  return state, drafter_config, metrics


def main(argv):
  del argv
  config = flags.FLAGS.config
  target_samples.check_data_source(config)  # before the target is loaded
  if not os.path.isdir(config.target_dir):
    raise FileNotFoundError(
        f'config.target_dir {config.target_dir!r} is not a folder: train the target first '
        '(`python -m specdec_jax.app.train.gpt`, which writes <workdir>/model) or give a '
        'LlamaGen checkpoint converted by `python -m specdec_jax.converters.llamagen`.')
  target, target_params = llamagen_converter.load_llamagen(config.target_dir, dtype='float32')
  train(config, flags.FLAGS.workdir, target, target_params,
        train_gpt.load_tokens(config.tokens_path))




if __name__ == '__main__':
  command.run(main, os.path.abspath(fashion_eagle_config.__file__))
