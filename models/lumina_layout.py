"""Lumina-mGPT (Chameleon) image-token layout and its window-aware logits processor.

Legend: B batch rows, T positions in a forward window, V vocabulary,
H / W image height / width in latent tokens (VQ codes).

A generated image span is

  8197 (image start), 8804 + H/2, 8804 + W/2 (resolution tokens),
  H rows of [W image tokens, 8803 (end of row)],
  8196 (image end), then 8710 (end of turn)

with image tokens the BPE ids 4..8195 (VQ code = id - 4). The header (first
three tokens) is part of the prompt in this library (see `models/chameleon.py`);
what the decoder generates is the body: H * (W + 1) tokens and the image end.
"Position in the image" below is the index of a token in that body, 0 for the
first image token.

`apply_layout` masks logits per position, so a Jacobi window of several
positions (each with its own position in the image) is processed in one call:
at end-of-row positions only 8803 is allowed, at the image-end position only
8196, after it only 8710, and everywhere else inside the image only image
tokens. Positions < 0 (prompt, text) are left unchanged. `LuminaSampling`
plugs the same mask into the decoding engine's `Sampling`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import logits as logits_lib

IMAGE_START = 8197  # <racm3:break>
IMAGE_END = 8196  # <eoss>
END_OF_ROW = 8803  # <reserved08799>
END_OF_TURN = 8710  # <reserved08706>, the generation eos
GRID_TOKEN_BASE = 8804  # <reserved08800 + n> encodes a resolution of n patches
FIRST_IMAGE_TOKEN = 4
NUM_IMAGE_CODES = 8192
LATENT_PER_GRID = 2  # patch size 32 over VQ downsampling 16
MIN_VOCAB_SIZE = END_OF_ROW + 1  # every forced id must be a logit index


@dataclasses.dataclass(frozen=True)
class ImageLayout:
  """Layout of one image of `height` x `width` latent tokens."""

  height: int
  width: int

  def __post_init__(self):
    for name in ('height', 'width'):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f'ImageLayout: {name} must be a positive int (latent '
                         f'tokens), got {value!r}.')

  @property
  def row_length(self) -> int:
    """W image tokens plus the end-of-row token."""
    return self.width + 1

  @property
  def body_length(self) -> int:
    """Tokens generated after the header: H rows of W+1 and the image end."""
    return self.height * self.row_length + 1

  def header_tokens(self) -> tuple[int, int, int]:
    """(image start, height token, width token); needs even H and W."""
    if self.height % LATENT_PER_GRID or self.width % LATENT_PER_GRID:
      raise ValueError(
          f'ImageLayout: the resolution tokens encode the size in 32-pixel '
          f'patches (2 latent tokens), so height and width must be even; got '
          f'{self.height} x {self.width}.')
    return (IMAGE_START, GRID_TOKEN_BASE + self.height // LATENT_PER_GRID,
            GRID_TOKEN_BASE + self.width // LATENT_PER_GRID)

  def body_tokens(self, codes: np.ndarray) -> np.ndarray:
    """The body for VQ codes int[..., H, W]: BPE ids with end-of-row tokens and image end."""
    codes = np.asarray(codes)
    if codes.shape[-2:] != (self.height, self.width):
      raise ValueError(f'body_tokens: codes shape {codes.shape} must end in '
                       f'({self.height}, {self.width}).')
    eol = np.full(codes.shape[:-1] + (1,), END_OF_ROW, np.int32)
    rows = np.concatenate([code_to_bpe(codes), eol], axis=-1)
    flat = rows.reshape(codes.shape[:-2] + (-1,))
    end = np.full(codes.shape[:-2] + (1,), IMAGE_END, np.int32)
    return np.concatenate([flat, end], axis=-1).astype(np.int32)


def forced_tokens(positions: jax.Array, layout: ImageLayout) -> jax.Array:
  """The token forced at each position in the image, or -1 where an image token is due.

  Args:
    positions: int32[...], positions in the image (may be < 0: outside).
    layout: the image size.
  Returns:
    int32[...]: END_OF_ROW, IMAGE_END, END_OF_TURN (past the end) or -1 (also
    outside the image, positions < 0).
  """
  positions = jnp.asarray(positions, jnp.int32)
  grid_end = layout.height * layout.row_length
  column = jnp.mod(positions, layout.row_length)
  forced = jnp.where((column == layout.width) & (positions >= 0), END_OF_ROW, -1)
  forced = jnp.where(positions == grid_end, IMAGE_END, forced)
  return jnp.where(positions > grid_end, END_OF_TURN, forced)


def layout_mask(positions: jax.Array, layout: ImageLayout, vocab_size: int) -> jax.Array:
  """Which tokens the layout allows at each position.

  Args:
    positions: int32[...] positions in the image (< 0: outside, all allowed).
    layout: the image size.
    vocab_size: V (>= MIN_VOCAB_SIZE).
  Returns:
    bool[..., V].
  """
  if vocab_size < MIN_VOCAB_SIZE:
    raise ValueError(f'layout_mask: vocab_size {vocab_size} is smaller than the '
                     f'Lumina layout ids need ({MIN_VOCAB_SIZE}).')
  positions = jnp.asarray(positions, jnp.int32)
  ids = jnp.arange(vocab_size, dtype=jnp.int32)  # [V]
  forced = forced_tokens(positions, layout)[..., None]  # [..., 1]
  is_image = (ids >= FIRST_IMAGE_TOKEN) & (ids < FIRST_IMAGE_TOKEN + NUM_IMAGE_CODES)
  allowed = jnp.where(forced >= 0, ids == forced, is_image)
  return allowed | (positions < 0)[..., None]


def apply_layout(logits: jax.Array, positions_in_image: jax.Array,
                 layout: ImageLayout) -> jax.Array:
  """Sets the logits of tokens the layout forbids to -inf, per position.

  Apply after the CFG combine (inf - inf would give NaN before it).

  Args:
    logits: float[B, T, V].
    positions_in_image: int32[B, T], position in the image of the token each
      logit row predicts (e.g. tokens generated so far + window index).
    layout: the image size.
  Returns:
    float[B, T, V] logits.
  """
  if positions_in_image.shape != logits.shape[:-1]:
    raise ValueError(f'apply_layout: positions_in_image shape '
                     f'{tuple(positions_in_image.shape)} must equal logits shape '
                     f'without the vocab axis {tuple(logits.shape[:-1])}.')
  allowed = layout_mask(positions_in_image, layout, logits.shape[-1])
  return jnp.where(allowed, logits, -jnp.inf)


# Masked logits get this finite value, not -inf, so that masking both CFG
# halves and then combining them, u + s (c - u), stays exactly at this value
# (-inf - -inf would be NaN); softmax gives such tokens probability 0.
MASKED_LOGIT = -1e30


@dataclasses.dataclass(frozen=True, kw_only=True)
class LuminaSampling(logits_lib.Sampling):
  """`Sampling` with the layout applied per position before CFG and processing.

  Use it as the engine's `sampling` for Lumina-mGPT: the engine passes each
  window position's image-token index as `token_index`, so vanilla decoding,
  Jacobi windows and draft distributions all see the layout of their own
  position. Masking each CFG half with the same finite MASKED_LOGIT equals
  masking the combined logits, then temperature, top-k and top-p follow.
  """

  layout: ImageLayout
  guide_below_one: bool = True  # Lumina-mGPT guides at every cfg_scale but 1

  def probs(self, cond_logits, uncond_logits=None, token_index=None):
    if token_index is None:
      raise ValueError(
          'LuminaSampling.probs needs token_index (the position in the image of '
          'each logit row); the engine passes it with CFG (cfg_scale != 1).')
    index = jnp.broadcast_to(jnp.asarray(token_index, jnp.int32), cond_logits.shape[:-1])
    allowed = layout_mask(index, self.layout, cond_logits.shape[-1])
    mask = lambda x: None if x is None else jnp.where(allowed, x, MASKED_LOGIT)
    return super().probs(mask(cond_logits), mask(uncond_logits), token_index)


def window_positions(num_generated: jax.Array, window: int) -> jax.Array:
  """int32[B, T] positions in the image of a window starting at each row's count."""
  return jnp.asarray(num_generated, jnp.int32)[:, None] + jnp.arange(window, dtype=jnp.int32)


