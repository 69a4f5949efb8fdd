"""The shared training loop learns, checkpoints and resumes."""

import functools
import itertools
import json
import os
import shutil
import tempfile
import time
import types
from unittest import mock

from absl.testing import absltest
import ml_collections
import numpy as np
import pytest

import jax
import jax.numpy as jnp
import optax

from specdec_jax.app import cli
from specdec_jax.app import fashion_mnist
from specdec_jax.app import run_record
from specdec_jax.app import training
from specdec_jax import testing
from specdec_jax.app.train import classifier as train_classifier
from specdec_jax.configs import classifier as classifier_config
from specdec_jax.models import classifier as classifier_model


def synthetic_split(num, seed):
  """Class c images are a bright square at a class-specific place (learnable)."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 4, num).astype(np.int32)
  images = rng.integers(0, 40, (num, 32, 32, 1)).astype(np.uint8)
  for i, label in enumerate(labels):
    row, col = divmod(int(label), 2)
    images[i, 4 + 14 * row:14 + 14 * row, 4 + 14 * col:14 + 14 * col] = 220
  return images, labels


class ClassifierTrainingTest(absltest.TestCase):

  def test_predict_is_the_model_in_batches_compiled_once(self):
    model = classifier_model.Classifier()
    images = np.random.default_rng(0).integers(0, 256, (7, 28, 28, 1), dtype=np.uint8)
    params = model.init(jax.random.key(0), images[:1])
    logits, features = train_classifier.predict(model, params, images, batch_size=3)
    want_logits, want_features = model.apply(params, images)
    np.testing.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(features, want_features, rtol=1e-5, atol=1e-5)
    with testing.jaxpr_traces() as traces:
      train_classifier.predict(model, params, images, batch_size=3)  # batches of 3, 3, 1
    self.assertEmpty(traces)  # the first call's two programs are reused

  def test_learns_and_resumes(self):
    config = ml_collections.ConfigDict(dict(
        seed=0, batch_size=32, num_steps=30, learning_rate=2e-3, warmup_steps=3,
        weight_decay=0.0, log_every=10, save_every=20, data_dir=''))
    train_data, test_data = synthetic_split(512, 0), synthetic_split(128, 1)
    with tempfile.TemporaryDirectory() as workdir:
      _, accuracy = train_classifier.train(config, workdir, train_data, test_data)
      self.assertGreater(accuracy, 0.9)  # chance is 0.25
      config.num_steps = 40  # resume, extended: only steps 31..40 run
      state, _ = train_classifier.train(config, workdir, train_data, test_data)
      self.assertEqual(int(state.step), 40)
      history = json.load(open(os.path.join(workdir, 'classifier_history.json')))
      self.assertEqual([h['step'] for h in history], [10, 20, 30, 40])  # kept on resume

  def test_command_trains_on_the_family_images(self):
    """The standalone command trains on the images the family classifies, its
    28x28x1 splits (it once padded them to 32x32: a classifier the family would
    bundle as its finished stage, which its decoded images could not go through)."""
    rng = np.random.default_rng(0)
    splits = {split: (rng.integers(0, 256, (n, 28, 28), np.uint8),
                      rng.integers(0, 10, n).astype(np.int32))
              for split, n in (('train', 6), ('test', 4))}
    config, seen = classifier_config.get_config(), {}
    with mock.patch.object(fashion_mnist, 'load', lambda split, _: splits[split]), \
         mock.patch.object(fashion_mnist, 'hashes', return_value={}), \
         mock.patch.object(train_classifier.flags, 'FLAGS',
                           types.SimpleNamespace(config=config, workdir='unused')), \
         mock.patch.object(train_classifier, 'train',
                           lambda _, __, train, test: seen.update(train=train, test=test)):
      train_classifier.main([])
    for split in ('train', 'test'):
      images, labels = seen[split]
      np.testing.assert_array_equal(images, splits[split][0][..., None])  # [N, 28, 28, 1]
      np.testing.assert_array_equal(labels, splits[split][1])


def _counting_step(state, batch, key, sleep_s=0.0):
  del batch, key
  time.sleep(sleep_s)
  return state.replace(step=state.step + 1), {'loss': state.step.astype(jnp.float32)}


def _fit(workdir, batches, **kw):
  state = training.init_state({'w': jnp.ones(3)}, training.adamw(1e-3, total_steps=100))
  return training.fit(_counting_step, state, batches, workdir=workdir, key=jax.random.key(0),
                      **kw)


class FitTest(absltest.TestCase):

  def test_counts_below_one_are_refused_before_any_step(self):
    batches = training.epoch_batches((np.zeros((8, 1)),), 2, 0)
    for kw in (dict(log_every=0), dict(save_every=0)):
      with self.subTest(str(kw)), tempfile.TemporaryDirectory() as workdir:
        with self.assertRaisesRegex(ValueError, f'{next(iter(kw))}=0: must be an integer >= 1'):
          _fit(workdir, batches, num_steps=4, **kw)
    with self.assertRaisesRegex(ValueError, 'batch_size=0: must be an integer >= 1'):
      training.epoch_batches((np.zeros((8, 1)),), 0, 0)
    with self.assertRaisesRegex(cli.ConfigError, r'config.batch_size=9 exceeds the 8 training '
                                r'examples; set config.batch_size to at most 8'):
      training.epoch_batches((np.zeros((8, 1)),), 9, 0)

  def test_a_resumed_run_keeps_the_history_up_to_its_checkpoint(self):
    """Killed after 10 steps (last checkpoint at 8): the resumed history is the
    earlier entries up to step 8, then the new ones."""
    batches = training.epoch_batches((np.zeros((8, 1)),), 2, 0)
    kw = dict(num_steps=16, log_every=2, save_every=8)
    with tempfile.TemporaryDirectory() as workdir:
      _fit(workdir, lambda start: itertools.islice(batches(start), 10 - start), **kw)
      _, history = _fit(workdir, batches, **kw)
      with open(os.path.join(workdir, 'train_history.json')) as f:
        self.assertEqual(json.load(f), history)
      self.assertEqual([h['step'] for h in history], [2, 4, 6, 8, 10, 12, 14, 16])
      self.assertEqual(history[4]['loss'], 8.5)  # the mean of the resumed steps 8 and 9

  def test_the_steps_before_the_time_budget_ends_are_logged(self):
    budget = training.TimeBudget(minutes=0.3 / 60, peak_lr=1e-3)
    state = training.init_state({'w': jnp.ones(3)},
                                training.adamw(1e-3, total_steps=100, time_budget=True))
    with tempfile.TemporaryDirectory() as workdir:
      state, history = training.fit(
          functools.partial(_counting_step, sleep_s=0.03), state,
          training.epoch_batches((np.zeros((8, 1)),), 2, 0), num_steps=10_000,
          workdir=workdir, key=jax.random.key(0), log_every=1000, budget=budget)
    self.assertLen(history, 1)
    self.assertEqual(history[0]['step'], int(state.step))
    self.assertEqual(history[0]['loss'], (int(state.step) - 1) / 2)  # mean of 0..step-1


def _run_config(**overrides):
  values = dict(seed=0, learning_rate=1e-3, batch_size=2, num_steps=8, train_minutes=0.0,
                log_every=2, save_every=4, fast_compile=False, tokens_path='a/tokens.npz',
                model=dict(dim=32, n_layer=2))
  values.update(overrides)
  return ml_collections.ConfigDict(values)


class ResumeConfigTest(absltest.TestCase):
  """A resumed run is the recorded run: fields that shape the training must match."""

  batches = staticmethod(training.epoch_batches((np.zeros((8, 1)),), 2, 0))

  def fit(self, workdir, config, stop_at=None):
    batches = self.batches
    if stop_at is not None:
      batches = lambda start: itertools.islice(self.batches(start), stop_at - start)
    return _fit(workdir, batches, num_steps=config.num_steps, log_every=config.log_every,
                save_every=config.save_every, config=config)

  def test_a_resume_with_another_config_is_refused(self):
    with tempfile.TemporaryDirectory() as workdir:
      self.fit(workdir, _run_config(), stop_at=5)  # killed after step 5; checkpoint at 4
      for field, value, recorded in (('learning_rate', 0.05, 0.001), ('seed', 3, 0),
                                     ('model.dim', 64, 32), ('train_minutes', 5.0, 0.0)):
        changed = _run_config()
        changed.update_from_flattened_dict({field: value})
        with self.subTest(field), self.assertRaisesRegex(
            cli.ConfigError, rf"holds checkpoints of a run with another config or input files: "
            rf"config.{field}={value!r} \(the checkpoints' run: {recorded!r}\)"):
          self.fit(workdir, changed)
      # How often it logs and saves, how fast it compiles and where its inputs are may change.
      state, _ = self.fit(workdir, _run_config(log_every=1, save_every=2, fast_compile=True,
                                               tokens_path='b/tokens.npz'))
      self.assertEqual(int(state.step), 8)

  def test_a_resume_with_other_input_files_is_refused(self):
    """The files a run reads (`inputs`: their hashes) are compared where both the record
    and the caller know them."""
    with tempfile.TemporaryDirectory() as workdir:
      fit = lambda inputs: _fit(workdir, self.batches, num_steps=8, log_every=2, save_every=4,
                                config=_run_config(), inputs=inputs)
      _fit(workdir, lambda start: itertools.islice(self.batches(start), 5 - start),
           num_steps=8, log_every=2, save_every=4, config=_run_config(),
           inputs={'tokens_sha256': 'aa'})
      with self.assertRaisesRegex(cli.ConfigError, "another config or input files: input "
                                  r"tokens_sha256 'bb' \(the checkpoints' run: 'aa'\)"):
        fit({'tokens_sha256': 'bb'})
      state, _ = fit(None)  # a caller that does not hash its inputs
      self.assertEqual(int(state.step), 8)
      with open(os.path.join(workdir, run_record.RUN_CONFIG_FILE)) as f:
        self.assertEqual(json.load(f)[run_record.INPUTS_PREFIX + 'tokens_sha256'], 'aa')

  def test_a_record_without_inputs_accepts_them_and_keeps_them(self):
    with tempfile.TemporaryDirectory() as workdir:
      self.fit(workdir, _run_config(), stop_at=5)  # recorded without inputs
      state, _ = _fit(workdir, self.batches, num_steps=8, log_every=2, save_every=4,
                      config=_run_config(), inputs={'tokens_sha256': 'cc'})
      self.assertEqual(int(state.step), 8)
      with open(os.path.join(workdir, run_record.RUN_CONFIG_FILE)) as f:
        self.assertEqual(json.load(f)[run_record.INPUTS_PREFIX + 'tokens_sha256'], 'cc')

  def test_a_run_may_be_extended_but_not_cut_below_its_checkpoint(self):
    with tempfile.TemporaryDirectory() as workdir:
      self.fit(workdir, _run_config())  # checkpoint at 8
      with self.assertRaisesRegex(cli.ConfigError, 'holds a checkpoint of step 8, past '
                                  'config.num_steps=6; set num_steps to 8 or more'):
        self.fit(workdir, _run_config(num_steps=6))
      with self.assertLogs(level='WARNING') as logs:
        state, _ = self.fit(workdir, _run_config(num_steps=12))
      self.assertEqual(int(state.step), 12)
      self.assertIn('resumed with another length (num_steps 8 -> 12)', ' '.join(logs.output))
      with open(os.path.join(workdir, run_record.RUN_CONFIG_FILE)) as f:
        self.assertEqual(json.load(f)['num_steps'], 12)  # the record follows the extension

  def test_a_failed_start_does_not_fix_the_config(self):
    """Without a checkpoint there is nothing to continue: any config may start afresh."""
    with tempfile.TemporaryDirectory() as workdir:
      self.fit(workdir, _run_config(), stop_at=2)  # no checkpoint yet (save_every 4)
      state, _ = self.fit(workdir, _run_config(learning_rate=0.05))
      self.assertEqual(int(state.step), 8)

  # orbax's refused restore closes its event loop under a pending callback (and leaves
  # read coroutines unawaited: pyproject.toml's filter, as they are collected later).
  @pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
  def test_a_checkpoint_of_another_shape_is_a_config_error(self):
    """A workdir from before the record: orbax's shape error becomes one message."""
    with tempfile.TemporaryDirectory() as workdir:
      _fit(workdir, self.batches, num_steps=4, save_every=4)
      other = training.init_state({'w': jnp.ones(5)}, training.adamw(1e-3, total_steps=100))
      with self.assertRaisesRegex(cli.ConfigError, r'the checkpoint of step 4 in .* does not '
                                  r"fit this run's model or optimizer \(Requested shape"):
        training.fit(_counting_step, other, self.batches, num_steps=8, workdir=workdir,
                     key=jax.random.key(0), config=_run_config())


