"""SCD and SJD-PAC against SJD on an image-like toy, by grid width, window and law (not a test).

  python bench/jacobi_grid_toy.py --out bench/results/jacobi_grid_toy

SCD (arXiv 2510.24211) and SJD-PAC (arXiv 2603.18599) gain less over SJD
on the bundle than in their papers. An earlier docs/results.md blamed its
grid: 14 tokens wide, so a window longer than 13 drafts holds the token below
a changed one, whose law moves as much as its right neighbour's. This bench
tests that explanation (it does not hold) and others on
`specdec_jax.app.toy.GridToy`, a target whose token k depends on its left
neighbour (k - 1) and its upper one (k - width) through a random table,
with nothing else changed between widths: the same table, the same number of
tokens per image, the same modes. Width 14 is the bundle's grid, 48
Lumina-mGPT's at 768 pixels (SJD-PAC's setting), and a width of
--num_tokens (one row) has no upper neighbour at all. --borders,
--context_weights and --background_pulls add GridToy's three image-model
traits (each combination a row set of its own): background columns whose
law is a point mass on one token, a small pull of each of the 32 tokens
before a token on its law (GridToy's default context_span, recorded in
those rows), and background that grows from the border columns into the
image, so that where an object ends depends on the tokens before. SJD's rows
of a toy with background record `peaked_share`, the share of the decoded
images' laws that put over 0.9 on one token (the bundle's: 0.43,
bench/results/context_sensitivity/).

Modes: SJD `Jacobi(W, init)`, SCD `Jacobi(W, init, coupling)` and SJD-PAC
`JacobiPAC(W, K, D, init)`, with the init, coupling, K and D of
configs/generate.py; lossless; the toy's own law (no CFG: the null class
would change only the first column). Each table is `scale` x N(0, 1) logits
over --vocab tokens, one per --scales value (flat to peaked laws); the JSON
records what each means for the law: its mean entropy and the mean
total-variation distance between a token's laws under two different left
neighbours (the bundle's: 0.37, bench/results/context_sensitivity/) and,
per context weight, the TV a changed token makes in a later law. Counts, so
machine load does not change them. Resumable: rows already in the JSON (same settings) are kept,
also those of toys, scales and methods a later run does not name.
Prints a table, writes JSON and a PNG (ratio to SJD against W, per toy).
"""

from __future__ import annotations

import itertools
import os
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import plotting  # pylint: disable=g-import-not-at-top  (bench/plotting.py)
import ratios  # pylint: disable=g-import-not-at-top  (bench/ratios.py)
import resume  # pylint: disable=g-import-not-at-top  (bench/resume.py)

_OUT = flags.DEFINE_string('out', 'bench/results/jacobi_grid_toy', 'Output folder.')
_WIDTHS = flags.DEFINE_list('widths', ['14', '48', '384'],
                            'Grid widths; --num_tokens means one row (no upper neighbour).')
_WINDOWS = flags.DEFINE_list('windows', ['4', '8', '16', '32'], 'Jacobi windows W.')
_METHODS = flags.DEFINE_list('methods', ['sjd', 'scd', 'sjd_pac'], "'sjd' is the reference.")
_NUM_TOKENS = flags.DEFINE_integer('num_tokens', 384, 'Tokens per image (8 rows of 48).')
_IMAGES = flags.DEFINE_integer('images', 200, 'Images per (width, window, method).',
                               lower_bound=2)  # a standard error needs two
_VOCAB = flags.DEFINE_integer('vocab', 256, 'Image tokens V of the toy.')
_SCALES = flags.DEFINE_list('scales', ['0.3', '0.75', '2.0'],
                            'Standard deviations of the table logits (one table each).')
_BORDERS = flags.DEFINE_list('borders', ['0'], 'GridToy.border values (background columns '
                             'on each side of a row).')
_CONTEXT_WEIGHTS = flags.DEFINE_list('context_weights', ['0'], 'GridToy.context_weight values.')
_BACKGROUND_PULLS = flags.DEFINE_list('background_pulls', ['0'],
                                      'GridToy.background_pull values.')
