"""Deviceless TPU compilation of whole decodes: memory, per-iteration cost, collectives.

Usage (CPU host, libtpu installed: pip install -e '.[tpu]'):
  JAX_PLATFORMS=cpu python bench/tpu_compile.py --quick --out=quick.json
  JAX_PLATFORMS=cpu python bench/tpu_compile.py --out=all.json --markdown=all.md
  JAX_PLATFORMS=cpu python bench/tpu_compile.py --only='xl-c2i.*v5e:2x2'

Legend: B images (2B cache rows with CFG), k drafts, W Jacobi window.

For each configuration (model, images, mode, TPU topology, data x model mesh)
it compiles `decode.generate`'s program (prefill plus the while loop) from
abstract bf16 parameters for TPU devices that need not exist
(`bench/tpu_compile_lib.py`) and reports, per device:
  * compile time on this host (lowering and XLA compilation);
  * HBM: arguments + outputs + temps - aliased, against the chip's capacity
    (an EAGLE head's embedding and LM head are the target's arrays, passed
    twice; their second copy is subtracted);
  * per loop iteration: flops and bytes accessed (XLA's cost analysis of the
    program minus that of the same program without the loop), an HBM-only
    traffic estimate read off the loop's HLO (`bench/tpu_compile_hlo.py`), the
    floor (every weight and KV byte the device holds, read once), a roofline
    time max(flops / peak, bytes / HBM bandwidth), and the collectives
    (kind, count, bytes) inside the loop body.
Prints a table and writes JSON (and optionally a markdown table). docs/tpu.md
explains the numbers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hlo_kernels  # pylint: disable=g-import-not-at-top
import resume  # bench/resume.py
import tpu_compile_hlo as hlo
import tpu_compile_lib as lib
from specdec_jax import decode
from specdec_jax import logits
from specdec_jax import modes
from specdec_jax import rules
from specdec_jax import sharding
from specdec_jax import verify
try:
  from specdec_jax.app import compile_cache
except ImportError:  # checkouts before the persistent cache (bench/with_tree.py): none to switch off
  compile_cache = None
from specdec_jax.models import chameleon
from specdec_jax.models import eagle
from specdec_jax.models import llamagen
from specdec_jax.models import lumina_layout

_QUICK = flags.DEFINE_bool('quick', False, 'Only XL vanilla + chain on v5e:2x2 and Lumina 7B '
                           'vanilla on v5e:2x4.')
_ONLY = flags.DEFINE_string('only', None, 'Regex on configuration names to run.')
_EXCLUDE = flags.DEFINE_string('exclude', None, 'Regex on configuration names to skip.')
_OUT = flags.DEFINE_string('out', None, 'JSON results (rewritten after every configuration).')
_MARKDOWN = flags.DEFINE_string('markdown', None, 'Markdown table of the results.')
_LABEL = flags.DEFINE_string('label', '', 'Free text stored in the JSON (e.g. before/after).')
_SCAN = flags.DEFINE_bool('scan_layers', False, "Build the targets with scan_layers=True (one "
                          "scanned block; engines whose model configs have that field).")
_TOPK_BLOCKS = flags.DEFINE_integer(
    'topk_blocks', None, "Sampling.topk_blocks (1: one sort of V). Default: generate's own "
    "choice, the mesh's 'model' size when it divides the vocabulary.")
_PHASES = flags.DEFINE_integer(
    'attention_phases', 1, "decode.generate's attention_phases (the sampler's default is 3: "
    'P loops on a growing cache).')
_HLO_DIR = flags.DEFINE_string('hlo_dir', None, 'Write each compiled program\'s optimized HLO '
                                'text here (one file per configuration).')
_PER_ROW_WRITES = flags.DEFINE_bool(
    'per_row_cache_writes', False, "Write the KV cache row by row even for one image "
    "(KVCache.shared_length off, the engine before 9634d5c), to compare the two writes.")
_COMPARE = flags.DEFINE_list('compare', None, 'BEFORE.json,AFTER.json: print a markdown table '
                             'of their differences (configurations in both) and exit.')

# A 15-node static tree of depth 4 (EAGLE-style: wide near the root).
TREE = verify.StaticTree.from_paths((
    (0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (2, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0),
    (1, 0, 0), (0, 0, 0, 0), (0, 0, 1, 0), (0, 1, 0, 0)))
MODES = {
    'vanilla': decode.Vanilla(),
    'chain': decode.ChainDraft(4, 'eagle'),
    'jacobi': decode.Jacobi(5),
    'tree': decode.TreeDraft(TREE, 'eagle'),
}
if hasattr(decode, 'DynamicTreeDraft'):  # absent in checkouts before EAGLE-2 (bench/with_tree.py)
  MODES['eagle2'] = decode.DynamicTreeDraft(24, 5, 4, 'eagle', drafts='sampled')
if hasattr(decode, 'JacobiPAC'):  # absent in checkouts before SCD and SJD-PAC
  # The main command's Jacobi family (window 4, left-neighbour fresh drafts, K 3, D 2)
  # and the same at SCD's and SJD-PAC's published window 32.
  for _window in (4, 32):
    MODES[f'sjd_w{_window}'] = decode.Jacobi(_window, 'spatial')
    MODES[f'scd_w{_window}'] = decode.Jacobi(_window, 'spatial', coupling='maximal')
    MODES[f'sjd_pac_w{_window}'] = decode.JacobiPAC(_window, 3, 2, init='spatial')
TOPOLOGIES = ('v5e:2x2', 'v5e:2x4', 'v5p:2x2x1', 'v6e:2x2')
BF16 = jnp.bfloat16


@dataclasses.dataclass(frozen=True)
class Config:
  model: str  # a key of MODELS
  images: int
  mode: str  # a key of MODES
  topology: str

  @property
  def name(self) -> str:
    return f'{self.model} B={self.images} {self.mode} {self.topology}'


def _scan() -> dict:
  return {'scan_layers': True} if _SCAN.value else {}


def _xl(images: int):
  target = llamagen.LlamaGenGPT(llamagen.gpt_config('GPT-XL', image_size=384, dtype='bfloat16',
                                                    **_scan()))
  labels = jnp.array([207] * images + [target.config.num_classes] * images, jnp.int32)
  drafter = eagle.EagleDrafter(eagle.llamagen_drafter_config(target.config))
  return target, drafter, labels, 576, logits.Sampling.preset('llamagen_c2i')


def _xxl_t2i(images: int):
  config = llamagen.gpt_config('GPT-XXL', image_size=512, model_type='t2i', dtype='bfloat16',
                               **_scan())
  target = llamagen.LlamaGenGPT(config)
  rows = 2 * images
  # 120 caption slots, the last 100 real (left padded), as T5 captions arrive.
  mask = jnp.broadcast_to(jnp.arange(config.cls_token_num) >= 20, (rows, config.cls_token_num))
  cond = llamagen.CaptionCond(
      features=jnp.zeros((rows, config.cls_token_num, config.caption_dim), jnp.float32),
      mask=mask)
  drafter = eagle.EagleDrafter(eagle.llamagen_drafter_config(config))
  return target, drafter, cond, config.block_size, logits.Sampling.preset('llamagen_t2i')


def _lumina(images: int):
  config = chameleon.lumina_7b(dtype=BF16, param_dtype=BF16, **_scan())
  target = chameleon.ChameleonModel(config)
  layout = lumina_layout.ImageLayout(48, 48)  # 768 px: 48 x 48 latent tokens
  prompt = [0] + [100] * 40 + [lumina_layout.END_OF_TURN]  # bos, a 40-token caption, eot
  cond = chameleon.build_prompt([prompt] * images, layout, cfg=True)
  drafter = eagle.EagleDrafter(eagle.lumina_drafter_config(dtype='bfloat16'))
  sampling = lumina_layout.LuminaSampling.preset('lumina_mgpt', layout=layout)
  return target, drafter, cond, layout.body_length, sampling


MODELS = {'xl-c2i-384': _xl, 'xxl-t2i-512': _xxl_t2i, 'lumina-7b-768': _lumina}
HEADS = {'xl-c2i-384': 20, 'xxl-t2i-512': 24, 'lumina-7b-768': 32}


def mesh_split(model: str, topology: str) -> tuple[int, int]:
  """(data, model): the widest tensor parallelism that divides the heads; images over the rest."""
  devices = len(lib.tpu_devices(topology))
  width = max(m for m in range(1, devices + 1) if devices % m == 0 and HEADS[model] % m == 0)
  return devices // width, width


def configurations(quick: bool) -> list[Config]:
  if quick:
    return [Config('xl-c2i-384', 1, 'vanilla', 'v5e:2x2'),
            Config('xl-c2i-384', 1, 'chain', 'v5e:2x2'),
            Config('lumina-7b-768', 1, 'vanilla', 'v5e:2x4')]
  # Every mode for XL on v5e:2x2 (where the targets are set), vanilla and
  # chain for XL on v5p and v6e and for Lumina on v5e:2x4; vanilla elsewhere.
  # (Each configuration compiles twice; on a 2-core host the larger ones take
  # minutes, so the matrix is kept to these.)
  out = [Config('xl-c2i-384', 1, mode, 'v5e:2x2') for mode in MODES]
  out += [Config('xl-c2i-384', 1, 'vanilla', 'v5e:2x4'), Config('xl-c2i-384', 8, 'vanilla',
                                                               'v5e:2x4')]
  # Images over 'data' and heads over 'model' (2 x 4) with a multi-token window.
  out += [Config('xl-c2i-384', 2, mode, 'v5e:2x4') for mode in ('chain', 'eagle2') if mode in MODES]
  out += [Config('xl-c2i-384', 1, mode, topology) for topology in ('v5p:2x2x1', 'v6e:2x2')
          for mode in ('vanilla', 'chain')]
  out += [Config('xxl-t2i-512', 1, 'vanilla', 'v5e:2x4')]
  out += [Config('lumina-7b-768', 1, mode, 'v5e:2x4') for mode in ('vanilla', 'chain')]
  out += [Config('lumina-7b-768', 1, 'vanilla', 'v5p:2x2x1')]
  return out


def measure(config: Config) -> dict:
  """Compiles one configuration twice (with and without the loop) and reports it."""
  target, drafter, cond, num_tokens, sampling = MODELS[config.model](config.images)
  mode = MODES[config.mode]
  data, width = mesh_split(config.model, config.topology)
  mesh = sharding.make_mesh(data, width, devices=lib.tpu_devices(config.topology))
  if _TOPK_BLOCKS.value is None:
    sampling = decode.vocab_parallel_sampling(sampling, target, mesh)
  else:
    sampling = dataclasses.replace(sampling, topk_blocks=_TOPK_BLOCKS.value)
  chip = lib.chip_of(config.topology)
  target_params = lib.abstract_params(target, mesh, sharding.LLAMA_RULES)
  draft = draft_params = None
  shared = 0
  if isinstance(mode, modes.DrafterMode):
    draft = drafter
    draft_params = lib.abstract_params(drafter, mesh, sharding.LLAMA_RULES)
    # embed_tokens and lm_head are the target's own arrays (eagle.attach_head).
    shared = lib.per_device_bytes((draft_params['embed_tokens'], draft_params['lm_head']))
  program = lib.build_program(target, target_params, cond, num_tokens=num_tokens, mode=mode,
                              sampling=sampling, rule=rules.Lossless(), draft=draft,
                              draft_params=draft_params, mesh=mesh,
                              attention_phases=_PHASES.value)
  compiled, lower_s, compile_s = lib.compile_decode(program, loop=True)
  memory = lib.memory(compiled)
  full = lib.cost(compiled)
  text = compiled.as_text()
  if _HLO_DIR.value:
    os.makedirs(_HLO_DIR.value, exist_ok=True)
    name = re.sub(r'[^\w.-]+', '_', config.name) + '.hlo'
    with open(os.path.join(_HLO_DIR.value, name), 'w') as f:
      f.write(text)
  report = hlo.loop_report(text)
  kernels = hlo_kernels.summary_row(hlo_kernels.loop_kernels(text))
  del compiled, text
  prefill, _, prefill_compile_s = lib.compile_decode(program, loop=False)
  before_loop = lib.cost(prefill)
  del prefill

  weights = lib.per_device_bytes(target_params) + (
      lib.per_device_bytes(draft_params) - shared if draft_params is not None else 0)
  cache = lib.kv_bytes(program.target_cache) + lib.kv_bytes(program.draft_cache)
  floor = weights + cache
  flops = full['flops'] - before_loop['flops']
  accessed = full['bytes_accessed'] - before_loop['bytes_accessed']
  hbm = memory['hbm_bytes'] - shared
  roofline = lambda num_bytes: 1e3 * max(flops / chip.peak_flops, num_bytes / chip.hbm_bandwidth)
  return {
      'name': config.name, **dataclasses.asdict(config), 'scan_layers': _SCAN.value,
      'attention_phases': _PHASES.value,
      'mesh': f'{data}x{width}', 'topk_blocks': sampling.topk_blocks,
      'num_tokens': num_tokens, 'rows': 2 * config.images, 'window': mode.width,
      'lower_s': lower_s, 'compile_s': compile_s, 'compile_without_loop_s': prefill_compile_s,
      'host_load_average': os.getloadavg()[0], 'host_cpus': os.cpu_count(),
      'memory': memory, 'shared_param_bytes': shared, 'hbm_bytes': hbm,
      'hbm_capacity_bytes': chip.hbm_bytes, 'fits': hbm <= chip.hbm_bytes,
      'weight_bytes': weights, 'kv_bytes': cache, 'floor_bytes': floor,
      'flops_per_iteration': flops, 'bytes_accessed_per_iteration': accessed,
      'hbm_estimate_per_iteration': report.hbm_bytes,
      'bytes_accessed_over_floor': accessed / floor,
      'hbm_estimate_over_floor': report.hbm_bytes / floor,
      'roofline_ms': roofline(accessed), 'roofline_hbm_estimate_ms': roofline(report.hbm_bytes),
      'roofline_floor_ms': roofline(floor),
      'collectives': report.collectives, 'largest_collectives': report.largest,
      'host_transfers_in_loop': report.host_transfers,
      'host_transfers_anywhere': report.host_transfers_anywhere,
      'loop_found': report.found_loop, 'nested_loops_unknown_trips': report.unknown_trip_counts,
      'kernels': kernels,
  }


def _collectives_text(collectives: dict) -> str:
  size = lambda entry: max(entry['operand_bytes'], entry['result_bytes']) / 1e3
  parts = [f"{kind} {entry['count']}x {size(entry):.0f}kB"
           for kind, entry in sorted(collectives.items())]
  return ', '.join(parts) or 'none'


def markdown(results: list[dict]) -> str:
  """The results table; cost-analysis cells are n/a for scanned targets.

  XLA's cost analysis counts a loop body once, so with scanned layers (a
  layer loop nested in the decode loop) it counts one layer per iteration.
  """
  lines = ['| configuration | mesh | compile s | HBM GiB (cap) | fits | GFLOP/it | GB/it cost '
           '| GB/it HBM est. | floor GB | cost/floor | est./floor | roofline ms (cost / est.) '
           '| collectives per iteration |',
           '|' + '---|' * 13]
  for r in results:
    scanned = r.get('scan_layers', False)
    cost = lambda text: 'n/a' if scanned else text  # pylint: disable=cell-var-from-loop
    flops = cost(f"{r['flops_per_iteration'] / 1e9:.2f}")
    accessed = cost(f"{r['bytes_accessed_per_iteration'] / 1e9:.2f}")
    ratio = cost(f"{r['bytes_accessed_over_floor']:.2f}")
    roofline = cost(f"{r['roofline_ms']:.2f}")
    bandwidth = lib.chip_of(r['topology']).hbm_bandwidth
    estimate_ms = (f"{1e3 * r['hbm_estimate_per_iteration'] / bandwidth:.2f}" if scanned
                   else f"{r['roofline_hbm_estimate_ms']:.2f}")
    lines.append(
        f"| {r['name']}{' (scanned)' if scanned else ''} | {r['mesh']} "
        f"| {r['lower_s'] + r['compile_s']:.0f} "
        f"| {r['hbm_bytes'] / lib.GiB:.2f} ({r['hbm_capacity_bytes'] / lib.GiB:.0f}) "
        f"| {'yes' if r['fits'] else 'NO'} | {flops} | {accessed} "
        f"| {r['hbm_estimate_per_iteration'] / 1e9:.3f} | {r['floor_bytes'] / 1e9:.3f} "
        f"| {ratio} | {r['hbm_estimate_over_floor']:.2f} | {roofline} / {estimate_ms} "
        f"| {_collectives_text(r['collectives'])} |")
  return '\n'.join(lines) + '\n'


def _collective_totals(result: dict) -> tuple[int, float]:
  entries = result['collectives'].values()
  return (sum(e['count'] for e in entries),
          sum(max(e['operand_bytes'], e['result_bytes']) for e in entries) / 1e6)


def comparison(before: list[dict], after: list[dict]) -> str:
  """Markdown: before -> after for every configuration measured in both."""
  old = {r['name']: r for r in before if 'error' not in r}
  lines = ['| configuration | compile s | HBM GiB | GB/it cost | GB/it HBM est. | est./floor '
           '| collectives per iteration (count, MB) |', '|' + '---|' * 7]
  for new in after:
    if 'error' in new or new['name'] not in old:
      continue
    was = old[new['name']]
    pair = lambda key, scale=1.0, fmt='.2f': (f'{was[key] / scale:{fmt}} -> '
                                                f'{new[key] / scale:{fmt}}')
    compile_s = (f"{was['lower_s'] + was['compile_s']:.0f} -> "
                 f"{new['lower_s'] + new['compile_s']:.0f}")
    (count0, mb0), (count1, mb1) = _collective_totals(was), _collective_totals(new)
    scanned = was.get('scan_layers') or new.get('scan_layers')
    accessed = 'n/a (scanned)' if scanned else pair('bytes_accessed_per_iteration', 1e9)
    lines.append(f"| {new['name']} | {compile_s} | {pair('hbm_bytes', lib.GiB)} "
                 f"| {accessed} "
                 f"| {pair('hbm_estimate_per_iteration', 1e9, '.3f')} "
                 f"| {pair('hbm_estimate_over_floor')} "
                 f"| {count0}, {mb0:.2f} -> {count1}, {mb1:.2f} |")
  return '\n'.join(lines) + '\n'


def _commit() -> str:
  try:
    return subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.abspath(__file__)), check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return 'unknown'


def main(argv):
  del argv
  if compile_cache is not None:
    compile_cache.enable(compile_cache.OFF)  # compile times are its measurements
  if _COMPARE.value:
    before, after = (json.load(open(path))['results'] for path in _COMPARE.value)
    print(comparison(before, after))
    return
  if _PER_ROW_WRITES.value:
    from specdec_jax import mode_base  # pylint: disable=g-import-not-at-top
    mode_base.Plan.shared_lengths = lambda self, cache: cache.replace(shared_length=False)
  configs = configurations(_QUICK.value)
  if _ONLY.value:
    configs = [c for c in configs if re.search(_ONLY.value, c.name)]
  if _EXCLUDE.value:
    configs = [c for c in configs if not re.search(_EXCLUDE.value, c.name)]
  if not configs:
    raise app.UsageError(f'no configuration matches --only={_ONLY.value!r} and '
                         f'--exclude={_EXCLUDE.value!r} (--quick={_QUICK.value}); the names '
                         'are those of docs/tpu.md\'s tables, such as "xl-c2i-384 B=1 vanilla '
                         'v5e:2x2".')
  header = {'label': _LABEL.value, 'scan_layers': _SCAN.value,
            'per_row_cache_writes': _PER_ROW_WRITES.value, 'bench_commit': _commit(),
            'jax': jax.__version__, 'libtpu': lib.libtpu_version(),
            'decode_module': decode.__file__, 'started': time.strftime('%Y-%m-%d %H:%M:%S UTC',
                                                                      time.gmtime())}
  results = []
  for config in configs:
    start = time.perf_counter()
    try:
      results.append(measure(config))
    except Exception as error:  # pylint: disable=broad-except
      results.append({'name': config.name, 'error': f'{type(error).__name__}: {error}'[:2000]})
    print(f'{config.name}: {time.perf_counter() - start:.0f} s', flush=True)
    if _OUT.value:
      resume.write_json(_OUT.value, {**header, 'results': results})
  good = [r for r in results if 'error' not in r]
  table = markdown(good)
  print(table)
  failed = [r for r in results if 'error' in r]
  for r in failed:
    print(f"{r['name']}: FAILED {r['error'][:300]}")
  if _MARKDOWN.value:  # the configurations that compiled, also when others failed
    with open(_MARKDOWN.value, 'w') as f:
      f.write(table)
  if failed:
    sys.exit(f'{len(failed)} of {len(results)} configurations failed (above).')


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
