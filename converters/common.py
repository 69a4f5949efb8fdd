"""Shared pieces of every checkpoint converter: read, unwrap, validate, write.

A converter reads the released file (`load_state_dict`), drops what is not a
weight, checks every key and shape against the config it assumes
(`validate_keys`), renames/transposes into a Flax param tree, and writes it with
`write_params_atomic`: an Orbax checkpoint plus `specdec_meta.json` (config,
sha256 of each source file, converter, dtype, date), written to a temporary
sibling folder and renamed into place, so a failed run leaves nothing behind.
`load_params` reads it back for the engine.

Each job has its own module; this one re-exports their public names, so
`from specdec_jax.converters import common` keeps working:

* `checkpoint_read`: reading .pt/.pth/.bin/.ckpt and safetensors files,
  unwrapping `model`/`ema`/deepspeed/FSDP dicts, numpy conversion;
* `checkpoint_keys`: key and shape validation with missing / unexpected /
  mis-shaped reports;
* `checkpoint_write`: atomic Orbax writes, metadata and hashing, progress
  logs, reading converted checkpoints back.

Legend: a "state dict" is a flat `{name: array}` mapping in the original
(PyTorch) key layout; "params" is the nested Flax parameter tree.
"""

from __future__ import annotations

# pylint: disable=unused-import
from specdec_jax.converters.checkpoint_keys import check_loaded_params
from specdec_jax.converters.checkpoint_keys import CheckpointMismatchError
from specdec_jax.converters.checkpoint_keys import shapes_of
from specdec_jax.converters.checkpoint_keys import tree_shapes
from specdec_jax.converters.checkpoint_keys import validate_keys
from specdec_jax.converters.checkpoint_read import CheckpointReadError
from specdec_jax.converters.checkpoint_read import drop_keys
from specdec_jax.converters.checkpoint_read import load_raw_checkpoint
from specdec_jax.converters.checkpoint_read import load_state_dict
from specdec_jax.converters.checkpoint_read import read_json_object
from specdec_jax.converters.checkpoint_read import SAFETENSORS_SUFFIXES
from specdec_jax.converters.checkpoint_read import to_numpy
from specdec_jax.converters.checkpoint_read import TORCH_SUFFIXES
from specdec_jax.converters.checkpoint_read import unwrap_checkpoint
from specdec_jax.converters.checkpoint_read import WRAPPER_KEYS
from specdec_jax.converters.checkpoint_read import WRAPPER_PREFIXES
from specdec_jax.converters.checkpoint_write import cast_params
from specdec_jax.converters.checkpoint_write import check_output_dir
from specdec_jax.converters.checkpoint_write import check_output_dtype
from specdec_jax.converters.checkpoint_write import count_params
from specdec_jax.converters.checkpoint_write import load_params
from specdec_jax.converters.checkpoint_write import lossless_dtype
from specdec_jax.converters.checkpoint_write import META_FILENAME
from specdec_jax.converters.checkpoint_write import OUTPUT_DTYPES
from specdec_jax.converters.checkpoint_write import output_dtype
from specdec_jax.converters.checkpoint_write import PARAMS_SUBDIR
from specdec_jax.converters.checkpoint_write import params_dtype
from specdec_jax.converters.checkpoint_write import PER_KEY_LAYOUT
from specdec_jax.converters.checkpoint_write import Progress
from specdec_jax.converters.checkpoint_write import read_meta
from specdec_jax.converters.checkpoint_write import read_meta_of
from specdec_jax.converters.checkpoint_write import sha256_file
from specdec_jax.converters.checkpoint_write import STORED
from specdec_jax.converters.checkpoint_write import write_params_atomic