_SEED = flags.DEFINE_integer('seed', 0, 'Key of the table and of every decode.')

_TOY_FIELDS = ('scale', 'width', 'border', 'context_weight', 'background_pull')  # a row's toy


def toy_key(row: dict) -> tuple:
  """(scale, width, border, context_weight, background_pull) of a JSON row (rows
  written before an option existed have none: 0)."""
  return tuple(row.get(field, 0) for field in _TOY_FIELDS)


def toy_label(key: tuple) -> str:
  scale, width, border, context_weight, background_pull = key
  extras = (f', border {border}' if border else '') + (
      f', context {context_weight:g}' if context_weight else '') + (
          f', background pull {background_pull:g}' if background_pull else '')
  return f'width {width}{extras}'


def _softmax(logits):
  """float64 laws [..., V] of logits [..., V] (numpy)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  probs = np.exp(np.asarray(logits, np.float64) - np.max(logits, axis=-1, keepdims=True))
  return probs / probs.sum(-1, keepdims=True)


def _mean_tv(probs, others) -> float:
  """Mean total-variation distance between matching laws [..., V]."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  return float(0.5 * np.abs(probs - others).sum(-1).mean())


def law_statistics(table, vocab: int) -> dict:
  """Mean entropy (nats) of the image-token laws and mean TV distance between the laws
  under two different left neighbours (the same upper one), from table [A, A, V]."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  probs = _softmax(np.asarray(table, np.float64)[:vocab, :vocab])  # image tokens as neighbours
  entropy = float(-(probs * np.log(probs)).sum(-1).mean())
  left_tv = _mean_tv(probs, np.roll(probs, 1, axis=0))  # left neighbour a against a - 1
  return dict(mean_entropy=entropy, max_entropy=float(np.log(vocab)), left_change_tv=left_tv)


def pull_tv(params, vocab: int, weight: float) -> float:
  """Mean TV distance between a token's law before and after one of the tokens
  before it changes, under GridToy's context pull of `weight`: laws
  softmax(table[l, u]) against softmax(table[l, u] + weight (context[a] - context[b]))
  over the image-token contexts (l, u) and token pairs a -> b = a + 1 (token 0,
  the background, pulls nothing, so pairs start at token 1)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  logits = np.asarray(params['table'], np.float64)[:vocab, :vocab].reshape(-1, vocab)
  context = np.asarray(params['context'], np.float64)[1:vocab]
  shifts = weight * (np.roll(context, -1, axis=0) - context)  # [V - 1, V]
  shifts = shifts[np.arange(len(logits)) % len(shifts)]  # one change per context
  return _mean_tv(_softmax(logits), _softmax(logits + shifts))


