"""specdec-jax: speculative decoding for autoregressive image generators in JAX.

Modules:
  rules       acceptance rules (Lossless, UniformRelaxed, CoolSD, Lantern,
              LanternPP, ContentAware, Grouped) with their residuals
  rule_base   the Rule base class, mode names, min(1, w t/d), hyperparameter checks
  rules_neighbor, rules_grouped
              LANTERN / LANTERN++ (neighbour mass); GSD (grouped acceptance)
  schedules   COOL-SD's annealed acceptance weights
  resampling  residual distributions (standard and TV-optimal G*)
  verify      one-step output law, chain and static-tree verification
  logits      the logits processing shared by target and draft (CFG, ...)
  topk        top-k / top-p filtering: one sort, blocked (vocab-parallel), approx
  precision   the dtype rule: float32 on CPU, bfloat16 on GPU/TPU
  decode      the compiled decoding loop (vanilla, chain, tree, Jacobi)
  program_cache  compiled decodes by signature, compiled once across threads
  modes       decoding modes and the checks run before compiling
  mode_base, mode_chain, mode_tree, mode_dynamic_tree, mode_pac
              the mode classes: loop protocol; vanilla, chain, Jacobi; static
              tree; EAGLE-2 dynamic tree; SJD-PAC (Jacobi chain + proactive tree)
  drafting    drafter adapters, chain/tree drafting, Jacobi window updates
  dynamic_tree
              EAGLE-2 tree growth per image (top-k or sampled children)
  metrics     per-image decoding counters
  sharding    meshes and partition rules for parameters and caches
  kv_cache    static-shape caches with per-row lengths
  attention   cached multi-head attention shared by every model
  protocol    the model protocol the decoding engine needs
  testing     statistical checks of sample counts against exact laws

Layers (tests/test_layers.py checks the imports):
  core                     the modules above, at the top of this package;
                           imports no other layer
  specdec_jax.models       Flax models (repository folder models/); imports core
  specdec_jax.converters   checkpoint converters (repository folder
                           converters/); imports models and core
  specdec_jax.app          the application: main command, demo, bundled family,
                           data, evaluation, training (`app.train`); imports
                           every layer
  specdec_jax.configs      ml_collections configs (repository folder configs/)
                           beside the application; imports only other configs

Commands: `python -m specdec_jax.generate` (the main command, also
`specdec-generate`) and `python -m specdec_jax.sample` (the evaluation-set
sampler) only run their `specdec_jax.app` modules; the trainers run as
`python -m specdec_jax.app.train.<name>` (`family` trains the whole bundle).
"""

__version__ = '0.1.0'
