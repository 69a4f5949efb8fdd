"""A demo of the core on context-dependent toy models whose exact law is known.

What `python -m specdec_jax.generate` runs while the bundled image family is
not part of the build. The target is a class-conditional second-order Markov
chain (`specdec_jax.app.toy.MarkovToy`) that reads its context back through the KV
cache, so every decoding mode exercises the real engine: CFG rows, per-row
rollback, drafting, verification. The drafters are a perturbed copy of the
target (independent draft model) and an EAGLE-style head on the target's
features. Because the target's law is known in closed form, drift is exact:
the mean per-token NLL of the generated tokens under the target's guided
distribution, minus that of vanilla samples.

Legend: B images, n tokens per image, V vocabulary.
"""

from __future__ import annotations

import os
import time

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decode
from specdec_jax import logits as logits_lib
from specdec_jax import rules
from specdec_jax.app import files
from specdec_jax.app import toy

VOCAB, NUM_CLASSES, NUM_TOKENS = 16, 4, 64


def line_neighbors(vocab: int, k: int) -> jax.Array:
  """Latent neighbours of toy tokens on a line: x-1, x+1, x-2, ... (self excluded)."""
  distance = np.abs(np.arange(vocab)[:, None] - np.arange(vocab)[None, :]).astype(float)
  distance += 0.1 * (np.arange(vocab)[None, :] > np.arange(vocab)[:, None])
  np.fill_diagonal(distance, np.inf)
  return jnp.asarray(np.argsort(distance, axis=1, kind='stable')[:, :k], jnp.int32)


def build(seed: int = 0):
  """(target, target params, draft model, its params, EAGLE head, its params)."""
  keys = jax.random.split(jax.random.key(seed), 3)
  target = toy.MarkovToy(VOCAB, NUM_CLASSES)
  target_params = target.init_params(keys[0], scale=2.5)
  noise = jax.random.normal(keys[1], target_params['table'].shape)
  draft_params = {'table': target_params['table'] + 1.2 * noise}
  head = toy.ToyEagle(VOCAB, NUM_CLASSES)
  head_params = {'table': target_params['table'] + 0.8 * noise,
                 'feature_head': jnp.zeros((head.hidden_size, VOCAB))}
  return target, target_params, target, draft_params, head, head_params


def exact_nll(target, params, labels, tokens, sampling) -> float:
  """Mean per-token NLL of tokens [B, n] under the guided target distribution."""
  table = params['table']
  batch, length = tokens.shape

  def history(class_ids):
    prefix = jnp.stack([jnp.full((batch,), target.bos), VOCAB + class_ids], axis=1)
    return jnp.concatenate([prefix, tokens], axis=1)  # [B, n + 2]

  cond, uncond = history(labels), history(jnp.full_like(labels, NUM_CLASSES))
  cond_logits = table[cond[:, :length], cond[:, 1:length + 1]]  # [B, n, V]
  uncond_logits = table[uncond[:, :length], uncond[:, 1:length + 1]]
  probs = sampling.probs(cond_logits, uncond_logits, token_index=jnp.arange(length)[None])
  chosen = jnp.take_along_axis(probs, tokens[..., None], axis=-1)[..., 0]
  return float(-jnp.mean(jnp.log(chosen)))


def methods(config):
  """name -> (mode, rule, drafter) with the main command's hyperparameters."""
  k, window, init = config.draft_length, config.jacobi_window, config.jacobi_init
  chain = decode.ChainDraft(k=k, drafter='eagle')
  jacobi = decode.Jacobi(window=window, init=init)
  columns = rules.neighbor_columns(config.lantern_k, config.lantern_residual)
  rule = dict(
      lossless=rules.Lossless(),
      lantern_pp=rules.LanternPP(neighbors=line_neighbors(VOCAB, columns),
                                 k=config.lantern_k, lam=config.lantern_lam,
                                 residual_mode=config.lantern_residual),
      uniform=rules.UniformRelaxed(omega=config.uniform_omega),
      coolsd=rules.CoolSD(delta=config.coolsd_delta),
      gsd=rules.Grouped(prob_threshold=config.gsd_prob_threshold),
      csd=rules.ContentAware(lam=config.csd_lam, tv_threshold=config.csd_tv_threshold))
  return {
      'vanilla': (decode.Vanilla(), None, None),
      'vanilla_seed1': (decode.Vanilla(), None, None),
      'eagle': (chain, rule['lossless'], 'eagle'),
      'draft_model': (decode.ChainDraft(k=k, drafter='model'), rule['lossless'], 'model'),
      'lantern_pp': (chain, rule['lantern_pp'], 'eagle'),
      'uniform': (chain, rule['uniform'], 'eagle'),
      'coolsd': (chain, rule['coolsd'], 'eagle'),
      'eagle2': (decode.DynamicTreeDraft(config.eagle2_total_tokens, config.eagle2_depth,
                                         config.eagle2_top_k, 'eagle',
                                         drafts=config.eagle2_drafts),
                 rule[config.eagle2_rule], 'eagle'),
      'sjd': (jacobi, rule['lossless'], None),
      'scd': (decode.Jacobi(window=window, init=init, coupling=config.scd_coupling),
              rule[config.scd_rule], None),
      'sjd_pac': (decode.JacobiPAC(window, config.pac_branches, config.pac_depth, init=init,
                                   sibling_law=config.pac_siblings),
                  rule[config.sjd_pac_rule], None),
      'gsd': (jacobi, rule['gsd'], None),
      'csd': (jacobi, rule['csd'], None),
  }


