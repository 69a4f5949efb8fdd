"""How fast the bundled target forgets a changed token: SJD-PAC's staleness diagnostic (not a test).

  python bench/context_sensitivity.py --out bench/results/context_sensitivity

Adaptive continuation (SJD-PAC, Kang et al., CVPR 2026, arXiv 2603.18599)
and SCD's coupling (arXiv 2510.24211) keep drafts that were drawn from a
*stale* target law, one computed before an earlier token changed. Their
gain rests on image tokens forgetting distant context: SJD-PAC's README
measures, on Lumina-mGPT, the total-variation distance between the next-token
laws with and without one perturbed token at offset j, and finds it falls
toward zero within a few positions for images (not for text).

The same measurement on the bundled family, with the main command's sampling
(CFG, `configs/generate.py`): --images vanilla images from the target; in each,
--positions token positions i drawn at random; token i is replaced by a draw
from the target's own law at i with the original token removed (what a
rejection and residual draw does to a window), and for offsets j = 1..--max_offset
TV(p(x_{i+j} | original prefix), p(x_{i+j} | perturbed prefix)) is averaged
over images and positions (standard error over the images' own means: an
image's positions share its tokens). Raster order: offset G (the grid width) is the
token directly below the perturbed one. The JSON also records the TV's
quantiles at j = 1 and j = G and how peaked the images' own laws are
(entropy quantiles, share with a top token over 0.9) and the mean TV over
the ambiguous laws only (top token at most 0.9), to compare with
bench/jacobi_grid_toy.py's uniform toy. Prints a table, writes JSON and a PNG.
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import plotting  # pylint: disable=g-import-not-at-top  (bench/plotting.py)
import resume  # pylint: disable=g-import-not-at-top  (bench/resume.py)
from specdec_jax.app import generate as generate_app  # pylint: disable=g-import-not-at-top

_OUT = flags.DEFINE_string('out', 'bench/results/context_sensitivity', 'Output folder.')
_IMAGES = flags.DEFINE_integer('images', 200, 'Vanilla images (every class in turn).',
                               lower_bound=2)  # the standard error is over images
_POSITIONS = flags.DEFINE_integer('positions', 8, 'Perturbed positions per image.',
                                  lower_bound=1)
_MAX_OFFSET = flags.DEFINE_integer('max_offset', 32, 'Largest offset j measured.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the images, positions and perturbations.')


def perturb(rng, probs, tokens, num_positions: int, max_offset: int):
  """Per image, `num_positions` positions i with i + max_offset < L, each token i
  redrawn from probs[i] without the original token.

  Returns (image index int[M], position int[M], perturbed tokens int[M, L]).
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  num_images, length = tokens.shape
  images = np.repeat(np.arange(num_images), num_positions)
  positions = np.concatenate([rng.choice(np.arange(1, length - max_offset), num_positions,
                                         replace=False) for _ in range(num_images)])
  perturbed = tokens[images].copy()
  for row, (image, position) in enumerate(zip(images, positions)):
    law = probs[image, position].astype(np.float64)
    law[tokens[image, position]] = 0.0
    if law.sum() <= 0:  # a point-mass law: any other token
      law = np.ones_like(law)
      law[tokens[image, position]] = 0.0
    perturbed[row, position] = rng.choice(law.size, p=law / law.sum())
  return images, positions, perturbed


QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def law_spread(probs) -> dict:
  """Entropy quantiles (nats) of the laws probs [N, L, V] and the share of them whose
  top token holds over 0.9 (nearly a point mass: every Jacobi method accepts there)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  probs = np.asarray(probs, np.float64).reshape(-1, probs.shape[-1])
  entropy = -(probs * np.log(np.where(probs > 0, probs, 1.0))).sum(-1)
  return {'entropy_quantiles': np.quantile(entropy, QUANTILES).tolist(),
          'share_top_token_over_0.9': float((probs.max(-1) > 0.9).mean())}


def plot(path: str, offsets, mean, stderr, grid_width: int) -> None:
  fig, ax = plotting.subplots()
  ax.errorbar(offsets, mean, yerr=stderr, marker='o', ms=3, capsize=2)
  ax.axvline(grid_width, color='grey', ls=':', lw=1)
  ax.text(grid_width + 0.3, max(mean) * 0.9, 'token below', color='grey', fontsize=8)
  ax.set_yscale('log')
  ax.set_xlabel('offset j after the perturbed token')
  ax.set_ylabel('TV(next-token law, original vs perturbed)')
  ax.set_title('Bundled target: how fast a changed token is forgotten')
  ax.grid(alpha=0.3)
  plotting.save(fig, path)


def main(argv):
  del argv
  generate_app.use_single_thread_xla()
  import numpy as np  # pylint: disable=g-import-not-at-top
  from specdec_jax import logits  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import family as family_lib  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import methods as methods_lib  # pylint: disable=g-import-not-at-top
  from specdec_jax.configs import generate as generate_config  # pylint: disable=g-import-not-at-top

  config = generate_config.get_config()
  config.methods = ('vanilla',)
  family = family_lib.load()
  if _MAX_OFFSET.value < family.grid[1]:  # the JSON's 'below' fields read offset G
    raise app.UsageError(f'--max_offset must be at least the grid width {family.grid[1]} '
                         f'(the token below), got {_MAX_OFFSET.value}.')
  most_positions = family.num_tokens - _MAX_OFFSET.value - 1  # 1..L-max_offset-1 are drawn
  if _POSITIONS.value > most_positions:
    raise app.UsageError(f'--positions must be at most {most_positions} (the positions followed '
                         f'by --max_offset={_MAX_OFFSET.value} tokens), got {_POSITIONS.value}.')
  sampling = logits.Sampling(**config.sampling.to_dict())
  vanilla = methods_lib.build_methods(config, family)[0]
  labels = (np.arange(_IMAGES.value) % family.num_classes).astype(np.int32)
  tokens, _, _ = generate_app.quality_pass(vanilla, family, labels, sampling, _SEED.value)
  tokens = np.asarray(tokens)
  print(f'{len(tokens)} vanilla images of {tokens.shape[1]} tokens', flush=True)
  probs = np.asarray(family.guided_probs(labels, tokens, sampling))
  rng = np.random.default_rng(_SEED.value)
  max_offset = _MAX_OFFSET.value
  images, positions, perturbed = perturb(rng, probs, tokens, _POSITIONS.value, max_offset)
  offsets = np.arange(1, max_offset + 1)
  distances = []  # [M, max_offset]
  ambiguous = []  # [M, max_offset]: the original law at i + j puts <= 0.9 on its top token
  for start in range(0, len(images), 256):
    rows = slice(start, start + 256)
    changed = np.asarray(family.guided_probs(labels[images[rows]], perturbed[rows], sampling))
    after = positions[rows, None] + offsets[None, :]  # [m, J]
    original = probs[images[rows][:, None], after]  # [m, J, V]
    new = np.take_along_axis(changed, after[..., None], axis=1)
    distances.append(0.5 * np.abs(original - new).sum(-1))
    ambiguous.append(original.max(-1) <= 0.9)
    print(f'  perturbed sequences {min(start + 256, len(images))}/{len(images)}', flush=True)
  distances = np.concatenate(distances)
  ambiguous = np.concatenate(ambiguous)
  # The same mean over the ambiguous laws only (objects, not background).
  ambiguous_mean = (distances * ambiguous).sum(0) / np.maximum(ambiguous.sum(0), 1)
  mean = distances.mean(0)
  # An image's perturbations share its tokens, so they are not independent: the
  # standard error is over the images' own means (each holds --positions rows).
  per_image = np.zeros((len(tokens), max_offset))
  np.add.at(per_image, images, distances / _POSITIONS.value)
  stderr = per_image.std(0, ddof=1) / np.sqrt(len(per_image))
  grid_width = family.grid[1]
  print('| offset j | TV mean | s.e. |')
  print('|---|---|---|')
  for j, m, s in zip(offsets, mean, stderr):
    print(f'| {j}{" (below)" if j == grid_width else ""} | {m:.4f} | {s:.4f} |')
  os.makedirs(_OUT.value, exist_ok=True)
  result = {
      'images': int(len(tokens)), 'positions_per_image': _POSITIONS.value, 'seed': _SEED.value,
      'sampling': config.sampling.to_dict(), 'grid_width': grid_width,
      'offsets': offsets.tolist(), 'tv_mean': mean.tolist(), 'tv_stderr': stderr.tolist(),
      'tv_mean_offsets_2_to_13': float(mean[1:grid_width - 1].mean()),
      # How the mean is made up: the TV's quantiles at j = 1 and at the token below,
      # and how peaked the vanilla images' own laws are (every position).
      'quantiles': list(QUANTILES),
      'tv_quantiles_offset_1': np.quantile(distances[:, 0], QUANTILES).tolist(),
      'tv_quantiles_below': np.quantile(distances[:, grid_width - 1], QUANTILES).tolist(),
      **law_spread(probs),
      'tv_mean_ambiguous': ambiguous_mean.tolist(),
      'ambiguous_share': ambiguous.mean(0).tolist(),
  }
  resume.write_json(os.path.join(_OUT.value, 'context_sensitivity.json'), result)
  plot(os.path.join(_OUT.value, 'context_sensitivity.png'), offsets, mean, stderr, grid_width)
  print('wrote', _OUT.value)


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
