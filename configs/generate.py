"""The main job: every method on the bundled Fashion-MNIST model family.

  python -m specdec_jax.generate --out results
  python -m specdec_jax.generate --config configs/generate.py --config.images_per_class=2 --out results

Each method is a decoding mode plus an acceptance rule (specdec_jax.rules);
all of them share one sampling configuration, so speed and drift compare
like with like. Hyperparameters here are the defaults the README's table was
measured with.
"""

import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  config.bundle_dir = ''  # '' = the bundled family shipped inside the package
  config.seed = 0
  config.images_per_class = 10  # quality pass: 10 x this many images
  # Quality-pass images per decode call (0: all at once). 1 reuses the latency pass's
  # batch-1 programs: on 2 CPU cores a batch of 100 decodes no faster per image than
  # one image, and compiling each method's batch-100 program took 20-40 s of the main
  # command's time (docs/results.md). On an accelerator, use 0.
  config.quality_batch = 1
  # Latency pass: one image with CFG per class, every class (how many tokens an
  # iteration accepts varies from image to image; three images under-sampled it).
  config.latency_classes = tuple(range(10))
  # Interleaved rounds of timed batch-1 runs (every method, every class) after the compile
  # runs; each (method, class) keeps its best.
  config.timing_repeats = 8
  # Methods compiled (and run untimed: the quality pass, the latency pass's first
  # runs) at a time, in threads; XLA compiles without the GIL (1.1-1.2x on 2 cores).
  config.compile_threads = 2
  config.side_by_side_per_class = 3  # images per class of each method in side_by_side.png
  config.grid_scale = 3  # PNG pixel repeat
  # One XLA thread per op (CPU): faster at batch 1, the latency regime SD is for.
  config.xla_cpu_single_thread = True
  # Compile the decodes with decode.CPU_LATENCY_OPTIONS on CPU: one plain
  # reduce per reduction instead of XLA:CPU's reduce-window + reduce rewrite
  # (bench/cpu_compiler_options.py: vanilla faster at batch 1, SD at batch 100).
  config.xla_cpu_plain_reductions = True
  # Persistent compilation cache: '' = $XDG_CACHE_HOME/specdec_jax (~/.cache/specdec_jax),
  # 'off' = none, or a folder (specdec_jax.app.compile_cache).
  config.compilation_cache = ''

  config.sampling = ml_collections.ConfigDict(dict(
      cfg_scale=2.0, cfg_interval=-1, temperature=1.0, top_k=0, top_p=1.0))

  config.draft_length = 4  # k for drafter chains
  # W for SJD / SCD / SJD-PAC / GSD / CSD. Longer windows accept more per forward but
  # cost more per forward on 2 CPU cores: W = 4 ran 1.11-1.16x vanilla's speed against
  # 0.96-1.02x at W = 8 on a Xeon host (bench/results/host_xeon_amx/rope_mask/), and
  # 0.71-0.75x against 0.55-0.57x on a Zen 4 one (bench/results/jacobi_window_small.json).
  # Where a 32-token forward costs about what an 8-token one does (an accelerator at
  # batch 1), longer windows pay: SCD's released default is 32. SCD's and SJD-PAC's gain
  # over SJD needs them too: at W = 4 at most 1.13x and 1.19x on every image-like toy
  # measured, 1.5x from W = 8-32 (docs/results.md, bench/results/jacobi_grid_toy).
  config.jacobi_window = 4
  # Fresh drafts at the end of a Jacobi window: 'random' (uniform over the image tokens,
  # SJD's released default for Lumina-mGPT) or 'spatial' (the token to the left, SJD's
  # 'repeat_horizon': its LlamaGen script asks for it, but the released LlamaGen path
  # ignores it and drafts at random, so 'spatial' is this library's choice for LlamaGen
  # models). On the bundle 'spatial' accepts
  # 1.32x the tokens per forward of 'random' at W = 4 (SJD 2.22 against 1.69) and ran SJD
  # at 1.26x vanilla's speed against 1.13x (bench/results/jacobi_window_init.json).
  config.jacobi_init = 'spatial'
  # SJD-PAC's proactive tree: K candidates at each of the first D drafts (the released
  # code's default tree_width=3, tree_depth=3, which counts the root: D = 2). On 2 CPU
  # cores K 3, D 1 runs 1.6x faster at 1.05x SJD's tokens per forward against 1.06x
  # (docs/results.md "SJD-PAC's proactive tree at window 4").
  config.pac_branches = 3
  config.pac_depth = 2
  # The law SJD-PAC's candidates after the main draft come from: 'target' (p itself) or
  # 'residual' (the released code's, Norm([p - q_old]_+): where the law moved). On the
  # bundle 'residual' accepts no more: 1.065x SJD's tokens per forward at W = 4 against
  # 1.060x, 1.30x at W = 32 against 1.33x (docs/results.md "SJD-PAC's siblings").
  config.pac_siblings = 'target'
  config.coolsd_delta = 2.0
  config.uniform_omega = 2.0
  config.lantern_k = 8
  config.lantern_lam = 3.0
  config.lantern_residual = 'optimal'
  config.csd_lam = 0.05  # nats: lam * H(t) with H up to log V = 5.5 (bench/pareto.py)
  config.csd_tv_threshold = 0.5
  config.gsd_prob_threshold = 0.15
  config.gsd_dist_threshold = 0.5
  # EAGLE-2 dynamic trees (DynamicTreeDraft): verify-forward tokens (root included),
  # drafter expansions (tree depth = eagle2_depth + 1) and top-k per node.
  # 'sampled': children drawn without replacement (lossless, this library's variant);
  # 'top_k': EAGLE-2's deterministic top-k children (LANTERN: 59, 4, 10).
  config.eagle2_drafts = 'sampled'
  config.eagle2_total_tokens = 24
  config.eagle2_depth = 5
  config.eagle2_top_k = 4
  # The rule the 2026 methods verify with: 'lossless', or a relaxed variant
  # (bench/pareto_sampled.py) 'uniform', 'coolsd', 'lantern_pp', 'csd' (with the
  # hyperparameters above), and for scd also 'gsd' (GSD has no tree form). Under
  # 'uniform', 'coolsd' and 'lantern_pp' fresh Jacobi drafts are verified losslessly.
  config.eagle2_rule = 'lossless'
  config.scd_rule = 'lossless'
  # SCD's coupling of a re-drafted position with its previous draft: 'maximal' (keep the
  # old token with probability min(1, t/q_old)) or 'gumbel' (fixed Gumbel numbers per
  # image token); docs/results.md compares them.
  config.scd_coupling = 'maximal'
  config.sjd_pac_rule = 'lossless'

  # Which methods run, in order. 'vanilla' must come first (it is the
  # reference for speed and drift); 'vanilla_seed1' is a second vanilla run
  # with another seed, the noise level of the drift measures.
  config.methods = ('vanilla', 'vanilla_seed1', 'eagle', 'draft_model', 'lantern_pp',
                    'uniform', 'coolsd', 'eagle2', 'sjd', 'scd', 'sjd_pac', 'gsd', 'csd')
  return config
