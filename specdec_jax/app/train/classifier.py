"""Trains the evaluation classifier and writes its test accuracy and feature statistics.

  python -m specdec_jax.app.train.classifier --config configs/classifier.py \
      --workdir runs/family/classifier

Outputs in --workdir: Orbax checkpoints, `classifier_history.json`,
`classifier_eval.json` (test accuracy), `test_features.npz` (mean and
covariance of the test split's features: the reference for Frechet
distances) and `classifier/` (the exported params, `common.load_params`).
"""

from __future__ import annotations

import functools
import os

from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec_jax.app import evaluation
from specdec_jax.app import files
from specdec_jax.app import training
from specdec_jax.app.train import command
from specdec_jax.app.train import kmeans_tokenizer
from specdec_jax.configs import classifier as classifier_config
from specdec_jax.converters import common
from specdec_jax.models import classifier



def make_step(model, optimizer):
  @jax.jit
  def step(state, batch, key):
    del key
    images, labels = batch

    def loss_fn(params):
      logits, _ = model.apply(params, images)
      loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
      return loss, jnp.mean(jnp.argmax(logits, -1) == labels)

    (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), dict(
        loss=loss, accuracy=accuracy)

  return step


@functools.partial(jax.jit, static_argnums=0)
def _apply(model, params, images):
  """model.apply compiled once per (module, shapes): params are an argument, not
  constants baked into a program built per call."""
  return model.apply(params, images)


def predict(model, params, images, batch_size=500):
  """(logits [N, 10], features [N, F]) of images uint8[N, H, W, 1], in batches."""
  outs = [_apply(model, params, images[i:i + batch_size])
          for i in range(0, len(images), batch_size)]
  return (np.concatenate([np.asarray(o[0]) for o in outs]),
          np.concatenate([np.asarray(o[1]) for o in outs]))


def train(config, workdir, train_data, test_data):
  """Trains on (images uint8[N, H, W, 1], labels) and evaluates on the test split
  (the family: H = W = 28)."""
  model = classifier.Classifier()
  key = jax.random.key(config.seed)
  params = model.init(key, train_data[0][:1])
  budget = training.time_budget_from(config)
  optimizer = training.adamw(config.learning_rate, total_steps=config.num_steps,
                             warmup_steps=config.warmup_steps, weight_decay=config.weight_decay,
                             time_budget=budget is not None)
  state = training.init_state(params, optimizer)
  state, history = training.fit(
      make_step(model, optimizer), state,
      training.epoch_batches(train_data, config.batch_size, config.seed),
      num_steps=config.num_steps, workdir=workdir, key=key, log_every=config.log_every,
      save_every=config.save_every, name='classifier', budget=budget, config=config,
      inputs={'train_data_sha256': files.tree_sha256(list(train_data))})
  logits, features = predict(model, state.params, test_data[0])
  accuracy = evaluation.class_accuracy(logits, test_data[1])
  mean, cov = evaluation.feature_statistics(features)
  with files.atomic_file(os.path.join(workdir, 'test_features.npz')) as f:
    np.savez(f, mean=mean, cov=cov)
  files.write_json(os.path.join(workdir, 'classifier_eval.json'),
                   dict(test_accuracy=accuracy, steps=int(state.step)))
  common.write_params_atomic(
      os.path.join(workdir, 'classifier'), jax.device_get(state.params),
      config={'model': 'Classifier', 'num_classes': 10, 'feature_dim': 128},
      source_files=[], converter='specdec_jax.app.train.classifier',
      extra_meta={'test_accuracy': accuracy, 'steps': int(state.step)}, overwrite=True)
  logging.info('classifier: test accuracy %.4f', accuracy)
  return state, accuracy


def main(argv):
  del argv
  config = flags.FLAGS.config
  # The family's own splits (28x28x1, what its tokenizer reads and its decodes give):
  # a classifier trained on other images cannot classify the family's.
  train_data, test_data, _ = kmeans_tokenizer.load_splits(config)
  train(config, flags.FLAGS.workdir, train_data, test_data)




if __name__ == '__main__':
  command.run(main, os.path.abspath(classifier_config.__file__))
