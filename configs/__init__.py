"""ml_collections configs (installed as specdec_jax.configs)."""
