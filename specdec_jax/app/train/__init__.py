"""Training entry points (absl apps with ml_collections configs).

Run as `python -m specdec_jax.train.<name>` (the old paths run these modules).
"""
