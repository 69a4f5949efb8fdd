"""Flax model implementations (installed as specdec_jax.models)."""
