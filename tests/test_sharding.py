"""Tests of specdec_jax.sharding: partition rules, and sharded decode == single-device decode."""

from __future__ import annotations

import textwrap
import types

import jax
from absl.testing import absltest
from absl.testing import parameterized
from jax.sharding import PartitionSpec as P

from specdec_jax import checks
from specdec_jax import kv_cache as kv
from specdec_jax import sharding
from specdec_jax.models import janus
from specdec_jax.models import layers
from specdec_jax.models import tiny
from tests import fresh_process

# Run in fresh interpreters: the device count is fixed when JAX starts. Each part starts
# from _PROLOGUE (the models, an 8-device mesh) and compiles its programs twice, on one
# device and on the mesh; the parts run as separate tests so pytest-xdist spreads them.
_PROLOGUE = textwrap.dedent("""
    import os
    os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=8'
    import jax, jax.numpy as jnp, numpy as np
    from specdec_jax import decode, logits, rules, sharding
    from specdec_jax.models import tiny

    config = tiny.TinyConfig(vocab_size=32, width=32, num_layers=1, num_heads=4,
                             num_kv_heads=4, ffn_dim=64)
    target = tiny.TinyTransformer(config)
    draft = tiny.TinyTransformer(tiny.TinyConfig(vocab_size=32, width=16, num_layers=1,
                                                 num_heads=2, num_kv_heads=2, ffn_dim=32))
    target_params = target.init_params(jax.random.key(0))
    draft_params = draft.init_params(jax.random.key(1))
    sampling = logits.Sampling(cfg_scale=2.0, top_k=8)
    cond = tiny.cfg_class_rows(jnp.arange(4) % 4, 4)  # 4 images -> 8 rows
    kwargs = dict(num_tokens=8, key=jax.random.key(5), mode=decode.ChainDraft(2, 'model'),
                  sampling=sampling, rule=rules.Lossless(), draft=draft,
                  draft_params=draft_params, compiler_options=decode.FAST_COMPILE)
    assert jax.device_count() == 8
    mesh = sharding.make_mesh(2, 4)

    def assert_sharded_equal(mode, rule):
      one, many = (decode.generate(target, target_params, cond,
                                   **dict(kwargs, mode=mode, rule=rule), **where)
                   for where in ({}, dict(mesh=mesh)))
      np.testing.assert_array_equal(np.asarray(one.tokens), np.asarray(many.tokens),
                                    err_msg=f'{mode} {rule}: tokens')
      np.testing.assert_array_equal(np.asarray(one.metrics.accepted_tokens),
                                    np.asarray(many.metrics.accepted_tokens),
                                    err_msg=f'{mode} {rule}: accepted_tokens')
""")

