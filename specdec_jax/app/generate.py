"""The main job: generate one class-conditional batch with vanilla AR and every SD method.

  python -m specdec_jax.generate --out results          (also: specdec-generate)

On the bundled Fashion-MNIST family (patch tokenizer, LlamaGen-architecture
target, EAGLE-1 head, small draft GPT, evaluation classifier) it runs each
method of `configs/generate.py` twice:

- quality pass: `images_per_class` images of every class, `quality_batch`
  per call (image i's tokens depend only on the seed and i);
  tokens_per_forward, nll_gap (target NLL of the generated tokens minus that
  of the vanilla samples, under the same guided distribution), frechet (in
  the classifier's feature space, against the test split) and
  class_accuracy;
- latency pass: one image with CFG (batch 1, the regime speculative decoding
  is for), for each of `latency_classes`, best of `timing_repeats` runs
  after compilation, every method's runs interleaved with every other's
  (`latency_pass`); speedup = vanilla's latency / the method's.

It saves one PNG grid per method and `side_by_side.png` (method names above
the columns, class names beside the rows), prints a table and writes
`results.json`; it needs no data set (the bundle has the test split's statistics).
"""

from __future__ import annotations

import concurrent.futures
import os
import runpy
import time

from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np

from specdec_jax import decode
from specdec_jax import logits as logits_lib
from specdec_jax import randomness
from specdec_jax import rules
from specdec_jax.app import cli
from specdec_jax.app import compile_cache
from specdec_jax.app import config_checks
from specdec_jax.app import demo
from specdec_jax.app import evaluation
from specdec_jax.app import family as family_lib
from specdec_jax.app import fashion_mnist
from specdec_jax.app import files
from specdec_jax.app import host as host_lib
from specdec_jax.app import images as images_lib
from specdec_jax.app import methods as methods_lib
from specdec_jax.configs import generate as default_config


def check_config(config, family: family_lib.Family | None = None) -> None:
  """Raises cli.ConfigError on a value no run can use, naming it and what it may be;
  with the family, also the bounds that depend on it (before any compilation)."""
  cli.check_fields(config, config_checks.main_command(methods_lib.METHOD_NAMES))
  config_checks.check_bundle_dir(config.bundle_dir, 'config.bundle_dir')
  if family is not None:
    config_checks.check_for_family(config, family, 'config', config.methods)
    config_checks.check_classes(config.latency_classes, family, 'config.latency_classes')


def cond_rows(model, params, cond, sampling: logits_lib.Sampling):
  """The decode's conditioning rows: [cond; uncond] when sampling guides (cfg_scale >
  1, the layout `decode.generate` expects then), else cond itself, one row per image."""
  return model.cfg_cond(params, cond) if sampling.uses_cfg else cond


def compiler_options(config) -> dict | None:
  """XLA options for the decodes: `decode.CPU_LATENCY_OPTIONS` on CPU when
  `config.xla_cpu_plain_reductions`, else None (XLA's defaults)."""
  if config.get('xla_cpu_plain_reductions', False) and jax.default_backend() == 'cpu':
    return dict(decode.CPU_LATENCY_OPTIONS)
  return None


def mode_compiler_options(mode, options: dict | None) -> dict | None:
  """The XLA options one mode compiles with: tree-verified modes (rule mode 'tree':
  static and EAGLE-2 trees, SJD-PAC) drop `decode.CPU_LATENCY_OPTIONS`, whose
  plain reductions fuse their sequential sibling tests into kernels that
  recompute the earlier tests (EAGLE-2's verification 4 ms instead of 0.03 ms
  per iteration; docs/results.md "XLA options")."""
  if options == decode.CPU_LATENCY_OPTIONS and mode.rule_mode == rules.TREE:
    return None
  return options


def decode_kwargs(method: methods_lib.Method, family: family_lib.Family, labels, sampling,
                  options: dict | None = None) -> dict:
  """generate() arguments of one method for a batch of class labels (options: the
  command's XLA options, adjusted per mode by `mode_compiler_options`)."""
  kwargs = dict(num_tokens=family.num_tokens, mode=method.mode, sampling=sampling,
                rule=method.rule, compiler_options=mode_compiler_options(method.mode, options))
  if method.drafter == 'eagle':
    kwargs.update(draft=family.eagle, draft_params=family.eagle_params)
  elif method.drafter == 'draft_model':
    kwargs.update(draft=family.draft_gpt, draft_params=family.draft_gpt_params,
                  draft_cond=cond_rows(family.draft_gpt, family.draft_gpt_params,
                                       jnp.asarray(labels), sampling))
  return kwargs


