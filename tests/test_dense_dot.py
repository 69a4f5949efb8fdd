"""Dense layers' dots on transposed kernels on CPU (`models.dense_dot.weight_dot`).

The transposed path must give `lax.dot_general`'s values, be taken exactly
where it is meant to (many rows, a large kernel, XLA:CPU), leave a decode
loop's body without the transpose (XLA hoists the copy), and leave the models'
parameters and greedy decodes as they are.
"""

import os
import re
import subprocess
import sys
import textwrap

from absl.testing import absltest
from absl.testing import parameterized
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decode
from specdec_jax import logits
from specdec_jax import rules
from specdec_jax.models import dense_dot
from specdec_jax.models import llamagen

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'bench'))
import tpu_compile_hlo as hlo  # pylint: disable=g-import-not-at-top,wrong-import-position

DENSE = (((1,), (0,)), ((), ()))
BIG = 512  # a [512, 512] float32 kernel is 1 MiB: TRANSPOSE_MIN_BYTES


def _compiled(fn, *args) -> str:
  return jax.jit(fn).lower(*args).compile().as_text()


def _transposed_dots(text: str) -> int:
  """Dots of a compiled [M, K] x kernel program that contract the kernel's minor dimension."""
  return text.count('lhs_contracting_dims={1}, rhs_contracting_dims={1}')


def _kernel_copies_in_loop(text: str, kernel_shapes) -> list[str]:
  """Transposes and copies of a kernel-shaped array (either orientation) in any
  computation the decode loop (`hlo.decode_loop`) runs, as 'opcode type' strings."""
  computations, entry = hlo.parse(text)
  loop = hlo.decode_loop(computations, entry)
  shapes = {f'f32[{a},{b}]' for a, b in kernel_shapes} | {f'f32[{b},{a}]' for a, b in kernel_shapes}
  found = []
  for name in hlo._reachable(computations, loop.called):  # pylint: disable=protected-access
    for instruction in computations[name]:
      if (instruction.opcode in ('transpose', 'copy')
          and instruction.result_type.split('{')[0] in shapes):
        found.append(f'{instruction.opcode} {instruction.result_type}')
  return found


def _computation(text: str, name: str) -> str:
  """The body of HLO computation `name` in a compiled module's text."""
  match = re.search(r'\n(?:ENTRY )?%' + re.escape(name) + r' [^\n]*\{\n(.*?)\n\}', text, re.S)
  assert match, name
  return match.group(1)


class WeightDotTest(parameterized.TestCase):

  @parameterized.parameters((8, BIG), (2, BIG), (8, 64), (1, BIG))
  def test_values_and_path(self, rows, width):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((rows, width)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((width, 256)), jnp.float32)
    got = jax.jit(lambda x, w: dense_dot.weight_dot(x, w, DENSE))(x, w)
    np.testing.assert_allclose(got, x @ w, rtol=1e-5, atol=1e-4)
    # Transposed only with >= TRANSPOSE_MIN_ROWS rows and a kernel of >= 1 MiB
    # ([512, 256] is 0.5 MiB: plain; [512, 512] below).
    square = jnp.asarray(rng.standard_normal((width, width)), jnp.float32)
    text = _compiled(lambda x, w: dense_dot.weight_dot(x, w, DENSE), x, square)
    taken = rows >= dense_dot.TRANSPOSE_MIN_ROWS and width >= BIG
    self.assertEqual(_transposed_dots(text), int(taken))

  def test_transposed_copy_is_hoisted_out_of_a_loop(self):
    x, w = jnp.ones((8, BIG)), jnp.ones((BIG, BIG))

    def loop(x, w):
      step = lambda _, x: jnp.tanh(dense_dot.weight_dot(x, w, DENSE))
      return jax.lax.fori_loop(0, 4, step, x)

    text = _compiled(loop, x, w)
    body = _computation(text, re.search(r'while\([^\n]*body=%([\w.\-]+)', text).group(1))
    # The body runs the transposed dot on a loop input, the copy [N, K] made once
    # before the loop; without hoisting the body would copy the kernel each step.
    self.assertIn('__ynn_fusion', body)
    self.assertNotIn('copy', body)
    self.assertNotIn('transpose', body)
    self.assertEqual(_transposed_dots(text), 1)
    self.assertIn('copy(', _computation(text, re.search(r'ENTRY %([\w.\-]+)', text).group(1)))

  def test_dense_layer_parameters_unchanged(self):
    x = jnp.ones((8, BIG))
    plain = nn.Dense(BIG, use_bias=True)
    transposed = nn.Dense(BIG, use_bias=True, dot_general=dense_dot.weight_dot)
    params = plain.init(jax.random.key(0), x)
    self.assertEqual(jax.tree.structure(params),
                     jax.tree.structure(transposed.init(jax.random.key(0), x)))
    np.testing.assert_allclose(transposed.apply(params, x), plain.apply(params, x),
                               rtol=1e-5, atol=1e-4)

  def test_other_contractions_are_plain(self):
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((8, BIG)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((BIG, BIG)), jnp.float32)
    other = (((1,), (1,)), ((), ()))  # x @ w.T: not a dense layer's dot
    np.testing.assert_allclose(jax.jit(lambda x, w: dense_dot.weight_dot(x, w, other))(x, w),
                               x @ w.T, rtol=1e-5, atol=1e-3)


