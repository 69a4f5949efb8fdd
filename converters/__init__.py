"""Checkpoint converters (installed as specdec_jax.converters)."""