def quality_pass(method: methods_lib.Method, family: family_lib.Family, labels: np.ndarray,
                 sampling, seed: int, options: dict | None = None, batch: int = 0):
  """Every image of `labels`: (tokens int32[N, L], metrics summary, compile seconds).

  Image i's key is the method's key folded with i (`randomness.per_image_keys`,
  what one call with one key gives), so its tokens depend only on (seed, i) and
  the method, whatever `batch` (images per call; 0: all N in one call).
  """
  keys = randomness.per_image_keys(jax.random.key(seed + 1000 * method.seed_offset), len(labels))
  tokens, metrics, compile_seconds = [], [], 0.0
  if batch < 0:
    raise ValueError(f'quality_pass: batch must be >= 0 (0: every image in one call), got {batch}.')
  size = batch or len(labels)
  for start in range(0, len(labels), size):
    rows = labels[start:start + size]
    result = decode.generate(
        family.target, family.target_params,
        cond_rows(family.target, family.target_params, jnp.asarray(rows), sampling),
        key=keys[start:start + len(rows)], **decode_kwargs(method, family, rows, sampling, options))
    tokens.append(np.asarray(result.tokens))
    metrics.append(jax.tree.map(np.asarray, result.metrics))
    compile_seconds += result.compile_seconds
  metrics = jax.tree.map(lambda *parts: np.concatenate(parts), *metrics)
  return np.concatenate(tokens), metrics.summary(), compile_seconds


def quality_measures(family: family_lib.Family, labels: np.ndarray, tokens: np.ndarray,
                     sampling) -> tuple[np.ndarray, np.ndarray, dict]:
  """Decoded images uint8[N, H, W, 1], their classifier features [N, F] and their
  measures: nll (guided target NLL per token), image_nlls [N] and nll_se (the mean's
  standard error), frechet (classifier features vs the test split), class_accuracy."""
  images = family.decode(tokens)
  class_logits, features = family.classify(images)
  image_nlls = family.guided_image_nlls(labels, tokens, sampling)
  return images, features, dict(nll=float(np.mean(image_nlls)), image_nlls=image_nlls,
                                nll_se=evaluation.standard_error(image_nlls),
                                frechet=family.frechet(features),
                                class_accuracy=evaluation.class_accuracy(class_logits, labels))


def in_threads(function, items, threads: int) -> list:
  """[function(item) for item in items], `threads` at a time (in order).

  XLA compiles without the GIL, so one method's compilation overlaps another's tracing
  and running (bench/parallel_compile.py: 1.11-1.21x faster on 2 cores for six methods'
  batch-1 programs). Nothing timed runs this way. A Ctrl-C: `cli.run_command`."""
  if threads <= 1 or len(items) <= 1:
    return [function(item) for item in items]
  pool = concurrent.futures.ThreadPoolExecutor(threads, cli.DROPPED_ON_INTERRUPT)
  try:
    return list(pool.map(function, items))
  finally:  # after an error or a Ctrl-C, not waiting for the running calls (XLA's)
    pool.shutdown(wait=False, cancel_futures=True)


def _timed_call(method: methods_lib.Method, family: family_lib.Family, label: int, sampling,
                seed: int, options: dict | None = None):
  """A function running one batch-1 decode of `label` (compiling on its first call)."""
  labels = np.asarray([label], np.int32)
  target_cond = cond_rows(family.target, family.target_params, jnp.asarray(labels), sampling)
  kwargs = decode_kwargs(method, family, labels, sampling, options)
  keys = jax.random.key(seed + 7919 * (label + 1) + 1000 * method.seed_offset)

  def call():
    start = time.perf_counter()
    result = decode.generate(family.target, family.target_params, target_cond, key=keys,
                             **kwargs)
    jax.block_until_ready(result.tokens)
    return result, time.perf_counter() - start

  return call