class EnvironmentSwitchTest(absltest.TestCase):
  """SPECDEC_JAX_TRANSPOSED_KERNELS=0 keeps every kernel as stored (no second copy)."""

  # Prints the compiled program of 8 rows by a 1 MiB kernel.
  _PROGRAM = textwrap.dedent(f"""
      import jax, jax.numpy as jnp
      from specdec_jax.models import dense_dot
      print(jax.jit(lambda x, w: dense_dot.weight_dot(x, w, {DENSE!r})).lower(
          jnp.ones((8, {BIG})), jnp.ones(({BIG}, {BIG}))).compile().as_text())
  """)

  def _run(self, value):
    env = {k: v for k, v in os.environ.items() if k != dense_dot.ENVIRONMENT_VARIABLE}
    if value is not None:
      env[dense_dot.ENVIRONMENT_VARIABLE] = value
    env['JAX_PLATFORMS'] = 'cpu'
    return subprocess.run([sys.executable, '-c', self._PROGRAM], env=env, capture_output=True,
                          text=True, timeout=120, check=False)

  def test_the_variable_reaches_the_compiled_program(self):
    # 8 rows by a 1 MiB kernel: transposed unless switched off.
    for value, expected in ((None, 1), ('1', 1), ('0', 0)):
      result = self._run(value)
      self.assertEqual(result.returncode, 0, result.stderr)
      self.assertIn('ENTRY', result.stdout)
      self.assertEqual(_transposed_dots(result.stdout), expected, value)

  def test_a_bad_value_is_refused_at_import(self):
    result = self._run('no')
    self.assertNotEqual(result.returncode, 0)
    self.assertIn("SPECDEC_JAX_TRANSPOSED_KERNELS must be '1'", result.stderr)
    self.assertIn("got 'no'", result.stderr)
    for value in ('0', '1', None):
      dense_dot.enabled_by(value)  # accepted
    self.assertFalse(dense_dot.enabled_by('0'))


