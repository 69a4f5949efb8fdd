"""The main job end to end: the toy demo and the image pipeline on a tiny random bundle."""

import json
import logging
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time
from unittest import mock

from absl import logging as absl_logging
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decode
from specdec_jax import logits
from specdec_jax import verify
from specdec_jax.app import cli
from specdec_jax.app import config_checks
from specdec_jax.app import demo
from specdec_jax.app import family as family_lib
from specdec_jax.app import generate
from specdec_jax.app import host
from specdec_jax.app import methods as methods_lib
from specdec_jax.app import images as images_lib
from specdec_jax.configs import generate as generate_config
from specdec_jax.models import classifier
from specdec_jax.models import eagle
from specdec_jax.models import llamagen
from specdec_jax.models import patch_tokenizer
from specdec_jax.models import vq
from tests import test_files
from tests import test_images


def tiny_bundle(directory, tokenizer_kind='patch'):
  """A structurally complete bundle with random weights (no training): a patch
  tokenizer (the shipped kind, 32x32 images) or a small conv VQ."""
  if tokenizer_kind == 'patch':
    tokenizer = patch_tokenizer.PatchTokenizer(patch_tokenizer.PatchTokenizerConfig(
        codebook_size=32, patch_size=2))
    tokenizer_params = patch_tokenizer.init_params(
        tokenizer.config, np.random.default_rng(0).uniform(-1, 1, (32, 4)))
  else:
    tokenizer = vq.VQTokenizer(vq.small_vq_config(codebook_size=32, ch=32, z_channels=32))
    tokenizer_params = tokenizer.init(0, (32, 32))
  gpt = lambda dim, layers: llamagen.GPTConfig(
      dim=dim, n_layer=layers, n_head=2, vocab_size=32, num_classes=10, block_size=256,
      multiple_of=32)
  target = llamagen.LlamaGenGPT(gpt(32, 2))
  target_params = target.init_params(jax.random.key(1))
  draft = llamagen.LlamaGenGPT(gpt(16, 1))
  head = eagle.EagleDrafter(eagle.llamagen_drafter_config(target.config))
  images = jnp.zeros((1, 32, 32, 1), jnp.uint8)
  features = np.random.default_rng(0).normal(size=(64, 128))
  return family_lib.write_bundle(
      directory, tokenizer=tokenizer, tokenizer_params=tokenizer_params, target=target,
      target_params=target_params, eagle=head, eagle_params=head.init_params(jax.random.key(2)),
      draft_gpt=draft, draft_gpt_params=draft.init_params(jax.random.key(3)),
      classifier_params=classifier.Classifier().init(jax.random.key(4), images),
      classifier_test_accuracy=0.9, reference_mean=features.mean(0),
      reference_cov=np.cov(features, rowvar=False), manifest={'note': 'test bundle'})


