"""Speed-quality Pareto sweep of the relaxed rules on the bundled Fashion-MNIST family.

  python bench/pareto.py --out bench/results/pareto
  python bench/pareto.py --images_per_class 4 --out /tmp/pareto      (quick)

Sweeps COOL-SD's and UniformRelaxed's delta (omega), LANTERN++'s lambda with
both residuals (published and G*), and CSD's lambda, all with the bundled
EAGLE-1 head (CSD: Jacobi drafting), plus vanilla (twice: the second seed is
the noise level of the quality measures) and lossless EAGLE. Every point is
one quality pass over the same class-conditional batch: tokens per target
forward, Frechet distance in the evaluation classifier's feature space
against the test split, NLL gap against the vanilla samples, and class
accuracy. Rule hyperparameters are pytree leaves, so each rule family
compiles once.

Writes `pareto.json` (every point, plus for each COOL-SD point LANTERN++'s
Frechet distance interpolated at the same tokens per forward) and
`pareto.png` (tokens per forward against Frechet distance and against NLL
gap), and prints a table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from pareto_knobs import CSD_LAMS, DELTAS, LANTERN_LAMS  # bench/pareto_knobs.py
import plotting  # bench/plotting.py
from specdec_jax import decode
from specdec_jax import logits as logits_lib
from specdec_jax import rules
from specdec_jax.app import compile_cache
from specdec_jax.app import family as family_lib
from specdec_jax.app import files
from specdec_jax.app import generate
from specdec_jax.app import methods as methods_lib
from specdec_jax.configs import generate as generate_config


def sweep_methods(config, family, draft_length: int, window: int, lantern_k: int) -> list:
  """(family name, knob value, methods_lib.Method) for every point of the sweep."""
  chain = decode.ChainDraft(k=draft_length, drafter='eagle')
  jacobi = decode.Jacobi(window=window, init='random')
  residuals = ('optimal', 'published_llamagen')
  neighbors = {residual: family.neighbors(rules.neighbor_columns(lantern_k, residual))
               for residual in residuals}
  points = [('vanilla', None, methods_lib.Method('vanilla', decode.Vanilla())),
            ('vanilla_seed1', None, methods_lib.Method('vanilla_seed1', decode.Vanilla(),
                                                     seed_offset=1)),
            ('lossless', None, methods_lib.Method('lossless', chain, rules.Lossless(), 'eagle'))]
  for delta in DELTAS:
    points.append(('coolsd', delta, methods_lib.Method(
        f'coolsd_{delta}', chain, rules.CoolSD(delta=delta), 'eagle')))
    points.append(('uniform', delta, methods_lib.Method(
        f'uniform_{delta}', chain, rules.UniformRelaxed(omega=delta), 'eagle')))
  for residual in residuals:
    for lam in LANTERN_LAMS:
      points.append((f'lantern_pp_{residual}', lam, methods_lib.Method(
          f'lantern_pp_{residual}_{lam}', chain,
          rules.LanternPP(neighbors=neighbors[residual], k=lantern_k, lam=lam,
                          residual_mode=residual),
          'eagle')))
  for lam in CSD_LAMS:
    points.append(('csd', lam, methods_lib.Method(
        f'csd_{lam}', jacobi, rules.ContentAware(lam=lam, tv_threshold=config.csd_tv_threshold))))
  return points


def interpolate(x_points, y_points, x):
  """Piecewise-linear y at x over points sorted by x; None outside their range."""
  order = np.argsort(x_points)
  xs, ys = np.asarray(x_points)[order], np.asarray(y_points)[order]
  if not xs[0] <= x <= xs[-1]:
    return None
  return float(np.interp(x, xs, ys))


def plot(rows: list, path: str) -> None:
  figure, axes = plotting.subplots(1, 2, figsize=(12, 4.8))
  families = sorted({r['family'] for r in rows})
  markers = dict(vanilla='s', vanilla_seed1='s', lossless='*', coolsd='o', uniform='^',
                 lantern_pp_optimal='D', lantern_pp_published_llamagen='d', csd='v')
  for axis, measure, label in ((axes[0], 'frechet', 'Frechet distance (classifier features)'),
                               (axes[1], 'nll_gap', 'NLL gap vs vanilla (nats/token)')):
    for name in families:
      points = sorted((r for r in rows if r['family'] == name),
                      key=lambda r: r['tokens_per_forward'])
      axis.plot([p['tokens_per_forward'] for p in points], [p[measure] for p in points],
                marker=markers.get(name, 'o'), label=name,
                linestyle='-' if len(points) > 1 else 'none')
      for p in points:
        if p['value'] is not None:
          axis.annotate(f'{p["value"]:g}', (p['tokens_per_forward'], p[measure]), fontsize=7,
                        xytext=(3, 3), textcoords='offset points')
    axis.set_xlabel('tokens per target forward')
    axis.set_ylabel(label)
    axis.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  figure.suptitle('Relaxed speculative decoding on the bundled Fashion-MNIST family '
                  '(lower is better, right is faster)', fontsize=10)
  plotting.save(figure, path, dpi=110)


def positive_int(text: str) -> int:
  """argparse type: an integer of at least 1."""
  value = int(text)
  if value < 1:
    raise argparse.ArgumentTypeError(f'must be at least 1, got {value}')
  return value


def main(argv=None) -> dict:
  compile_cache.enable()
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', default='bench/results/pareto')
  parser.add_argument('--bundle_dir', default='')
  parser.add_argument('--images_per_class', type=positive_int, default=20)
  parser.add_argument('--draft_length', type=int, default=4)
  parser.add_argument('--window', type=int, default=8)
  parser.add_argument('--lantern_k', type=int, default=8)
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  config = generate_config.get_config()
  family = family_lib.load(args.bundle_dir or None)
  sampling = logits_lib.Sampling(**config.sampling.to_dict())
  labels = np.repeat(np.arange(family.num_classes), args.images_per_class).astype(np.int32)
  points = sweep_methods(config, family, args.draft_length, args.window, args.lantern_k)
  rows, reference_nll, began = [], None, time.time()
  for index, (name, value, method) in enumerate(points):
    tokens, summary, _ = generate.quality_pass(method, family, labels, sampling, args.seed)
    _, _, measures = generate.quality_measures(family, labels, tokens, sampling)
    if reference_nll is None:
      reference_nll = measures['nll']
    rows.append(dict(
        family=name, value=value, method=method.name,
        tokens_per_forward=summary['tokens_per_target_forward'],
        frechet=measures['frechet'], nll_gap=measures['nll'] - reference_nll,
        class_accuracy=measures['class_accuracy'],
        acceptance_per_position=summary.get('acceptance_per_position'),
        hyperparameters=methods_lib.rule_hyperparameters(method.rule)))
    row = rows[-1]
    print(f'[{index + 1}/{len(points)}] {method.name:28s} tokens/fwd '
          f'{row["tokens_per_forward"]:.2f}  frechet {row["frechet"]:.2f}  nll_gap '
          f'{row["nll_gap"]:+.4f}  acc {row["class_accuracy"]:.2f}  '
          f'({time.time() - began:.0f} s)', flush=True)
  lantern = [r for r in rows if r['family'] == 'lantern_pp_optimal']
  lossless = next(r for r in rows if r['family'] == 'lossless')
  comparison = []
  for row in rows:
    if row['family'] != 'coolsd':
      continue
    comparison.append(dict(
        delta=row['value'], tokens_per_forward=row['tokens_per_forward'],
        vs_lossless=row['tokens_per_forward'] / lossless['tokens_per_forward'],
        frechet=row['frechet'],
        lantern_pp_frechet_at_same_speed=interpolate(
            [r['tokens_per_forward'] for r in lantern], [r['frechet'] for r in lantern],
            row['tokens_per_forward'])))
  output = dict(points=rows, coolsd_vs_lantern_pp=comparison, images=len(labels),
                sampling=config.sampling.to_dict(), draft_length=args.draft_length,
                window=args.window, lantern_k=args.lantern_k, command=' '.join(sys.argv),
                vanilla_noise=dict(
                    frechet=[r['frechet'] for r in rows if r['family'].startswith('vanilla')],
                    nll_gap=[r['nll_gap'] for r in rows if r['family'].startswith('vanilla')]),
                wall_seconds=time.time() - began)
  files.write_json(os.path.join(args.out, 'pareto.json'), output)
  plot(rows, os.path.join(args.out, 'pareto.png'))
  print('\nCOOL-SD against lossless EAGLE and LANTERN++ (G*) at equal tokens per forward:')
  print(f'{"delta":>6s} {"tok/fwd":>8s} {"x lossless":>10s} {"frechet":>8s} '
        f'{"LANTERN++ frechet":>18s}')
  for c in comparison:
    other = c['lantern_pp_frechet_at_same_speed']
    print(f'{c["delta"]:6g} {c["tokens_per_forward"]:8.2f} {c["vs_lossless"]:10.2f} '
          f'{c["frechet"]:8.2f} {("%.2f" % other) if other is not None else "out of range":>18s}')
  print(f'wrote {args.out}/pareto.json and pareto.png')
  return output


if __name__ == '__main__':
  main()