def evaluate(config, out_dir: str) -> dict:
  """Runs every method of config.methods on the toy family; writes results.json."""
  os.makedirs(out_dir, exist_ok=True)
  sampling = logits_lib.Sampling(**config.sampling.to_dict())
  target, target_params, draft, draft_params, head, head_params = build(config.seed)
  labels = jnp.asarray(np.repeat(np.arange(NUM_CLASSES), config.images_per_class), jnp.int32)
  rows_cond = jnp.concatenate([labels, jnp.full_like(labels, NUM_CLASSES)])
  catalogue = methods(config)
  unknown = [m for m in config.methods if m not in catalogue]
  if unknown or config.methods[0] != 'vanilla':
    raise ValueError(f'config.methods must start with vanilla and name only {list(catalogue)}; '
                     f'got {list(config.methods)}.')
  results, reference_nll, vanilla_seconds = {}, None, None
  for index, name in enumerate(config.methods):
    mode, rule, drafter = catalogue[name]
    kwargs = dict(num_tokens=NUM_TOKENS, mode=mode, rule=rule, sampling=sampling)
    if drafter == 'eagle':
      kwargs.update(draft=head, draft_params=head_params)
    elif drafter == 'model':
      kwargs.update(draft=draft, draft_params=draft_params)
    keys = jax.random.split(jax.random.key(config.seed + (1 if name == 'vanilla_seed1' else 0)),
                            labels.shape[0])
    first = decode.generate(target, target_params, rows_cond, key=keys, **kwargs)
    seconds = []
    for _ in range(config.timing_repeats):
      start = time.perf_counter()
      result = decode.generate(target, target_params, rows_cond, key=keys, **kwargs)
      jax.block_until_ready(result.tokens)
      seconds.append(time.perf_counter() - start)
    nll = exact_nll(target, target_params, labels, result.tokens, sampling)
    if name == 'vanilla':
      reference_nll, vanilla_seconds = nll, min(seconds)
    summary = result.metrics.summary()
    results[name] = dict(
        tokens_per_forward=summary['tokens_per_target_forward'],
        speedup=vanilla_seconds / min(seconds), seconds=min(seconds), nll=nll,
        nll_gap=nll - reference_nll, frechet=None, class_accuracy=None,
        acceptance_per_position=summary['acceptance_per_position'],
        compile_seconds=first.compile_seconds, mode=type(mode).__name__,
        rule=type(rule).__name__ if rule is not None else None)
    logging.info('[%d/%d] %-14s tokens/forward %.2f  nll_gap %+.4f', index + 1,
                 len(config.methods), name, results[name]['tokens_per_forward'],
                 results[name]['nll_gap'])
  output = dict(kind='toy-demo', methods=results, sampling=config.sampling.to_dict(),
                num_images=int(labels.shape[0]), tokens_per_image=NUM_TOKENS,
                vocab=VOCAB, backend=jax.default_backend())
  path = os.path.join(out_dir, 'results.json')
  files.write_json(path, output)
  header = f'{"method":14s} {"tokens/fwd":>10s} {"speedup":>8s} {"nll_gap":>9s}'
  print('\n'.join([header, '-' * len(header)] + [
      f'{name:14s} {row["tokens_per_forward"]:10.2f} {row["speedup"]:7.2f}x '
      f'{row["nll_gap"]:+9.4f}' for name, row in results.items()]))
  print('(toy Markov target, exact NLL; speedups on a toy say little about real models)')
  print(f'wrote {path}')
  return output