def is_valid_body(tokens: np.ndarray, layout: ImageLayout) -> bool:
  """True iff tokens[body_length] is exactly a layout-conforming image body."""
  tokens = np.asarray(tokens)
  if tokens.shape != (layout.body_length,):
    return False
  grid = tokens[:-1].reshape(layout.height, layout.row_length)
  images = grid[:, :-1]
  return bool((grid[:, -1] == END_OF_ROW).all() and tokens[-1] == IMAGE_END
              and (images >= FIRST_IMAGE_TOKEN).all()
              and (images < FIRST_IMAGE_TOKEN + NUM_IMAGE_CODES).all())


def strip_layout(tokens, layout: ImageLayout):
  """VQ codes int32[..., H, W] from generated bodies int[..., >= H * (W+1)].

  Drops the end-of-row tokens (and anything after the last row) and maps
  BPE ids to codes. Does not check the layout; see `is_valid_body`.
  """
  grid_end = layout.height * layout.row_length
  if tokens.shape[-1] < grid_end:
    raise ValueError(f'strip_layout: need at least H * (W + 1) = {grid_end} tokens, '
                     f'got {tokens.shape[-1]}.')
  grid = tokens[..., :grid_end].reshape(tokens.shape[:-1] + (layout.height, layout.row_length))
  return bpe_to_code(grid[..., :layout.width])


