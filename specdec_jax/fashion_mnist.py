"""Moved to `specdec_jax.app.fashion_mnist`; this old path is an alias that warns."""

from specdec_jax import _moved

_SHIM_FOR = 'specdec_jax.app.fashion_mnist'

_moved.alias(__name__, _SHIM_FOR)
