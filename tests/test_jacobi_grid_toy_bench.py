"""`bench/jacobi_grid_toy.py` end to end on a tiny grid: every toy, window and method
gets a row with its ratio to SJD, the PNG is written, a second run resumes
(decodes nothing), and a run over fewer toys and methods keeps every row and law."""

import json
import os
import subprocess
import sys
import tempfile

from absl.testing import absltest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FLAGS = ['--images=4', '--num_tokens=12', '--widths=3', '--windows=3', '--scales=1.0',
          '--borders=0,1', '--context_weights=0,0.1', '--background_pulls=0,2']


def _run(out: str, extra_flags=()) -> str:
  """The bench's stdout; extra_flags override _FLAGS (absl keeps the last value)."""
  command = [sys.executable, os.path.join(_ROOT, 'bench', 'jacobi_grid_toy.py'), f'--out={out}',
             *_FLAGS, *extra_flags]
  result = subprocess.run(command, cwd=_ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, check=False)
  if result.returncode:
    raise AssertionError(f'bench failed:\n{result.stdout}\n{result.stderr}')
  return result.stdout


class JacobiGridToyBenchTest(absltest.TestCase):

  def test_rows_plot_and_resume(self):
    with tempfile.TemporaryDirectory() as out:
      first = _run(out)
      with open(os.path.join(out, 'jacobi_grid_toy.json')) as f:
        saved = json.load(f)
      rows = saved['rows']
      # 2 borders x 2 context weights x 2 background pulls x 1 width x 1 window x 3 methods.
      self.assertLen(rows, 24)
      self.assertEqual({(r['border'], r['context_weight'], r['background_pull']) for r in rows},
                       {(b, c, g) for b in (0, 1) for c in (0.0, 0.1) for g in (0.0, 2.0)})
      for row in rows:
        self.assertGreaterEqual(row['tokens_per_forward'], 1.0)
        self.assertIn('ratio_to_sjd', row)
        self.assertEqual('context_span' in row, row['context_weight'] > 0)
        with_background = row['method'] == 'sjd' and (row['border'] or row['background_pull'])
        self.assertEqual('peaked_share' in row, bool(with_background))
        if with_background:
          self.assertBetween(row['peaked_share'], 0.0, 1.0)
      # Border 1 of width 3: two of three columns are point masses.
      self.assertTrue(all(r['peaked_share'] >= 2 / 3 for r in rows
                          if r['method'] == 'sjd' and r['border']))
      self.assertEqual([r['ratio_to_sjd'] for r in rows if r['method'] == 'sjd'], [1.0] * 8)
      pull = saved['laws']['1.0']['context_change_tv']
      self.assertEqual(pull['0.0'], 0.0)
      self.assertGreater(pull['0.1'], 0.0)
      self.assertTrue(os.path.exists(os.path.join(out, 'jacobi_grid_toy.png')))
      self.assertEqual(first.count('tokens per forward ('), 24)
      table = [line for line in first.splitlines() if line.startswith('|')]
      self.assertLen(table, 2 + 8)  # header, separator, one row per toy
      self.assertLen({line.count('|') for line in table}, 1, table)  # a markdown table
      self.assertEqual(_run(out).count('tokens per forward ('), 0)  # resumed
      # A run over a subset of the toys decodes nothing and drops no row or law.
      subset = _run(out, ['--borders=0', '--context_weights=0', '--background_pulls=0',
                          '--methods=sjd,scd'])
      self.assertEqual(subset.count('tokens per forward ('), 0)
      with open(os.path.join(out, 'jacobi_grid_toy.json')) as f:
        self.assertEqual(json.load(f), saved)


if __name__ == '__main__':
  absltest.main()
