"""CFG rows are interleaved (image b: rows 2b, 2b + 1), so over a 'data' mesh no
logits move between devices: the compiled decode has no collective of a [*, V]
array, for every mode (EAGLE-2's tree growth and GSD's group search included:
their lax.top_k runs per 'data' shard). Negative controls: the old [cond;
uncond] halves layout, and lax.top_k (whose batch XLA's partitioner gathers),
on a toy computation.

Over a 'model' mesh with vocab-sharded logits, the blocked top-k
(`Sampling.topk_blocks`) moves no vocabulary-sized array; one sort of V does.
"""

from __future__ import annotations

import json
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

from specdec_jax import drafting
from specdec_jax import logits
from tests import fresh_process

# Runs in a fresh interpreter: the device count is fixed when JAX starts.
_SCRIPT = textwrap.dedent("""
    import json, os, re
    os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=4'
    import jax, jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    from specdec_jax import decode, drafting, logits, rules, sharding, verify
    from specdec_jax.models import tiny

    VOCAB = 160  # a size no other array dimension has
    COLLECTIVE = re.compile(r'(all-gather|all-to-all|collective-permute|all-reduce|'
                            r'reduce-scatter)(-start)?\\(')
    SHAPE_WITH_V = re.compile(r'\\[[^\\]]*\\b%d\\b[^\\]]*\\]' % VOCAB)

    def moved_logits(compiled):
      lines = [l.strip() for l in compiled.as_text().splitlines() if COLLECTIVE.search(l)]
      return [l[:160] for l in lines if SHAPE_WITH_V.search(l)]

    mesh = sharding.make_mesh(2, 1)
    config = tiny.TinyConfig(vocab_size=VOCAB, num_classes=4, width=32, num_layers=1,
                             num_heads=4, num_kv_heads=2, ffn_dim=64)
    target = tiny.TinyTransformer(config)
    draft = tiny.TinyTransformer(tiny.TinyConfig(vocab_size=VOCAB, num_classes=4, width=16,
                                                 num_layers=1, num_heads=2, num_kv_heads=2,
                                                 ffn_dim=32))
    target_params = target.init_params(jax.random.key(0))
    draft_params = draft.init_params(jax.random.key(1))
    cond = tiny.cfg_class_rows(jnp.arange(4), 4)  # 4 images -> 8 rows
    tree = verify.StaticTree.from_paths(((0,), (1,), (0, 0)))
    report = {}
    for name, mode, sampling in (
        ('vanilla_topk', decode.Vanilla(), logits.Sampling(cfg_scale=2.0, top_k=8)),
        ('chain_topk_topp', decode.ChainDraft(2, 'model'),
         logits.Sampling(cfg_scale=2.0, top_k=8, top_p=0.9)),
        ('tree_approx', decode.TreeDraft(tree, 'model'),
         logits.Sampling(cfg_scale=2.0, top_k=8, topk_method='approx')),
        ('scd_topk', decode.Jacobi(3, coupling='maximal'), logits.Sampling(cfg_scale=2.0, top_k=8)),
        ('sjd_pac_topk', decode.JacobiPAC(3, 2, 1), logits.Sampling(cfg_scale=2.0, top_k=8)),
        ('eagle2_sampled', decode.DynamicTreeDraft(6, 2, 2, 'model', 'sampled'),
         logits.Sampling(cfg_scale=2.0, top_k=8)),
        ('eagle2_top_k', decode.DynamicTreeDraft(6, 2, 2, 'model', 'top_k'),
         logits.Sampling(cfg_scale=2.0)),
        ('gsd_chain', decode.ChainDraft(2, 'model'), logits.Sampling(cfg_scale=2.0)),
        ('gsd_jacobi', decode.Jacobi(3), logits.Sampling(cfg_scale=2.0)),
    ):
      verified = not isinstance(mode, decode.Vanilla)
      # Jacobi drafts itself
      drafter = isinstance(mode, (decode.ChainDraft, decode.TreeDraft, decode.DynamicTreeDraft))
      rule = rules.Grouped(below=2, above=2) if name.startswith('gsd') else rules.Lossless()
      _, compiled, _ = decode._prepare(
          target, target_params, cond, 8, jax.random.key(0), mode, sampling,
          rule if verified else None, draft if drafter else None,
          draft_params if drafter else None, None, None, mesh, sharding.LLAMA_RULES,
          sharding.LLAMA_RULES, tuple(sorted(decode.FAST_COMPILE.items())))
      report[name] = moved_logits(compiled)
    # One image (2 rows) on data=2: its rows stay together (replicated), not split.
    _, compiled, _ = decode._prepare(
        target, target_params, tiny.cfg_class_rows(jnp.arange(1), 4), 8, jax.random.key(0),
        decode.Vanilla(), logits.Sampling(cfg_scale=2.0), None, None, None, None, None, mesh,
        sharding.LLAMA_RULES, sharding.LLAMA_RULES, tuple(sorted(decode.FAST_COMPILE.items())))
    report['vanilla_one_image'] = moved_logits(compiled)
    cache = target.init_cache(2, 8)
    report['one_image_cache_spec'] = str(sharding.cache_shardings(cache, mesh, 2).keys[0].spec)
    report['one_image_rows_spec'] = str(sharding.cache_shardings(cache, mesh, 1).keys[0].spec)

    # Toy computations: row logits [8, 3, V] split over 'data', image probabilities
    # [4, 3, V] pinned to 'data'.
    rows = jax.ShapeDtypeStruct((8, 3, VOCAB), jnp.float32,
                                sharding=NamedSharding(mesh, P('data')))
    sampling = logits.Sampling(cfg_scale=2.0)
    pin = lambda x: jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P('data')))

    def halves(x):  # the layout before: rows [cond; uncond]
      return pin(sampling.probs(x[:4], x[4:]))

    def interleaved(x):
      return pin(drafting.guided_probs(sampling, x, None, True))

    def lax_top_k(x):
      return pin(jnp.where(x < jax.lax.top_k(x, 8)[0][..., -1:], -jnp.inf, x))

    def sort_top_k(x):
      return pin(logits.top_k_mask(x, 8))

    for name, fn in (('toy_halves', halves), ('toy_interleaved', interleaved),
                     ('toy_lax_top_k', lax_top_k), ('toy_sort_top_k', sort_top_k)):
      report[name] = moved_logits(jax.jit(fn).lower(rows).compile())
    print('REPORT', json.dumps(report))
""")


