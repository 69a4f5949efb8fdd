"""The bundled default model family (Fashion-MNIST) and what the main job needs from it.

Legend: N images, L tokens per image (the shipped family: 14 x 14 = 196
2x2-pixel patches of 28x28 images), V codebook size, E target width, F
classifier feature width.

A bundle folder holds one `write_params_atomic` folder per model (the same
format and loaders as converted LlamaGen checkpoints), the test split's
classifier feature statistics and a manifest:

  tokenizer/   patch or VQ tokenizer (converters.vq.load_tokenizer)
  target/      LlamaGen c2i target   (converters.llamagen.load_llamagen)
  eagle/       EAGLE-1 head          (converters.lantern_drafter.load_drafter)
  draft_gpt/   small LlamaGen GPT    (converters.llamagen.load_llamagen)
  classifier/  evaluation CNN        (converters.common.load_params)
  reference_features.npz   mean/cov of classifier features of the test split
  manifest.json            commands, data hashes, steps, final metrics
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
from typing import Any

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

import specdec_jax
from specdec_jax.app import evaluation
from specdec_jax.app import files
from specdec_jax.converters import common
from specdec_jax.converters import lantern_drafter
from specdec_jax.converters import llamagen as llamagen_converter
from specdec_jax.converters import vq as vq_converter
from specdec_jax.models import classifier as classifier_lib
from specdec_jax.models import llamagen
from specdec_jax.models import neighbors as neighbors_lib

# The bundle ships as package data of the top-level package, not of `app`.
BUNDLE_DIR = pathlib.Path(specdec_jax.__file__).resolve().parent / 'assets' / 'fashion_mnist'
PARTS = ('tokenizer', 'target', 'eagle', 'draft_gpt', 'classifier')


@dataclasses.dataclass
class Family:
  """Loaded models of one bundle plus evaluation helpers."""

  tokenizer: Any
  tokenizer_params: Any
  target: llamagen.LlamaGenGPT
  target_params: Any
  eagle: Any
  eagle_params: Any
  draft_gpt: llamagen.LlamaGenGPT
  draft_gpt_params: Any
  classifier_params: Any
  reference_mean: np.ndarray
  reference_cov: np.ndarray
  classifier_test_accuracy: float
  manifest: dict
  _neighbor_tables: dict = dataclasses.field(default_factory=dict, repr=False)

  @property
  def num_classes(self) -> int:
    return self.target.config.num_classes

  @property
  def num_tokens(self) -> int:
    return self.target.config.block_size

  @property
  def grid(self) -> tuple[int, int]:
    side = int(round(self.num_tokens ** 0.5))
    return side, side

  def neighbors(self, k: int) -> jax.Array:
    """LANTERN neighbour table int32[V, k] of the tokenizer's raw codebook (cached)."""
    if k not in self._neighbor_tables:
      codebook = self.tokenizer.codebook(self.tokenizer_params)  # [V, D], raw
      self._neighbor_tables[k] = jnp.asarray(neighbors_lib.neighbor_table(
          np.asarray(codebook), k, vocab_size=self.target.vocab_size))
    return self._neighbor_tables[k]

  def token_embeddings(self) -> jax.Array:
    """The target's input token embeddings [V, E] (GSD's distance space)."""
    return jnp.asarray(self.target_params['tok_embeddings']['embedding'], jnp.float32)

  def decode(self, tokens) -> np.ndarray:
    """Token grids int[N, L] -> uint8[N, H, W, 1] images."""
    images = self.tokenizer.decode(self.tokenizer_params, jnp.asarray(tokens, jnp.int32),
                                   self.grid)
    return np.asarray(self.tokenizer.to_uint8(images))

  def classify(self, images) -> tuple[np.ndarray, np.ndarray]:
    """uint8[N, H, W, 1] -> (class logits [N, 10], features [N, F])."""
    logits, features = _classifier_apply(self.classifier_params, jnp.asarray(images))
    return np.asarray(logits), np.asarray(features)

  def frechet(self, features) -> float:
    """Frechet distance of features [N, F] to the test split's statistics."""
    mean, cov = evaluation.feature_statistics(features)
    return evaluation.frechet_distance(mean, cov, self.reference_mean, self.reference_cov)

  def guided_nll(self, labels, tokens, sampling) -> float:
    """Mean per-token NLL of tokens [N, L] under the distribution decoding samples
    from (CFG combine with the null class, then temperature / top-k / top-p)."""
    return float(np.mean(self.guided_image_nlls(labels, tokens, sampling)))

  def guided_image_nlls(self, labels, tokens, sampling) -> np.ndarray:
    """Each image's mean per-token NLL, float64[N], as `guided_nll`."""
    labels = jnp.asarray(labels, jnp.int32)
    tokens = jnp.asarray(tokens, jnp.int32)
    log_probs = _guided_log_probs(self.target, self.target_params, labels, tokens, sampling)
    return evaluation.image_nlls(log_probs)

  def guided_probs(self, labels, tokens, sampling) -> jax.Array:
    """The law decoding samples image token i from, given tokens [N, L]'s first i:
    float32[N, L, V], teacher-forced (what `guided_nll` reads at the tokens)."""
    return _guided_probs(self.target, self.target_params, jnp.asarray(labels, jnp.int32),
                         jnp.asarray(tokens, jnp.int32), sampling)

  def manifest_summary(self) -> dict:
    return {part: self.manifest.get(part, {}).get('final_metrics', {}) for part in PARTS}


