"""Moved to `specdec_jax.app.train`; the modules here are aliases kept so that
`python -m specdec_jax.train.<name>` and old imports keep working."""

_SHIM_FOR = 'specdec_jax.app.train'
