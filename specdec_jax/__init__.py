"""specdec-jax: speculative decoding for autoregressive image generators in JAX.

Modules:
  rules       acceptance rules (Lossless, UniformRelaxed, CoolSD, Lantern,
              LanternPP, ContentAware, Grouped) with their residuals
  schedules   COOL-SD's annealed acceptance weights
  resampling  residual distributions (standard and TV-optimal G*)
  verify      one-step output law, chain and static-tree verification
  logits      the logits processing shared by target and draft (CFG, ...)
  decode      the compiled decoding loop (vanilla, chain, tree, Jacobi)
  modes       decoding modes and the checks run before compiling
  drafting    drafter adapters, chain/tree drafting, Jacobi window updates
  metrics     per-image decoding counters
  sharding    meshes and partition rules for parameters and caches
  kv_cache    static-shape caches with per-row lengths
  attention   cached multi-head attention shared by every model
  protocol    the model protocol the decoding engine needs
  testing     statistical checks of sample counts against exact laws
  evaluation  Frechet distance, class accuracy, NLL
  family      the bundled model family; generate / demo: the main command
  train       training entry points (VQ, GPT, EAGLE drafter, classifier)
Subpackages installed from the repository's top-level folders:
  specdec_jax.models, specdec_jax.converters, specdec_jax.configs.
"""

__version__ = '0.1.0'