def latency_pass(methods: list[methods_lib.Method], family: family_lib.Family, classes, sampling,
                 seed: int, rounds: int, options: dict | None = None,
                 compile_threads: int = 1) -> dict:
  """Batch-1 latency (one image, its CFG rows) of every method, best of `rounds` per class.

  Every method's decode of every class is compiled and run once first
  (`compile_threads` methods at a time, untimed). Then
  each round runs every class once with every method in turn (the methods'
  order rotated by one each round), so all methods' times are drawn from the
  same stretch of time: these machines are noisy and drift over minutes, and
  a slow phase slows an SD decode more than a vanilla one, so timing one
  method after another made a method's speedup depend on when it ran
  (docs/results.md, "The main command").

  Args:
    methods: the methods; the first (vanilla) is the speed reference.
  Returns:
    {name: dict(latency_s = mean over classes of the best time, per_class_s,
    speedup = the first method's latency_s / this one's, tokens_per_forward
    of these runs, compile_s, host_overhead_s = a repeated call's wall time
    minus its device run time (median))}.
  """
  def first_runs(method):
    """Compiles the method's batch-1 program and runs each class once."""
    out = []
    for label in classes:
      call = _timed_call(method, family, label, sampling, seed, options)
      result, _ = call()
      out.append((label, call, result))
    return out

  calls, first_tokens = {}, {}
  compile_s = {m.name: 0.0 for m in methods}
  tokens_per_forward = {m.name: [] for m in methods}
  for method, runs in zip(methods, in_threads(first_runs, methods, compile_threads)):
    for label, call, result in runs:
      compile_s[method.name] += result.compile_seconds
      tokens_per_forward[method.name].append(
          result.metrics.summary()['tokens_per_target_forward'])
      calls[method.name, label] = call
      first_tokens[method.name, label] = np.asarray(result.tokens)
  best = {key: np.inf for key in calls}
  overheads = {m.name: [] for m in methods}
  for round_index in range(rounds):
    started = time.perf_counter()
    shift = round_index % len(methods)
    order = methods[shift:] + methods[:shift]
    for label in classes:
      for method in order:
        result, seconds = calls[method.name, label]()
        best[method.name, label] = min(best[method.name, label], seconds)
        overheads[method.name].append(seconds - result.run_seconds)
        if round_index == 0:  # same keys -> same tokens
          np.testing.assert_array_equal(np.asarray(result.tokens),
                                        first_tokens[method.name, label])
    logging.info('latency round %d/%d: %.1f s', round_index + 1, rounds,
                 time.perf_counter() - started)
  out = {}
  for method in methods:
    per_class = [float(best[method.name, label]) for label in classes]
    out[method.name] = dict(latency_s=float(np.mean(per_class)), per_class_s=per_class,
                            tokens_per_forward=float(np.mean(tokens_per_forward[method.name])),
                            compile_s=compile_s[method.name],
                            host_overhead_s=float(np.median(overheads[method.name])))
  reference = out[methods[0].name]['latency_s']
  for row in out.values():
    row['speedup'] = reference / row['latency_s']
  return out


def evaluate(config, family: family_lib.Family, out_dir: str) -> dict:
  """Runs every method (quality and latency passes); writes PNG grids and results.json."""
  check_config(config, family)
  os.makedirs(out_dir, exist_ok=True)
  sampling = logits_lib.Sampling(**config.sampling.to_dict())
  labels = np.repeat(np.arange(family.num_classes), config.images_per_class).astype(np.int32)
  latency_classes = tuple(int(c) for c in config.latency_classes)
  methods = methods_lib.build_methods(config, family)
  options = compiler_options(config)
  evaluate_started = time.perf_counter()
  pictures, features, quality = {}, {}, {}
  logging.info('quality pass: %d images (%d tokens each); latency pass: 1 image%s, '
               'classes %s, best of %d interleaved rounds; %d methods', len(labels),
               family.num_tokens, ' with CFG' * sampling.uses_cfg, latency_classes,
               config.timing_repeats, len(methods))
  def quality_of(method):
    started = time.perf_counter()
    tokens, summary, compile_s = quality_pass(method, family, labels, sampling, config.seed,
                                              options, config.quality_batch)
    images, method_features, measures = quality_measures(family, labels, tokens, sampling)
    wall_s = time.perf_counter() - started
    logging.info('%-14s quality: tokens/forward %.2f  nll %.4f  frechet %.2f  accuracy %.2f  '
                 '(%.0f s)', method.name, summary['tokens_per_target_forward'], measures['nll'],
                 measures['frechet'], measures['class_accuracy'], wall_s)
    return images, method_features, dict(summary=summary, measures=measures,
                                         compile_s=compile_s, wall_s=wall_s)

  for method, (images, method_features, record) in zip(
      methods, in_threads(quality_of, methods, config.compile_threads)):
    pictures[method.name] = images  # rows of classes: labels are sorted
    features[method.name] = method_features
    quality[method.name] = record
  started = time.perf_counter()
  latencies = latency_pass(methods, family, latency_classes, sampling, config.seed,
                           config.timing_repeats, options, config.compile_threads)
  latency_wall_s = time.perf_counter() - started
  reference = quality[methods[0].name]['measures']
  # Drift from the target itself: the Frechet distance of each method's features to
  # vanilla's (same labels, same number of images). vanilla_seed1 (vanilla under
  # another seed) gives the noise floor of this estimate.
  to_target = {method.name: evaluation.features_frechet(features[method.name],
                                                        features[methods[0].name])
               for method in methods}
  results = {}
  for method in methods:
    summary = quality[method.name]['summary']
    measures = quality[method.name]['measures']
    latency = latencies[method.name]
    results[method.name] = dict(
        tokens_per_forward=summary['tokens_per_target_forward'],
        speedup=latency['speedup'],
        latency_s=latency['latency_s'],
        vanilla_latency_s=latencies[methods[0].name]['latency_s'],
        latency_per_class_s=latency['per_class_s'],
        latency_tokens_per_forward=latency['tokens_per_forward'],
        host_overhead_ms=1e3 * latency['host_overhead_s'],
        nll=measures['nll'],
        nll_se=measures['nll_se'],
        nll_gap=measures['nll'] - reference['nll'],
        nll_gap_se=(0.0 if method is methods[0] else evaluation.paired_gap_standard_error(
            measures['image_nlls'], reference['image_nlls'])),  # image i: one label in both
        frechet=measures['frechet'],
        frechet_to_target=to_target[method.name],
        class_accuracy=measures['class_accuracy'],
        acceptance_per_position=summary.get('acceptance_per_position'),
        compile_s=quality[method.name]['compile_s'] + latency['compile_s'],
        wall_s=quality[method.name]['wall_s'],
        rule=type(method.rule).__name__ if method.rule is not None else None,
        mode=type(method.mode).__name__,
        hyperparameters=dict(methods_lib.rule_hyperparameters(method.rule),
                             **method.hyperparameters))
  logging.info('latency pass: %.0f s; speedups %s', latency_wall_s,
               ', '.join(f'{name} {row["speedup"]:.2f}x' for name, row in results.items()))
  images_lib.write_figures(out_dir, pictures, fashion_mnist.CLASS_NAMES[:family.num_classes],
                           config.side_by_side_per_class, config.grid_scale)
  images_lib.remove_earlier_figures(out_dir, kept=results)
  output = dict(
      methods=results,
      method_order=list(results),
      sampling=config.sampling.to_dict(),
      num_images=len(labels), images_per_class=config.images_per_class,
      latency_classes=list(latency_classes), timing_repeats=config.timing_repeats,
      latency_wall_s=latency_wall_s, compile_threads=config.compile_threads,
      evaluate_wall_s=time.perf_counter() - evaluate_started,
      compiler_options=options,
      tokens_per_image=family.num_tokens,
      classifier_test_accuracy=family.classifier_test_accuracy,
      backend=jax.default_backend(), devices=[str(d) for d in jax.devices()],
      host=host_lib.describe(),
      bundle=family.manifest_summary())
  path = os.path.join(out_dir, 'results.json')
  files.write_json(path, output)
  print(evaluation.format_table(results, family.classifier_test_accuracy))
  print(f'wrote {path}, {len(results)} PNG grids and side_by_side.png to {out_dir}')
  return output


