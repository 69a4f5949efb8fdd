"""What an evaluation set is sampled with: the model family, the method and the classes.

Legend: N images, L image tokens per image, V vocabulary, H x W pixels.

A model is either the bundled Fashion-MNIST family (`kind='fashion'`) or a
converted LlamaGen class-conditional checkpoint with its VQ tokenizer and,
optionally, a converted EAGLE/LANTERN drafter and a small LlamaGen drafting
GPT (`kind='llamagen'`); both load into `family_lib.Family`, so methods are
named and built exactly as the main command builds them
(`app.generate.build_methods`).
"""

from __future__ import annotations

import hashlib
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from specdec_jax.app import family as family_lib
from specdec_jax.app import generate
from specdec_jax.converters import common
from specdec_jax.converters import lantern_drafter
from specdec_jax.converters import llamagen as llamagen_converter
from specdec_jax.converters import vq as vq_converter

KINDS = ('fashion', 'llamagen')
# The main command's methods; its second vanilla seed is a noise level, not a method.
METHODS = tuple(m for m in generate.METHOD_NAMES if m != 'vanilla_seed1')
DRAFTER_FIELDS = {'eagle': 'eagle', 'draft_model': 'draft_model'}  # Method.drafter -> config


def _meta_sha256(folder) -> str:
  """SHA-256 of a checkpoint folder's metadata (its config and source-file hashes)."""
  return hashlib.sha256((pathlib.Path(folder) / common.META_FILENAME).read_bytes()).hexdigest()


def _require_checkpoint(field: str, path: str) -> pathlib.Path:
  if not path:
    raise ValueError(f'config.model.{field} is empty: set it to a converted checkpoint folder '
                     f'(README, "Models and converters"), e.g. --config.model.{field}=ckpts/...')
  folder = pathlib.Path(path)
  if not (folder / common.META_FILENAME).exists():
    raise FileNotFoundError(
        f'config.model.{field}={path!r} is not a converted checkpoint folder (no '
        f'{common.META_FILENAME} there'
        + ('' if folder.exists() else '; the folder does not exist')
        + '). Convert the released weights first (README, "Models and converters").')
  return folder


def check_model_config(model: ml_collections.ConfigDict) -> None:
  """Raises early (before JAX starts) on an unknown kind or missing checkpoint paths."""
  if model.kind not in KINDS:
    raise ValueError(f'config.model.kind={model.kind!r} is unknown; known: {KINDS}.')
  if model.kind == 'fashion':
    if not family_lib.bundle_available(model.bundle_dir or None):
      raise FileNotFoundError(
          f'config.model.bundle_dir={model.bundle_dir!r} is not a complete model bundle '
          f'(parts {family_lib.PARTS}); leave it empty for the bundled family, or build one '
          'with `python -m specdec_jax.train.family`.')
    return
  _require_checkpoint('checkpoint', model.checkpoint)
  _require_checkpoint('vq', model.vq)
  for field in DRAFTER_FIELDS.values():
    if model[field]:
      _require_checkpoint(field, model[field])


def load(model: ml_collections.ConfigDict) -> tuple[family_lib.Family, dict]:
  """Loads the model family; returns it with its identity (metadata hashes per part).

  The identity, not the paths, goes into the output folder's fingerprint: the
  same checkpoints reached by another path give the same images.
  """
  check_model_config(model)
  if model.kind == 'fashion':
    root = pathlib.Path(model.bundle_dir) if model.bundle_dir else family_lib.BUNDLE_DIR
    family = family_lib.load(root)
    return family, dict(kind='fashion', **{part: _meta_sha256(root / part)
                                           for part in family_lib.PARTS})
  target, target_params = llamagen_converter.load_llamagen(model.checkpoint)
  if target.config.model_type != 'c2i':
    raise ValueError(f'config.model.checkpoint={model.checkpoint!r} is a '
                     f'{target.config.model_type} model; this job samples class-conditional '
                     '(c2i) models, whose conditioning is config.classes.')
  tokenizer, tokenizer_params = vq_converter.load_tokenizer(model.vq)
  eagle = eagle_params = draft_gpt = draft_gpt_params = None
  if model.eagle:
    eagle, eagle_params = lantern_drafter.load_drafter(model.eagle,
                                                       target_params['output']['kernel'])
  if model.draft_model:
    draft_gpt, draft_gpt_params = llamagen_converter.load_llamagen(model.draft_model)
  family = family_lib.Family(
      tokenizer=tokenizer, tokenizer_params=tokenizer_params, target=target,
      target_params=target_params, eagle=eagle, eagle_params=eagle_params,
      draft_gpt=draft_gpt, draft_gpt_params=draft_gpt_params, classifier_params=None,
      reference_mean=None, reference_cov=None, classifier_test_accuracy=float('nan'),
      manifest={})
  identity = dict(kind='llamagen', checkpoint=_meta_sha256(model.checkpoint),
                  vq=_meta_sha256(model.vq))
  for field in DRAFTER_FIELDS.values():
    if model[field]:
      identity[field] = _meta_sha256(model[field])
  return family, identity


def build_method(config: ml_collections.ConfigDict, family: family_lib.Family) -> generate.Method:
  """The method config.method names, with config.hparams, checked against the family."""
  if config.method not in METHODS:
    raise ValueError(f'config.method={config.method!r} is unknown; known: {METHODS}.')
  named = ml_collections.ConfigDict(dict(config.hparams.to_dict(),
                                         methods=('vanilla', config.method)))
  method = generate.build_methods(named, family)[-1]
  if method.drafter is not None and getattr(
      family, 'eagle' if method.drafter == 'eagle' else 'draft_gpt') is None:
    field = DRAFTER_FIELDS[method.drafter]
    raise ValueError(
        f'config.method={config.method!r} drafts with {method.drafter!r}, which this model '
        f'has none of: set --config.model.{field} to a converted drafter, or choose a method '
        "without a drafter ('vanilla', 'sjd', 'gsd', 'csd').")
  return method


def classes(config: ml_collections.ConfigDict, family: family_lib.Family) -> tuple[int, ...]:
  """config.classes (every class when empty); image i gets classes[i % len(classes)]."""
  if config.get('prompts'):
    raise ValueError(f'config.prompts={config.prompts!r}: this model is class-conditional '
                     '(c2i) and takes no prompts; set config.classes (empty = every class).')
  chosen = tuple(int(c) for c in config.classes) or tuple(range(family.num_classes))
  bad = [c for c in chosen if not 0 <= c < family.num_classes]
  if bad:
    raise ValueError(f'config.classes has {bad}, outside [0, {family.num_classes}) for this '
                     'model.')
  return chosen


def image_decoder(family: family_lib.Family, batch: int):
  """tokens int[n, L] -> uint8[n, H, W, 3], decoded in padded batches of fixed size
  `batch` (the same shapes whatever n, so an image's pixels never depend on it)."""
  decode = jax.jit(lambda params, tokens: family.tokenizer.to_uint8(
      family.tokenizer.decode(params, tokens, family.grid)))

  def decode_images(tokens: np.ndarray) -> np.ndarray:
    out = []
    for start in range(0, len(tokens), batch):
      piece = tokens[start:start + batch]
      padded = np.zeros((batch,) + piece.shape[1:], np.int32)
      padded[:len(piece)] = piece
      out.append(np.asarray(decode(family.tokenizer_params, jnp.asarray(padded)))[:len(piece)])
    images = np.concatenate(out)
    return np.repeat(images, 3, axis=-1) if images.shape[-1] == 1 else images

  return decode_images