_SHARDED_PARTS = {
    'chain_rules_and_devices': """
        single = decode.generate(target, target_params, cond, **kwargs)
        sharded = decode.generate(target, target_params, cond, mesh=mesh, **kwargs)
        placed = sharding.shard_params(target_params, mesh)
        q_kernel = placed['layers_0']['self_attn']['q_proj']['kernel']
        assert q_kernel.sharding.spec == jax.sharding.PartitionSpec(None, 'model'), (
            q_kernel.sharding)
        assert len(q_kernel.addressable_shards) == 8
        np.testing.assert_array_equal(np.asarray(single.tokens), np.asarray(sharded.tokens))
        np.testing.assert_array_equal(np.asarray(single.metrics.accepted_tokens),
                                      np.asarray(sharded.metrics.accepted_tokens))
        print('accepted', np.asarray(sharded.metrics.accepted_tokens).tolist())
        # Other partition rules, same shapes: a new program (the rules are in the cache
        # key), not the old one called with parameters it was not compiled for.
        replicated = ((r'.*', jax.sharding.PartitionSpec()),)
        other = decode.generate(target, target_params, cond, mesh=mesh, target_rules=replicated,
                                **kwargs)
        assert other.compile_seconds > 0, 'reused the program of other partition rules'
        np.testing.assert_array_equal(np.asarray(single.tokens), np.asarray(other.tokens))
        again = decode.generate(target, target_params, cond, mesh=mesh, **kwargs)
        assert again.compile_seconds == 0, 'the first rules lost their program'
        # Rules from a generator are read once into a tuple: the same rules, the same program.
        from_generator = decode.generate(target, target_params, cond, mesh=mesh,
                                         target_rules=(r for r in sharding.LLAMA_RULES), **kwargs)
        assert from_generator.compile_seconds == 0, 'validation used up the generator of rules'
        # GSD (a lax.top_k inside the rule) and COOL-SD on chains, verified per 'data' shard.
        assert_sharded_equal(decode.ChainDraft(2, 'model'),
                             rules.Grouped(below=2, above=2, prob_threshold=0.5))
        assert_sharded_equal(decode.ChainDraft(2, 'model'), rules.CoolSD(delta=2.0))
        # Without a mesh, target and draft on different devices: a clear error, not XLA's.
        device_0, device_1 = jax.devices()[:2]
        try:
          decode.generate(target, jax.device_put(target_params, device_0), cond,
                          **dict(kwargs, draft_params=jax.device_put(draft_params, device_1)))
        except ValueError as e:
          assert 'target_params on device ids [0]; draft_params on device ids [1]' in str(e), e
        else:
          raise AssertionError('generate ran with target and draft on different devices')
    """,
    # The 2026 modes and the rules verified per 'data' shard (sharding.vmap_per_image):
    # SCD's two couplings, SJD-PAC, GSD (a lax.top_k inside the rule) on Jacobi drafts.
    'scd_sjd_pac_and_gsd_on_jacobi': """
        for mode, rule in ((decode.Jacobi(4, coupling='maximal'), rules.Lossless()),
                           (decode.Jacobi(4, coupling='gumbel'), rules.Lossless()),
                           (decode.JacobiPAC(4, 3, 2, init='spatial'), rules.Lossless()),
                           (decode.Jacobi(4), rules.Grouped(below=2, above=2, prob_threshold=0.5))):
          assert_sharded_equal(mode, rule)
    """,
    # EAGLE-2: a different tree per image.
    'eagle2': """
        for drafts in ('sampled', 'top_k'):
          assert_sharded_equal(decode.DynamicTreeDraft(7, 2, 3, 'model', drafts=drafts),
                               rules.Lossless())
    """,
    # Janus-Pro's generation path: its image head column-parallel and its image
    # embedding vocabulary-parallel, as the LM heads and embeddings of the others.
    'janus': """
        from specdec_jax.models import janus
        janus_model = janus.JanusModel(janus.JanusConfig(
            text_vocab_size=64, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=4,
            head_dim=8, intermediate_size=48, image_vocab_size=40, gen_head_dim=24))
        janus_params = janus_model.init_params(jax.random.key(2))
        placed = sharding.shard_params(janus_params, mesh)
        assert placed['gen_head']['vision_head']['kernel'].sharding.spec == (
            jax.sharding.PartitionSpec(None, 'model'))
        assert placed['gen_embed']['embedding'].sharding.spec == (
            jax.sharding.PartitionSpec('model', None))
        prompt = janus.build_prompt([[0, 11, 12, 9], [0, 21, 9]] * 2, pad_id=5, cfg=True)
        janus_kwargs = dict(num_tokens=6, key=jax.random.key(3), mode=decode.Jacobi(3),
                            rule=rules.Lossless(), sampling=logits.Sampling(cfg_scale=3.0),
                            compiler_options=decode.FAST_COMPILE)
        one, many = (decode.generate(janus_model, janus_params, prompt, **janus_kwargs, **where)
                     for where in ({}, dict(mesh=mesh)))
        np.testing.assert_array_equal(np.asarray(one.tokens), np.asarray(many.tokens),
                                      err_msg='janus: tokens')
    """,
}