class RunRecordTest(absltest.TestCase):
  """run_record's comparison on its own: which fields a resume may change."""

  def setUp(self):
    super().setUp()
    self.workdir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.workdir)

  def recorded(self, step_folder: str = '4', **config):
    run_record.record(self.workdir, config, 'test', resumed=False)
    os.makedirs(os.path.join(run_record.checkpoint_dir(self.workdir), step_folder))

  def test_paths_and_folders_may_move(self):
    self.recorded(data_dir='/old/data', tokens_path='/old/t.npz', learning_rate=0.1)
    run_record.check_resume(self.workdir, dict(data_dir='/new/data', tokens_path='/new/t.npz',
                                               learning_rate=0.1))
    with self.assertRaisesRegex(cli.ConfigError, 'config.learning_rate=0.2'):
      run_record.check_resume(self.workdir, dict(data_dir='/old/data', tokens_path='/old/t.npz',
                                                 learning_rate=0.2))

  def test_a_killed_save_is_not_a_checkpoint(self):
    self.recorded(step_folder='4.orbax-checkpoint-tmp', learning_rate=0.1)
    self.assertFalse(run_record.has_checkpoints(self.workdir))
    run_record.check_resume(self.workdir, dict(learning_rate=0.2))  # nothing to continue

  def test_a_time_budget_may_grow_but_not_become_a_step_schedule(self):
    self.recorded(train_minutes=5.0, learning_rate=0.1)
    run_record.check_resume(self.workdir, dict(train_minutes=10.0, learning_rate=0.1))
    with self.assertRaisesRegex(cli.ConfigError, 'config.train_minutes=0.0'):
      run_record.check_resume(self.workdir, dict(train_minutes=0.0, learning_rate=0.1))


