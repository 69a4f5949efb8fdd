"""Writing converted checkpoints (and reading them back): atomic Orbax folders.

`write_params_atomic` writes an Orbax checkpoint plus `specdec_meta.json`
(config, sha256 and size of each source file, converter, dtype, date) into a
temporary sibling folder and renames it into place, so a failed run leaves
nothing behind; `load_params` reads it back for the engine. `Progress` logs
long loops. Part of `specdec_jax.converters.common`, which re-exports every
public name.

Legend: "params" is the nested Flax parameter tree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import glob
import hashlib
import json
import os
import pathlib
import shutil
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.converters.checkpoint_read import CheckpointReadError

META_FILENAME = 'specdec_meta.json'
PARAMS_SUBDIR = 'params'
PER_KEY_LAYOUT = 'per_top_level_key'  # params/<key>/ holds one Orbax item per entry

# ---------------------------------------------------------------- progress ---


class Progress:
  """Logs "converting 37/88 tensors" about `num_logs` times over a loop."""

  def __init__(self, total: int, what: str = 'tensors', verb: str = 'converting',
               num_logs: int = 10):
    self.total, self.what, self.verb, self.count = total, what, verb, 0
    self._every = max(1, total // max(1, num_logs))

  def step(self, name: str = '') -> None:
    self.count += 1
    if self.count % self._every == 0 or self.count == self.total:
      logging.info('%s %d/%d %s%s', self.verb, self.count, self.total, self.what,
                   f' ({name})' if name else '')


# --------------------------------------------------------- params helpers ---


def cast_params(params: Any, dtype: Any) -> Any:
  """Casts every floating leaf to `dtype` ('float32', 'bfloat16', ...); ints stay."""
  if dtype is None:
    return params
  target = jnp.dtype(dtype)

  def cast(leaf):
    if jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
      if isinstance(leaf, np.ndarray):
        return leaf.astype(target, copy=False)
      return jnp.asarray(leaf).astype(target)
    return leaf

  return jax.tree_util.tree_map(cast, params)


STORED = 'stored'  # a converter's --dtype default: keep the checkpoint's own dtype
OUTPUT_DTYPES = (STORED, 'float32', 'bfloat16')


def check_output_dtype(dtype: Any) -> str:
  """dtype (None means STORED) if it is one of OUTPUT_DTYPES, else ValueError."""
  dtype = STORED if dtype is None else dtype
  if dtype not in OUTPUT_DTYPES:
    raise ValueError(f'--dtype must be one of {OUTPUT_DTYPES} ({STORED!r}, the default, keeps '
                     f'the checkpoint\'s own dtype), got {dtype!r}.')
  return dtype


def lossless_dtype(dtype_names: Iterable[str]) -> str | None:
  """The floating dtype that holds every value of the named dtypes exactly.

  One floating dtype: that one (a bf16 checkpoint stays bf16, an fp32 one fp32,
  as Hugging Face's `torch_dtype='auto'`); several: the widest, float32 for a
  mix of 2-byte ones (float32 holds every bfloat16 and float16 value); None
  without floating dtypes. Names as numpy gives them ('float32', 'bfloat16').
  """
  floats = {str(name).removeprefix('torch.') for name in dtype_names}
  floats = {name for name in floats if name.startswith(('float', 'bfloat'))}
  if len(floats) <= 1:
    return floats.pop() if floats else None
  widest = max(floats, key=lambda name: jnp.dtype(name).itemsize)
  return 'float32' if jnp.dtype(widest).itemsize < 4 else widest


def output_dtype(requested: Any, dtype_names: Iterable[str]) -> str:
  """The dtype a converter writes: `lossless_dtype` of the checkpoint's tensors for
  STORED (float32 if it holds no floats), else the requested one."""
  requested = check_output_dtype(requested)
  if requested != STORED:
    return requested
  return lossless_dtype(dtype_names) or 'float32'


def params_dtype(params: Any) -> str:
  """Name of the floating dtype(s) in a param tree, e.g. 'float32'."""
  dtypes = sorted({str(jnp.result_type(x)) for x in jax.tree_util.tree_leaves(params)
                   if jnp.issubdtype(jnp.result_type(x), jnp.floating)})
  return ','.join(dtypes) or 'none'


def count_params(params: Any) -> int:
  return int(sum(np.size(x) for x in jax.tree_util.tree_leaves(params)))


# ------------------------------------------------------------ writing ---


def sha256_file(path: str | os.PathLike, chunk_bytes: int = 1 << 22) -> str:
  """Hex sha256 of a file, read in chunks."""
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(chunk_bytes), b''):
      digest.update(chunk)
  return digest.hexdigest()


def _jsonable(config: Any) -> Any:
  if dataclasses.is_dataclass(config) and not isinstance(config, type):
    config = dataclasses.asdict(config)
  if hasattr(config, 'to_dict'):  # ml_collections.ConfigDict
    config = config.to_dict()
  return json.loads(json.dumps(config, default=str))


def check_output_dir(out_dir: str | os.PathLike, overwrite: bool = False) -> pathlib.Path:
  """The absolute output folder, after checking it can be written (before any
  conversion work): it must not exist unless `overwrite`, and its nearest
  existing parent must be a folder we can create entries in (probed with a
  temporary folder, removed again).

  Raises:
    FileExistsError: it exists and `overwrite` is False.
    ValueError: it cannot be written (the message names the folder in the way), or
      it is neither empty nor a converted checkpoint (`overwrite` would delete it).
  """
  out_dir = pathlib.Path(out_dir).absolute()
  if out_dir.exists() and not overwrite:
    raise FileExistsError(
        f'Output folder {str(out_dir)!r} already exists. Choose another '
        '--output or pass --overwrite.')
  if out_dir.exists() and not out_dir.is_dir():
    raise ValueError(f'--output {str(out_dir)!r} is a file, not a folder; choose a folder.')
  if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / META_FILENAME).is_file():
    raise ValueError(
        f'--output {str(out_dir)!r} holds files but no {META_FILENAME}: it is not a converted '
        'checkpoint, and --overwrite replaces only a converted checkpoint or an empty folder. '
        'Choose another --output.')
  parent = next(folder for folder in out_dir.parents if folder.exists())  # '/' exists
  try:
    if not parent.is_dir():
      raise NotADirectoryError(f'{str(parent)!r} is a file')
    os.rmdir(tempfile.mkdtemp(prefix='.specdec-write-probe-', dir=parent))
  except OSError as e:
    raise ValueError(f'--output {str(out_dir)!r} cannot be written: no folder can be created '
                     f'in {str(parent)!r} ({e}). Choose a writable --output.') from e
  return out_dir


def _warn_stale_siblings(out_dir: pathlib.Path) -> None:
  """Logs the temporary folders earlier writes of `out_dir` left (a killed process
  cannot remove its `.<name>.tmp-<id>`, a failed removal leaves `.<name>.old-<id>`;
  a 7B conversion leaves tens of GB). Never fails: a folder another write is
  changing now is named without its size."""
  stale = sorted(out_dir.parent.glob(f'.{glob.escape(out_dir.name)}.tmp-*')) + sorted(
      out_dir.parent.glob(f'.{glob.escape(out_dir.name)}.old-*'))
  for folder in stale:
    try:
      size = f' ({sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6:.1f} MB)'
    except OSError:
      size = ''
    logging.warning('%s%s was left by an earlier, interrupted write into %s; delete it '
                    'unless another write into that folder is running now.', folder, size,
                    out_dir)


def written_by() -> dict:
  """Which code wrote a checkpoint, and how it was called: the specdec_jax and JAX
  versions and the command line (provenance only: not part of the model's
  identity, like the date and the source paths)."""
  import specdec_jax  # pylint: disable=g-import-not-at-top
  return {'specdec_jax': specdec_jax.__version__, 'jax': jax.__version__,
          'command': ' '.join([pathlib.Path(sys.executable).name, *sys.argv])}


@contextlib.contextmanager
def _interrupt_after_block():
  """Holds a Ctrl-C back until the block (an Orbax save) ends, then raises KeyboardInterrupt:
  one inside `save` leaves Orbax's writer threads running untracked, writing into the
  folder after its removal. A second Ctrl-C stops at once. Main thread, default handler."""
  if (threading.current_thread() is not threading.main_thread()
      or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
    yield
    return
  received = []

  def hold(signum, frame):
    if received:
      signal.default_int_handler(signum, frame)
    received.append(signum)

  signal.signal(signal.SIGINT, hold)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, signal.default_int_handler)
  if received:
    raise KeyboardInterrupt


def write_params_atomic(
    out_dir: str | os.PathLike,
    params: Any,
    *,
    config: Any,
    source_files: Sequence[str | os.PathLike],
    converter: str = '',
    extra_meta: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    use_ocdbt: bool = False,
    consume: bool = False,
) -> pathlib.Path:
  """Writes an Orbax checkpoint of `params` plus `specdec_meta.json`, atomically.

  Everything is written into a temporary sibling folder
  (`<parent>/.<name>.tmp-<id>`) which is renamed to `out_dir` at the end. On
  any exception the temporary folder is removed once Orbax's background save
  has ended (a Ctrl-C takes effect once the entry being saved is written), and
  so are the parent folders this call created: `out_dir` either holds a
  complete checkpoint or does not exist.

  Args:
    out_dir: destination folder; must not exist unless `overwrite`.
    params: the param pytree (numpy or jax arrays).
    config: the model config (dataclass, ConfigDict or dict), stored in meta.
    source_files: files converted; their sha256 and size are recorded.
    converter: name of the converter (stored in meta).
    extra_meta: more JSON-serialisable metadata.
    overwrite: replace an existing `out_dir`.
    use_ocdbt: Orbax's OCDBT format. Off by default: one file per array keeps
      peak host memory near 1.2x the checkpoint, while OCDBT buffers a second
      copy while saving (bench/convert_memory.py measured 1.8x for 2 GB).
    consume: pop the top-level entries of a dict `params` as they are written
      (the caller's dict is emptied), so converted weights are not held twice.
  Returns:
    The absolute path of `out_dir`.
  Raises:
    FileExistsError: `out_dir` exists and `overwrite` is False.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  out_dir = check_output_dir(out_dir, overwrite)
  made = [folder for folder in out_dir.parents if not folder.exists()]  # deepest first
  out_dir.parent.mkdir(parents=True, exist_ok=True)
  _warn_stale_siblings(out_dir)
  tmp_dir = out_dir.parent / f'.{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}'
  checkpointer = None
  try:
    tmp_dir.mkdir()
    meta = {
        'converter': converter,
        'config': _jsonable(config),
        'dtype': params_dtype(params),
        'num_params': count_params(params),
        'date': datetime.datetime.now(datetime.timezone.utc).isoformat(),
        'written_by': written_by(),
        'source_files': [],
    }
    for source in source_files:
      logging.info('hashing %s', source)
      meta['source_files'].append({
          'path': str(pathlib.Path(source).absolute()),
          'sha256': sha256_file(source),
          'bytes': os.path.getsize(source),
      })
    if extra_meta:
      meta.update(_jsonable(dict(extra_meta)))
    logging.info('writing %d parameters (%s) to %s', meta['num_params'],
                 meta['dtype'], out_dir)
    checkpointer = (ocp.StandardCheckpointer() if use_ocdbt
                    else ocp.StandardCheckpointer(use_ocdbt=False))
    if isinstance(params, Mapping) and params:
      # One Orbax item per top-level entry (a layer, the embeddings, ...): the
      # save buffers one entry at a time, and with `consume` each entry is
      # released once written, so peak host memory stays near one copy.
      meta['params_layout'] = PER_KEY_LAYOUT
      meta['params_keys'] = [str(k) for k in params]
      progress = Progress(len(meta['params_keys']), what='parameter groups', verb='writing')
      for name in list(params):
        entry = params.pop(name) if consume else params[name]
        with _interrupt_after_block():
          checkpointer.save(tmp_dir / PARAMS_SUBDIR / str(name), {'value': entry})
          checkpointer.wait_until_finished()
        del entry
        progress.step(str(name))
    else:
      with _interrupt_after_block():
        checkpointer.save(tmp_dir / PARAMS_SUBDIR, params)
        checkpointer.wait_until_finished()
    checkpointer.close()
    checkpointer = None
    with open(tmp_dir / META_FILENAME, 'w') as f:
      json.dump(meta, f, indent=2, sort_keys=True)
    if out_dir.exists():  # overwrite=True: move the old one aside first
      trash = out_dir.parent / f'.{out_dir.name}.old-{uuid.uuid4().hex[:8]}'
      os.rename(out_dir, trash)
      try:
        os.rename(tmp_dir, out_dir)
      except BaseException:
        os.rename(trash, out_dir)  # the old output back where it was
        raise
      shutil.rmtree(trash, ignore_errors=True)
    else:
      os.rename(tmp_dir, out_dir)
  except BaseException:
    try:  # Orbax's background save would write on into tmp_dir: let it end first
      if checkpointer is not None:
        checkpointer.close()
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('closing the checkpointer of a failed write: %s', e)
    finally:
      shutil.rmtree(tmp_dir, ignore_errors=True)
      for folder in made:  # the parents made above, where still empty
        with contextlib.suppress(OSError):
          folder.rmdir()
    raise
  logging.info('wrote %s', out_dir)
  return out_dir


def read_meta(out_dir: str | os.PathLike) -> dict[str, Any]:
  """The `specdec_meta.json` of a converted checkpoint."""
  path = pathlib.Path(out_dir) / META_FILENAME
  if not path.is_file():
    raise CheckpointReadError(
        f'{str(out_dir)!r} is not a converted specdec checkpoint: {META_FILENAME} '
        'is missing. Run a converter (python -m specdec_jax.converters.<model>) '
        'first.')
  with open(path) as f:
    return json.load(f)


def read_meta_of(out_dir: str | os.PathLike, model: str, what: str, converter: str) -> dict:
  """The metadata of a converted checkpoint whose `model` entry is `model`; else
  CheckpointReadError naming what the folder holds (a tokenizer has a `kind` instead)."""
  meta = read_meta(out_dir)
  if meta.get('model') != model:
    held = (repr(meta['model']) if meta.get('model') else f'{meta["kind"]!r} tokenizer'
            if meta.get('kind') else f'{meta.get("converter")!r}')
    raise CheckpointReadError(f'{str(out_dir)!r} holds a {held} checkpoint, not {what}; '
                              f'convert with python -m {converter}.')
  return meta


def load_params(out_dir: str | os.PathLike, dtype: Any = None) -> tuple[Any, dict[str, Any]]:
  """Reads a folder written by `write_params_atomic`.

  Args:
    out_dir: the converted checkpoint folder.
    dtype: cast floating leaves to this dtype (default: as stored).
  Returns:
    (params pytree of numpy arrays, metadata dict). Jitted calls move them to
    the device; `jax.device_put(params, shardings)` shards them.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  out_dir = pathlib.Path(out_dir).absolute()
  meta = read_meta(out_dir)
  checkpointer = ocp.StandardCheckpointer()
  if meta.get('params_layout') == PER_KEY_LAYOUT:
    params = {name: checkpointer.restore(out_dir / PARAMS_SUBDIR / name)['value']
              for name in meta['params_keys']}
  else:
    params = checkpointer.restore(out_dir / PARAMS_SUBDIR)
  checkpointer.close()
  return cast_params(params, dtype), meta
