"""The bundled model family's trainers (VQ, GPT, EAGLE drafter) learn, write and resume.

Tiny models and synthetic data: compile time dominates, so each trainer runs
once for a few dozen steps and several properties are checked on that run.
"""

import itertools
import json
import os
import tempfile
from unittest import mock

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from specdec_jax.app import cli
from specdec_jax.app import files
from specdec_jax.app import training
from specdec_jax.app.train import drafter as train_drafter
from specdec_jax.app.train import gpt as train_gpt
from specdec_jax.app.train import target_samples
from specdec_jax.app.train import vq as train_vq
from specdec_jax.converters import lantern_drafter
from specdec_jax.converters import llamagen as llamagen_converter
from specdec_jax.converters import vq as vq_converter
from specdec_jax.models import eagle
from specdec_jax.models import llamagen

VOCAB, GRID, CLASSES = 16, 4, 4
NUM_TOKENS = GRID * GRID


def synthetic_images(num, seed):
  """8x8 images: a bright 4x4 square in a class-specific quadrant on noise."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, CLASSES, num).astype(np.int32)
  images = rng.integers(0, 30, (num, 8, 8, 1)).astype(np.uint8)
  for i, label in enumerate(labels):
    row, col = divmod(int(label), 2)
    images[i, 4 * row:4 * row + 4, 4 * col:4 * col + 4] = 220
  return images, labels


def synthetic_tokens(num, seed):
  """A learnable rule: token t+1 = (token t + class + 1) mod V, first token uniform."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, CLASSES, num).astype(np.int32)
  first = rng.integers(0, VOCAB, num)
  tokens = (first[:, None] + (labels[:, None] + 1) * np.arange(NUM_TOKENS)[None]) % VOCAB
  return tokens.astype(np.int32), labels


def token_data(num_train=512, num_test=64):
  (train_tokens, train_labels), (test_tokens, test_labels) = (
      synthetic_tokens(num_train, 0), synthetic_tokens(num_test, 1))
  return dict(train_tokens=train_tokens, train_labels=train_labels, test_tokens=test_tokens,
              test_labels=test_labels, vocab_size=VOCAB, grid=(GRID, GRID))


def read_json(*parts):
  with open(os.path.join(*parts)) as f:
    return json.load(f)


class ManifestMixin:

  def assert_manifest(self, workdir, steps):
    manifest = read_json(workdir, 'manifest.json')
    self.assertEqual(manifest['steps'], steps)
    for key in ('command', 'config', 'data', 'metrics', 'date'):
      self.assertIn(key, manifest)
    self.assertIsInstance(manifest['command'], list)


# -------------------------------------------------------------------- VQ ---


