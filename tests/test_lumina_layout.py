"""Tests for models/lumina_layout.py: image-token layout and the window-aware processor."""

import functools
import warnings

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decode
from specdec_jax import logits as logits_lib
from specdec_jax.models import chameleon
from specdec_jax.models import lumina_layout as ll

VOCAB = 8832  # every Lumina layout id (<= 8803 + grid) is a valid logit index


@functools.partial(jax.jit, static_argnames=('layout', 'greedy'))
def _draw(key, positions, layout, greedy):
  """Samples through apply_layout from adversarial random logits [B, T, V].

  Layout, padding and text tokens get a large bonus, so the layout mask alone
  keeps them out of (or forces them into) the right places.
  """
  k_logits, k_sample = jax.random.split(key)
  logits = jax.random.normal(k_logits, positions.shape + (VOCAB,)) * 3
  logits = logits.at[..., jnp.array([0, 1, 8196, 8197, 8803, 8710])].add(40.0)
  processed = ll.apply_layout(logits, positions, layout)
  if greedy:
    return jnp.argmax(processed, axis=-1), ll.forced_tokens(positions, layout)
  return (jax.random.categorical(k_sample, processed, axis=-1),
          ll.forced_tokens(positions, layout))


class LayoutTest(parameterized.TestCase):

  def test_768_layout_matches_the_original_counts(self):
    layout = ll.ImageLayout(48, 48)
    self.assertEqual(layout.header_tokens(), (8197, 8828, 8828))
    # 1 start + 2 resolution + 48 rows of 49 + 1 end = 2356 tokens.
    self.assertEqual(3 + layout.body_length, 2356)
    self.assertEqual(ll.ImageLayout(32, 32).header_tokens()[1], 8820)
    # Height first, then width, as Lumina-mGPT's item processor (a square hides a swap).
    self.assertEqual(ll.ImageLayout(4, 6).header_tokens(), (8197, 8806, 8807))

  def test_odd_size_has_no_header(self):
    with self.assertRaisesRegex(ValueError, 'must be even'):
      ll.ImageLayout(3, 4).header_tokens()

  def test_body_round_trip_and_validity(self):
    layout = ll.ImageLayout(3, 4)
    codes = np.random.default_rng(0).integers(0, ll.NUM_IMAGE_CODES, (2, 3, 4))
    body = layout.body_tokens(codes)
    self.assertEqual(body.shape, (2, layout.body_length))
    np.testing.assert_array_equal(ll.strip_layout(body, layout), codes)
    self.assertTrue(ll.is_valid_body(body[0], layout))
    broken = body[0].copy()
    broken[4] = 100  # end-of-row slot of row 0 replaced by an image token
    self.assertFalse(ll.is_valid_body(broken, layout))
    for index, token in ((-1, ll.END_OF_TURN),  # no image end
                         (0, ll.FIRST_IMAGE_TOKEN + ll.NUM_IMAGE_CODES),  # one past the codes
                         (0, ll.FIRST_IMAGE_TOKEN - 1)):
      broken = body[0].copy()
      broken[index] = token
      self.assertFalse(ll.is_valid_body(broken, layout), (index, token))

  def test_forced_tokens_per_position(self):
    layout = ll.ImageLayout(2, 3)
    forced = np.asarray(ll.forced_tokens(jnp.arange(-1, 10), layout))
    # positions -1, 0..2 image, 3 EOL, 4..6 image, 7 EOL, 8 image end, 9 end of turn
    np.testing.assert_array_equal(
        forced, [-1, -1, -1, -1, 8803, -1, -1, -1, 8803, 8196, 8710])

  def test_mask_keeps_text_positions_and_image_range(self):
    layout = ll.ImageLayout(2, 3)
    logits = jax.random.normal(jax.random.key(0), (1, 3, VOCAB))
    out = ll.apply_layout(logits, jnp.array([[-2, 0, 3]]), layout)
    np.testing.assert_array_equal(out[0, 0], logits[0, 0])  # outside the image
    finite = np.isfinite(np.asarray(out[0, 1]))
    self.assertEqual(finite.sum(), ll.NUM_IMAGE_CODES)
    self.assertTrue(finite[4] and finite[8195] and not finite[3] and not finite[8196])
    self.assertEqual(np.nonzero(np.isfinite(np.asarray(out[0, 2])))[0].tolist(), [8803])

  def test_chameleon_declares_the_layout_image_tokens(self):
    """Jacobi random drafts use the model's image_token_range: exactly the ids the
    layout allows at an image position."""
    from specdec_jax import protocol  # pylint: disable=g-import-not-at-top
    from specdec_jax.models import chameleon  # pylint: disable=g-import-not-at-top
    model = chameleon.ChameleonModel(chameleon.ChameleonConfig(vocab_size=VOCAB))
    start, stop = protocol.image_token_range(model)
    self.assertEqual((start, stop), (4, 8196))
    allowed = np.asarray(ll.layout_mask(jnp.array(0), ll.ImageLayout(2, 3), VOCAB))
    np.testing.assert_array_equal(np.nonzero(allowed)[0], np.arange(start, stop))

  def test_mask_needs_layout_ids_in_vocab(self):
    with self.assertRaisesRegex(ValueError, 'vocab_size 100'):
      ll.layout_mask(jnp.zeros((1,), jnp.int32), ll.ImageLayout(2, 2), 100)

  @parameterized.parameters(True, False)
  def test_vanilla_decoding_gives_valid_layout(self, greedy):
    layout = ll.ImageLayout(3, 4)
    batch = 3
    key = jax.random.key(1)
    tokens = []
    for step in range(layout.body_length):
      key, subkey = jax.random.split(key)
      positions = jnp.full((batch, 1), step, jnp.int32)
      tokens.append(np.asarray(_draw(subkey, positions, layout, greedy)[0]))
    body = np.concatenate(tokens, axis=1)
    for row in body:
      self.assertTrue(ll.is_valid_body(row, layout), row)

  @parameterized.parameters((5, 1), (7, 2))
  def test_jacobi_windows_give_valid_layout(self, window, seed):
    """Window positions are per index: every draft in a window obeys the layout."""
    layout = ll.ImageLayout(3, 4)
    batch = 2
    rng = np.random.default_rng(seed)
    key = jax.random.key(seed)
    committed = [[] for _ in range(batch)]
    num_generated = np.zeros(batch, np.int32)
    while (num_generated < layout.body_length).any():
      key, subkey = jax.random.split(key)
      positions = ll.window_positions(jnp.asarray(num_generated), window)
      drafts, forced = map(np.asarray, _draw(subkey, positions, layout, False))
      in_image = (forced < 0) & (np.asarray(positions) < layout.body_length)
      np.testing.assert_array_equal(drafts[forced >= 0], forced[forced >= 0])
      self.assertTrue(((drafts[in_image] >= 4) & (drafts[in_image] < 8196)).all())
      for b in range(batch):  # accept a random prefix of the window per row
        accepted = int(rng.integers(1, window + 1))
        accepted = min(accepted, layout.body_length - int(num_generated[b]))
        committed[b].extend(drafts[b, :accepted].tolist())
        num_generated[b] += accepted
    for row in committed:
      self.assertTrue(ll.is_valid_body(np.array(row), layout), row)