class TimeBudgetTest(absltest.TestCase):

  def test_schedule_closed_form(self):
    """Warm-up by steps, constant, then linear decay to 5% over the last fifth of the time."""
    budget = training.TimeBudget(minutes=10.0, peak_lr=2.0, warmup_steps=4)
    self.assertAlmostEqual(budget.learning_rate(0, 0.0), 0.5)  # step 1 of 4
    self.assertAlmostEqual(budget.learning_rate(3, 10.0), 2.0)
    self.assertAlmostEqual(budget.learning_rate(100, 479.0), 2.0)  # before 80% of 600 s
    self.assertAlmostEqual(budget.learning_rate(100, 540.0), 2.0 * (1 - 0.95 * 0.5))
    self.assertAlmostEqual(budget.learning_rate(100, 600.0), 0.1)
    self.assertAlmostEqual(budget.learning_rate(100, 900.0), 0.1)
    with self.assertRaisesRegex(ValueError, 'minutes > 0'):
      training.TimeBudget(minutes=0.0, peak_lr=1.0)
    config = ml_collections.ConfigDict(dict(train_minutes=-1.0, learning_rate=1.0))
    with self.assertRaisesRegex(ValueError, 'train_minutes must be >= 0'):
      training.time_budget_from(config)
    config.train_minutes = 0.0
    self.assertIsNone(training.time_budget_from(config))

  def test_fit_stops_on_time_sets_the_rate_and_resumes_the_clock(self):
    """A step that takes 50 ms under a 0.5 s budget stops after about 10 steps, with
    the rate set from the budget every step, and a resumed run does not restart the clock."""
    optimizer = training.adamw(1.0, total_steps=10_000, time_budget=True, clip_norm=None)
    rates = []

    def step(state, batch, key):
      del batch, key
      import time  # pylint: disable=g-import-not-at-top
      time.sleep(0.05)
      rates.append(training.learning_rate_of(state))
      return state.replace(step=state.step + 1), {'loss': jnp.zeros(())}

    budget = training.TimeBudget(minutes=0.5 / 60, peak_lr=1.0, warmup_steps=2)
    batches = lambda start: iter(lambda: (), None)
    with tempfile.TemporaryDirectory() as workdir:
      state = training.init_state({'w': jnp.ones(3)}, optimizer)
      state, _ = training.fit(step, state, batches, num_steps=10_000, workdir=workdir,
                              key=jax.random.key(0), log_every=5, save_every=10_000,
                              budget=budget)
      steps = int(state.step)
      self.assertBetween(steps, 3, 11)
      self.assertGreaterEqual(float(state.elapsed_s), 0.5)
      self.assertAlmostEqual(rates[0], 0.5)  # warm-up step 1 of 2
      self.assertAlmostEqual(rates[1], 1.0)
      self.assertLess(rates[-1], 1.0)  # inside the final decay
      fresh = training.init_state({'w': jnp.ones(3)}, optimizer)
      resumed, _ = training.fit(step, fresh, batches, num_steps=10_000, workdir=workdir,
                                key=jax.random.key(0), budget=budget)
      self.assertEqual(int(resumed.step), steps)  # the budget was already spent

  def test_weight_decay_spares_norm_gains_and_biases(self):
    """With zero gradients AdamW's only update is the decay: kernels shrink by
    lr * wd, 1-D leaves (RMSNorm gains, biases) stay as they are (LlamaGen decays
    only ndim >= 2; decaying the gains pulled a target's to 0.92 on average)."""
    params = {'norm': {'weight': jnp.ones(4)}, 'dense': {'kernel': jnp.ones((4, 3)),
                                                         'bias': jnp.ones(3)}}
    optimizer = training.adamw(1.0, total_steps=10, weight_decay=0.05, clip_norm=None,
                               time_budget=True)
    state = training.set_learning_rate(training.init_state(params, optimizer), 1e-2)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    updates, _ = optimizer.update(zeros, state.opt_state, params)
    np.testing.assert_array_equal(updates['norm']['weight'], 0.0)
    np.testing.assert_array_equal(updates['dense']['bias'], 0.0)
    np.testing.assert_allclose(updates['dense']['kernel'], -1e-2 * 0.05, rtol=1e-6)
    # Without decay there is no mask: the state tree of runs saved before it, resumable.
    plain = training.adamw(1.0, total_steps=10, clip_norm=None).init(params)
    is_masked = lambda node: isinstance(node, optax.MaskedState)
    self.assertFalse(any(map(is_masked, jax.tree.leaves(plain, is_leaf=is_masked))))
    self.assertTrue(any(map(is_masked, jax.tree.leaves(state.opt_state, is_leaf=is_masked))))

  def test_step_schedule_is_kept(self):
    optimizer = training.adamw(1.0, total_steps=100, warmup_steps=10)
    state = training.init_state({'w': jnp.ones(3)}, optimizer)
    self.assertAlmostEqual(training.learning_rate_of(state), 0.0)


if __name__ == '__main__':
  absltest.main()
