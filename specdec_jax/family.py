"""Moved to `specdec_jax.app.family`; this old path is an alias that warns."""

from specdec_jax import _moved

_SHIM_FOR = 'specdec_jax.app.family'

_moved.alias(__name__, _SHIM_FOR)