class VQTrainerTest(absltest.TestCase, ManifestMixin):

  def config(self):
    # One level (no stride), no attention, GroupNorm 8: the shortest compile.
    return ml_collections.ConfigDict(dict(
        seed=0, vq=dict(codebook_size=32, codebook_dim=4, ch=16, ch_mult=(1,),
                        num_res_blocks=1, z_channels=16, attn_levels=(), norm_groups=8),
        batch_size=16, num_steps=25, learning_rate=3e-3, warmup_steps=2, weight_decay=0.0,
        b1=0.9, b2=0.95, clip_norm=1.0, dead_code_every=5, eval_batch_size=64, log_every=5,
        save_every=10, data_dir='', fast_compile=True))

  def test_learns_writes_outputs_and_resumes(self):
    config = self.config()
    train_data, test_data = synthetic_images(128, 0), synthetic_images(64, 1)
    with tempfile.TemporaryDirectory() as workdir:
      # The first run is interrupted after 20 of its 25 steps (its data ends).
      original = training.epoch_batches
      stop_early = lambda *args: lambda start: itertools.islice(original(*args)(start),
                                                                20 - start)
      with mock.patch.object(training, 'epoch_batches', stop_early):
        state, metrics = train_vq.train(config, workdir, train_data, test_data)
      self.assertEqual(int(state.step), 20)  # checkpointed at save_every = 10
      history = read_json(workdir, 'vq_history.json')
      self.assertEqual([h['step'] for h in history], [5, 10, 15, 20])
      self.assertLess(history[-1]['reconstruction'], 0.3 * history[0]['reconstruction'])
      self.assertGreater(sum(h['restarted'] for h in history), 0)  # dead codes were restarted

      with np.load(os.path.join(workdir, 'tokens.npz')) as f:
        tokens = {k: f[k] for k in f.files}
      self.assertEqual(tokens['train_tokens'].shape, (128, 64))  # 8x8 grid, no stride
      self.assertEqual(tokens['test_tokens'].shape, (64, 64))
      self.assertEqual(tokens['train_tokens'].dtype, np.int16)
      np.testing.assert_array_equal(tokens['train_labels'], train_data[1])
      np.testing.assert_array_equal(tokens['grid'], [8, 8])
      self.assertEqual(int(tokens['vocab_size']), 32)
      self.assertLess(int(tokens['test_tokens'].max()), 32)

      evaluation = read_json(workdir, 'vq_eval.json')
      self.assertEqual(evaluation, metrics)
      self.assertGreater(evaluation['codebook_usage'], 0.25)
      self.assertLessEqual(evaluation['codebook_usage'], 1.0)
      self.assertLess(evaluation['test_mse'], 0.1)
      self.assertGreater(evaluation['test_psnr_db'], 15.0)
      self.assert_manifest(workdir, 20)

      # The exported tokenizer reproduces the stored token grids.
      tokenizer, params = vq_converter.load_tokenizer(os.path.join(workdir, 'tokenizer'))
      np.testing.assert_array_equal(tokenizer.encode(params, test_data[0]),
                                    tokens['test_tokens'])

      state, _ = train_vq.train(config, workdir, train_data, test_data)
      self.assertEqual(int(state.step), 25)
      self.assertEqual([h['step'] for h in read_json(workdir, 'vq_history.json')],
                       [5, 10, 15, 20, 25])  # the resumed run keeps the earlier entries
      self.assert_manifest(workdir, 25)

  def test_tokenizer_shapes_no_vq_has_are_refused(self):
    """VQConfig's ValueErrors were tracebacks."""
    for field, value, message in (('norm_groups', 7, 'not divisible by norm_groups=7'),
                                  ('ch_mult', (), 'ch_mult must be non-empty'),
                                  ('codebook_dim', 0, 'codebook_dim must be >= 1')):
      config = self.config()
      config.vq[field] = value
      with self.subTest(field), self.assertRaisesRegex(
          cli.ConfigError, f'config.vq makes no tokenizer: .*{message}.*Set config.vq'):
        train_vq.tokenizer_from_config(config)

  def test_token_dtype_holds_every_id(self):
    """tokens.npz ids fit their dtype (the k-means trainer cast to int16 always)."""
    for vocab in (256, 32768, 32769, 70000):
      dtype = train_vq.token_dtype(vocab)
      self.assertEqual(np.asarray(vocab - 1).astype(dtype), vocab - 1)
    self.assertEqual(train_vq.token_dtype(32768), np.int16)

  def test_restart_dead_codes_replaces_only_unused_rows(self):
    table = jnp.arange(12.0).reshape(6, 2)
    params = {'quantize': {'embedding': table}, 'encoder': {'w': jnp.ones(3)}}
    tokens = jnp.array([[0, 2, 2, 0]])  # rows 1, 3, 4, 5 unused
    latents = jnp.array([[[100.0, 101.0], [102.0, 103.0], [104.0, 105.0], [106.0, 107.0]]])
    new, restarted = train_vq.restart_dead_codes(params, tokens, latents, jax.random.key(0))
    new_table = np.asarray(new['quantize']['embedding'])
    self.assertEqual(int(restarted), 4)
    np.testing.assert_array_equal(new_table[[0, 2]], table[jnp.array([0, 2])])
    candidates = {tuple(row) for row in np.asarray(latents[0])}
    self.assertTrue(all(tuple(new_table[i]) in candidates for i in (1, 3, 4, 5)))
    self.assertIs(new['encoder'], params['encoder'])


# ------------------------------------------------------------------- GPT ---