class GenerateTest(absltest.TestCase):

  def test_image_pipeline_on_tiny_bundle(self):
    with tempfile.TemporaryDirectory() as tmp:
      bundle = tiny_bundle(os.path.join(tmp, 'bundle'))
      self.assertTrue(family_lib.bundle_available(bundle))
      family = family_lib.load(bundle)
      # Parameters are placed on the device once (NumPy leaves would be copied per call).
      for tree in (family.target_params, family.eagle_params, family.draft_gpt_params,
                   family.tokenizer_params, family.classifier_params):
        self.assertTrue(all(isinstance(x, jax.Array) for x in jax.tree.leaves(tree)))
      config = generate_config.get_config()
      config.images_per_class = 1
      config.side_by_side_per_class = 1
      config.latency_classes = (3,)
      config.timing_repeats = 2
      config.methods = ('vanilla', 'eagle', 'coolsd', 'csd')
      out = os.path.join(tmp, 'out')
      os.makedirs(out)  # an earlier run's grid of a method this run lacks, and files of yours
      for leftover in ('gsd.png', 'notes.png', 'uniform.png'):
        pathlib.Path(out, leftover).write_bytes(b'')
      pathlib.Path(out, 'results.json').write_text('{"method_order": ["vanilla", "gsd"]}')
      results = generate.evaluate(config, family, out)
      saved = test_files.strict_loads(pathlib.Path(out, 'results.json').read_text())
      self.assertEqual(set(saved['methods']), set(config.methods))
      self.assertFalse(os.path.exists(os.path.join(out, 'gsd.png')))
      self.assertTrue(os.path.exists(os.path.join(out, 'notes.png')))
      self.assertTrue(os.path.exists(os.path.join(out, 'uniform.png')))  # not the run's
      for name, row in saved['methods'].items():
        self.assertTrue(os.path.exists(os.path.join(out, f'{name}.png')))
        for key in ('tokens_per_forward', 'speedup', 'latency_s', 'nll_gap', 'frechet',
                    'frechet_to_target', 'class_accuracy', 'hyperparameters'):
          self.assertIn(key, row)
        self.assertGreaterEqual(row['tokens_per_forward'], 1.0)
        self.assertLess(row['host_overhead_ms'], 50.0)  # no re-validation (about 1 ms)
      side = test_images.decode_png(open(os.path.join(out, 'side_by_side.png'), 'rb').read())
      # Method names in a band above the 10 class rows of 32x32 images.
      self.assertEqual(side.shape[0], config.grid_scale * (images_lib.TITLE_BAND + 10 * 34 + 2))
      self.assertTrue((side[:config.grid_scale * images_lib.TITLE_BAND] == 0).any())
      self.assertEqual(saved['method_order'], list(config.methods))
      self.assertEqual(saved['methods']['coolsd']['hyperparameters']['delta'],
                       config.coolsd_delta)
      self.assertEqual(saved['methods']['vanilla']['speedup'], 1.0)
      # Drift is measured against vanilla's own images: zero for vanilla itself.
      self.assertEqual(saved['methods']['vanilla']['frechet_to_target'], 0.0)
      self.assertGreater(saved['methods']['csd']['frechet_to_target'], 0.0)
      self.assertGreater(saved['latency_wall_s'], 0.0)
      self.assertEqual(saved['host'], host.describe())  # the CPU the run drew its images on
      vanilla_latency = saved['methods']['vanilla']['latency_s']
      for row in saved['methods'].values():  # one shared vanilla reference
        self.assertEqual(row['vanilla_latency_s'], vanilla_latency)
        self.assertAlmostEqual(row['speedup'], vanilla_latency / row['latency_s'])
      self.assertEqual(results['methods']['vanilla']['tokens_per_forward'], 1.0)
      self.assertEqual(saved['methods']['vanilla']['nll_gap'], 0.0)
      self.assertEqual(saved['methods']['vanilla']['nll_gap_se'], 0.0)
      for name, row in saved['methods'].items():  # nll_gap = NLL - vanilla's NLL
        self.assertAlmostEqual(row['nll_gap'], row['nll'] - saved['methods']['vanilla']['nll'])
        # frechet is against the test split's statistics, not vanilla's images: positive
        # for vanilla too (random weights), where frechet_to_target is 0.
        self.assertGreater(row['frechet'], 0.0, name)
      self.assertNotEqual(saved['methods']['eagle']['nll_gap'], 0.0)  # other draws, other tokens
      for name in ('eagle', 'coolsd', 'csd'):  # the paired s.e.: test_evaluate_rows_...
        self.assertGreater(saved['methods'][name]['nll_gap_se'], 0.0)
      # On CPU the decodes were compiled with the plain-reduction options.
      self.assertEqual(saved['compiler_options'], decode.CPU_LATENCY_OPTIONS)

  def test_quality_pass_tokens_depend_only_on_seed_and_image_index(self):
    """Any quality_batch gives image i the tokens of a decode of image i alone with
    the method's key folded with i (what one call over all images gives it too)."""
    with tempfile.TemporaryDirectory() as tmp:
      family = family_lib.load(tiny_bundle(os.path.join(tmp, 'bundle')))
      config = generate_config.get_config()
      config.methods = ('vanilla', 'eagle')
      sampling = logits.Sampling(**config.sampling.to_dict())
      eagle_method = methods_lib.build_methods(config, family)[1]
      labels = np.array([0, 3, 5, 7, 9], np.int32)
      passes = {batch: generate.quality_pass(eagle_method, family, labels, sampling, 4,
                                             batch=batch) for batch in (1, 2)}
      # Batch 1: images 0 and 4; batch 2: image 4, alone in the last, short chunk (the
      # same program as the lone decode; other batch sizes may round differently).
      for index, batches in ((0, (1,)), (4, (1, 2))):
        alone = decode.generate(
            family.target, family.target_params,
            generate.cond_rows(family.target, family.target_params,
                               jnp.asarray(labels[index:index + 1]), sampling),
            key=jax.random.fold_in(jax.random.key(4 + 1000 * eagle_method.seed_offset),
                                   index)[None],
            **generate.decode_kwargs(eagle_method, family, labels[index:index + 1], sampling))
        for batch in batches:
          np.testing.assert_array_equal(passes[batch][0][index], np.asarray(alone.tokens)[0])
      for tokens, summary, compile_s in passes.values():
        self.assertEqual(tokens.shape, (5, family.num_tokens))
        self.assertGreater(compile_s, 0.0)
        self.assertGreaterEqual(summary['tokens_per_target_forward'], 1.0)
        self.assertLen(summary['acceptance_per_position'], config.draft_length)
      with self.assertRaisesRegex(ValueError, 'batch must be >= 0'):
        generate.quality_pass(eagle_method, family, labels, sampling, 4, batch=-1)
      with self.assertRaisesRegex(cli.ConfigError, 'config.quality_batch=-1'):
        config.quality_batch = -1
        generate.check_config(config)

  def test_loading_a_bundle_leaves_the_log_level_as_it_was(self):
    """family.load quiets Orbax, then restored the absl verbosity it read: an unset level
    came back as WARNING, and later INFO logs (a trainer's) were lost."""
    absl_logger = absl_logging.get_absl_logger()
    level = absl_logger.level
    absl_logger.setLevel(logging.NOTSET)
    try:
      with tempfile.TemporaryDirectory() as tmp:
        family_lib.load(tiny_bundle(os.path.join(tmp, 'bundle')))
      self.assertEqual(absl_logger.level, logging.NOTSET)
    finally:
      absl_logger.setLevel(level)

  def test_guided_probs_are_the_law_of_each_token_given_the_ones_before(self):
    """Entry i is a distribution that depends on tokens < i only (changing token 5
    moves entry 6 but not entries 0..5), and at the tokens it gives guided_image_nlls."""
    with tempfile.TemporaryDirectory() as tmp:
      family = family_lib.load(tiny_bundle(os.path.join(tmp, 'bundle')))
      sampling = logits.Sampling(cfg_scale=2.0)
      labels = np.array([2, 7], np.int32)
      tokens = np.random.default_rng(0).integers(0, 32, (2, family.num_tokens)).astype(np.int32)
      probs = np.asarray(family.guided_probs(labels, tokens, sampling))
      self.assertEqual(probs.shape, (2, family.num_tokens, 32))
      np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
      chosen = np.take_along_axis(probs, tokens[..., None], axis=-1)[..., 0]
      np.testing.assert_allclose(-np.log(chosen).mean(1),
                                 family.guided_image_nlls(labels, tokens, sampling), rtol=1e-5)
      changed = tokens.copy()
      changed[:, 5] = (changed[:, 5] + 1) % 32
      moved = np.asarray(family.guided_probs(labels, changed, sampling))
      np.testing.assert_allclose(moved[:, :6], probs[:, :6], atol=1e-6)
      self.assertGreater(np.abs(moved[:, 6] - probs[:, 6]).max(), 1e-4)
      # The law decoding samples from: Sampling.probs of the target's logits for the rows
      # the decode conditions on ([cond; uncond], `generate.cond_rows`), split in halves.
      rows = generate.cond_rows(family.target, family.target_params, jnp.asarray(labels),
                                sampling)
      self.assertEqual(rows.shape, (4,))
      row_logits = llamagen.forward_logits(family.target_params, family.target.config, rows,
                                           jnp.asarray(np.concatenate([tokens, tokens])[:, :-1]))
      decode_law = sampling.probs(row_logits[:2], row_logits[2:],
                                  token_index=jnp.arange(family.num_tokens)[None])
      np.testing.assert_allclose(probs, np.asarray(decode_law), atol=1e-5)
      # Another CFG scale is a traced value: the same program, another law.
      programs = family_lib._guided_probs._cache_size()  # pylint: disable=protected-access
      other = np.asarray(family.guided_probs(labels, tokens, logits.Sampling(cfg_scale=3.0)))
      self.assertEqual(family_lib._guided_probs._cache_size(), programs)  # pylint: disable=protected-access
      self.assertGreater(np.abs(other - probs).max(), 1e-4)

  def test_latency_pass_interleaves_every_method_and_keeps_the_best(self):
    """Rounds run every class with every method in turn, the order rotated each
    round; each (method, class) keeps its best time; speedups are against the
    first method. Timed calls are stubbed, with one slow phase in round 1, or in
    the last round (the best is the minimum over rounds, not the last time)."""
    for slow_call in (2, 3):  # call 0 compiles; calls 1, 2, 3 are rounds 0, 1, 2
      with self.subTest(slow_round=slow_call - 1):
        self._check_latency_pass(slow_call)

  def _check_latency_pass(self, slow_call):
    methods = [methods_lib.Method(name, None) for name in ('vanilla', 'fast', 'slow')]
    base = {'vanilla': 0.040, 'fast': 0.020, 'slow': 0.080}
    calls = []

    def fake_timed_call(method, family, label, sampling, seed, options=None):
      def call():
        index = len([c for c in calls if c[0] == method.name and c[1] == label])
        calls.append((method.name, label))
        # Compile run (index 0) is slow; round slow_call - 1 hits a slow phase.
        seconds = base[method.name] * (1 + label) * (5.0 if index in (0, slow_call) else 1.0)
        result = mock.Mock(compile_seconds=1.0 if index == 0 else 0.0,
                           run_seconds=seconds - 0.001, tokens=np.full((1, 4), label))
        result.metrics.summary.return_value = {'tokens_per_target_forward': 2.0 + label}
        return result, seconds
      return call

    with mock.patch.object(generate, '_timed_call', fake_timed_call):
      out = generate.latency_pass(methods, None, (0, 1), None, 0, rounds=3)
    # Compile runs first (each method, each class), then 3 rounds x 2 classes x 3 methods.
    self.assertEqual(calls[:6], [(m, c) for m in ('vanilla', 'fast', 'slow') for c in (0, 1)])
    rounds = calls[6:]
    self.assertLen(rounds, 18)
    self.assertEqual([m for m, c in rounds[:3]], ['vanilla', 'fast', 'slow'])
    self.assertEqual([m for m, c in rounds[6:9]], ['fast', 'slow', 'vanilla'])  # rotated
    self.assertEqual([m for m, c in rounds[12:15]], ['slow', 'vanilla', 'fast'])
    self.assertEqual([c for m, c in rounds[:6]], [0, 0, 0, 1, 1, 1])
    for name, row in out.items():  # the slow phase's and compile runs' times are not kept
      self.assertEqual(row['per_class_s'], [base[name], 2 * base[name]])
      self.assertAlmostEqual(row['latency_s'], 1.5 * base[name])
      self.assertAlmostEqual(row['speedup'], base['vanilla'] / base[name])
      self.assertEqual(row['compile_s'], 2.0)
      self.assertEqual(row['tokens_per_forward'], 2.5)
      self.assertAlmostEqual(row['host_overhead_s'], 0.001)
    self.assertEqual(out['vanilla']['speedup'], 1.0)

  def test_vanilla_seed1_draws_under_other_keys_than_vanilla(self):
    """vanilla_seed1 is the noise floor of the drift measures: vanilla's law under
    another seed. Its quality-pass images and latency decodes get other keys than
    vanilla's (the same keys would give vanilla's tokens, a floor of exactly 0).
    The decode is stubbed; only the keys it is handed are compared."""
    config = generate_config.get_config()
    config.methods = ('vanilla', 'vanilla_seed1')
    methods = methods_lib.build_methods(config, None)
    family = mock.Mock(num_tokens=16)
    sampling = logits.Sampling(cfg_scale=1.0)
    labels = np.array([0, 4, 9], np.int32)

    class Handed(Exception):
      """Carries the keys decode.generate was called with."""

    def stub(*args, key, **kwargs):
      raise Handed(np.asarray(jax.random.key_data(key)))

    image_keys, latency_keys = {}, {}
    with mock.patch.object(decode, 'generate', side_effect=stub):
      for method in methods:
        with self.assertRaises(Handed) as handed:
          generate.quality_pass(method, family, labels, sampling, seed=5)
        image_keys[method.name] = handed.exception.args[0].reshape(len(labels), -1)
        with self.assertRaises(Handed) as handed:
          timed = generate._timed_call  # pylint: disable=protected-access
          timed(method, family, 4, sampling, seed=5)()
        latency_keys[method.name] = handed.exception.args[0].ravel()
    for i in range(len(labels)):
      for j in range(len(labels)):
        self.assertFalse(np.array_equal(image_keys['vanilla'][i], image_keys['vanilla_seed1'][j]),
                         (i, j))
    self.assertFalse(np.array_equal(latency_keys['vanilla'], latency_keys['vanilla_seed1']))

  def test_quality_measures_are_the_mean_nll_and_its_standard_error(self):
    """nll is the mean of the images' NLLs and nll_se the standard error of that mean,
    sqrt(sum (x - mean)^2 / (N - 1) / N) (not the spread of the images); class_accuracy
    the fraction of images classified as their label. The family is stubbed."""
    image_nlls = np.array([1.0, 2.0, 3.0, 4.0])
    class_logits = np.eye(3)[[0, 1, 1, 2]]  # image 2 (label 2) is taken for class 1
    family = mock.Mock()
    family.classify.return_value = (class_logits, np.zeros((4, 2)))
    family.guided_image_nlls.return_value = image_nlls
    family.frechet.return_value = 7.0
    _, _, measures = generate.quality_measures(family, np.array([0, 1, 2, 2]), None, None)
    self.assertAlmostEqual(measures['nll'], 2.5)
    self.assertAlmostEqual(measures['nll_se'], np.sqrt((2.25 + 0.25 + 0.25 + 2.25) / 3 / 4))
    self.assertEqual(measures['frechet'], 7.0)
    self.assertEqual(measures['class_accuracy'], 0.75)

  def test_mode_compiler_options_drop_the_plain_reductions_for_tree_modes_only(self):
    """Tree-verified modes (EAGLE-2's dynamic tree, SJD-PAC) compile without
    CPU_LATENCY_OPTIONS; every other mode keeps them, and any other options (or
    none) pass unchanged to every mode."""
    plain = dict(decode.CPU_LATENCY_OPTIONS)
    other = {'xla_cpu_enable_fast_math': False}
    trees = (decode.DynamicTreeDraft(total_tokens=8, depth=2, top_k=2),
             decode.JacobiPAC(window=4),
             decode.TreeDraft(verify.StaticTree.from_paths(((0,), (1,))), 'eagle'))
    for mode in trees:
      self.assertIsNone(generate.mode_compiler_options(mode, plain), mode)
    for mode in (decode.Vanilla(), decode.ChainDraft(k=4), decode.Jacobi(window=4)):
      self.assertEqual(generate.mode_compiler_options(mode, plain), plain, mode)
    for mode in trees + (decode.ChainDraft(k=4),):
      self.assertEqual(generate.mode_compiler_options(mode, other), other, mode)
      self.assertIsNone(generate.mode_compiler_options(mode, None), mode)

  def test_evaluate_rows_follow_their_definitions(self):
    """evaluate's rows from stubbed passes with distinct numbers: the quality pass
    gets images_per_class images of every class, sorted by class (the grids' rows);
    tokens_per_forward is the quality pass's, latency_tokens_per_forward the latency
    pass's; nll_gap = nll - vanilla's nll, nll_gap_se = the standard error of the
    images' paired NLL differences (0 for vanilla); frechet is the method's own,
    frechet_to_target its distance to vanilla's features (0 for vanilla);
    vanilla_latency_s is vanilla's latency in every row; compile_s adds both passes'
    compile times."""
    names = ('vanilla', 'vanilla_seed1', 'eagle')
    config = generate_config.get_config()
    config.update(dict(methods=names, images_per_class=4, latency_classes=(1,),
                       timing_repeats=1, side_by_side_per_class=1))
    family = mock.Mock(num_tokens=16, num_classes=3, classifier_test_accuracy=0.5)
    family.target.vocab_size = 32
    family.manifest_summary.return_value = {}
    rng = np.random.default_rng(0)
    # Per method (by index): quality tokens/forward, compile s, nll, nll_se, frechet, features.
    quality = {i: dict(tpf=1.0 + i, compile_s=10.0 + i, nll=3.0 + 0.5 * i, se=0.1 + 0.2 * i,
                       frechet=20.0 + i, features=rng.normal(size=(12, 2)) + 3 * i,
                       image_nlls=rng.normal(size=12) + 0.5 * i)
               for i in range(3)}
    latency = {name: dict(latency_s=0.1 / (1 + i), per_class_s=[0.1 / (1 + i)], speedup=1.0 + i,
                          tokens_per_forward=5.0 + i, compile_s=100.0 * (1 + i),
                          host_overhead_s=0.0) for i, name in enumerate(names)}
    seen_labels = []

    def quality_pass(method, family, labels, *args):
      seen_labels.append(np.asarray(labels))
      i = names.index(method.name)
      return (np.full((len(labels), 16), i),
              dict(tokens_per_target_forward=quality[i]['tpf']), quality[i]['compile_s'])

    def quality_measures(family, labels, tokens, sampling):
      q = quality[int(tokens[0, 0])]
      return (np.zeros((len(labels), 32, 32, 1), np.uint8), q['features'],
              dict(nll=q['nll'], nll_se=q['se'], image_nlls=q['image_nlls'],
                   frechet=q['frechet'], class_accuracy=0.5))

    with tempfile.TemporaryDirectory() as tmp, \
        mock.patch.object(generate, 'quality_pass', quality_pass), \
        mock.patch.object(generate, 'quality_measures', quality_measures), \
        mock.patch.object(generate, 'latency_pass', return_value=latency), \
        mock.patch.object(images_lib, 'write_figures'):
      rows = generate.evaluate(config, family, tmp)['methods']
    self.assertLen(seen_labels, 3)
    for labels in seen_labels:
      np.testing.assert_array_equal(labels, np.sort(labels))
      np.testing.assert_array_equal(np.bincount(labels), [4, 4, 4])
    for i, name in enumerate(names):
      row, vanilla = rows[name], rows['vanilla']
      self.assertEqual(row['tokens_per_forward'], 1.0 + i)
      self.assertEqual(row['latency_tokens_per_forward'], 5.0 + i)
      self.assertEqual(row['speedup'], 1.0 + i)
      self.assertEqual(row['vanilla_latency_s'], 0.1)
      self.assertAlmostEqual(row['nll_gap'], 0.5 * i)
      differences = quality[i]['image_nlls'] - quality[0]['image_nlls']
      self.assertAlmostEqual(row['nll_gap_se'], 0.0 if i == 0 else
                             np.std(differences, ddof=1) / np.sqrt(12))
      self.assertEqual(row['frechet'], 20.0 + i)
      self.assertAlmostEqual(row['compile_s'], 10.0 + i + 100.0 * (1 + i))
      self.assertEqual(row['frechet_to_target'] == 0.0, i == 0, row['frechet_to_target'])
      self.assertEqual(vanilla['nll'], 3.0)

  def test_untimed_passes_run_two_methods_at_once_in_order(self):
    """in_threads(f, items, 2) runs two items together (each waits at a barrier for
    the other) and returns results in the items' order; with one thread the same
    barrier is never met (the negative control)."""
    def meet(item):
      barrier.wait(timeout=10)
      return item * 10

    barrier = threading.Barrier(2)
    self.assertEqual(generate.in_threads(meet, [3, 1, 2, 5], 2), [30, 10, 20, 50])
    barrier = threading.Barrier(2)
    with self.assertRaises(threading.BrokenBarrierError):
      generate.in_threads(lambda item: barrier.wait(timeout=0.2), [1, 2], 1)
    self.assertEqual(generate.in_threads(lambda item: item + 1, [4], 2), [5])

  def test_a_ctrl_c_does_not_wait_for_the_calls_running_in_threads(self):
    """A KeyboardInterrupt leaves in_threads while other items still run (as an XLA
    call would, which no signal stops), and the items queued behind them never run."""
    release, started = threading.Event(), []
    self.addCleanup(release.set)

    def work(item):
      started.append(item)
      # A Ctrl-C ends the process at once while these threads run (cli.run_command).
      self.assertStartsWith(threading.current_thread().name, cli.DROPPED_ON_INTERRUPT)
      if item == 0:
        time.sleep(0.2)  # item 1 is running by now
        raise KeyboardInterrupt
      release.wait(timeout=30)  # a call that would hold the interrupt back
      return item

    begun = time.monotonic()
    with self.assertRaises(KeyboardInterrupt):
      generate.in_threads(work, list(range(6)), 2)
    self.assertLess(time.monotonic() - begun, 15)  # not the 30 s the running calls hold
    release.set()
    time.sleep(0.5)
    self.assertContainsSubset(started, [0, 1, 2])  # 2: the thread freed by item 0 may start it

  def test_compiler_options_follow_the_config(self):
    config = generate_config.get_config()
    self.assertTrue(config.xla_cpu_plain_reductions)
    self.assertEqual(generate.compiler_options(config), decode.CPU_LATENCY_OPTIONS)
    self.assertIsNot(generate.compiler_options(config), decode.CPU_LATENCY_OPTIONS)  # a copy
    config.xla_cpu_plain_reductions = False
    self.assertIsNone(generate.compiler_options(config))
    with mock.patch.object(jax, 'default_backend', return_value='gpu'):
      config.xla_cpu_plain_reductions = True
      self.assertIsNone(generate.compiler_options(config))

  def test_conv_vq_bundle_loads_and_decodes(self):
    with tempfile.TemporaryDirectory() as tmp:
      family = family_lib.load(tiny_bundle(os.path.join(tmp, 'bundle'), 'vq'))
      images = family.decode(np.zeros((2, 256), np.int32))
      self.assertEqual(images.shape, (2, 32, 32, 1))
      self.assertEqual(family.neighbors(3).shape, (32, 3))

  def test_single_thread_xla_flags_only_before_jax_starts(self):
    """Once the backend is up (as in this process), the flags would be ignored: the
    function says so and leaves XLA_FLAGS alone."""
    jax.devices()
    with mock.patch.dict(os.environ, {'XLA_FLAGS': '--xla_dump_to=/tmp/x'}):
      self.assertFalse(generate.use_single_thread_xla())
      self.assertEqual(os.environ['XLA_FLAGS'], '--xla_dump_to=/tmp/x')
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    with mock.patch.object(xla_bridge, 'backends_are_initialized', return_value=False), \
        mock.patch.dict(os.environ, {'XLA_FLAGS': '--xla_dump_to=/tmp/x'}):
      self.assertTrue(generate.use_single_thread_xla())
      self.assertEqual(os.environ['XLA_FLAGS'].split(),
                       ['--xla_dump_to=/tmp/x', *generate.SINGLE_THREAD_XLA_FLAGS])
      generate.use_single_thread_xla()  # idempotent
      self.assertEqual(len(os.environ['XLA_FLAGS'].split()), 2)
    for flag in generate.SINGLE_THREAD_XLA_FLAGS:  # XLA drops everything after a non-flag
      self.assertTrue(flag.startswith('--xla_'), flag)

  def test_missing_bundle_is_a_clear_error(self):
    with tempfile.TemporaryDirectory() as tmp:
      self.assertFalse(family_lib.bundle_available(tmp))
      with self.assertRaisesRegex(FileNotFoundError, 'not a complete model bundle'):
        family_lib.load(tmp)
    config = generate_config.get_config()
    config.methods = ('eagle', 'vanilla')
    with self.assertRaisesRegex(ValueError, "start with 'vanilla'"):
      methods_lib.build_methods(config, None)

  def test_a_partial_bundle_is_named_not_loaded(self):
    """Every part and the reference features must be there (linked from the shipped one)."""
    with tempfile.TemporaryDirectory() as tmp:
      os.symlink(family_lib.BUNDLE_DIR / 'tokenizer', os.path.join(tmp, 'tokenizer'))
      self.assertFalse(family_lib.bundle_available(tmp))  # one part of five
      for part in family_lib.PARTS[1:]:
        os.symlink(family_lib.BUNDLE_DIR / part, os.path.join(tmp, part))
      self.assertFalse(family_lib.bundle_available(tmp))  # no reference features
      with self.assertRaisesRegex(FileNotFoundError, r'not a complete model bundle \(missing: '
                                  r'reference_features.npz\)'):
        family_lib.load(tmp)
      os.symlink(family_lib.BUNDLE_DIR / 'reference_features.npz',
                 os.path.join(tmp, 'reference_features.npz'))
      self.assertTrue(family_lib.bundle_available(tmp))

  def test_toy_demo_lossless_methods_match_target_law(self):
    config = generate_config.get_config()
    config.images_per_class = 2
    config.timing_repeats = 1
    config.methods = ('vanilla', 'vanilla_seed1', 'eagle', 'uniform')
    with tempfile.TemporaryDirectory() as tmp:
      output = demo.evaluate(config, tmp)
      self.assertTrue(os.path.exists(os.path.join(tmp, 'results.json')))
    rows = output['methods']
    for name, row in rows.items():  # the reported numbers are their definitions
      self.assertAlmostEqual(row['speedup'], rows['vanilla']['seconds'] / row['seconds'])
      self.assertAlmostEqual(row['nll_gap'], row['nll'] - rows['vanilla']['nll'])
    # vanilla_seed1 samples under another key: other tokens, another NLL.
    self.assertNotEqual(rows['vanilla_seed1']['nll'], rows['vanilla']['nll'])
    self.assertNotEqual(rows['eagle']['nll_gap'], 0.0)
    self.assertEqual(rows['vanilla']['tokens_per_forward'], 1.0)
    self.assertGreater(rows['eagle']['tokens_per_forward'], 1.5)
    self.assertGreater(rows['uniform']['tokens_per_forward'], rows['eagle']['tokens_per_forward'])

  def test_toy_demo_knows_every_default_method_and_runs_the_2026_ones(self):
    """The fallback without the bundle runs the default method list (it once lacked
    eagle2, scd and sjd_pac and stopped at once)."""
    config = generate_config.get_config()
    self.assertEmpty(set(config.methods) - set(demo.methods(config)))
    config.images_per_class, config.timing_repeats = 1, 1
    config.methods = ('vanilla', 'eagle2', 'scd', 'sjd_pac')
    with tempfile.TemporaryDirectory() as tmp:
      rows = demo.evaluate(config, tmp)['methods']
    for name in config.methods[1:]:
      self.assertGreater(rows[name]['tokens_per_forward'], 1.05, name)

  def test_exact_nll_matches_a_direct_computation(self):
    target, params, *_ = demo.build(0)
    from specdec_jax import logits
    sampling = logits.Sampling(cfg_scale=2.0)
    labels = jnp.array([1], jnp.int32)
    tokens = jnp.array([[3, 5, 2]], jnp.int32)
    table = np.asarray(params['table'])
    history_c, history_u = [target.bos, demo.VOCAB + 1], [target.bos, demo.VOCAB + demo.NUM_CLASSES]
    total = 0.0
    for i, token in enumerate([3, 5, 2]):
      probs = sampling.probs(jnp.asarray(table[history_c[-2], history_c[-1]]),
                             jnp.asarray(table[history_u[-2], history_u[-1]]))
      total -= np.log(float(probs[token]))
      history_c.append(token)
      history_u.append(token)
    self.assertAlmostEqual(demo.exact_nll(target, params, labels, tokens, sampling), total / 3,
                           places=5)


