"""Speed-drift frontier of the relaxed rules, each point a large set drawn by the sampler (not a test).

  nohup python bench/pareto_sampled.py --root runs/pareto --out bench/results/pareto_sampled > pareto.log &
  python bench/pareto_sampled.py --root /tmp/p --num_images 200 --points vanilla,vanilla_seed1,coolsd_2

Every point of the sweep (a method of the main command's catalogue with one
hyperparameter value) is an evaluation set of --num_images images drawn by
`python -m specdec_jax.sample` on the bundled Fashion-MNIST family, the main
command's sampling settings, into its own folder under --root. The sampler
resumes an interrupted set and this script skips finished ones (after checking
that their config.json records the point's settings and --num_images; a
finished set of fewer images is extended), so the whole sweep survives being
killed and rerun, and a rerun with a larger --num_images keeps what it drew.
For each point it reports, from the set's classifier features:
  * frechet_to_target: the Frechet distance to the target's own samples
    (vanilla, seed 0): the drift a relaxation causes;
  * frechet_to_data: the Frechet distance to the test split (which rewards
    the sharpening that relaxing an imperfect target brings, so it is not a
    fidelity measure on its own);
  * tokens per target forward (the sampler's mean over the set) and class
    accuracy.
Jacobi points run at window JACOBI_WINDOW with --jacobi_init's fresh drafts
(the main command's 'spatial' by default; the first committed sweep,
bench/results/pareto_sampled, ran --jacobi_init=random).
vanilla under seed 1 against seed 0 is the noise floor of frechet_to_target
at this set size. Writes pareto.json and pareto.png (tokens per forward
against each distance, the floor drawn) under --out, and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from pareto_knobs import CSD_LAMS, DELTAS, LANTERN_LAMS  # bench/pareto_knobs.py
import plotting  # bench/plotting.py
from specdec_jax import jacobi_drafts

# The 2026 methods' relaxed variants (their *_rule hyperparameter): EAGLE-2's
# tree with COOL-SD, SCD's and SJD-PAC's Jacobi drafts with CSD.
EAGLE2_COOLSD_DELTAS = (2.0, 4.0)
SCD_CSD_LAMS = (0.05, 0.2)
SJD_PAC_CSD_LAMS = (0.2,)
SCD_CHAIN_RULE_DELTAS = (2.0,)
SCD_LANTERN_LAMS = (3.0,)
JACOBI_WINDOW = 8  # the committed sweep's (the main command's default is now 4)
JACOBI_INIT = 'spatial'  # fresh Jacobi drafts: the main command's (the first sweep ran 'random')
JACOBI_METHODS = ('sjd', 'scd', 'sjd_pac', 'gsd', 'csd')  # those reading the two settings above


def sweep_points() -> list[tuple]:
  """(point name, family, knob value, method, hyperparameter overrides, seed) per point."""
  points = [('vanilla', 'vanilla', None, 'vanilla', {}, 0),
            ('vanilla_seed1', 'vanilla_seed1', None, 'vanilla', {}, 1),
            ('eagle', 'lossless', None, 'eagle', {}, 0),
            ('eagle2', 'lossless', None, 'eagle2', {}, 0),
            ('sjd', 'lossless', None, 'sjd', {}, 0),
            ('scd', 'lossless', None, 'scd', {}, 0),
            ('sjd_pac', 'lossless', None, 'sjd_pac', {}, 0)]
  points += [(f'coolsd_{d:g}', 'coolsd', d, 'coolsd', {'coolsd_delta': d}, 0) for d in DELTAS]
  points += [(f'uniform_{d:g}', 'uniform', d, 'uniform', {'uniform_omega': d}, 0)
             for d in DELTAS]
  points += [(f'lantern_pp_{lam:g}', 'lantern_pp', lam, 'lantern_pp',
              {'lantern_lam': lam, 'lantern_residual': 'optimal'}, 0) for lam in LANTERN_LAMS]
  points += [(f'csd_{lam:g}', 'csd', lam, 'csd', {'csd_lam': lam}, 0) for lam in CSD_LAMS]
  points += [(f'eagle2_coolsd_{d:g}', 'eagle2_coolsd', d, 'eagle2',
              {'eagle2_rule': 'coolsd', 'coolsd_delta': d}, 0) for d in EAGLE2_COOLSD_DELTAS]
  points += [(f'scd_csd_{lam:g}', 'scd_csd', lam, 'scd', {'scd_rule': 'csd', 'csd_lam': lam}, 0)
             for lam in SCD_CSD_LAMS]
  points += [(f'sjd_pac_csd_{lam:g}', 'sjd_pac_csd', lam, 'sjd_pac',
              {'sjd_pac_rule': 'csd', 'csd_lam': lam}, 0) for lam in SJD_PAC_CSD_LAMS]
  # GSD, and the chain rules on SCD's Jacobi drafts (fresh drafts are point masses).
  points += [('gsd', 'gsd', None, 'gsd', {}, 0)]
  points += [(f'scd_uniform_{d:g}', 'scd_uniform', d, 'scd',
              {'scd_rule': 'uniform', 'uniform_omega': d}, 0) for d in SCD_CHAIN_RULE_DELTAS]
  points += [(f'scd_coolsd_{d:g}', 'scd_coolsd', d, 'scd',
              {'scd_rule': 'coolsd', 'coolsd_delta': d}, 0) for d in SCD_CHAIN_RULE_DELTAS]
  points += [(f'scd_lantern_pp_{lam:g}', 'scd_lantern_pp', lam, 'scd',
              {'scd_rule': 'lantern_pp', 'lantern_lam': lam, 'lantern_residual': 'optimal'}, 0)
             for lam in SCD_LANTERN_LAMS]
  return points


def sampler_settings(point: tuple, num_images: int, jacobi_init: str = JACOBI_INIT) -> dict:
  """The sampler config fields (dotted names) a point sets: those its images depend on."""
  _, _, _, method, hparams, seed = point
  if method in JACOBI_METHODS:  # other methods' images do not depend on them
    hparams = {'jacobi_window': JACOBI_WINDOW, 'jacobi_init': jacobi_init, **hparams}
  return {'method': method, 'num_images': num_images, 'seed': seed,
          **{f'hparams.{key}': value for key, value in hparams.items()}}


def recorded_value(config: dict, name: str):
  """The value of a dotted field in a config dict ('<not recorded>' if absent)."""
  for key in name.split('.'):
    if not isinstance(config, dict) or key not in config:
      return '<not recorded>'
    config = config[key]
  return config


def check_reusable(folder: str, settings: dict) -> bool:
  """Raises ValueError unless a finished folder's set was drawn with these settings
  (its config.json, written by the sampler) and counts committed tokens per forward.

  Returns:
    True when the set is this point's as it is; False when it holds fewer images
    than settings['num_images'] and nothing else differs (the sampler extends it).
  """
  try:
    with open(os.path.join(folder, 'config.json')) as f:
      recorded = json.load(f)['config']
    with open(os.path.join(folder, 'summary.json')) as f:
      merged = json.load(f)['num_images']
    with open(os.path.join(folder, 'metrics.jsonl')) as f:
      first = json.loads(f.readline())
  except (OSError, ValueError, KeyError) as e:
    raise ValueError(f'{folder} holds a set whose configuration or metrics cannot be read '
                     f'({e!r}); delete the folder to draw it again.') from None
  held = recorded_value(recorded, 'num_images')
  # A set stopped while being extended (by a sampler from before it removed the
  # merged files then) holds fewer merged images than its config.json names.
  asked = settings['num_images']
  grows = isinstance(held, int) and (held < asked or (held == asked and merged != held))
  changed = [f'{name}: {recorded_value(recorded, name)!r} (folder) -> {value!r} (this sweep)'
             for name, value in settings.items()
             if recorded_value(recorded, name) != value and not (grows and name == 'num_images')]
  if 'committed_tokens' not in first:
    changed.append('metrics: drawn by a sampler whose tokens_per_forward counted drafts '
                   'accepted past the last token')
  if changed:
    raise ValueError(f'{folder} holds another set than this sweep asks for:\n  '
                     + '\n  '.join(changed)
                     + '\nDelete the folder to draw it again, or pass another --root.')
  return not grows


def draw(point: tuple, root: str, num_images: int, batch: int,
         jacobi_init: str = JACOBI_INIT) -> str:
  """Runs (or resumes) the sampler for one point; returns its folder. A finished
  folder is reused only when its set has the point's settings (`check_reusable`), and
  extended by the sampler when it has fewer images than asked for."""
  folder = os.path.join(root, point[0])
  settings = sampler_settings(point, num_images, jacobi_init)
  if (os.path.exists(os.path.join(folder, 'summary.json'))
      and check_reusable(folder, settings)):
    return folder
  command = [sys.executable, '-m', 'specdec_jax.sample', '--config', 'configs/sample_fashion.py',
             f'--config.out_dir={folder}', '--config.write_png=False',
             f'--config.batch_per_device={batch}', f'--config.chunk_size={batch * 4}']
  command += [f'--config.{name}={value}' for name, value in settings.items()]
  print('$', ' '.join(command), flush=True)
  subprocess.run(command, check=True)
  return folder


def features_of(folder: str, family) -> dict:
  """Classifier features and logits of a set's images (cached next to them, with the
  SHA-256 of the samples.npz they were computed from: an extended set is measured anew)."""
  from specdec_jax.app import files  # pylint: disable=g-import-not-at-top
  cache, samples = (os.path.join(folder, name) for name in ('classifier_features.npz',
                                                            'samples.npz'))
  digest = files.sha256(samples)
  if os.path.exists(cache):
    with np.load(cache) as cached:
      if 'samples_sha256' in cached and str(cached['samples_sha256']) == digest:
        return dict(logits=cached['logits'], features=cached['features'])
  with np.load(samples) as data:
    images = data['arr_0'][..., :1]  # grayscale, stored as 3 equal channels
  logits, features = [], []
  for start in range(0, len(images), 500):
    batch_logits, batch_features = family.classify(images[start:start + 500])
    logits.append(np.asarray(batch_logits))
    features.append(np.asarray(batch_features))
  out = dict(logits=np.concatenate(logits), features=np.concatenate(features))
  np.savez(cache + '.tmp.npz', samples_sha256=np.array(digest), **out)
  os.replace(cache + '.tmp.npz', cache)
  return out


def plot(rows: list, floor: float, path: str) -> None:
  figure, axes = plotting.subplots(1, 2, figsize=(12, 4.8))
  families = sorted({r['family'] for r in rows} - {'vanilla', 'vanilla_seed1'})
  for axis, measure, label in (
      (axes[0], 'frechet_to_target', "Frechet distance to the target's samples (drift)"),
      (axes[1], 'frechet_to_data', 'Frechet distance to the test split')):
    for name in families:
      points = sorted((r for r in rows if r['family'] == name),
                      key=lambda r: r['tokens_per_forward'])
      axis.plot([p['tokens_per_forward'] for p in points], [p[measure] for p in points],
                marker='o', label=name, linestyle='-' if len(points) > 1 else 'none')
      for p in points:
        if p['value'] is not None:
          axis.annotate(f'{p["value"]:g}', (p['tokens_per_forward'], p[measure]), fontsize=7,
                        xytext=(3, 3), textcoords='offset points')
    vanilla = [r for r in rows if r['family'] in ('vanilla', 'vanilla_seed1')]
    for r in vanilla:
      axis.plot([r['tokens_per_forward']], [r[measure]], marker='s', color='black')
    if measure == 'frechet_to_target':
      axis.axhline(floor, color='gray', linestyle='--', label='vanilla seed 1 vs seed 0 (floor)')
    axis.set_xlabel('tokens per target forward')
    axis.set_ylabel(label)
    axis.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  figure.suptitle(f'Relaxed speculative decoding on the bundled Fashion-MNIST family, '
                  f'{rows[0]["images"]} images per point (lower is better, right is faster)',
                  fontsize=10)
  plotting.save(figure, path, dpi=110)


def select_points(points: list[tuple], names: str) -> list[tuple]:
  """The points named in the comma-separated `names` ('' = all), in sweep order; vanilla
  must be among them (the drift reference). SystemExit names unknown points."""
  if names:
    wanted = [name.strip() for name in names.split(',')]
    unknown = [name for name in wanted if name not in {point[0] for point in points}]
    if unknown:
      raise SystemExit(f'--points: unknown point(s) {unknown}; the sweep has '
                       f'{[point[0] for point in points]}.')
    points = [point for point in points if point[0] in wanted]
  if points[0][0] != 'vanilla':
    raise SystemExit('--points: the sweep needs its vanilla point (the drift reference); '
                     'add vanilla to --points.')
  return points


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--root', default='runs/pareto', help='One sampler folder per point.')
  parser.add_argument('--out', default='bench/results/pareto_sampled')
  parser.add_argument('--num_images', type=int, default=2000)
  parser.add_argument('--batch', type=int, default=50, help='Images per decode call.')
  parser.add_argument('--points', default='', help='Comma-separated point names (default all).')
  parser.add_argument('--jacobi_init', default=JACOBI_INIT, choices=jacobi_drafts.INITS,
                      help="Fresh Jacobi drafts (the first sweep ran 'random').")
  args = parser.parse_args(argv)
  points = select_points(sweep_points(), args.points)
  if args.num_images < 2 or args.batch < 1:
    parser.error(f'--num_images must be at least 2 and --batch at least 1, '
                 f'got {args.num_images} and {args.batch}.')
  started = time.time()
  for index, point in enumerate(points):
    draw(point, args.root, args.num_images, args.batch, args.jacobi_init)
    print(f'[{index + 1}/{len(points)}] {point[0]} drawn ({time.time() - started:.0f} s)',
          flush=True)

  from specdec_jax.app import evaluation  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import family as family_lib  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import files  # pylint: disable=g-import-not-at-top
  family = family_lib.load()
  reference = features_of(os.path.join(args.root, 'vanilla'), family)['features']
  rows = []
  for name, family_name, value, method, hparams, seed in points:
    folder = os.path.join(args.root, name)
    measured = features_of(folder, family)
    summary = json.load(open(os.path.join(folder, 'summary.json')))
    labels = np.arange(len(measured['logits'])) % family.num_classes
    rows.append(dict(
        point=name, family=family_name, value=value, method=method, hparams=hparams, seed=seed,
        images=len(labels), tokens_per_forward=summary['mean_tokens_per_forward'],
        frechet_to_target=evaluation.features_frechet(measured['features'], reference),
        frechet_to_data=family.frechet(measured['features']),
        class_accuracy=evaluation.class_accuracy(measured['logits'], labels),
        images_per_s=summary.get('images_per_s')))
  floor = next((r['frechet_to_target'] for r in rows if r['point'] == 'vanilla_seed1'), None)
  os.makedirs(args.out, exist_ok=True)
  output = dict(points=rows, noise_floor=floor, num_images=args.num_images,
                jacobi_window=JACOBI_WINDOW, jacobi_init=args.jacobi_init,
                command=' '.join(sys.argv),
                wall_seconds=time.time() - started)
  files.write_json(os.path.join(args.out, 'pareto.json'), output)
  if floor is not None:
    plot(rows, floor, os.path.join(args.out, 'pareto.png'))
  print(f'{"point":20s} {"tok/fwd":>8s} {"fd target":>10s} {"fd data":>8s} {"accuracy":>9s}')
  for r in rows:
    print(f'{r["point"]:20s} {r["tokens_per_forward"]:8.2f} {r["frechet_to_target"]:10.2f} '
          f'{r["frechet_to_data"]:8.2f} {r["class_accuracy"]:9.3f}')
  print(f'noise floor (vanilla seed 1 vs seed 0): {floor}')
  return output


if __name__ == '__main__':
  main()