class GPTTrainerTest(absltest.TestCase, ManifestMixin):

  def test_class_dropout_rate(self):
    labels = jnp.asarray(np.random.default_rng(0).integers(0, 10, 20000), jnp.int32)
    dropped = np.asarray(train_gpt.class_dropout(jax.random.key(1), labels, 0.1, 10))
    is_null = dropped == 10
    self.assertAlmostEqual(is_null.mean(), 0.1, delta=0.01)  # ~5 sigma
    np.testing.assert_array_equal(dropped[~is_null], np.asarray(labels)[~is_null])
    self.assertFalse(np.any(np.asarray(train_gpt.class_dropout(
        jax.random.key(1), labels, 0.0, 10)) == 10))
    self.assertTrue(np.all(np.asarray(train_gpt.class_dropout(
        jax.random.key(1), labels, 1.0, 10)) == 10))

  def test_init_like_llamagen(self):
    shapes = {'output': {'kernel': jax.ShapeDtypeStruct((64, 32), jnp.float32)},
              'layer': {'kernel': jax.ShapeDtypeStruct((256, 128), jnp.float32),
                        'bias': jax.ShapeDtypeStruct((128,), jnp.float32)},
              'norm': {'weight': jax.ShapeDtypeStruct((8,), jnp.float32)}}
    params = train_gpt.init_like_llamagen(shapes, 0)
    self.assertEqual(float(jnp.abs(params['output']['kernel']).max()), 0.0)
    self.assertAlmostEqual(float(jnp.std(params['layer']['kernel'])), 0.02, delta=0.001)
    self.assertEqual(float(jnp.abs(params['layer']['bias']).max()), 0.0)
    np.testing.assert_array_equal(params['norm']['weight'], np.ones(8))

  def test_load_tokens(self):
    with tempfile.TemporaryDirectory() as workdir:
      with self.assertRaisesRegex(FileNotFoundError, 'train a tokenizer first.*kmeans_tokenizer'):
        train_gpt.load_tokens(os.path.join(workdir, 'missing.npz'))
      data = token_data(8, 4)
      path = os.path.join(workdir, 'tokens.npz')
      np.savez(path, train_tokens=data['train_tokens'].astype(np.int16),
               train_labels=data['train_labels'],
               test_tokens=data['test_tokens'].astype(np.int16),
               test_labels=data['test_labels'], grid=np.array([GRID, GRID]),
               vocab_size=np.array(VOCAB))
      loaded = train_gpt.load_tokens(path)
      self.assertEqual(loaded['train_tokens'].dtype, np.int32)
      np.testing.assert_array_equal(loaded['test_tokens'], data['test_tokens'])
      self.assertEqual(loaded['vocab_size'], VOCAB)
      self.assertEqual(loaded['grid'], (GRID, GRID))
      self.assertEqual(len(loaded['data_info']['tokens_sha256']), 64)

  def test_files_that_are_not_tokens_files_are_refused(self):
    with tempfile.TemporaryDirectory() as workdir:
      path = os.path.join(workdir, 'images.gz')
      with open(path, 'wb') as f:
        f.write(b'\x1f\x8bnot a zip archive')
      with self.assertRaisesRegex(cli.ConfigError, 'is not a tokens.npz.*tokens_path'):
        train_gpt.load_tokens(path)  # numpy: 'pickled (object) data', a traceback
      np.save(os.path.join(workdir, 'one.npy'), np.zeros(3))
      with self.assertRaisesRegex(cli.ConfigError, 'one array, not an .npz'):
        train_gpt.load_tokens(os.path.join(workdir, 'one.npy'))
      np.savez(os.path.join(workdir, 'other.npz'), x=np.zeros(3))
      with self.assertRaisesRegex(cli.ConfigError, "lacks 'train_tokens'"):
        train_gpt.load_tokens(os.path.join(workdir, 'other.npz'))

  def test_models_no_gpt_has_and_labels_beyond_num_classes_are_refused_before_writing(self):
    """GPTConfig's ValueError, init_cache's (n_layer 0) and a ZeroDivisionError were
    tracebacks; labels >= num_classes were clamped by the class embedding, silently."""
    base = dict(seed=0, num_classes=CLASSES, model=dict(dim=32, n_layer=2, n_head=2,
                                                        multiple_of=32, vocab_size=0))
    refused = [(dict(model=dict(dim=63)), 'config.model makes no GPT: .*dim 63 must be '
                'divisible by n_head 2'),
               (dict(model=dict(n_layer=0)), r'config.model.n_layer=0: must be an integer >= 1'),
               (dict(model=dict(n_head=0)), r'config.model.n_head=0: must be'),
               (dict(model=dict(multiple_of=0)), r'config.model.multiple_of=0: must be'),
               (dict(num_classes=0), r'config.num_classes=0: must be an integer >= 1'),
               (dict(num_classes=CLASSES - 1), rf'config.num_classes={CLASSES - 1}: must cover '
                rf'the labels in the tokens file \(0..{CLASSES - 1}\); set it to {CLASSES}')]
    for change, message in refused:
      config = ml_collections.ConfigDict(base)
      config.update_from_flattened_dict(files.dotted_fields(change))
      with self.subTest(message), tempfile.TemporaryDirectory() as tmp:
        workdir = os.path.join(tmp, 'gpt')
        with self.assertRaisesRegex(cli.ConfigError, message):
          train_gpt.train(config, workdir, token_data(8, 4))
        self.assertFalse(os.path.exists(workdir))

  def test_learns_rule_and_exports(self):
    config = ml_collections.ConfigDict(dict(
        seed=0, num_classes=CLASSES,
        model=dict(dim=32, n_layer=2, n_head=2, multiple_of=32, vocab_size=0),
        class_dropout=0.1, batch_size=32, num_steps=60, learning_rate=1e-2, warmup_steps=5,
        weight_decay=0.0, b1=0.9, b2=0.95, clip_norm=1.0, eval_batch_size=64, log_every=10,
        save_every=1000, fast_compile=True))
    data = token_data()
    with tempfile.TemporaryDirectory() as workdir:
      _, gpt, metrics = train_gpt.train(config, workdir, data)
      # Only the first token is unpredictable: the floor is log(V) / N = 0.17 nats.
      self.assertLess(metrics['test_nll'], 0.15 * np.log(VOCAB))
      self.assertGreater(metrics['test_nll_uncond'], metrics['test_nll'])
      self.assertEqual(read_json(workdir, 'gpt_eval.json'), metrics)
      self.assert_manifest(workdir, 60)
      model, params = llamagen_converter.load_llamagen(os.path.join(workdir, 'model'))
      self.assertEqual(model.config, gpt)
      self.assertEqual((gpt.vocab_size, gpt.block_size, gpt.num_classes),
                       (VOCAB, NUM_TOKENS, CLASSES))
      table = params['cls_embedding']['embedding_table']['embedding']  # [K + 1, E]
      chex.assert_shape(table, (CLASSES + 1, 32))
      # Class dropout reaches the step: the null class's row was trained (with
      # no weight decay, a row no batch uses keeps its initial value).
      initial = train_gpt.init_like_llamagen(
          jax.eval_shape(model.init_params, jax.random.key(0)), config.seed)
      initial_table = initial['cls_embedding']['embedding_table']['embedding']
      self.assertGreater(float(np.abs(table[CLASSES] - initial_table[CLASSES]).max()), 1e-3)