_VOCAB_SHARDED_SCRIPT = textwrap.dedent("""
    import json, os, re
    os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=4'
    import jax, jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    from specdec_jax import decode, logits, sharding
    from specdec_jax.models import tiny

    VOCAB, MODEL = 160, 4  # V and V / 4 = 40: sizes no other dimension has
    COLLECTIVE = re.compile(r'(all-gather|all-to-all|collective-permute|all-reduce|'
                            r'reduce-scatter)(-start)?\\(')
    SHAPE = re.compile(r'\\[([0-9,]*)\\]')

    def vocab_collectives(compiled):
      # Collectives whose result has a dimension of V or V / model.
      moved = []
      for line in compiled.as_text().splitlines():
        match = COLLECTIVE.search(line)
        if match:
          result = line[:match.start()]
          sizes = {int(d) for m in SHAPE.finditer(result) for d in m.group(1).split(',') if d}
          if sizes & {VOCAB, VOCAB // MODEL}:
            moved.append(line.strip()[:160])
      return moved

    mesh = sharding.make_mesh(1, MODEL)
    vocab_sharded = NamedSharding(mesh, P(None, None, 'model'))
    rows = jax.device_put(jnp.zeros((8, 3, VOCAB)), vocab_sharded)
    report = {}
    for name, sampling in (
        ('blocked_top_k', logits.Sampling(top_k=8, topk_blocks=MODEL)),
        ('blocked_top_k_top_p', logits.Sampling(top_k=8, top_p=0.9, topk_blocks=MODEL)),
        ('single_top_k', logits.Sampling(top_k=8)),
        ('single_top_k_top_p', logits.Sampling(top_k=8, top_p=0.9)),
    ):
      probs = jax.jit(sampling.probs, out_shardings=vocab_sharded)
      report[name] = vocab_collectives(probs.lower(rows).compile())
    # Negative control: a sort-based top-k over the sharded V axis gathers rows.
    lax_top_k = jax.jit(lambda x: jax.lax.top_k(x, 8)[0])
    report['lax_top_k'] = vocab_collectives(lax_top_k.lower(rows).compile())
    target = tiny.TinyTransformer(tiny.TinyConfig(vocab_size=VOCAB, num_classes=4, width=32,
                                                  num_layers=1, num_heads=4, num_kv_heads=2,
                                                  ffn_dim=64))
    blocks = lambda sampling, mesh: decode.vocab_parallel_sampling(
        sampling, target, mesh).topk_blocks
    report['auto_blocks'] = [
        blocks(logits.Sampling(top_k=8), mesh),
        blocks(logits.Sampling(top_k=8, topk_blocks=2), mesh),
        blocks(logits.Sampling(top_k=8), None),
        blocks(logits.Sampling(top_k=8), sharding.make_mesh(1, 3))]
    print('REPORT', json.dumps(report))
""")


