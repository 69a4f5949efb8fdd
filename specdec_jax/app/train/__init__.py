"""Training entry points (absl apps with ml_collections configs).

Run as `python -m specdec_jax.app.train.<name>`; `family` trains the whole bundled family.
"""