def bpe_to_code(ids):
  """VQ codes from image-token BPE ids (id - 4; see `image_token_table`)."""
  return ids - FIRST_IMAGE_TOKEN


def code_to_bpe(codes):
  """Image-token BPE ids from VQ codes (code + 4)."""
  return codes + FIRST_IMAGE_TOKEN


_IMAGE_NAME = re.compile(r'^IMGIMG([A-J]+)Z$')


def image_token_table(vocabulary_map: Mapping[str, int]) -> np.ndarray:
  """The code -> BPE id table from Chameleon's `vocabulary_map`, checked to be code + 4.

  Image tokens are named `IMGIMG<digits>Z` with the code's decimal digits
  written A-J (A = 0).

  Args:
    vocabulary_map: `{token name: BPE id}` (config.json `vocabulary_map`).
  Returns:
    int32[8192], entry c = BPE id of code c (== c + 4).
  Raises:
    ValueError: codes missing or duplicated, or the table is not code + 4
      (then `bpe_to_code` would be wrong for this tokenizer).
  """
  table = np.full(NUM_IMAGE_CODES, -1, np.int64)
  for name, bpe_id in vocabulary_map.items():
    match = _IMAGE_NAME.match(name)
    if not match:
      continue
    code = int(''.join(str(ord(ch) - ord('A')) for ch in match.group(1)))
    if not 0 <= code < NUM_IMAGE_CODES:
      raise ValueError(f'image_token_table: {name!r} encodes code {code}, outside '
                       f'[0, {NUM_IMAGE_CODES}).')
    if table[code] >= 0:
      raise ValueError(f'image_token_table: code {code} appears twice ({name!r}).')
    table[code] = int(bpe_id)
  missing = np.nonzero(table < 0)[0]
  if missing.size:
    raise ValueError(f'image_token_table: {missing.size} of {NUM_IMAGE_CODES} image '
                     f'codes have no IMGIMG...Z entry in vocabulary_map (first: '
                     f'{missing[:5].tolist()}). Pass the config.json vocabulary_map.')
  wrong = np.nonzero(table != np.arange(NUM_IMAGE_CODES) + FIRST_IMAGE_TOKEN)[0]
  if wrong.size:
    c = int(wrong[0])
    raise ValueError(f'image_token_table: expected BPE id = code + {FIRST_IMAGE_TOKEN}, '
                     f'but code {c} has id {int(table[c])} ({wrong.size} codes differ). '
                     'This tokenizer is not the Lumina-mGPT/Chameleon one the layout '
                     'assumes.')
  return table.astype(np.int32)


def image_token_name(code: int) -> str:
  """`IMGIMG<digits as A-J>Z` for a VQ code (inverse of the table's parsing)."""
  return 'IMGIMG' + ''.join(chr(ord('A') + int(d)) for d in str(int(code))) + 'Z'