@jax.jit
def _classifier_apply(params, images):
  return classifier_lib.Classifier().apply(params, images)


@functools.partial(jax.jit, static_argnums=0)  # sampling traced: one program per CFG flag
def _guided_probs(target, params, labels, tokens, sampling):
  """Sampling.probs of teacher-forced logits: float32[N, L, V] for tokens [N, L]."""
  config = target.config
  inputs = tokens[:, :-1]
  cond_logits = llamagen.forward_logits(params, config, labels, inputs)
  uncond_logits = None
  if sampling.uses_cfg:
    null = jnp.full_like(labels, config.num_classes)
    uncond_logits = llamagen.forward_logits(params, config, null, inputs)
  positions = jnp.arange(tokens.shape[1])[None, :]
  return sampling.probs(cond_logits, uncond_logits, token_index=positions)


@functools.partial(jax.jit, static_argnums=0)  # sampling traced: one program per CFG flag
def _guided_log_probs(target, params, labels, tokens, sampling):
  """log p(token) [N, L] under `_guided_probs`."""
  probs = _guided_probs(target, params, labels, tokens, sampling)
  return jnp.log(jnp.take_along_axis(probs, tokens[..., None], axis=-1)[..., 0])


def write_bundle(directory, *, tokenizer, tokenizer_params, target, target_params, eagle,
                 eagle_params, draft_gpt, draft_gpt_params, classifier_params,
                 classifier_test_accuracy: float, reference_mean, reference_cov,
                 manifest: dict | None = None, overwrite: bool = False) -> pathlib.Path:
  """Writes a bundle folder that `load` reads (each part, each file, written
  atomically; the manifest last).

  eagle_params may include the target's head (`lm_head`); it is dropped, since
  `load` re-attaches the target's own head.
  """
  root = pathlib.Path(directory)
  root.mkdir(parents=True, exist_ok=True)
  eagle_params = {k: v for k, v in eagle_params.items() if k != 'lm_head'}
  parts = {
      'tokenizer': (tokenizer_params, tokenizer.config.to_dict(),
                    dict(kind=tokenizer.config.to_dict().get('kind', 'vq'))),
      'target': (target_params, dataclasses.asdict(target.config), dict(model='llamagen_gpt')),
      'draft_gpt': (draft_gpt_params, dataclasses.asdict(draft_gpt.config),
                    dict(model='llamagen_gpt')),
      'eagle': (eagle_params, dataclasses.asdict(eagle.config), dict(model='eagle_drafter')),
      'classifier': (classifier_params, dict(model='Classifier'),
                     dict(test_accuracy=float(classifier_test_accuracy))),
  }
  for name, (params, config, meta) in parts.items():
    common.write_params_atomic(root / name, jax.device_get(params), config=config,
                               source_files=[], converter='specdec_jax.app.family.write_bundle',
                               extra_meta=meta, overwrite=overwrite)
  with files.atomic_file(root / 'reference_features.npz') as f:
    np.savez(f, mean=np.asarray(reference_mean), cov=np.asarray(reference_cov))
  # Last: the trainer takes a bundle whose manifest reads as finished.
  files.write_atomic(root / 'manifest.json',
                     json.dumps(manifest or {}, indent=1, default=str).encode())
  return root