class EngineLayoutTest(parameterized.TestCase):
  """The real engine on a tiny random Chameleon, with LuminaSampling."""

  @parameterized.named_parameters(
      ('vanilla', 'vanilla', 0),
      ('jacobi_window_3', 'jacobi', 3),
  )
  def test_generated_bodies_follow_the_layout(self, mode_name, window):
    from specdec_jax import decode, rules  # pylint: disable=g-import-not-at-top
    from specdec_jax.models import chameleon  # pylint: disable=g-import-not-at-top
    config = chameleon.ChameleonConfig(vocab_size=VOCAB, hidden_size=32, num_layers=1,
                                       num_heads=4, num_kv_heads=4, head_dim=8,
                                       intermediate_size=48)
    model = chameleon.ChameleonModel(config)
    params = model.init_params(jax.random.key(0))
    # Without the mask a random model would put end-of-row tokens in the right
    # places with probability ~ (1/8832)^2 per image.
    layout = ll.ImageLayout(2, 4)
    prompt = chameleon.build_prompt([[0, 9, 8710], [0, 10, 11, 8710]], layout)
    mode = decode.Vanilla() if mode_name == 'vanilla' else decode.Jacobi(window)
    run = lambda sampling_class: decode.generate(
        model, params, prompt, num_tokens=layout.body_length, key=jax.random.key(3),
        mode=mode, rule=None if mode_name == 'vanilla' else rules.Lossless(),
        sampling=sampling_class(layout=layout, cfg_scale=3.0, top_k=2000),
        compiler_options=decode.FAST_COMPILE)
    with warnings.catch_warnings():
      warnings.simplefilter('error')
      result = run(ll.LuminaSampling)
    for body in np.asarray(result.tokens):
      self.assertTrue(ll.is_valid_body(body, layout), body)
    # README's plain preset (a Sampling without the layout): invalid bodies, silently.
    plain = lambda layout, **values: logits_lib.Sampling(guide_below_one=True, **values)
    with self.assertWarnsRegex(UserWarning, r'ChameleonModel sampled with a plain Sampling.*'
                                            r"LuminaSampling.preset\('lumina_mgpt', layout"):
      result = run(plain)
    self.assertFalse(any(ll.is_valid_body(body, layout) for body in np.asarray(result.tokens)))

  def test_sampling_needs_token_index(self):
    sampling = ll.LuminaSampling(layout=ll.ImageLayout(2, 2))
    with self.assertRaisesRegex(ValueError, 'token_index'):
      sampling.probs(jnp.zeros((1, VOCAB)))

  def test_masking_both_cfg_halves_equals_masking_the_combination(self):
    layout = ll.ImageLayout(2, 3)
    cond, uncond = jax.random.normal(jax.random.key(5), (2, 4, VOCAB))
    index = jnp.array([0, 3, 8, 9])
    sampling = ll.LuminaSampling(layout=layout, cfg_scale=3.0, top_k=50)
    got = sampling.probs(cond, uncond, index)
    combined = ll.apply_layout((uncond + 3.0 * (cond - uncond))[None], index[None], layout)[0]
    plain = logits_lib.Sampling(top_k=50).probs(combined)
    np.testing.assert_allclose(got, plain, atol=1e-6)
    self.assertEqual(float(got[1, 8803]), 1.0)


