"""What an evaluation set is sampled with: the model family, the method and the classes.

Legend: N images, L image tokens per image, V vocabulary, H x W pixels.

A model is either the bundled Fashion-MNIST family (`kind='fashion'`) or a
converted LlamaGen checkpoint (c2i, or t2i with a prompt file of caption
features) with its VQ tokenizer and,
optionally, a converted EAGLE/LANTERN drafter and a small LlamaGen drafting
GPT (`kind='llamagen'`); both load into `family_lib.Family`, so methods are
named and built exactly as the main command builds them
(`app.methods.build_methods`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from specdec_jax import mode_base
from specdec_jax.app import cli
from specdec_jax.app import config_checks
from specdec_jax.app import family as family_lib
from specdec_jax.app import methods as methods_lib
from specdec_jax.converters import common
from specdec_jax.converters import lantern_drafter
from specdec_jax.converters import llamagen as llamagen_converter
from specdec_jax.converters import vq as vq_converter
from specdec_jax.models import llamagen

KINDS = ('fashion', 'llamagen')
# The main command's methods; its second vanilla seed is a noise level, not a method.
METHODS = tuple(m for m in methods_lib.METHOD_NAMES if m != 'vanilla_seed1')
DRAFTER_FIELDS = {'eagle': 'eagle', 'draft_model': 'draft_model'}  # Method.drafter -> config


def _meta_sha256(folder, whole_file: bool = False) -> str:
  """SHA-256 of a checkpoint folder's metadata: its config, layout and the hashes of the
  files it was converted from, without when, from where and by what ('date', the
  source paths, 'written_by'), so the same source converted again, on another
  machine or by another version, is the same model. whole_file: the file's own hash, the identity folders sampled before
  this version recorded (`identity`'s older form)."""
  path = pathlib.Path(folder) / common.META_FILENAME
  if whole_file:
    return hashlib.sha256(path.read_bytes()).hexdigest()
  meta = json.loads(path.read_text())
  meta.pop('date', None)
  meta.pop('written_by', None)
  meta['source_files'] = [{k: v for k, v in source.items() if k != 'path'}
                          for source in meta.get('source_files', [])]
  return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()


def identity(model: ml_collections.ConfigDict, dtype: str | None = None,
             whole_files: bool = False) -> dict:
  """What the images depend on in config.model (the output folder's fingerprint holds
  it, not the paths: the same checkpoints reached by another path give the same
  images): each checkpoint's `_meta_sha256` and, for kind llamagen, the resolved
  compute dtype and scan_layers."""
  digest = lambda folder: _meta_sha256(folder, whole_files)
  if model.kind == 'fashion':
    root = pathlib.Path(model.bundle_dir) if model.bundle_dir else family_lib.BUNDLE_DIR
    return dict(kind='fashion', **{part: digest(root / part) for part in family_lib.PARTS})
  found = dict(kind='llamagen', checkpoint=digest(model.checkpoint), vq=digest(model.vq),
               dtype=dtype, scan_layers=bool(model.scan_layers))
  for field in DRAFTER_FIELDS.values():
    if model[field]:
      found[field] = digest(model[field])
  return found


def _require_checkpoint(field: str, path: str) -> pathlib.Path:
  if not path:
    raise cli.ConfigError(f'config.model.{field} is empty: set it to a converted checkpoint '
                          'folder (README, "Models and converters"), e.g. '
                          f'--config.model.{field}=ckpts/...')
  folder = pathlib.Path(path)
  if not (folder / common.META_FILENAME).exists():
    raise cli.ConfigError(
        f'config.model.{field}={path!r} is not a converted checkpoint folder (no '
        f'{common.META_FILENAME} there'
        + ('' if folder.exists() else '; the folder does not exist')
        + '). Convert the released weights first (README, "Models and converters").')
  return folder


def check_model_config(model: ml_collections.ConfigDict) -> None:
  """Raises cli.ConfigError early (before JAX starts) on an unknown kind, missing
  checkpoint paths, or paths and settings the kind would ignore (a drafter
  given to the bundle would silently decode with the bundle's own; a dtype
  with the bundle's float32)."""
  if model.kind not in KINDS:
    raise cli.ConfigError(f'config.model.kind={model.kind!r} is unknown; known: {KINDS}.')
  ignored = ('checkpoint', 'vq', *DRAFTER_FIELDS.values()) if model.kind == 'fashion' else (
      'bundle_dir',)
  for field in ignored:
    if model[field]:
      raise cli.ConfigError(
          f'config.model.{field}={model[field]!r} is not read by kind {model.kind!r}: '
          + ('the bundle brings its own checkpoints; set config.model.kind=llamagen to '
             'sample converted ones.' if model.kind == 'fashion' else
             'it names the bundle (kind fashion); leave it empty.'))
  if model.kind == 'fashion':
    for field, default in (('dtype', 'auto'), ('scan_layers', False)):
      if model[field] != default:
        raise cli.ConfigError(
            f'config.model.{field}={model[field]!r} is not read by kind \'fashion\': the bundle '
            f'decodes in float32 as trained; leave it {default!r}.')
    config_checks.check_bundle_dir(model.bundle_dir, 'config.model.bundle_dir', required=True)
    return
  _require_checkpoint('checkpoint', model.checkpoint)
  _require_checkpoint('vq', model.vq)
  for field in DRAFTER_FIELDS.values():
    if model[field]:
      _require_checkpoint(field, model[field])


def load(model: ml_collections.ConfigDict) -> tuple[family_lib.Family, dict]:
  """Loads the model family; returns it with its `identity`."""
  check_model_config(model)
  if model.kind == 'fashion':
    return family_lib.load(model.bundle_dir or None), identity(model)
  target, target_params = _checked(model, 'checkpoint', lambda: llamagen_converter.load_llamagen(
      model.checkpoint, dtype=model.dtype, scan_layers=model.scan_layers))
  tokenizer, tokenizer_params = _checked(model, 'vq', lambda: vq_converter.load_tokenizer(model.vq))
  tokenizer_params = jax.device_put(tokenizer_params)  # each batch's decode would copy it
  if tokenizer.vocab_size != target.vocab_size:  # else the images come out black, silently
    raise cli.ConfigError(
        f'config.model.vq={model.vq!r} has {tokenizer.vocab_size} codebook entries, but the GPT '
        f'of config.model.checkpoint={model.checkpoint!r} has a vocabulary of '
        f'{target.vocab_size} image tokens: give the tokenizer the GPT was trained with.')
  eagle = eagle_params = draft_gpt = draft_gpt_params = None
  if model.eagle:
    eagle, eagle_params = _checked(model, 'eagle', lambda: lantern_drafter.load_drafter(
        model.eagle, target_params['output']['kernel'], dtype=model.dtype))
    _checked(model, 'eagle', lambda: eagle.check_target(target), (ValueError,))
  if model.draft_model:
    draft_gpt, draft_gpt_params = _checked(model, 'draft_model', lambda: (
        llamagen_converter.load_llamagen(model.draft_model, dtype=model.dtype)))
    _checked(model, 'draft_model', lambda: mode_base.check_same_layout(target, draft_gpt),
             (ValueError,))
  family = family_lib.Family(
      tokenizer=tokenizer, tokenizer_params=tokenizer_params, target=target,
      target_params=target_params, eagle=eagle, eagle_params=eagle_params,
      draft_gpt=draft_gpt, draft_gpt_params=draft_gpt_params, classifier_params=None,
      reference_mean=None, reference_cov=None, classifier_test_accuracy=float('nan'),
      manifest={})
  return family, identity(model, str(target.config.dtype))


# What a checkpoint that does not fit raises: the converters' read and key errors, a
# missing file. Other errors are bugs and keep their traceback.
CHECKPOINT_ERRORS = (common.CheckpointReadError, common.CheckpointMismatchError,
                     FileNotFoundError)


def _checked(model: ml_collections.ConfigDict, field: str, load: Callable,
             errors: tuple = CHECKPOINT_ERRORS) -> Any:
  """load(), with `errors` as a ConfigError naming config.model.<field>."""
  try:
    return load()
  except errors as error:
    raise cli.ConfigError(f'config.model.{field}={model[field]!r}: {error}') from error


def build_method(config: ml_collections.ConfigDict,
                 family: family_lib.Family) -> methods_lib.Method:
  """The method config.method names, with config.hparams, checked against the family."""
  if config.method not in METHODS:
    raise cli.ConfigError(f'config.method={config.method!r} is unknown; known: {METHODS}.')
  named = ml_collections.ConfigDict(dict(config.hparams.to_dict(),
                                         methods=('vanilla', config.method)))
  method = methods_lib.build_methods(named, family)[-1]
  if method.drafter == 'draft_model' and family.target.config.model_type == 't2i':
    raise cli.ConfigError("config.method='draft_model' conditions its draft GPT on class ids "
                          "(app.generate.decode_kwargs); this model is t2i: choose another method "
                          "(e.g. 'eagle', 'sjd').")
  if method.drafter is not None and getattr(
      family, 'eagle' if method.drafter == 'eagle' else 'draft_gpt') is None:
    raise _missing_drafter(config.method, method.drafter)
  return method


def _missing_drafter(method: str, drafter: str) -> cli.ConfigError:
  without = tuple(m for m in METHODS if m not in methods_lib.DRAFTERS)
  return cli.ConfigError(
      f'config.method={method!r} drafts with {drafter!r}, which this model has none of: set '
      f'--config.model.{DRAFTER_FIELDS[drafter]} to a converted drafter, or choose a method '
      f'without a drafter {without}.')


def check_method_drafter(config: ml_collections.ConfigDict) -> None:
  """Raises cli.ConfigError before JAX starts when config.method drafts with a model
  that config.model does not name (a converted checkpoint's family; the bundle has both)."""
  drafter = methods_lib.DRAFTERS.get(config.method)
  if drafter is not None and config.model.kind != 'fashion' and not config.model[
      DRAFTER_FIELDS[drafter]]:
    raise _missing_drafter(config.method, drafter)


@dataclasses.dataclass(frozen=True)
class Conditions:
  """What image i is conditioned on: entry i % count of `classes` (c2i) or of the
  prompts' caption features (t2i).

  Attributes:
    name: the metrics record's key, 'label' or 'prompt'.
    classes: int32[count] class ids (c2i), or None.
    captions: t2i prompts as left-padded `CaptionCond(features float32[count, P, C],
      mask bool[count, P])`, or None.
    identity: what the images depend on (the classes, or the prompt file's SHA-256).
  """

  name: str
  classes: np.ndarray | None = None
  captions: llamagen.CaptionCond | None = None
  identity: object = None

  @property
  def count(self) -> int:
    return len(self.classes) if self.classes is not None else len(self.captions.features)

  def values(self, ids: np.ndarray) -> np.ndarray:
    """What the metrics record: the class id (c2i) or the prompt's row (t2i)."""
    return self.classes[ids] if self.classes is not None else np.asarray(ids)

  def cond(self, ids: np.ndarray):
    """Unguided conditioning of the rows with condition ids int[G] (entries < count)."""
    if self.classes is not None:
      return jnp.asarray(self.classes[ids])
    return llamagen.CaptionCond(features=jnp.asarray(self.captions.features[ids]),
                                mask=jnp.asarray(self.captions.mask[ids]))


def _read_prompts(path: str, target) -> llamagen.CaptionCond:
  """A prompt file: .npz of FLAN-T5 outputs as T5 gives them, `features`
  float[n, P, C] with valid tokens first and `mask` [n, P] (1 on a prefix),
  left padded here as LlamaGen's sample_t2i.py does."""
  want = (target.config.cls_token_num, target.config.caption_dim)
  try:
    with np.load(path) as loaded:
      features, mask = loaded['features'], loaded['mask']
  except (OSError, KeyError, ValueError) as e:
    raise cli.ConfigError(f'config.prompts={path!r}: expected an .npz with `features` '
                          f'float[n, {want[0]}, {want[1]}] (FLAN-T5 outputs, valid tokens first) '
                          f'and `mask` [n, {want[0]}]; reading it failed: {e}') from e
  if features.ndim != 3 or features.shape[1:] != want or mask.shape != features.shape[:2]:
    raise cli.ConfigError(f'config.prompts={path!r}: features {features.shape} and mask '
                          f'{mask.shape} do not fit this model: want [n, {want[0]}, {want[1]}] '
                          f'and [n, {want[0]}].')
  captions = llamagen.left_pad_captions(jnp.asarray(features, jnp.float32), jnp.asarray(mask))
  return jax.tree.map(np.asarray, captions)


def conditions(config: ml_collections.ConfigDict, family: family_lib.Family) -> Conditions:
  """config.classes (c2i; empty = every class) or config.prompts (t2i), checked
  against the model."""
  model_type = family.target.config.model_type
  if model_type == 't2i':
    if not config.prompts:
      raise cli.ConfigError('this model is text-conditional (t2i): set config.prompts to a prompt '
                            'file (.npz of FLAN-T5 caption features, docs/sampling.md).')
    if not pathlib.Path(config.prompts).is_file():
      raise cli.ConfigError(f'config.prompts={config.prompts!r}: no such file.')
    digest = hashlib.sha256(pathlib.Path(config.prompts).read_bytes()).hexdigest()
    return Conditions('prompt', captions=_read_prompts(config.prompts, family.target),
                      identity=dict(prompts_sha256=digest))
  if config.prompts:
    raise cli.ConfigError(f'config.prompts={config.prompts!r}: this model is class-conditional '
                          '(c2i) and takes no prompts; set config.classes (empty = every class).')
  chosen = tuple(int(c) for c in config.classes) or tuple(range(family.num_classes))
  config_checks.check_classes(chosen, family, 'config.classes')
  return Conditions('label', classes=np.asarray(chosen, np.int32), identity=list(chosen))


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