def define_flags() -> None:
  """Defines the flags (only when run as a program: no clash with other absl apps)."""
  config_flags.DEFINE_config_file('config', os.path.abspath(default_config.__file__),
                                  'Generation configuration.')
  flags.DEFINE_string('out', 'results', 'Folder for PNG grids and results.json.')


# XLA:CPU flags for the batch-1 regime: one thread per op. At one image with CFG
# every op is tiny, and the intra-op thread pool's synchronisation costs more
# than it saves (measured on 2 cores: SD iterations ~15% faster, vanilla
# unchanged; docs/results.md "The main command"). Every entry must be a --flag: XLA stops
# reading XLA_FLAGS at the first token that is not one, dropping the rest.
SINGLE_THREAD_XLA_FLAGS = ('--xla_cpu_multi_thread_eigen=false',)


def use_single_thread_xla() -> bool:
  """Adds SINGLE_THREAD_XLA_FLAGS to XLA_FLAGS; effective only before JAX starts
  its CPU backend (returns False, changing nothing, if it already has)."""
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  if xla_bridge.backends_are_initialized():
    return False
  current = os.environ.get('XLA_FLAGS', '')
  missing = [f for f in SINGLE_THREAD_XLA_FLAGS if f.split('=')[0] not in current]
  os.environ['XLA_FLAGS'] = ' '.join([current, *missing]).strip()
  return True


def main(argv):
  del argv
  config, out_dir = flags.FLAGS.config, flags.FLAGS.out
  check_config(config)
  config_checks.check_output_folder(out_dir, '--out')
  with files.FolderLock(out_dir, break_flag=None):  # one run per folder
    if config.xla_cpu_single_thread and not use_single_thread_xla():
      logging.warning('JAX already started; xla_cpu_single_thread has no effect.')
    compile_cache.enable(config.compilation_cache)
    if not config.bundle_dir and not family_lib.bundle_available():
      logging.warning('The bundled Fashion-MNIST model family is not part of this build yet '
                      '(see README, "Bundled model"); running the core demo on toy Markov '
                      'models instead.')
      demo.evaluate(config, out_dir)
      return
    family = family_lib.load(config.bundle_dir or None)
    evaluate(config, family, out_dir)


def run():
  """`specdec-generate`: runs this file as the program, as `python -m` does (--help)."""
  runpy.run_path(__file__, run_name='__main__')


if __name__ == '__main__':
  cli.run_command(main, define_flags, os.path.abspath(default_config.__file__),
                  refusals=(files.FolderLockedError,))