class MainCommandConfigTest(parameterized.TestCase):
  """Values no run can use stop the main command before any compilation."""

  def test_the_default_config_passes(self):
    generate.check_config(generate_config.get_config())

  @parameterized.parameters('images_per_class', 'timing_repeats')
  def test_zero_is_refused(self, field):
    config = generate_config.get_config()
    config[field] = 0
    with self.assertRaisesRegex(cli.ConfigError, f'config.{field}=0: must be an integer >= 1'):
      generate.check_config(config)

  def test_bad_draft_length_stops_before_the_vanilla_pass(self):
    config = generate_config.get_config()
    config.draft_length = 0
    with self.assertRaisesRegex(cli.ConfigError, r'config.draft_length=0: must be an integer '
                                r'>= 1 \(and below the tokens per image\)'):
      generate.check_config(config)
    config.draft_length = 256  # valid alone, not for 256-token images
    with tempfile.TemporaryDirectory() as tmp:
      family = family_lib.load(tiny_bundle(os.path.join(tmp, 'bundle')))
      with mock.patch.object(generate, 'quality_pass') as quality_pass:
        with self.assertRaisesRegex(cli.ConfigError, 'config.draft_length=256: must be below '
                                    'the 256 tokens per image'):
          generate.evaluate(config, family, os.path.join(tmp, 'out'))
      quality_pass.assert_not_called()
      self.assertFalse(os.path.exists(os.path.join(tmp, 'out')))

  def test_sjd_pac_bounds_apply_only_when_sjd_pac_runs(self):
    """pac_depth < jacobi_window and the tree's size (at most 1024 nodes) are checked
    with the family, before compiling, and only for runs that include sjd_pac."""
    family = family_lib.load()
    config = generate_config.get_config()
    config.pac_branches = 40  # 40 + 1600 + 4 - 2 nodes at the default window 4 and depth 2
    with self.assertRaisesRegex(cli.ConfigError, r"config.pac_branches=40: must be small "
                                r"enough that SJD-PAC's tree, .* = 1642 nodes, is at most 1024"):
      config_checks.check_for_family(config, family, 'config', config.methods)
    config.pac_branches, config.jacobi_window = 3, 2
    config_checks.check_for_family(config, family, 'config', ('vanilla', 'sjd', 'scd'))
    with self.assertRaisesRegex(cli.ConfigError, 'config.pac_depth=2: must be below '
                                'jacobi_window=2'):
      config_checks.check_for_family(config, family, 'config', ('vanilla', 'sjd_pac'))

  def test_lantern_k_bound_counts_the_columns_its_residual_reads(self):
    """The published residuals read lantern_k + 1 neighbours among the V - 1 other
    tokens: lantern_k = V - 1 is refused with the family when LANTERN++ runs (as a
    method or an SCD/EAGLE-2/SJD-PAC rule), not when it does not."""
    family = family_lib.load()
    vocab = family.target.vocab_size
    config = generate_config.get_config()
    config.update(dict(lantern_k=vocab - 1, lantern_residual='published_llamagen'))
    for methods, rule in ((('vanilla', 'lantern_pp'), {}),
                          (('vanilla', 'scd'), dict(scd_rule='lantern_pp')),
                          (('vanilla', 'eagle2'), dict(eagle2_rule='lantern_pp'))):
      config.update(rule)
      with self.assertRaisesRegex(cli.ConfigError,
                                  f'config.lantern_k={vocab - 1}: must be below {vocab - 1}: '
                                  "with lantern_residual='published_llamagen'"):
        config_checks.check_for_family(config, family, 'config', methods)
    config_checks.check_for_family(config, family, 'config', ('vanilla', 'eagle'))
    config.lantern_k = vocab - 2
    config_checks.check_for_family(config, family, 'config', ('vanilla', 'lantern_pp'))
    config.update(dict(lantern_k=vocab - 1, lantern_residual='optimal'))
    config_checks.check_for_family(config, family, 'config', ('vanilla', 'lantern_pp'))

  def test_seed_leaves_room_for_the_method_and_class_offsets(self):
    """Every key seed the main command makes (seed + 1000 * offset + 7919 * (class +
    1)) fits in uint32; jax.random.key would reduce a larger one modulo 2**32."""
    family = family_lib.load()
    limit = 2**32 - 1 - 1000 - 7919 * family.num_classes
    config = generate_config.get_config()
    config.seed = 2**32
    with self.assertRaisesRegex(cli.ConfigError, 'config.seed=4294967296: must be an integer '
                                '>= 0 and <= 4294967295'):
      generate.check_config(config)
    config.seed = limit + 1
    generate.check_config(config)  # without the family: the uint32 bound only
    with self.assertRaisesRegex(cli.ConfigError, f'config.seed={limit + 1}: must be at most '
                                f'{limit}. The main command adds up to {1000 + 7919 * 10}'):
      generate.check_config(config, family)
    config.seed = limit
    generate.check_config(config, family)
    config.methods = ('vanilla', 'vanilla_seed1')
    seed_1 = methods_lib.build_methods(config, family)[1]
    seeds, key = [], jax.random.key
    with mock.patch.object(jax.random, 'key', side_effect=lambda s: seeds.append(s) or key(s)):
      generate._timed_call(  # pylint: disable=protected-access
          seed_1, family, family.num_classes - 1, logits.Sampling(), limit)
    self.assertEqual(seeds, [2**32 - 1])  # the largest key seed the command makes

  def test_out_that_is_a_file_or_read_only_is_a_usage_error(self):
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, 'a_file')
      pathlib.Path(path).write_text('')
      for out, problem in ((path, f'{path} is a file, not a folder'),
                           ('/sys/specdec_out', 'no folder can be made in /sys')):
        result = subprocess.run(
            [sys.executable, '-m', 'specdec_jax.generate', f'--out={out}'],
            env=dict(os.environ, JAX_PLATFORMS='cpu'), capture_output=True, text=True,
            timeout=300)
        self.assertEqual(result.returncode, 2, result.stderr[-3000:])
        self.assertIn(f'--out={out!r}: {problem}', result.stderr)
        self.assertNotIn('Traceback', result.stderr)

  def test_unguided_main_command_runs_with_the_cache_off(self):
    """cfg_scale = 1.0 runs (one row per image, the draft model's too) and
    compilation_cache=off writes no cache."""
    with tempfile.TemporaryDirectory() as tmp:
      bundle = tiny_bundle(os.path.join(tmp, 'bundle'))
      out = os.path.join(tmp, 'out')
      env = dict(os.environ, JAX_PLATFORMS='cpu', XDG_CACHE_HOME=os.path.join(tmp, 'cache'))
      env.pop('JAX_COMPILATION_CACHE_DIR', None)
      result = subprocess.run(
          [sys.executable, '-m', 'specdec_jax.generate', f'--config.bundle_dir={bundle}',
           '--config.images_per_class=1', '--config.side_by_side_per_class=1',
           '--config.latency_classes=(3,)', '--config.timing_repeats=1',
           "--config.methods=('vanilla','draft_model')", '--config.sampling.cfg_scale=1.0',
           '--config.compilation_cache=off', f'--out={out}'],
          env=env, capture_output=True, text=True, timeout=600)
      self.assertEqual(result.returncode, 0, result.stderr[-3000:])
      saved = json.load(open(os.path.join(out, 'results.json')))
      self.assertEqual(saved['sampling']['cfg_scale'], 1.0)
      self.assertEqual(saved['method_order'], ['vanilla', 'draft_model'])
      self.assertGreaterEqual(saved['methods']['draft_model']['tokens_per_forward'], 1.0)
      self.assertIn('persistent compilation cache: off', result.stderr)
      self.assertFalse(os.path.exists(os.path.join(tmp, 'cache')))


if __name__ == '__main__':
  absltest.main()