def bundle_available(directory: str | pathlib.Path | None = None) -> bool:
  root = pathlib.Path(directory) if directory else BUNDLE_DIR
  return (all((root / p / common.META_FILENAME).exists() for p in PARTS)
          and (root / 'reference_features.npz').exists())  # what `load` reads


def load(directory: str | pathlib.Path | None = None) -> Family:
  """Loads a bundle (default: the one shipped in the package).

  Every parameter tree is placed on JAX's default device once, here: the
  converters' loaders return NumPy arrays, which a jitted call (such as
  `decode.generate`) would copy to the device again on every call.
  """
  root = pathlib.Path(directory) if directory else BUNDLE_DIR
  missing = [p for p in PARTS if not (root / p / common.META_FILENAME).exists()]
  if missing or not (root / 'reference_features.npz').exists():
    raise FileNotFoundError(
        f'{root} is not a complete model bundle (missing: {missing or "reference_features.npz"}). '
        'The repository ships one in specdec_jax/assets/fashion_mnist; rebuild it with '
        '`python -m specdec_jax.app.train.family`, or pass --config.bundle_dir.')
  # Orbax logs every array it reads at INFO. The absl logger's own level is restored
  # (set_verbosity(get_verbosity()) would turn an unset level into WARNING for good).
  absl_logger = logging.get_absl_logger()
  level = absl_logger.level
  absl_logger.setLevel(logging.converter.absl_to_standard(logging.WARNING))
  try:
    return _load_parts(root)
  finally:
    absl_logger.setLevel(level)


def _load_parts(root: pathlib.Path) -> Family:
  tokenizer, tokenizer_params = vq_converter.load_tokenizer(root / 'tokenizer')
  target, target_params = llamagen_converter.load_llamagen(root / 'target')
  draft_gpt, draft_gpt_params = llamagen_converter.load_llamagen(root / 'draft_gpt')
  eagle, eagle_params = lantern_drafter.load_drafter(root / 'eagle',
                                                     target_params['output']['kernel'])
  classifier_params, classifier_meta = common.load_params(root / 'classifier')
  (tokenizer_params, target_params, draft_gpt_params, eagle_params,
   classifier_params) = jax.device_put((tokenizer_params, target_params, draft_gpt_params,
                                        eagle_params, classifier_params))
  reference = np.load(root / 'reference_features.npz')
  manifest = json.loads((root / 'manifest.json').read_text()) if (
      root / 'manifest.json').exists() else {}
  return Family(
      tokenizer=tokenizer, tokenizer_params=tokenizer_params, target=target,
      target_params=target_params, eagle=eagle, eagle_params=eagle_params,
      draft_gpt=draft_gpt, draft_gpt_params=draft_gpt_params,
      classifier_params=classifier_params, reference_mean=reference['mean'],
      reference_cov=reference['cov'],
      classifier_test_accuracy=float(classifier_meta.get('test_accuracy', float('nan'))),
      manifest=manifest)
