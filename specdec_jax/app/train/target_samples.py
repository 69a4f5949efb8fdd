"""What an EAGLE drafter trains on: the dataset's token grids or the target's samples.

With `config.data_source='target'` the sequences are sampled from the target
with the engine's vanilla loop and cached in `<workdir>/target_samples.npz`,
with the settings they were sampled with and the target's hash: a rerun with other
settings or another target samples again, or is refused when checkpoints trained
on the cache.
"""

from __future__ import annotations

import json
import os
from typing import Any

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.app import cli
from specdec_jax.app import files
from specdec_jax.app import run_record
from specdec_jax.models import llamagen

SAMPLES_FILE = 'target_samples.npz'
# The config fields the cached target samples depend on (recorded in the file).
SAMPLE_SETTINGS = ('seed', 'num_target_samples', 'sample_batch_size', 'sample_temperature',
                   'sample_cfg_scale')
DATA_SOURCES = ('dataset', 'target')


def sample_from_target(target: llamagen.LlamaGenGPT, target_params: Any, labels: np.ndarray,
                       *, key: jax.Array, batch_size: int, temperature: float = 1.0,
                       cfg_scale: float = 1.0, top_k: int = 0,
                       compiler_options: dict | None = None) -> np.ndarray:
  """Image-token sequences int32[len(labels), N] sampled from the target.

  Uses the engine's vanilla loop (`specdec_jax.decode.generate`); with
  cfg_scale != 1 the rows are [cond; uncond] as LlamaGen samples them;
  temperature 0 is greedy. `compiler_options` go to XLA (tests pass
  `decode.FAST_COMPILE`).
  """
  from specdec_jax import decode  # pylint: disable=g-import-not-at-top
  from specdec_jax import logits as logits_lib  # pylint: disable=g-import-not-at-top

  sampling = logits_lib.Sampling(cfg_scale=cfg_scale, temperature=temperature, top_k=top_k)
  chunks = []
  for start in range(0, len(labels), batch_size):
    chunk = jnp.asarray(labels[start:start + batch_size], jnp.int32)
    cond = target.cfg_cond(target_params, chunk) if sampling.uses_cfg else chunk
    result = decode.generate(target, target_params, cond,
                             num_tokens=target.config.block_size,
                             key=jax.random.fold_in(key, start), mode=decode.Vanilla(),
                             sampling=sampling, compiler_options=compiler_options)
    chunks.append(np.asarray(result.tokens, np.int32))
    logging.info('drafter: sampled %d / %d target sequences', start + len(chunk), len(labels))
  return np.concatenate(chunks)


def check_data_source(config) -> None:
  if config.data_source not in DATA_SOURCES:
    raise cli.ConfigError(f'config.data_source must be one of {DATA_SOURCES}, got '
                          f'{config.data_source!r}.')


def _same_settings(recorded: str | None, settings: str) -> bool:
  """Whether a cache's recorded settings are `settings`. A cache from before settings
  (None) or the target's hash were recorded is compared on what it recorded."""
  if recorded is None:
    return True
  stored, current = json.loads(recorded), json.loads(settings)
  if 'target_params_sha256' not in stored:
    current.pop('target_params_sha256', None)
  return stored == current


def training_sequences(config, workdir: str, target: llamagen.LlamaGenGPT, target_params: Any,
                       data: dict, target_sha256: str | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
  """(tokens int32[S, N], labels int32[S]) the drafter trains on.

  `target_sha256` (`files.tree_sha256` of target_params; computed when None) is
  recorded with the cached samples' settings: another target samples again.
  """
  check_data_source(config)
  if config.data_source == 'dataset':
    return data['train_tokens'], data['train_labels']
  path = os.path.join(workdir, SAMPLES_FILE)
  settings = json.dumps(dict({k: config[k] for k in SAMPLE_SETTINGS}, target_params_sha256=(
      target_sha256 or files.tree_sha256(target_params))), sort_keys=True)
  if os.path.isfile(path):  # a resumed run trains on the same samples
    with np.load(path) as f:
      recorded = str(f['settings']) if 'settings' in f else None
      if _same_settings(recorded, settings):
        return f['tokens'], f['labels']
    if run_record.has_checkpoints(workdir):
      raise cli.ConfigError(f'{path} was sampled with {recorded}, not {settings}, and the '
                            'checkpoints beside it trained on it; use a new --workdir.')
    logging.info('drafter: %s was sampled with %s; sampling again with %s', path, recorded,
                 settings)
  rng = np.random.default_rng(config.seed)
  labels = rng.integers(0, target.config.num_classes, config.num_target_samples).astype(np.int32)
  tokens = sample_from_target(target, target_params, labels,
                              key=jax.random.key(config.seed + 7),
                              batch_size=config.sample_batch_size,
                              temperature=config.sample_temperature,
                              cfg_scale=config.sample_cfg_scale)
  with files.atomic_file(path) as f:  # creates workdir
    np.savez(f, tokens=tokens, labels=labels, settings=np.array(settings))
  return tokens, labels
