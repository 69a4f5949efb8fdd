"""Training entry points (absl apps with ml_collections configs)."""