class VocabularyTableTest(absltest.TestCase):

  def _vocabulary_map(self):
    vocab = {'<s>': 0, '<pad>': 1, '</s>': 2, '<racm3:break>': 8197, '<eoss>': 8196}
    vocab.update({ll.image_token_name(code): code + 4 for code in range(ll.NUM_IMAGE_CODES)})
    return vocab

  def test_table_is_code_plus_four(self):
    self.assertEqual(ll.image_token_name(1203), 'IMGIMGBCADZ')
    table = ll.image_token_table(self._vocabulary_map())
    np.testing.assert_array_equal(table, np.arange(8192) + 4)
    np.testing.assert_array_equal(ll.bpe_to_code(table), np.arange(8192))

  def test_shifted_table_is_rejected(self):
    vocab = self._vocabulary_map()
    vocab[ll.image_token_name(7)], vocab[ll.image_token_name(8)] = 12, 11
    with self.assertRaisesRegex(ValueError, 'code 7 has id 12'):
      ll.image_token_table(vocab)

  def test_missing_codes_are_rejected(self):
    vocab = self._vocabulary_map()
    del vocab[ll.image_token_name(5)]
    with self.assertRaisesRegex(ValueError, r'1 of 8192 image codes.*\[5\]'):
      ll.image_token_table(vocab)


class FirstTokenTest(absltest.TestCase):
  """The token the prefill samples is masked as image position 0."""

  def test_a_prompt_for_another_image_size_is_refused(self):
    """The prompt's resolution header (build_prompt) and LuminaSampling.layout must
    name one size: a 2 x 4 prompt sampled with a 4 x 2 layout would decode a 4 x 2
    body that no 2 x 4 image reads. The same prompt with its own layout decodes."""
    config = chameleon.ChameleonConfig(vocab_size=8832, hidden_size=32, num_layers=1,
                                       num_heads=4, num_kv_heads=4, head_dim=8,
                                       intermediate_size=48)
    model = chameleon.ChameleonModel(config)
    params = model.init_params(jax.random.key(0))
    prompt = chameleon.build_prompt([[0, 9, 8710], [0, 8710]], ll.ImageLayout(2, 4))
    for layout in (ll.ImageLayout(4, 2), ll.ImageLayout(2, 2), ll.ImageLayout(3, 1)):
      with self.assertRaisesRegex(ValueError, r'row\(s\) \[0, 1, 2, 3\] end in the resolution '
                                  r'header of a 2 x 4 latent image, but LuminaSampling.layout '
                                  f'is {layout.height} x {layout.width}; build the prompt'):
        decode.generate(model, params, prompt, num_tokens=layout.body_length,
                        key=jax.random.key(3), sampling=ll.LuminaSampling(layout=layout),
                        compiler_options=decode.FAST_COMPILE)
    layout = ll.ImageLayout(2, 4)
    result = decode.generate(model, params, prompt, num_tokens=layout.body_length,
                             key=jax.random.key(3), sampling=ll.LuminaSampling(layout=layout),
                             compiler_options=decode.FAST_COMPILE)
    for body in np.asarray(result.tokens):
      self.assertTrue(ll.is_valid_body(body, layout), body)

  def test_first_token_is_processed_as_image_position_0(self):
    # Width-1 Lumina layout: body = code, EOL, code, EOL, ..., so the token the
    # prefill samples must be masked for position 0 (a code), not position 1 (EOL).
    config = chameleon.ChameleonConfig(vocab_size=8832, hidden_size=32, num_layers=1,
                                       num_heads=4, num_kv_heads=4, head_dim=8,
                                       intermediate_size=48)
    model = chameleon.ChameleonModel(config)
    params = model.init_params(jax.random.key(0))
    layout = ll.ImageLayout(3, 1)
    # (An odd size has no resolution header; the mask reads only the layout and the index.)
    prompt = chameleon.ChameleonPrompt(jnp.asarray([[0, 9, 8710]], jnp.int32))
    result = decode.generate(
        model, params, prompt, num_tokens=layout.body_length, key=jax.random.key(3),
        sampling=ll.LuminaSampling(layout=layout, top_k=2000),
        compiler_options=decode.FAST_COMPILE)
    for body in np.asarray(result.tokens):
      self.assertTrue(ll.is_valid_body(body, layout), body)


if __name__ == '__main__':
  absltest.main()