# --------------------------------------------------------------- drafter ---


def tiny_target():
  """A random c2i target with peaked (non-uniform) next-token distributions."""
  config = llamagen.GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=VOCAB,
                              block_size=NUM_TOKENS, num_classes=CLASSES, multiple_of=32)
  model = llamagen.LlamaGenGPT(config)
  params = train_gpt.init_like_llamagen(jax.eval_shape(model.init_params, jax.random.key(0)),
                                        seed=3, zero_init=())
  params = jax.tree_util.tree_map(lambda x: x * 25.0 if x.ndim == 2 else x, params)  # std 0.5
  return model, params


def drafter_config(**overrides):
  values = dict(
      seed=0, data_source='dataset', num_target_samples=16, sample_batch_size=16,
      sample_temperature=1.0, sample_cfg_scale=1.0, embedding_source='tok_embeddings',
      drafter={}, uncond_prob=0.1, noise_std=0.2, reg_weight=1.0, cls_weight=0.1,
      batch_size=16, num_steps=30, learning_rate=3e-3, warmup_steps=3, weight_decay=0.0,
      b1=0.9, b2=0.95, grad_clip_value=0.5, clip_norm=0.0, eval_examples=32,
      eval_batch_size=32, log_every=10, save_every=1000, fast_compile=True)
  values.update(overrides)
  return ml_collections.ConfigDict(values)


