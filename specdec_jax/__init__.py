"""specdec-jax: speculative decoding for autoregressive image generators in JAX.

Modules:
  rules       acceptance rules (Lossless, UniformRelaxed, CoolSD, Lantern,
              LanternPP, ContentAware, Grouped) with their residuals
  verify      one-step output law, chain and static-tree verification
  logits      the logits processing shared by target and draft
  kv_cache    static-shape caches with per-row lengths
  protocol    the model protocol the decoding engine needs
"""

__version__ = '0.1.0'
