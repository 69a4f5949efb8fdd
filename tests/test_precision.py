"""The dtype rule: float32 on CPU, bfloat16 on accelerators, explicit dtypes kept."""

from unittest import mock

from absl import flags
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp

from specdec_jax import precision
from specdec_jax.converters import lantern_drafter
from specdec_jax.converters import llamagen as llamagen_converter
from specdec_jax.models import chameleon
from specdec_jax.models import eagle
from specdec_jax.models import janus
from specdec_jax.models import llamagen


def on_backend(name):
  return mock.patch.object(jax, 'default_backend', return_value=name)


def tiny_configs():
  return {
      'llamagen': llamagen.GPTConfig(n_layer=1, n_head=2, dim=16, vocab_size=24, block_size=4,
                                     num_classes=3),
      'chameleon': chameleon.ChameleonConfig(vocab_size=24, hidden_size=16, num_layers=1,
                                             num_heads=2, num_kv_heads=2, head_dim=8,
                                             intermediate_size=24),
      'janus': janus.JanusConfig(text_vocab_size=24, hidden_size=16, num_layers=1,
                                 num_heads=2, num_kv_heads=2, head_dim=8,
                                 intermediate_size=24, image_vocab_size=20, gen_head_dim=12),
      'eagle': eagle.DrafterConfig(hidden_size=16, num_heads=2, intermediate_size=24,
                                   vocab_size=24, grid_size=2, cls_token_num=0),
  }


class ResolveDtypeTest(parameterized.TestCase):

  @parameterized.parameters(('cpu', jnp.float32), ('gpu', jnp.bfloat16), ('tpu', jnp.bfloat16))
  def test_auto_follows_the_backend(self, backend, want):
    with on_backend(backend):
      self.assertEqual(precision.resolve_dtype(None), jnp.dtype(want))
      self.assertEqual(precision.resolve_dtype('auto'), jnp.dtype(want))
      # An explicit dtype is kept on every backend.
      self.assertEqual(precision.resolve_dtype('float32'), jnp.dtype(jnp.float32))
      self.assertEqual(precision.resolve_dtype(jnp.bfloat16), jnp.dtype(jnp.bfloat16))

  def test_unknown_name_is_refused(self):
    with self.assertRaises(TypeError):
      precision.resolve_dtype('float33')

  @parameterized.parameters(('cpu', 'float32'), ('gpu', 'bfloat16'))
  def test_model_configs_resolve_when_built(self, backend, want):
    with on_backend(backend):
      configs = tiny_configs()
    for name, config in configs.items():
      self.assertEqual(jnp.dtype(config.dtype).name, want, name)
      if hasattr(config, 'param_dtype'):
        self.assertEqual(jnp.dtype(config.param_dtype).name, want, name)
    # Resolved at construction: later backend queries do not change them.
    with on_backend('cpu' if backend != 'cpu' else 'gpu'):
      self.assertEqual(jnp.dtype(configs['llamagen'].dtype).name, want)

  def test_explicit_dtype_wins_on_an_accelerator(self):
    with on_backend('tpu'):
      config = chameleon.ChameleonConfig(dtype='float32')
      gpt = llamagen.GPTConfig(dtype='float32')
    self.assertEqual(config.param_dtype, jnp.float32)  # param_dtype follows dtype
    self.assertEqual(gpt.dtype, 'float32')

  @parameterized.parameters('llamagen', 'chameleon', 'janus', 'eagle')
  def test_accelerator_default_gives_bf16_params_and_cache(self, name):
    with on_backend('gpu'):
      config = tiny_configs()[name]
    model = {'llamagen': llamagen.LlamaGenGPT, 'chameleon': chameleon.ChameleonModel,
             'janus': janus.JanusModel, 'eagle': eagle.EagleDrafter}[name](config)
    params = model.init_params(jax.random.PRNGKey(0))
    dtypes = {leaf.dtype for leaf in jax.tree_util.tree_leaves(params)}
    self.assertEqual(dtypes, {jnp.dtype(jnp.bfloat16)})
    cache = model.init_cache(2, 4)
    self.assertEqual(cache.keys[0].dtype, jnp.bfloat16)


class ConverterDefaultsTest(absltest.TestCase):

  def test_command_lines_keep_the_stored_dtype_by_default(self):
    """Conversions are lossless unless asked: --dtype defaults to 'stored' (the
    checkpoint's own dtype); bfloat16 is one flag away."""
    for module in (llamagen_converter, lantern_drafter):
      values = flags.FlagValues()
      module.define_flags(values)
      values(['prog'])
      self.assertEqual(values.dtype, 'stored', module.__name__)
      values(['prog', '--dtype=bfloat16'])
      self.assertEqual(values.dtype, 'bfloat16', module.__name__)


if __name__ == '__main__':
  absltest.main()