def peaked_share(target, params, cond, tokens) -> float:
  """Share of the laws of decoded images tokens [N, L] that put over 0.9 on one
  token (each image's class cond [N]), from the toy's own step_logits."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  arrays = {name: np.asarray(value) for name, value in params.items()}
  tokens, cond = np.asarray(tokens), np.asarray(cond)
  laws = [_softmax(target.step_logits(arrays, target.vocab + int(c), sequence, index))
          for c, sequence in zip(cond, tokens) for index in range(len(sequence))]
  return float(np.mean(np.max(laws, axis=-1) > 0.9))


def build_mode(name: str, window: int, config):
  from specdec_jax import decode  # pylint: disable=g-import-not-at-top
  if name == 'sjd':
    return decode.Jacobi(window, init=config.jacobi_init)
  if name == 'scd':
    return decode.Jacobi(window, init=config.jacobi_init, coupling=config.scd_coupling)
  if name == 'sjd_pac':
    return decode.JacobiPAC(window, branches=config.pac_branches, depth=config.pac_depth,
                            init=config.jacobi_init)
  raise ValueError(f"--methods: unknown method {name!r}; use 'sjd', 'scd' or 'sjd_pac'.")


def plot(path: str, rows: list[dict], laws: dict, methods: list[str]) -> None:
  """One panel per table scale: each method's ratio to SJD against W, per toy."""
  scales = sorted({r['scale'] for r in rows})
  columns = min(3, len(scales))
  lines = -(-len(scales) // columns)
  fig, axes = plotting.subplots(lines, columns,  # each panel's legend to its right
                                figsize=(max(6.4, 7.4 * columns), 4.0 * lines))
  import matplotlib  # pylint: disable=g-import-not-at-top  (after plotting's backend choice)
  axes = list(getattr(axes, 'flat', [axes]))
  for ax in axes[len(scales):]:
    ax.set_visible(False)
  for index, (ax, scale) in enumerate(zip(axes, scales)):
    if index % columns == 0:
      ax.set_ylabel('ratio to SJD at the same W')
    keys = sorted({toy_key(r) for r in rows if r['scale'] == scale})
    colors = matplotlib.colormaps['tab20'] if len(keys) > 10 else None
    for number, key in enumerate(keys):
      color = colors(number % 20) if colors else f'C{number}'  # a colour per toy
      for name in methods[1:]:
        mine = sorted((r for r in rows if toy_key(r) == key and r['method'] == name),
                      key=lambda r: r['window'])
        ax.errorbar([r['window'] for r in mine], [r['ratio_to_sjd'] for r in mine],
                    yerr=[r['ratio_stderr'] for r in mine], marker='o', ms=4, capsize=2,
                    color=color, linestyle='-' if name == 'scd' else '--',
                    label=f'{name}, {toy_label(key)}')
    ax.axhline(1.2, color='grey', lw=0.8, ls=':')
    ax.axhline(1.5, color='grey', lw=0.8, ls=':')
    ax.set_xscale('log', base=2)
    ax.set_xlabel('Jacobi window W')
    law = laws[str(scale)]
    ax.set_title(f"scale {scale}: entropy {law['mean_entropy']:.1f} nats, "
                 f"left-change TV {law['left_change_tv']:.2f}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc='upper left', bbox_to_anchor=(1.01, 1.0))
  fig.suptitle("GridToy: SCD and SJD-PAC tokens per forward / SJD's")
  plotting.save(fig, path)


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from specdec_jax import decode, logits, rules  # pylint: disable=g-import-not-at-top
  from specdec_jax.app import toy  # pylint: disable=g-import-not-at-top
  from specdec_jax.configs import generate as generate_config  # pylint: disable=g-import-not-at-top

  methods = list(_METHODS.value)
  if methods[0] != 'sjd':
    raise ValueError(f"--methods must start with 'sjd' (the reference), got {methods}.")
  widths = [int(w) for w in _WIDTHS.value]
  if not all(1 <= w <= _NUM_TOKENS.value for w in widths):
    raise ValueError(f'--widths must be in [1, --num_tokens={_NUM_TOKENS.value}], got {widths}.')
  config = generate_config.get_config()
  settings = dict(images=_IMAGES.value, seed=_SEED.value, vocab=_VOCAB.value,
                  num_tokens=_NUM_TOKENS.value, init=config.jacobi_init,
                  coupling=config.scd_coupling, pac_tree=[config.pac_branches, config.pac_depth])
  os.makedirs(_OUT.value, exist_ok=True)
  json_path = os.path.join(_OUT.value, 'jacobi_grid_toy.json')
  done = resume.saved_rows(json_path, lambda saved: saved['settings'] == settings,
                          lambda r: (toy_key(r), r['window'], r['method']))
  classes = 2
  cond = jnp.asarray(np.arange(_IMAGES.value) % classes, jnp.int32)

  def write(rows):
    # after every row: a killed run resumes
    resume.write_json(json_path, {'settings': settings, 'laws': laws, 'rows': rows})

  laws = {}
  scales = [float(x) for x in _SCALES.value]
  toys = list(itertools.product(widths, [int(b) for b in _BORDERS.value],
                                [float(c) for c in _CONTEXT_WEIGHTS.value],
                                [float(g) for g in _BACKGROUND_PULLS.value]))
  # Every saved toy is kept, with its law's statistics: a run over fewer scales or
  # context weights than the JSON holds adds rows and drops none.
  for scale in sorted(set(scales) | {key[0] for key, _, _ in done}):
    params = toy.GridToy(_VOCAB.value, classes).init_params(jax.random.key(_SEED.value),
                                                            scale=scale)
    laws[str(scale)] = law_statistics(params['table'], _VOCAB.value)
    weights = sorted({float(c) for c in _CONTEXT_WEIGHTS.value}
                     | {float(key[3]) for key, _, _ in done if key[0] == scale})
    laws[str(scale)]['context_change_tv'] = {
        str(c): pull_tv(params, _VOCAB.value, c) for c in weights}
    print(f'scale {scale}: toy law {laws[str(scale)]}', flush=True)
    if scale not in scales:
      continue
    for (width, border, context_weight, background_pull), window, name in itertools.product(
        toys, [int(w) for w in _WINDOWS.value], methods):
      key = (scale, width, border, context_weight, background_pull)
      if (key, window, name) in done:
        continue
      start = time.perf_counter()
      target = toy.GridToy(_VOCAB.value, classes, width, border, context_weight,
                           background_pull=background_pull)
      result = decode.generate(target, params, cond, num_tokens=_NUM_TOKENS.value,
                               key=jax.random.key(_SEED.value + 1),
                               mode=build_mode(name, window, config), sampling=logits.Sampling(),
                               rule=rules.Lossless())
      per_image = np.asarray(result.metrics.tokens_per_target_forward, np.float64)
      done[(key, window, name)] = dict(
          zip(_TOY_FIELDS, key), window=window, method=name,
          **({'context_span': target.context_span} if context_weight else {}),
          tokens_per_forward=float(per_image.mean()),
          stderr=float(per_image.std(ddof=1) / np.sqrt(per_image.size)),
          per_image=per_image.tolist(),
          acceptance_per_position=result.metrics.summary()['acceptance_per_position'],
          **({'peaked_share': peaked_share(target, params, cond, result.tokens)}
             if name == 'sjd' and (border or background_pull) else {}))
      print(f'scale {scale} {toy_label(key)} W={window} {name}: {per_image.mean():.3f} '
            f'tokens per forward ({time.perf_counter() - start:.0f} s)', flush=True)
      write(list(done.values()))
  rows = []
  print('| scale | toy | W | ' + ' | '.join(methods) + ' | '
        + ' | '.join(f'{name} / SJD' for name in methods[1:]) + ' |')
  print('|---' * (2 + 2 * len(methods)) + '|')  # scale, toy, W, methods, ratios
  names = methods + sorted({name for _, _, name in done} - set(methods))
  for key, window in sorted({(key, window) for key, window, _ in done}):
    if (key, window, 'sjd') not in done:
      continue
    reference = done[(key, window, 'sjd')]
    mine = [ratios.with_ratio(done[(key, window, name)], reference)
            for name in names if (key, window, name) in done]
    rows.extend(mine)
    shown = [r for r in mine if r['method'] in methods]  # the table's columns
    print(f'| {key[0]} | {toy_label(key)} | {window} | ' + ' | '.join(
        f"{r['tokens_per_forward']:.2f} ({r['stderr']:.2f})" for r in shown) + ' | ' + ' | '.join(
            f"{r['ratio_to_sjd']:.2f} ({r['ratio_stderr']:.2f})" for r in shown[1:]) + ' |')
  write(rows)
  plot(os.path.join(_OUT.value, 'jacobi_grid_toy.png'), rows, laws, methods)
  print('wrote', _OUT.value)


if __name__ == '__main__':
  from specdec_jax.app import cli  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=cli.parse_flags)  # --help exits 0, a bad flag 2