class DrafterTrainerTest(absltest.TestCase, ManifestMixin):

  def test_caption_conditioned_targets_are_refused(self):
    """Their drafters first consume the condition positions at inference
    (`EagleDrafter.prefix_pairs`), which `eagle_loss` does not train."""
    t2i = llamagen.gpt_config('GPT-B', model_type='t2i', image_size=256)
    with self.assertRaisesRegex(ValueError, '120 condition positions.*class-conditional'):
      train_drafter.drafter_config_from(ml_collections.ConfigDict(), t2i)
    c2i = train_drafter.drafter_config_from(ml_collections.ConfigDict(),
                                            llamagen.gpt_config('GPT-B', image_size=256))
    self.assertEqual(c2i.cls_token_num, 0)

  def test_drafter_overrides_no_drafter_has_are_refused(self):
    target = llamagen.gpt_config('GPT-B', image_size=256)
    for overrides, message in ((dict(num_layers=0), 'config.drafter.num_layers=0: must be'),
                               (dict(num_heads=7), 'makes no drafter.*divisible by num_heads 7'),
                               (dict(layers=2), "makes no drafter.*'layers'")):
      with self.subTest(message), self.assertRaisesRegex(cli.ConfigError, message):
        train_drafter.drafter_config_from(ml_collections.ConfigDict(dict(drafter=overrides)),
                                          target)

  def test_labels_beyond_the_targets_classes_are_refused(self):
    target, target_params = tiny_target()
    data = token_data(8, 4)
    data['test_labels'][0] = target.config.num_classes
    with tempfile.TemporaryDirectory() as workdir:
      with self.assertRaisesRegex(cli.ConfigError, "the target's num_classes=.*must cover the "
                                  'labels.*set config.tokens_path'):
        train_drafter.train(ml_collections.ConfigDict(), workdir, target, target_params, data)

  def test_trains_keeps_frozen_parts_and_exports(self):
    target, target_params = tiny_target()
    before = jax.tree_util.tree_map(np.array, target_params)
    data = token_data(256, 32)
    with tempfile.TemporaryDirectory() as workdir:
      state, config, metrics = train_drafter.train(drafter_config(), workdir, target,
                                                   target_params, data)
      initial = metrics['initial']
      self.assertLess(metrics['loss'], 0.9 * initial['loss'])  # held out, no noise
      self.assertLess(metrics['cls'], initial['cls'])
      self.assertGreater(metrics['acceptance'], initial['acceptance'] + 0.05)
      self.assertEqual(read_json(workdir, 'drafter_eval.json'), metrics)
      self.assert_manifest(workdir, 30)
      # Only fc and the decoder layer are trained; the target is untouched.
      self.assertEqual(set(state.params), {'fc', 'layers_0'})
      chex.assert_trees_all_equal(jax.tree_util.tree_map(np.asarray, target_params), before)
      # The export holds the frozen embedding (the target's) but not the head,
      # and loads like a converted LANTERN drafter.
      drafter, params = lantern_drafter.load_drafter(
          os.path.join(workdir, 'drafter'), target_params['output']['kernel'])
      self.assertEqual(drafter.config, config)
      self.assertEqual(config.cls_token_num, 0)  # target's 1 condition token minus one
      np.testing.assert_array_equal(params['embed_tokens']['embedding'],
                                    target_params['tok_embeddings']['embedding'])
      np.testing.assert_array_equal(params['fc']['kernel'], state.params['fc']['kernel'])

  def test_a_resume_against_another_target_or_tokens_is_refused(self):
    target, target_params = tiny_target()
    data = token_data(64, 32)
    with tempfile.TemporaryDirectory() as workdir:
      config = drafter_config(num_steps=2, save_every=1, eval_examples=4)
      train_drafter.train(config, workdir, target, target_params, data)
      other_target = jax.tree_util.tree_map(lambda x: x * 0.5, target_params)
      other_tokens = dict(data, train_tokens=data['train_tokens'][::-1])
      for name, args in (('target_params_sha256', (target, other_target, data)),
                         ('train_tokens_sha256', (target, target_params, other_tokens))):
        with self.subTest(name), self.assertRaisesRegex(
            cli.ConfigError, f'another config or input files: input {name} '):
          train_drafter.train(config, workdir, *args)

  def test_cached_target_samples_are_those_of_the_config(self):
    """The cache records the settings it was sampled with: other settings sample again
    before any checkpoint, and are refused once checkpoints trained on the cache."""
    target, target_params = tiny_target()
    calls = []

    def fake_sample(target, params, labels, **kw):
      calls.append(kw)
      return np.full((len(labels), NUM_TOKENS), len(calls), np.int32)

    config = drafter_config(data_source='target', num_target_samples=4)
    with tempfile.TemporaryDirectory() as workdir, mock.patch.object(
        target_samples, 'sample_from_target', fake_sample):
      sequences = lambda config: target_samples.training_sequences(
          config, workdir, target, target_params, None)[0]
      self.assertEqual(sequences(config)[0, 0], 1)
      self.assertEqual(sequences(config)[0, 0], 1)  # cached
      hotter = drafter_config(data_source='target', num_target_samples=4,
                              sample_temperature=0.5)
      self.assertEqual(sequences(hotter)[0, 0], 2)  # sampled again at the new temperature
      self.assertEqual(calls[-1]['temperature'], 0.5)
      other_target = jax.tree_util.tree_map(lambda x: x + 1.0, target_params)
      self.assertEqual(target_samples.training_sequences(  # another target: sampled again
          hotter, workdir, target, other_target, None)[0][0, 0], 3)
      self.assertEqual(target_samples.training_sequences(  # the hash the caller computed
          hotter, workdir, target, target_params, None,
          files.tree_sha256(other_target))[0][0, 0], 3)
      os.makedirs(os.path.join(workdir, 'checkpoints', '10'))
      with self.assertRaisesRegex(cli.ConfigError, 'was sampled with .*"sample_temperature": '
                                  '0.5.*the checkpoints beside it trained on it'):
        sequences(config)
      self.assertLen(calls, 3)

  def test_target_samples_cached_before_the_target_hash_was_recorded_are_reused(self):
    target, target_params = tiny_target()
    config = drafter_config(data_source='target', num_target_samples=4)
    settings = {k: config[k] for k in target_samples.SAMPLE_SETTINGS}
    with tempfile.TemporaryDirectory() as workdir:
      np.savez(os.path.join(workdir, target_samples.SAMPLES_FILE),
               tokens=np.full((4, NUM_TOKENS), 7, np.int32), labels=np.zeros(4, np.int32),
               settings=np.array(json.dumps(settings, sort_keys=True)))
      tokens, _ = target_samples.training_sequences(config, workdir, target, target_params, None)
      self.assertEqual(tokens[0, 0], 7)

  def test_greedy_target_samples_and_features_follow_the_target(self):
    target, target_params = tiny_target()
    labels = np.array([0, 3, 4], np.int32)  # 4 = the null class
    tokens = target_samples.sample_from_target(
        target, target_params, labels, key=jax.random.key(0), batch_size=3, temperature=0.0,
        compiler_options=train_vq.FAST_COMPILE)
    chex.assert_shape(tokens, (3, NUM_TOKENS))
    logits = llamagen.forward_logits(target_params, target.config, jnp.asarray(labels),
                                     jnp.asarray(tokens[:, :-1]))  # entry i predicts token i
    np.testing.assert_array_equal(tokens, np.argmax(logits, -1))
    # The features drafter training pairs with token i are the ones that predicted it.
    features, feature_logits = jax.jit(train_drafter.target_features, static_argnums=0)(
        target, target_params, labels, tokens)
    chex.assert_shape(features, (3, NUM_TOKENS, 32))
    np.testing.assert_allclose(feature_logits, logits, rtol=1e-5, atol=1e-5)
    head = target_params['output']['kernel']
    np.testing.assert_allclose(features @ head, logits, rtol=1e-4, atol=1e-4)

  def test_feature_noise_is_uniform_and_only_in_training(self):
    features = jnp.zeros((4, 64, 32))
    noisy = np.asarray(train_drafter.feature_noise(jax.random.key(0), features, 0.2))
    width = 0.2 * 512 / 64
    self.assertLessEqual(np.abs(noisy).max(), width / 2)
    self.assertGreater(np.abs(noisy).max(), 0.45 * width)
    self.assertAlmostEqual(noisy.std(), width / np.sqrt(12), delta=0.02 * width)

    target, target_params = tiny_target()
    drafter = eagle.EagleDrafter(eagle.llamagen_drafter_config(target.config))
    params = dict(train_drafter.init_trainable(drafter, 0),
                  **train_drafter.frozen_params(target_params))
    tokens, labels = synthetic_tokens(2, 6)

    @jax.jit
    def training_loss(noise_key, noise_std):
      features, logits = train_drafter.target_features(target, target_params, labels, tokens)
      return train_drafter.eagle_loss(drafter, params, tokens, features, logits,
                                      noise_key=noise_key, noise_std=noise_std)[0]

    evaluate = lambda: train_drafter.evaluate(target, drafter, target_params, params, tokens,
                                              labels, 2, drafter_config())['loss']
    self.assertEqual(evaluate(), evaluate())  # evaluation is deterministic
    key = jax.random.key(1)
    self.assertAlmostEqual(float(training_loss(key, 0.0)), evaluate(), places=5)
    self.assertNotAlmostEqual(float(training_loss(key, 0.2)), evaluate(), places=3)


if __name__ == '__main__':
  absltest.main()
