"""Split and moved: the Markov toys to `specdec_jax.toy` (core), the tiny transformer
to `specdec_jax.models.tiny`. This old path re-exports both, with a DeprecationWarning."""

import warnings

from specdec_jax.models.tiny import TinyConfig
from specdec_jax.models.tiny import TinyTransformer
from specdec_jax.toy import cfg_class_rows
from specdec_jax.toy import check_class_ids
from specdec_jax.toy import MarkovToy
from specdec_jax.toy import ToyEagle

_SHIM_FOR = ('specdec_jax.toy', 'specdec_jax.models.tiny')

warnings.warn('specdec_jax.models.toy moved: import MarkovToy, ToyEagle and cfg_class_rows from '
              'specdec_jax.toy, TinyTransformer and TinyConfig from specdec_jax.models.tiny.',
              DeprecationWarning, stacklevel=2)