class LargeKernelModelTest(absltest.TestCase):
  """A LlamaGen whose kernels pass TRANSPOSE_MIN_BYTES: forwards and greedy decodes."""

  def setUp(self):
    super().setUp()
    config = llamagen.GPTConfig(n_layer=1, n_head=8, dim=BIG, vocab_size=BIG, num_classes=4,
                                block_size=16)
    self.model = llamagen.LlamaGenGPT(config)
    self.params = self.model.init_params(jax.random.key(0))

  def test_verify_forward_uses_transposed_kernels_with_the_same_logits(self):
    cond = self.model.cfg_cond(self.params, jnp.array([0, 3]))
    prefix = self.model.prefill(self.params, self.model.init_cache(4, 12), cond)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, BIG, (4, 6)), jnp.int32)
    args = (self.params, prefix.cache, tokens)

    def forward(p, c, t):
      return self.model.forward(p, c, t).logits

    transposed = _compiled(forward, *args)  # 24 rows, 1 MiB kernels
    got = jax.jit(forward)(*args)
    original = dense_dot.TRANSPOSE_MIN_BYTES
    dense_dot.TRANSPOSE_MIN_BYTES = 1 << 40  # the plain dots (fresh traces: new lambdas)
    try:
      plain = _compiled(lambda p, c, t: forward(p, c, t), *args)
      want = jax.jit(lambda p, c, t: forward(p, c, t))(*args)
    finally:
      dense_dot.TRANSPOSE_MIN_BYTES = original
    self.assertGreater(_transposed_dots(transposed), _transposed_dots(plain))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

  def test_no_kernel_is_copied_inside_the_decode_loop(self):
    # The copies [N, K] are made once, before the loop, for every mode and row count
    # the floor lets through (chain verify forwards of 5 tokens for 2 images: 20 rows
    # with CFG, 10 without). (With TRANSPOSE_MIN_ROWS = 1, one image without CFG,
    # XLA:CPU transposed this model's kernels back inside the loop, 16 transposes and
    # copies per step: why 1-row dots stay plain, docs/results.md.)
    kernels = {leaf.shape for leaf in jax.tree.leaves(self.params)
               if leaf.ndim == 2 and leaf.size * 4 >= dense_dot.TRANSPOSE_MIN_BYTES}
    self.assertGreaterEqual(len(kernels), 2)
    for cfg_scale in (1.0, 2.0):
      for mode in (decode.Vanilla(), decode.ChainDraft(4, 'model')):
        labels = jnp.array([0, 3])
        cond = self.model.cfg_cond(self.params, labels) if cfg_scale > 1 else labels
        decode.clear_compile_cache()
        kwargs = {} if isinstance(mode, decode.Vanilla) else dict(draft=self.model,
                                                                 draft_params=self.params)
        decode.generate(self.model, self.params, cond, num_tokens=10, key=jax.random.key(0),
                        mode=mode, sampling=logits.Sampling(cfg_scale=cfg_scale),
                        rule=rules.Lossless(), compiler_options=decode.FAST_COMPILE, **kwargs)
        text = list(decode._COMPILED.values())[-1].as_text()  # pylint: disable=protected-access
        self.assertEqual(_kernel_copies_in_loop(text, kernels), [], (cfg_scale, mode))
        if not isinstance(mode, decode.Vanilla):
          self.assertGreater(_transposed_dots(text), 0)  # the floor let them through

  def test_kernel_copies_in_the_loop_are_found(self):
    # Negative control of the check above: a kernel that changes every step is
    # transposed inside the loop.
    x, w = jnp.ones((8, BIG)), jnp.ones((BIG, BIG))

    def loop(x, w):
      def step(i, x):
        return jnp.tanh(dense_dot.weight_dot(x, w * i.astype(jnp.float32), DENSE))
      return jax.lax.fori_loop(0, 4, step, x)

    self.assertNotEqual(_kernel_copies_in_loop(_compiled(loop, x, w), {(BIG, BIG)}), [])

  def test_greedy_chain_equals_vanilla(self):
    # Vanilla's 2-row dots stay plain, the 8- and 12-row verify forwards run
    # transposed; with temperature 0 every lossless mode must emit vanilla's tokens.
    cond = self.model.cfg_cond(self.params, jnp.array([0, 1, 3]))
    run = lambda mode, **kwargs: np.asarray(decode.generate(
        self.model, self.params, cond, num_tokens=12, key=jax.random.key(4), mode=mode,
        sampling=logits.Sampling(cfg_scale=2.0, temperature=0.0), rule=rules.Lossless(),
        compiler_options=decode.FAST_COMPILE, **kwargs).tokens)
    expected = run(decode.Vanilla())
    np.testing.assert_array_equal(
        run(decode.ChainDraft(3, 'model'), draft=self.model, draft_params=self.params), expected)


if __name__ == '__main__':
  absltest.main()