class PartitionRulesTest(absltest.TestCase):

  def test_llama_rules(self):
    params = tiny.TinyTransformer().init_params(jax.random.key(0))
    specs = sharding.param_specs(params)
    layer = specs['layers_0']
    self.assertEqual(layer['self_attn']['q_proj']['kernel'], P(None, 'model'))
    self.assertEqual(layer['self_attn']['o_proj']['kernel'], P('model', None))
    self.assertEqual(layer['mlp']['down']['kernel'], P('model', None))
    self.assertEqual(layer['input_layernorm']['weight'], P())
    self.assertEqual(specs['lm_head']['kernel'], P(None, 'model'))
    # Vocabulary-parallel token embeddings (rows over 'model'; see docs/sharding.md).
    self.assertEqual(specs['embed_tokens']['embedding'], P('model', None))

  def test_janus_image_head_and_embedding_follow_the_llama_rules(self):
    janus_model = janus.JanusModel(janus.JanusConfig(
        text_vocab_size=64, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=4,
        head_dim=8, intermediate_size=48, image_vocab_size=40, gen_head_dim=24))
    specs = sharding.param_specs(janus_model.init_params(jax.random.key(0)))
    self.assertEqual(specs['gen_head']['vision_head']['kernel'], P(None, 'model'))
    self.assertEqual(specs['gen_embed']['embedding'], P('model', None))
    self.assertEqual(specs['embed_tokens']['embedding'], P('model', None))
    # The projector before the head stays replicated (a small square matrix).
    self.assertEqual(specs['gen_head']['output_mlp_projector']['kernel'], P())

  def test_stacked_layer_params_keep_the_per_layer_spec_on_trailing_dims(self):
    """A scanned model's [N, in, out] kernels: 'model' stays on the same dim as unscanned."""
    params = layers.stack_layer_params(tiny.TinyTransformer().init_params(jax.random.key(0)))
    specs = sharding.param_specs(params)
    self.assertEqual(specs['layers']['self_attn']['q_proj']['kernel'], P(None, None, 'model'))
    self.assertEqual(specs['layers']['mlp']['down']['kernel'], P(None, 'model', None))
    self.assertEqual(specs['layers']['input_layernorm']['weight'], P())
    self.assertEqual(specs['lm_head']['kernel'], P(None, 'model'))

  def test_fit_spec_replicates_dims_the_axis_does_not_divide(self):
    mesh = sharding.make_mesh(1, 1)
    self.assertEqual(sharding.fit_spec((3, 8), P('data', 'model'), mesh), P('data', 'model'))

  def test_fit_spec_splits_a_dim_over_a_tuple_of_axes_by_their_product(self):
    mesh = types.SimpleNamespace(shape={'data': 2, 'model': 4}, axis_names=('data', 'model'))
    spec = P(('data', 'model'), None)
    self.assertEqual(sharding.fit_spec((16, 3), spec, mesh), spec)
    self.assertEqual(sharding.fit_spec((12, 3), spec, mesh), P(None, None))  # 8 does not divide
    self.assertEqual(sharding.fit_spec((12, 6), P('data', 'model'), mesh), P('data', None))

  def test_fit_spec_names_an_axis_the_mesh_lacks(self):
    mesh = sharding.make_mesh(1, 1)
    with self.assertRaisesRegex(ValueError, r"axes \['tensor'\].*axes \('data', 'model'\)"):
      sharding.fit_spec((4, 4), P(None, 'tensor'), mesh)
    with self.assertRaisesRegex(ValueError, r"\['tensor'\]"):
      sharding.fit_spec((4, 4), P(('data', 'tensor'), None), mesh)

  def test_check_mesh_reads_generator_rules_once_into_a_tuple(self):
    mesh = sharding.make_mesh(1, 1)
    target_rules, draft_rules = checks.check_mesh(
        mesh, (rule for rule in sharding.LLAMA_RULES), sharding.LLAMA_RULES)
    self.assertEqual(target_rules, tuple(sharding.LLAMA_RULES))
    self.assertIs(draft_rules, sharding.LLAMA_RULES)
    self.assertEqual(checks.check_mesh(None, iter(()), None), ((), None))

  def test_make_mesh_rejects_too_many_devices(self):
    with self.assertRaisesRegex(ValueError, 'needs 64 devices'):
      sharding.make_mesh(8, 8)

  def test_cache_shardings_follow_rows_and_heads(self):
    mesh = sharding.make_mesh(1, 1)
    cache = tiny.TinyTransformer().init_cache(2, 8)
    shardings = sharding.cache_shardings(cache, mesh)
    self.assertEqual(shardings.keys[0].spec, P('data', 'model', None, None))
    self.assertEqual(shardings.lengths.spec, P('data'))
    stacked = sharding.cache_shardings(kv.stack_layers(cache), mesh)
    self.assertEqual(stacked.keys.spec, P(None, 'data', 'model', None, None))
    self.assertEqual(stacked.values.spec, P(None, 'data', 'model', None, None))


class ShardedDecodeTest(parameterized.TestCase):

  @parameterized.named_parameters((name, name) for name in _SHARDED_PARTS)
  def test_sharded_run_equals_single_device(self, part):
    """8 simulated CPU devices, mesh data=2 x model=4: the same tokens and acceptance
    counts as one device (chain: also with other partition rules on a repeated call)."""
    script = _PROLOGUE + textwrap.dedent(_SHARDED_PARTS[part]) + "print('SHARDED_EQUAL')\n"
    result = fresh_process.run_cpu_script(script, timeout=600)
    self.assertEqual(result.returncode, 0, result.stderr[-4000:])
    self.assertIn('SHARDED_EQUAL', result.stdout)


if __name__ == '__main__':
  absltest.main()
