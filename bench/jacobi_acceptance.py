"""Tokens per forward of the Jacobi methods against the window W, over many images (not a test).

  python bench/jacobi_acceptance.py --out bench/results/jacobi_acceptance

Issue targets for the 2026 Jacobi methods are ratios of tokens per target
forward at one window: SCD (arXiv 2510.24211) and SJD-PAC (arXiv
2603.18599) against SJD. `bench/jacobi_window.py` times one image per class
(speed); this bench counts acceptance, so it decodes --images images per
(window, method) in one batch with the main command's methods and
hyperparameters (`app.methods.build_methods`, configs/generate.py), all from
the same key, and reports each method's mean tokens per forward with its
standard error over images, its ratio to SJD at the same window
(`ratios.with_ratio`: paired over images, which every run decodes from the
same key and labels) and its acceptance per window
position (the share of verify steps that accepted draft i,
`DecodeMetrics.summary`), and the target's mean per-token NLL of the
images (`family.guided_image_nlls`: a lossless method's is SJD's within the
noise). --gumbel_scd adds a row 'scd_gumbel': SCD with its Gumbel coupling
(configs/generate.py's scd_coupling 'gumbel'). --released_scd adds a row
'scd_released': SCD with the released code's recording of a kept draft's
law (bench/scd_recording.py, not lossless), to measure what that recording
gains. --pac_residual_siblings adds 'sjd_pac_residual': SJD-PAC drawing its
extra candidates from the residual, as its released code does
(configs/generate.py's pac_siblings 'residual'). --pac_without_continuation
adds 'sjd_pac_no_continuation': proactive drafting alone, the chain
re-drafted as SJD's (SJD-PAC's ablation step). Counts do not depend on
machine load. Resumable: rows already in the JSON are kept. Prints a table,
writes JSON and a PNG (tokens per forward against W).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import plotting  # pylint: disable=g-import-not-at-top  (bench/plotting.py)
import ratios  # pylint: disable=g-import-not-at-top  (bench/ratios.py)
import resume  # pylint: disable=g-import-not-at-top  (bench/resume.py)
import scd_recording  # pylint: disable=g-import-not-at-top  (bench/scd_recording.py)
from specdec_jax import jacobi_drafts  # pylint: disable=g-import-not-at-top
from specdec_jax.app import generate as generate_app  # pylint: disable=g-import-not-at-top

_OUT = flags.DEFINE_string('out', 'bench/results/jacobi_acceptance', 'Output folder.')
_WINDOWS = flags.DEFINE_list('windows', ['8', '16', '32', '64'], 'Jacobi windows W.')
_METHODS = flags.DEFINE_list('methods', ['sjd', 'scd', 'sjd_pac'],
                             "Main-command Jacobi methods; 'sjd' is the reference.")
_IMAGES = flags.DEFINE_integer('images', 200, 'Images per (window, method), every class in turn.')
_SEED = flags.DEFINE_integer('seed', 0, 'Key of every decode.')
_INIT = flags.DEFINE_enum('init', 'random', list(jacobi_drafts.INITS),
                          "Fresh Jacobi drafts; 'random', as the runs committed before the "
                          "main command's jacobi_init became 'spatial'.")
_RELEASED_SCD = flags.DEFINE_bool(
    'released_scd', False, "Add 'scd_released': SCD recording a kept draft's old law as its "
    'released code does (bench/scd_recording.py; not lossless).')
_GUMBEL_SCD = flags.DEFINE_bool(
    'gumbel_scd', False, "Add 'scd_gumbel': SCD with the Gumbel coupling (scd_coupling='gumbel').")
_RESIDUAL_SIBLINGS = flags.DEFINE_bool(
    'pac_residual_siblings', False, "Add 'sjd_pac_residual': SJD-PAC drawing its extra "
    "candidates from the residual Norm([p - q_old]_+) as its released code does "
    "(pac_siblings='residual').")
_PAC_WITHOUT_CONTINUATION = flags.DEFINE_bool(
    'pac_without_continuation', False, "Add 'sjd_pac_no_continuation': SJD-PAC's proactive "
    "drafting alone, its chain re-drafted as SJD's (JacobiPAC(adaptive_continuation=False)).")
_PAC_TREES = flags.DEFINE_list(
    'pac_trees', [], "More SJD-PAC proactive trees 'KxD' (K candidates at each of the first D "
    "drafts) beside configs/generate.py's; their rows are named 'sjd_pac_KxD'.")


def ratio_row(row: dict, reference: dict) -> dict:
  """Tokens per forward relative to the reference row (`ratios.with_ratio`), and the
  NLL gap to it where both rows have one."""
  if row is reference:
    return dict(ratios.with_ratio(row, row), nll_gap_to_sjd=0.0, nll_gap_stderr=0.0)
  if 'nll' in row and 'nll' in reference:  # paired per image where both rows kept them
    stderr = (ratios.paired_difference_stderr(row['per_image_nll'], reference['per_image_nll'])
              if ratios.is_paired(row, reference, 'per_image_nll')
              else (row['nll_stderr'] ** 2 + reference['nll_stderr'] ** 2) ** 0.5)
    row = dict(row, nll_gap_to_sjd=row['nll'] - reference['nll'], nll_gap_stderr=stderr)
  return ratios.with_ratio(row, reference)


def plot(path: str, rows: list[dict], methods: list[str]) -> None:
  fig, ax = plotting.subplots()
  for name in methods:
    mine = sorted((r for r in rows if r['method'] == name), key=lambda r: r['window'])
    ax.errorbar([r['window'] for r in mine], [r['tokens_per_forward'] for r in mine],
                yerr=[r['stderr'] for r in mine], marker='o', ms=4, capsize=2, label=name)
  ax.set_xscale('log', base=2)
  ax.set_xlabel('Jacobi window W')
  ax.set_ylabel('tokens per target forward')
  ax.set_title('Bundled family: Jacobi acceptance against the window')
  ax.grid(alpha=0.3)
  ax.legend()
  plotting.save(fig, path)


def main(argv):
  del argv
  if _IMAGES.value < 2:
    raise app.UsageError(f'--images must be at least 2 (a standard error needs two), '
                         f'got {_IMAGES.value}.')
  generate_app.use_single_thread_xla()
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from specdec_jax import decode, logits  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import family as family_lib  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import methods as methods_lib  # pylint: disable=g-import-not-at-top
  from specdec_jax.configs import generate as generate_config  # pylint: disable=g-import-not-at-top

  if not _METHODS.value or _METHODS.value[0] != 'sjd':
    raise app.UsageError(f"--methods must start with 'sjd' (the reference), "
                         f"got {_METHODS.value}.")
  if not _WINDOWS.value:
    raise app.UsageError('--windows is empty: name at least one Jacobi window.')
  os.makedirs(_OUT.value, exist_ok=True)
  json_path = os.path.join(_OUT.value, 'jacobi_acceptance.json')
  settings = (_IMAGES.value, _SEED.value, _INIT.value)
  done = resume.saved_rows(
      json_path, lambda saved: (saved['images'], saved['seed'],
                                saved.get('init', 'random')) == settings,
      lambda r: (r['window'], r['method']))
  family = family_lib.load()
  labels = (np.arange(_IMAGES.value) % family.num_classes).astype(np.int32)
  for window in [int(w) for w in _WINDOWS.value]:
    config = generate_config.get_config()
    config.jacobi_window, config.jacobi_init = window, _INIT.value
    config.methods = ('vanilla', *_METHODS.value)
    sampling = logits.Sampling(**config.sampling.to_dict())
    methods = []
    for method in methods_lib.build_methods(config, family)[1:]:
      methods.append((method.name, method))
      if method.name == 'scd' and _GUMBEL_SCD.value:
        methods.append(('scd_gumbel', methods_lib.build_variant(config, family, 'scd',
                                                                scd_coupling='gumbel')))
      if method.name == 'scd' and _RELEASED_SCD.value:
        methods.append(('scd_released', method))
      if method.name != 'sjd_pac':
        continue
      if _PAC_WITHOUT_CONTINUATION.value:
        methods.append(('sjd_pac_no_continuation', dataclasses.replace(
            method, name='sjd_pac_no_continuation',
            mode=dataclasses.replace(method.mode, adaptive_continuation=False),
            hyperparameters=dict(method.hyperparameters, adaptive_continuation=False))))
      if _RESIDUAL_SIBLINGS.value:
        methods.append(('sjd_pac_residual', methods_lib.build_variant(
            config, family, 'sjd_pac', pac_siblings='residual')))
      for variant in methods_lib.pac_tree_variants(config, family, _PAC_TREES.value):
        methods.append((variant.name, variant))  # beside the configured tree
    for name, method in methods:
      if (window, name) in done:
        continue
      start = time.perf_counter()
      cond = generate_app.cond_rows(family.target, family.target_params, jnp.asarray(labels),
                                    sampling)
      recording = (scd_recording.released_recording() if name == 'scd_released'
                   else contextlib.nullcontext())
      with recording:
        result = decode.generate(family.target, family.target_params, cond,
                                 key=jax.random.key(_SEED.value),
                                 **generate_app.decode_kwargs(method, family, labels, sampling))
      per_image = np.asarray(result.metrics.tokens_per_target_forward, np.float64)
      nlls = family.guided_image_nlls(labels, np.asarray(result.tokens), sampling)
      done[(window, name)] = dict(
          window=window, method=name, hyperparameters=method.hyperparameters,
          tokens_per_forward=float(per_image.mean()),
          stderr=float(per_image.std(ddof=1) / np.sqrt(per_image.size)),
          per_image=per_image.tolist(), per_image_nll=np.asarray(nlls, np.float64).tolist(),
          acceptance_per_position=result.metrics.summary()['acceptance_per_position'],
          nll=float(nlls.mean()), nll_stderr=float(nlls.std(ddof=1) / np.sqrt(nlls.size)),
          seconds=time.perf_counter() - start)
      print(f'W={window} {name}: {per_image.mean():.3f} tokens per forward '
            f'({time.perf_counter() - start:.0f} s)', flush=True)
      resume.write_json(json_path, {  # after every row: a killed run resumes
          'images': _IMAGES.value, 'seed': _SEED.value, 'init': _INIT.value,
          'rows': list(done.values())})
  # Every row decoded so far (this run's windows and methods and a resumed run's).
  names = list(dict.fromkeys([*_METHODS.value, *sorted(name for _, name in done)]))
  rows = []
  print('| W | method | tokens / forward | s.e. | / SJD at W | NLL gap to SJD |')
  print('|---|---|---|---|---|---|')
  for window in sorted({window for window, _ in done}):
    reference = done[(window, 'sjd')]
    for name in names:
      if (window, name) not in done:
        continue
      row = ratio_row(done[(window, name)], reference)
      rows.append(row)
      print(f"| {window} | {name} | {row['tokens_per_forward']:.3f} | {row['stderr']:.3f} | "
            f"{row['ratio_to_sjd']:.3f} +- {row['ratio_stderr']:.3f} | "
            + (f"{row['nll_gap_to_sjd']:+.4f} +- {row['nll_gap_stderr']:.4f} |"
               if 'nll_gap_to_sjd' in row else '- |'))
  resume.write_json(json_path, {'images': _IMAGES.value, 'seed': _SEED.value,
                                'init': _INIT.value, 'sampling':
                                generate_config.get_config().sampling.to_dict(), 'rows': rows})
  plot(os.path.join(_OUT.value, 'jacobi_acceptance.png'), rows, names)
  print('wrote', _OUT.value)


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
