"""Sampling an evaluation set from the bundled Fashion-MNIST family.

  python -m specdec_jax.sample --config configs/sample_fashion.py
  python -m specdec_jax.sample --config configs/sample_fashion.py \
      --config.method=coolsd --config.num_images=10000 --config.out_dir=samples/coolsd

Every process of a multi-host job runs the same command (docs/sampling.md).
Image i's tokens depend only on (seed, i), the method and its
hyperparameters, the sampling settings, and the per-device batch shape
(batch_per_device, model_parallel); not on the number of processes or devices.
"""

import ml_collections

from specdec_jax.configs import generate

# The method hyperparameters of the main command (same names, same defaults).
HYPERPARAMETERS = ('draft_length', 'jacobi_window', 'jacobi_init', 'pac_branches', 'pac_depth',
                   'pac_siblings', 'coolsd_delta', 'uniform_omega', 'lantern_k', 'lantern_lam',
                   'lantern_residual', 'csd_lam', 'csd_tv_threshold', 'gsd_prob_threshold',
                   'gsd_dist_threshold', 'eagle2_drafts', 'eagle2_total_tokens', 'eagle2_depth',
                   'eagle2_top_k', 'eagle2_rule', 'scd_rule', 'scd_coupling', 'sjd_pac_rule')


def get_config():
  base = generate.get_config()
  config = ml_collections.ConfigDict()
  # kind 'fashion': the bundle (bundle_dir '' = the one shipped in the package);
  # kind 'llamagen': converted checkpoint folders (configs/sample_llamagen_c2i.py).
  # dtype and scan_layers apply to converted checkpoints ('auto': float32 on CPU,
  # bfloat16 on GPU/TPU; specdec_jax.precision); the bundle is float32.
  config.model = ml_collections.ConfigDict(dict(
      kind='fashion', bundle_dir='', checkpoint='', vq='', eagle='', draft_model='',
      dtype='auto', scan_layers=False))
  # vanilla, eagle, draft_model, lantern_pp, uniform, coolsd, eagle2, sjd, scd, sjd_pac, gsd, csd
  config.method = 'eagle'
  config.hparams = ml_collections.ConfigDict({name: base[name] for name in HYPERPARAMETERS})
  config.sampling = base.sampling
  config.classes = ()  # () = every class; image i gets classes[i % len(classes)]
  # t2i models: .npz of FLAN-T5 caption features (`features` [n, P, C], `mask` [n, P]);
  # image i gets prompt i % n. Class-conditional models refuse it.
  config.prompts = ''
  config.num_images = 1000
  config.batch_per_device = 10  # images per device per decode call (fixes the per-device shapes)
  # Decode loops whose target cache grows between them, so attention reads only the
  # slots each can reach (decode.generate(attention_phases=...)): 3 compiles the loop
  # three times and, at batch 20 on the bundle, ran vanilla 1.55x and the EAGLE-1 chain
  # 1.21x faster (bench/attention_phases.py); 1 = one loop over the whole cache.
  config.attention_phases = 3
  config.model_parallel = 1  # devices on the 'model' mesh axis (tensor parallelism of the target)
  config.seed = 0
  config.out_dir = 'samples/fashion'
  config.chunk_size = 100  # images per committed chunk; best a multiple of the local batch
  config.write_png = True  # switched on at a restart: the missing PNGs are written from the .npz
  # A restart refuses a folder written by another version of specdec_jax or JAX
  # (config.json's fingerprint 'code'); True continues it (the change is logged).
  config.allow_code_change = False
  # Take over the folder's lock (job.lock) left by a job that is gone (its host crashed);
  # a dead holder on this host is detected without it (docs/sampling.md, "Restarts").
  config.break_lock = False
  # Persistent compilation cache: '' = $XDG_CACHE_HOME/specdec_jax (~/.cache/specdec_jax),
  # 'off' = none, or a folder (specdec_jax.app.compile_cache).
  config.compilation_cache = ''
  # XLA:CPU only: one thread per op (docs/results.md, "The main command"); no image changes.
  config.xla_cpu_single_thread = False
  config.fast_compile = False  # tests: cheaper XLA:CPU compilation (decode.FAST_COMPILE)
  config.stop_after_chunks = 0  # tests: stop (no merge) once this many chunks are committed
  return config