class RowLayoutTest(absltest.TestCase):

  def test_rows_interleave_and_split_back(self):
    cond = jnp.array([10, 11, 12, 20, 21, 22])  # [cond; uncond] halves, B = 3
    rows = drafting.cfg_rows({'ids': cond}, True)['ids']
    np.testing.assert_array_equal(rows, [10, 20, 11, 21, 12, 22])
    np.testing.assert_array_equal(drafting.as_rows(jnp.array([1, 2, 3]), True),
                                  [1, 1, 2, 2, 3, 3])
    np.testing.assert_array_equal(drafting.image_rows(rows, True), [10, 11, 12])
    np.testing.assert_array_equal(drafting.cfg_rows(cond, False), cond)

  def test_guided_probs_pairs_each_images_rows(self):
    row_logits = jax.random.normal(jax.random.key(0), (6, 2, 9))
    sampling = logits.Sampling(cfg_scale=3.0)
    got = drafting.guided_probs(sampling, row_logits, jnp.zeros((3, 2), jnp.int32), True)
    expected = sampling.probs(row_logits[0::2], row_logits[1::2])
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


class NoLogitsCollectiveTest(absltest.TestCase):

  def test_sharded_decode_moves_no_logits(self):
    """Mesh data=2 x model=1 over 4 simulated CPU devices."""
    result = fresh_process.run_cpu_script(_SCRIPT, timeout=900)
    self.assertEqual(result.returncode, 0, result.stderr[-4000:])
    report = json.loads(result.stdout.split('REPORT', 1)[1])
    for name in ('vanilla_topk', 'chain_topk_topp', 'tree_approx', 'scd_topk', 'sjd_pac_topk',
                 'eagle2_sampled', 'eagle2_top_k', 'gsd_chain', 'gsd_jacobi', 'vanilla_one_image', 'toy_interleaved', 'toy_sort_top_k'):
      self.assertEqual(report[name], [], name)
    # Rows are split over 'data' in whole images only.
    self.assertEqual(report['one_image_cache_spec'], "P(None, 'model', None, None)")
    self.assertEqual(report['one_image_rows_spec'], "P('data', 'model', None, None)")
    # Negative controls: the same check does see logits move.
    self.assertNotEmpty(report['toy_halves'])
    self.assertNotEmpty(report['toy_lax_top_k'])


class VocabShardedTopKTest(absltest.TestCase):

  def test_blocked_top_k_moves_no_vocabulary_row(self):
    """Mesh data=1 x model=4 over 4 simulated CPU devices, logits split over V."""
    result = fresh_process.run_cpu_script(_VOCAB_SHARDED_SCRIPT, timeout=600)
    self.assertEqual(result.returncode, 0, result.stderr[-4000:])
    report = json.loads(result.stdout.split('REPORT', 1)[1])
    self.assertEqual(report['blocked_top_k'], [])
    self.assertEqual(report['blocked_top_k_top_p'], [])
    # One block finds the k-th value by bisection (topk.kth_largest): only
    # scalar reductions cross the shards, no vocabulary row.
    self.assertEqual(report['single_top_k'], [])
    # Negative control: a sort of the sharded V axis moves vocabulary rows.
    self.assertNotEmpty(report['lax_top_k'])
    # generate's default: the 'model' size when it divides V (160 % 3 != 0).
    self.assertEqual(report['auto_blocks'], [4, 2, 1, 1])


if __name__ == '__main__':
  absltest.main()
