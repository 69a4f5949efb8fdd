"""XLA compiler options for the decode programs (`decode.generate(compiler_options=...)`).

Both are XLA:CPU settings; other backends compile with their defaults.
"""

# Cheaper XLA:CPU compilation for tests and smoke runs: LLVM's expensive passes off.
# Not xla_backend_optimization_level 0 (about 2x faster compiles on the test models):
# at level 0 top-k + top-p gave another nucleus than the same program at the default
# level in 10 of 2,400 CFG rows, e.g. one token short with the cut 0.015 of mass away
# (tests/test_xla_options.py), so the decode's laws were not the target's.
FAST_COMPILE = {'xla_llvm_disable_expensive_passes': True}

# XLA:CPU options for small-batch (latency) decoding, where every kernel of
# the loop body is small and its dispatch is a large part of its cost:
#  * tree_reduction_rewriter off: XLA:CPU rewrites every reduction it does not
#    hand to its YNNPACK kernels (those below a few thousand elements) into a
#    reduce-window over blocks of 32 followed by a reduce, two loop kernels
#    where one suffices; at one image with CFG every reduction of the loop is
#    that small (the softmax over the cache slots, the RMSNorms, the softmax
#    over the vocabulary).
#  * cpu-parallel-task-assigner off: XLA:CPU splits large loop fusions into
#    partitions run on its intra-op thread pool; at batch 1 the handoff costs
#    more than the split saves (one profiled SD iteration spent most of its
#    time in a partitioned attention reduce; bench/loop_profile.py).
# Exact in law: only the summation order of f32 reductions changes. Measured
# with bench/cpu_compiler_options.py (docs/results.md).
CPU_LATENCY_OPTIONS = {
    'xla_disable_hlo_passes': 'tree_reduction_rewriter,cpu-parallel-task-assigner'}
