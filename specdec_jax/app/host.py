"""The machine a run ran on, for the JSON that records its measurements.

Timings depend on the CPU, and so, slightly, do the images: XLA:CPU compiles and
tunes its kernels for the host CPU (its model, vector extensions, cache sizes),
so logits can differ in their last bits between hosts, and a token whose uniform
draw falls within that difference of a category boundary flips (docs/results.md,
"The main command"). The model name tells hosts apart; the flags say which
vector units the kernels could use.
"""

from __future__ import annotations

import os

# /proc/cpuinfo flags of the vector units XLA:CPU's kernels may use: AVX2, AVX-512, AMX.
VECTOR_FLAGS = {'avx2': 'avx2', 'avx512': 'avx512f', 'amx': 'amx_tile'}


def describe() -> dict:
  """{'cpu': model name, 'cores': os.cpu_count(), 'avx2'/'avx512'/'amx': bool}, from
  Linux's /proc/cpuinfo (an empty name and False flags where it cannot be read)."""
  fields = {}
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        key, _, value = line.partition(':')
        fields.setdefault(key.strip(), value.strip())
  except OSError:
    pass
  flags = set(fields.get('flags', '').split())
  return {'cpu': fields.get('model name', ''), 'cores': os.cpu_count(),
          **{name: flag in flags for name, flag in VECTOR_FLAGS.items()}}
