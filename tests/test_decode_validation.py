"""generate()'s boundary: every bad argument is named before anything is compiled.

One test per case of a probe of the public API that once passed silently or
failed late (raw tracer errors, `KeyError`, `IndexError`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized

from specdec_jax import decode
from specdec_jax import logits
from specdec_jax import rules
from specdec_jax.models import llamagen
from tests.decode_support import CLASSES
from tests.decode_support import DRAFT
from tests.decode_support import EAGLE
from tests.decode_support import FAST
from tests.decode_support import NUM_TOKENS
from tests.decode_support import TARGET
from tests.decode_support import _params


def _must_not_run(*args, **kwargs):
  raise AssertionError('the decode was traced despite invalid input')


class BoundaryTest(parameterized.TestCase):
  """Each case fails with a ValueError naming the argument, and nothing is traced."""

  def setUp(self):
    super().setUp()
    self._original = decode._decode
    decode._decode = _must_not_run
    decode.clear_compile_cache()

  def tearDown(self):
    decode._decode = self._original
    decode.clear_compile_cache()
    super().tearDown()

  def _generate(self, target=TARGET, target_params=None, **overrides):
    default_target_params, draft_params, _ = _params()
    kwargs = dict(num_tokens=NUM_TOKENS, key=jax.random.key(0),
                  mode=decode.ChainDraft(2, 'model'), rule=rules.Lossless(), draft=DRAFT,
                  draft_params=draft_params, compiler_options=FAST)
    kwargs.update(overrides)
    cond = kwargs.pop('cond', jnp.zeros((2,), jnp.int32))
    params = default_target_params if target_params is None else target_params
    return decode.generate(target, params, cond, **kwargs)

  @parameterized.named_parameters(
      ('class_id_too_large', [0, 99]), ('class_id_negative', [-1, 0]),
      ('past_the_null_class', [0, CLASSES + 1]))
  def test_class_ids_out_of_range(self, ids):
    with self.assertRaisesRegex(ValueError, r'generate: cond: class ids must be in \[0, 3\)'):
      self._generate(cond=jnp.asarray(ids, jnp.int32))

  @parameterized.named_parameters(('one_past_the_grid', 197), ('far_past_the_grid', 1000))
  def test_num_tokens_past_the_model_grid(self, num_tokens):
    """A 196-token (14 x 14) LlamaGen: 197 or 1000 tokens are refused, not clamped."""
    model = llamagen.LlamaGenGPT(llamagen.GPTConfig(
        n_layer=1, n_head=2, dim=16, vocab_size=32, num_classes=4, block_size=196))
    params = jax.eval_shape(model.init_params, jax.random.key(0))
    with self.assertRaisesRegex(ValueError, rf'num_tokens={num_tokens} exceeds the 196 image '
                                            'tokens the target LlamaGenGPT has'):
      self._generate(target=model, target_params=params, num_tokens=num_tokens,
                     mode=decode.Vanilla(), draft=None, draft_params=None)

  def test_num_tokens_past_the_draft_model_grid(self):
    """The draft model's grid is checked too: a 196-token draft under a 256-token target."""
    def model(block_size):
      gpt = llamagen.LlamaGenGPT(llamagen.GPTConfig(
          n_layer=1, n_head=2, dim=16, vocab_size=32, num_classes=4, block_size=block_size))
      return gpt, jax.eval_shape(gpt.init_params, jax.random.key(0))
    (target, target_params), (draft, draft_params) = model(256), model(196)
    with self.assertRaisesRegex(ValueError, 'num_tokens=197 exceeds the 196 image tokens the '
                                            'draft model LlamaGenGPT has'):
      self._generate(target=target, target_params=target_params, draft=draft,
                     draft_params=draft_params, num_tokens=197)

  @parameterized.named_parameters(('string', '4'), ('float', 2.5), ('bool', True))
  def test_num_tokens_of_the_wrong_type(self, num_tokens):
    with self.assertRaisesRegex(ValueError, r'num_tokens must be an int >= 1 \(image tokens '
                                            rf'per image\), got {num_tokens!r}'):
      self._generate(num_tokens=num_tokens)

  def test_float_chain_length(self):
    with self.assertRaisesRegex(ValueError, r'ChainDraft.k must be an int, got 2.0'):
      self._generate(mode=decode.ChainDraft(2.0, 'model'))

  @parameterized.named_parameters(('zero', 0), ('num_tokens', NUM_TOKENS))
  def test_chain_length_at_the_bounds(self, k):
    """k drafts need k + 1 <= num_tokens image tokens: k = num_tokens and k = 0 are refused."""
    with self.assertRaisesRegex(ValueError, rf'ChainDraft.k must be in \[1, num_tokens='
                                            rf'{NUM_TOKENS}\), got {k}'):
      self._generate(mode=decode.ChainDraft(k, 'model'))

  @parameterized.named_parameters(
      ('python_int', 0), ('int_array', jnp.zeros((2,), jnp.int32)),
      ('wrong_batch_of_keys', jax.random.split(jax.random.key(0), 3)))
  def test_bad_key(self, key):
    with self.assertRaisesRegex(ValueError, r'generate: key must be jax.random.key\(seed\)'):
      self._generate(key=key)

  @parameterized.named_parameters(('string', 'lossless'), ('class', rules.Lossless))
  def test_rule_that_is_not_a_rule(self, rule):
    with self.assertRaisesRegex(ValueError, 'rule must be an acceptance rule'):
      self._generate(rule=rule)

  def test_eagle_head_where_a_draft_model_is_expected(self):
    _, _, eagle_params = _params()
    with self.assertRaisesRegex(ValueError, "drafter='model' needs a DecodeModel draft.*"
                                            "got ToyEagle; for an EAGLE-style head use"):
      self._generate(draft=EAGLE, draft_params=eagle_params)

  def test_draft_model_where_an_eagle_head_is_expected(self):
    with self.assertRaisesRegex(ValueError, "drafter='eagle' needs an EAGLE-style head.*"
                                            'got MarkovToy'):
      self._generate(mode=decode.ChainDraft(2, 'eagle'))

  def test_unknown_drafter(self):
    with self.assertRaisesRegex(ValueError, "drafter must be 'eagle' or 'model', got 'x'"):
      self._generate(mode=decode.ChainDraft(2, 'x'))

  def test_eagle_head_of_another_width(self):
    """An EAGLE head consumes the target's hidden states: a wider one is refused too."""

    class WideEagle(type(EAGLE)):

      @property
      def hidden_size(self):
        return 2 * super().hidden_size

    _, _, eagle_params = _params()
    with self.assertRaisesRegex(ValueError, f'EAGLE drafter hidden_size {2 * EAGLE.hidden_size}'
                                            f' != target hidden_size {TARGET.hidden_size}'):
      self._generate(mode=decode.ChainDraft(2, 'eagle'), draft=WideEagle(EAGLE.vocab, CLASSES),
                     draft_params=eagle_params)

  def test_mesh_without_a_model_axis(self):
    mesh = jax.make_mesh((1,), ('data',))
    with self.assertRaisesRegex(ValueError, r"mesh axes \('data',\) lack \['model'\]"):
      self._generate(mesh=mesh)

  def test_mesh_with_explicit_axes(self):
    """jax.make_mesh's default axis types are Explicit, which failed deep in the first
    sharding constraint ('can only refer to Auto axes ... reshard API?')."""
    mesh = jax.make_mesh((1, 1), ('data', 'model'),
                         axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    with self.assertRaisesRegex(ValueError, r"mesh axes \{'data': 'Explicit', 'model': "
                                r"'Explicit'\} must be AxisType.Auto.*sharding.make_mesh"):
      self._generate(mesh=mesh)

  def test_mesh_of_the_wrong_type_and_bad_partition_rules(self):
    with self.assertRaisesRegex(ValueError, 'mesh must be a jax.sharding.Mesh'):
      self._generate(mesh='data')
    from specdec_jax import sharding  # pylint: disable=g-import-not-at-top
    mesh = sharding.make_mesh(1, 1)
    with self.assertRaisesRegex(ValueError, 'target_rules must be'):
      self._generate(mesh=mesh, target_rules=[('.*', 'model')])
    with self.assertRaisesRegex(ValueError, 'draft_rules must be'):
      self._generate(mesh=mesh, draft_rules=[('.*', jax.sharding.PartitionSpec('tensor'))])

  def test_grouped_embeddings_with_the_wrong_row_count(self):
    embeddings = jnp.zeros((TARGET.vocab_size + 1, 3))
    with self.assertRaisesRegex(ValueError, 'Grouped: embeddings has 5 rows but the '
                                            'vocabulary has V=4'):
      self._generate(rule=rules.Grouped(embeddings=embeddings))

  @parameterized.named_parameters(('fewer_rows', 1), ('more_rows', 4))
  def test_draft_cond_rows_must_match_cond(self, rows):
    """The drafter's conditioning holds one row per cache row of the target's."""
    with self.assertRaisesRegex(ValueError, rf'generate: draft_cond has {rows} rows, cond '
                                'has 2; they must match'):
      self._generate(draft_cond=jnp.zeros((rows,), jnp.int32))

  @parameterized.named_parameters(
      ('scalar', jnp.int32(0), r'cond must be an array \(or pytree of arrays\) with a '
       'leading row axis'),
      ('ragged_pytree', {'a': jnp.zeros((2,), jnp.int32), 'b': jnp.zeros((3,), jnp.int32)},
       r'every array of cond needs the same leading row count, got \[2, 3\]'))
  def test_cond_without_one_row_count(self, cond, message):
    with self.assertRaisesRegex(ValueError, 'generate: ' + message):
      self._generate(cond=cond)

  def test_draft_cond_is_what_the_draft_model_is_checked_with(self):
    """A valid cond does not stand in for a draft_cond the draft model refuses."""
    with self.assertRaisesRegex(ValueError, r'MarkovToy.prefill: cond must be integer class '
                                r'ids of shape \[B\].*got shape \(2,\) dtype float32'):
      self._generate(draft_cond=jnp.zeros((2,), jnp.float32))

  def test_other_arguments_of_the_wrong_type(self):
    with self.assertRaisesRegex(ValueError, "capacity must be an int.*got '9'"):
      self._generate(capacity='9')
    with self.assertRaisesRegex(ValueError, 'compiler_options must be a dict'):
      self._generate(compiler_options=['xla_cpu_fast'])
    with self.assertRaisesRegex(ValueError, 'sampling must be a specdec_jax.logits.Sampling'):
      self._generate(sampling={'top_k': 2})


class RepeatedCallValuesTest(absltest.TestCase):

  def test_class_ids_are_checked_on_a_repeated_call(self):
    """The compiled program is keyed on shapes: a second call with the same shapes but
    out-of-range class ids is still refused (the first check used to run only while
    tracing, where ids are tracers)."""
    target_params, _, _ = _params()
    run = lambda ids: decode.generate(TARGET, target_params, jnp.asarray(ids, jnp.int32),
                                      num_tokens=NUM_TOKENS, key=jax.random.key(0),
                                      compiler_options=FAST)
    first = run([0, 1])
    self.assertGreater(first.compile_seconds, 0.0)
    self.assertEqual(run([1, 0]).compile_seconds, 0.0)  # reused
    for ids in ([0, 99], [-1, 0]):
      with self.assertRaisesRegex(ValueError, 'class ids must be in'):
        run(ids)


class SamplingAndRuleBoundaryTest(parameterized.TestCase):
  """Hyperparameters that used to be accepted (CFG off, NaN laws) are refused."""

  @parameterized.named_parameters(
      ('cfg_scale_inf', dict(cfg_scale=np.inf), 'cfg_scale'),
      ('cfg_scale_nan', dict(cfg_scale=np.nan), 'cfg_scale'),
      ('cfg_scale_negative', dict(cfg_scale=-2.0), 'cfg_scale'),
      ('temperature_inf', dict(temperature=np.inf), 'temperature'),
      ('top_k_float', dict(top_k=2.5), 'top_k must be an int'),
  )
  def test_sampling(self, kwargs, message):
    with self.assertRaisesRegex(ValueError, f'Sampling.{message}'):
      logits.Sampling(**kwargs)

  @parameterized.named_parameters(
      ('coolsd_mu_nan', lambda: rules.CoolSD(mu=np.nan), 'CoolSD: mu'),
      ('coolsd_array_delta', lambda: rules.CoolSD(delta=jnp.array([1.0, 2.0])),
       'CoolSD: delta must be one number'),
      ('uniform_array_omega', lambda: rules.UniformRelaxed(omega=np.ones(3)),
       'UniformRelaxed: omega must be one number'),
      ('coolsd_delta_none', lambda: rules.CoolSD(delta=None), 'CoolSD: delta must be a number'),
      ('uniform_omega_none', lambda: rules.UniformRelaxed(omega=None),
       'UniformRelaxed: omega must be a number'),
      ('coolsd_window_str', lambda: rules.CoolSD(window='3'), 'CoolSD: window must be an int'),
      ('lantern_pp_float_k', lambda: rules.LanternPP(np.zeros((4, 2), np.int32), k=2.0),
       r'LanternPP: k \(neighbours per token\) must be an int'),
      ('lantern_pp_bool_k', lambda: rules.LanternPP(np.zeros((4, 2), np.int32), k=True),
       'LanternPP: k .* must be an int'),
      ('lantern_pp_list_table', lambda: rules.LanternPP([[1, 2], [0, 2]], k=1),
       'LanternPP: neighbors must be an int array'),
      ('content_aware_flag', lambda: rules.ContentAware(relax_point_masses='no'),
       'ContentAware: relax_point_masses must be True or False'),
      ('grouped_flag', lambda: rules.Grouped(keep_target_support=1),
       'Grouped: keep_target_support must be True or False'),
  )
  def test_rule_hyperparameters(self, build, message):
    with self.assertRaisesRegex(ValueError, message):
      build()


if __name__ == '__main__':
  absltest.main()
