"""Toy models implementing the decoding protocol, for the engine's exactness tests and the demo.

Legend: B cache rows, T new tokens, S cache slots, V vocabulary, C classes,
A = V + C + 1 alphabet of the Markov toys (image tokens, class tokens, BOS),
E hidden width.

* `MarkovToy`: a second-order Markov chain over image tokens whose next-token
  logits are a table lookup `table[previous, current]`. It stores every token
  it sees in its KV cache and reads the previous token *back from the cache*
  (the visible slot whose position is one less), so a wrong cache length or a
  wrong tree mask changes its law: the property the engine's exactness tests
  rely on. Its exact joint law is `joint_law`.
* `GridToy`: the same alphabet and cache, laid out as an image: rows of
  `width` tokens, each token's logits a table lookup on its left and upper
  neighbours (read from the cache along the query's tree path), so a
  changed token disturbs the token below it `width` positions later.
* `ToyEagle`: an EAGLE-style drafter with the engine's drafter signature
  `forward(params, cache, tokens, features, window_mask, depths)`: logits
  depend on the fed token, the previous token read from its own cache and a
  linear map of the feature (the target's hidden state, or its own output).

They sit in the application, next to the demo that runs them when no bundle is
installed; the core never imports them. They use only the cache, the protocol
and the class-id check of `specdec_jax.models.tiny` (whose `cfg_class_rows`
builds their CFG rows too), so the engine's tests need no real model.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import kv_cache as kv
from specdec_jax import protocol
from specdec_jax.models.tiny import check_class_ids


class _Slots(NamedTuple):
  """What the new queries of one forward see in the token cache (after the write).

  The cache holds each slot's token in its key and its position id in its
  value (`_write`), as a transformer's rotary keys carry their positions.
  """

  visible: jax.Array  # bool[B, T, S]: the slots each query may attend to
  positions: jax.Array  # int32[B, S]: each slot's position id
  tokens: jax.Array  # int32[B, S]: each slot's token


def _write(cache: kv.KVCache, tokens, window_mask, depths):
  """Writes tokens int32[B, T] at the window's positions.

  Returns (positions int32[B, T] of the new queries, the written cache, not yet
  advanced, and its `_Slots`).
  """
  num_new = tokens.shape[1]
  positions = kv.window_positions(cache, num_new, depths)  # [B, T]
  # Keys hold the tokens, values their position ids ([B, T, 1, 1] each).
  written = kv.update_layer(cache, 0, tokens.astype(jnp.float32)[..., None, None],
                            positions.astype(jnp.float32)[..., None, None])
  slots = _Slots(visible=kv.attention_mask(written, num_new, window_mask),
                 positions=written.values[0][:, 0, :, 0].astype(jnp.int32),  # [B, K, S, D]
                 tokens=written.keys[0][:, 0, 0, :].astype(jnp.int32))  # [B, K, D, S]
  return positions, written, slots


# One compiled program for every row of a joint law (op by op, a top-k law took 22 s).
_softmax_rows = jax.jit(lambda logits: jax.nn.softmax(logits, axis=-1))
_sampling_rows = jax.jit(
    lambda sampling, cond, uncond, index: sampling.probs(cond, uncond, token_index=index))


def _token_at(slots: _Slots, wanted, bos: int):
  """int32[B, T]: for each new query, the token of the visible slot (its tree path
  and the committed tokens) whose position id is wanted int32[B, T]; BOS if none."""
  match = slots.visible & (slots.positions[:, None, :] == wanted[..., None])
  token = jnp.take_along_axis(slots.tokens, jnp.argmax(match, axis=-1), axis=1)
  return jnp.where(jnp.any(match, axis=-1), token, bos)


def _token_cache(batch_size: int, capacity: int) -> kv.KVCache:
  """One layer, one head, one dim: slot s stores its token id (key) and position id
  (value), as float32."""
  return kv.init_cache(num_layers=1, batch_size=batch_size, capacity=capacity,
                       num_kv_heads=1, head_dim=1)


def _markov_step(table, cache, tokens, window_mask, depths, bos):
  """Writes tokens [B, T], reads their predecessors, returns (prev, logits, cache)."""
  positions, written, slots = _write(cache, tokens, window_mask, depths)
  previous = _token_at(slots, positions - 1, bos)  # [B, T]
  logits = table[previous, tokens]  # [B, T, V]
  return previous, logits.astype(jnp.float32), kv.advance(written, tokens.shape[1])


@dataclasses.dataclass(frozen=True)
class _TableToy:
  """What the table toys share: the alphabet, the class-token prefix [BOS, V + c]
  (P = 2; class C is the null class of CFG rows), the token cache and the
  protocol's calls and the exact joint law. Subclasses define
  `_output(params, cache, tokens [B, T], window_mask, depths)` (the engine's
  forward) and `step_logits` (the same logits from a numpy sequence).
  Params: {'table': f32[A, A, V]}, next-token logits indexed by two tokens.
  """

  vocab: int = 4
  num_classes: int = 2

  @property
  def alphabet(self) -> int:
    return self.vocab + self.num_classes + 2  # + null class + BOS

  @property
  def bos(self) -> int:
    return self.alphabet - 1

  @property
  def vocab_size(self) -> int:
    return self.vocab

  @property
  def hidden_size(self) -> int:
    return 2 * self.alphabet

  def init_params(self, key, scale: float = 1.5) -> dict:
    shape = (self.alphabet, self.alphabet, self.vocab)
    return {'table': scale * jax.random.normal(key, shape, jnp.float32)}

  def prefix_length(self, cond) -> int:
    del cond
    return 2

  def check_cond(self, cond) -> None:
    """Checks concrete class ids too (`specdec_jax.checks`)."""
    check_class_ids(cond, self.num_classes, 'generate: cond', allow_null=True)

  def init_cache(self, batch_size: int, capacity: int) -> kv.KVCache:
    return _token_cache(batch_size, capacity)

  def prefill(self, params, cache, cond) -> protocol.ForwardOutput:
    check_class_ids(cond, self.num_classes, f'{type(self).__name__}.prefill', allow_null=True)
    batch = cond.shape[0]
    tokens = jnp.stack([jnp.full((batch,), self.bos, jnp.int32),
                        self.vocab + cond.astype(jnp.int32)], axis=1)  # [B, 2]
    return self._output(params, cache, tokens)

  def forward(self, params, cache, tokens, window_mask=None, depths=None):
    return self._output(params, cache, tokens.astype(jnp.int32), window_mask, depths)

  def joint_law(self, params, class_id: int, num_tokens: int, sampling=None) -> np.ndarray:
    """Exact law of the first num_tokens generated tokens, float64[V ** n] (C order).

    `sampling` (a `specdec_jax.logits.Sampling`) is applied exactly as the
    engine does: CFG between the class row and the null-class row, then
    processing; token index i decides the CFG interval. Each token's logits
    come from the subclass's `step_logits(arrays, class_token, sequence, index)`
    (arrays: the params as numpy).
    """
    arrays = {name: np.asarray(value, np.float32) for name, value in params.items()}
    sequences = list(itertools.product(range(self.vocab), repeat=num_tokens))

    def rows(class_token):  # float32[S * n, V]: every sequence's logits at every index
      return np.stack([self.step_logits(arrays, class_token, sequence, i)
                       for sequence in sequences for i in range(num_tokens)])

    cond_logits = rows(self.vocab + class_id)
    if sampling is None:
      steps = _softmax_rows(cond_logits)
    else:
      index = np.tile(np.arange(num_tokens, dtype=np.int32), len(sequences))  # [S * n]
      steps = _sampling_rows(sampling, cond_logits, rows(self.vocab + self.num_classes), index)
    steps = np.asarray(steps, np.float64).reshape(len(sequences), num_tokens, self.vocab)
    chosen = np.take_along_axis(steps, np.asarray(sequences)[..., None], axis=-1)[..., 0]
    law = np.prod(chosen, axis=-1)  # [S], C order over the sequences
    return law.reshape(-1)


@dataclasses.dataclass(frozen=True)
class MarkovToy(_TableToy):
  """Second-order Markov chain with a class-token prefix, reading through its cache.

  The prefix of class c is [BOS, V + c] (P = 2); generated tokens are in [0, V).
  Class id C is the unconditional ("null") class used for CFG rows.
  Params: {'table': f32[A, A, V]} logits of the next token given
  (previous, current).
  """

  def _output(self, params, cache, tokens, window_mask=None, depths=None):
    previous, logits, cache = _markov_step(params['table'], cache, tokens, window_mask,
                                           depths, self.bos)
    hidden = jnp.concatenate([jax.nn.one_hot(previous, self.alphabet),
                              jax.nn.one_hot(tokens, self.alphabet)], axis=-1)
    return protocol.ForwardOutput(logits=logits, hidden=hidden, cache=cache)

  def step_logits(self, arrays: dict, class_token: int, sequence, index: int) -> np.ndarray:
    """Logits float32[V] of generated token `index` after `sequence[:index]` (numpy)."""
    history = (self.bos, class_token) + tuple(sequence[:index])
    return arrays['table'][history[-2], history[-1]]


@dataclasses.dataclass(frozen=True)
class GridToy(_TableToy):
  """An image-like toy: tokens fill rows of `width`; each depends on its left and upper
  neighbours, read through the cache.

  Generated token k sits at row k // width, column k % width. Its logits are
  `table[left, above]`: left is token k - 1 (the class token V + c at column
  0), above is token k - width (BOS in the first row). So a changed token
  moves the law of its right neighbour and of the token below it, width
  positions later, as a VQ image model's does (bench/jacobi_grid_toy.py
  measures the Jacobi methods against the width). The prefix of class c is
  [BOS, V + c] (P = 2), class C is the null class for CFG rows, as
  `MarkovToy`'s. Tree windows read both neighbours along their own path
  (`_token_at`), so a wrong tree mask changes the law.

  Three options bring it closer to an image model (all off by default):
  `border` columns on each side of every row are background: there the law
  is a point mass on token 0 whatever the context (a centred object on a
  black ground); `context_weight` adds `context_weight * sum_j context[x_j]`
  over the `context_span` generated tokens before token k, so a changed token
  moves the next `context_span` laws a little, as a transformer's does.
  Token 0 (the background) pulls nothing: a run of background would
  otherwise add up to one sharp bias. `background_pull` makes the background
  grow from the border into the image, so where an object ends depends on
  the tokens drawn before: a token whose left and upper neighbours are both
  background is background (a point mass on 0), and one with background on
  one side gets `background_pull` added to token 0's logit.
  Params: {'table': f32[A, A, V]} logits of token k given (left, above),
  {'context': f32[A, V]} the per-token pull (row 0 zero).
  """

  width: int = 3
  border: int = 0
  context_weight: float = 0.0
  context_span: int = 32
  background_pull: float = 0.0

  def __post_init__(self):
    if self.width < 1:
      raise ValueError(f'GridToy.width must be >= 1, got {self.width}.')
    if not 0 <= 2 * self.border < self.width:
      raise ValueError(f'GridToy.border must be in [0, (width - 1) / 2] (columns of '
                       f'background on each side), got {self.border} for width {self.width}.')
    if self.context_span < 1:
      raise ValueError(f'GridToy.context_span must be >= 1, got {self.context_span}.')
    if not self.background_pull >= 0:
      raise ValueError('GridToy.background_pull must be >= 0 (a logit added to the '
                       f'background token), got {self.background_pull}.')

  def init_params(self, key, scale: float = 1.5) -> dict:
    context = jax.random.normal(jax.random.fold_in(key, 1), (self.alphabet, self.vocab))
    context = context.at[0].set(0.0)  # the background pulls nothing
    return {**super().init_params(key, scale), 'context': context.astype(jnp.float32)}

  def _is_border(self, index):
    """Whether generated token `index` (int or int32 array) is a background column."""
    column = index % self.width
    return (column < self.border) | (column >= self.width - self.border)

  def _output(self, params, cache, tokens, window_mask=None, depths=None):
    positions, written, slots = _write(cache, tokens, window_mask, depths)
    index = positions - 1  # the generated token each query predicts (-1 at BOS)
    class_token = _token_at(slots, jnp.ones_like(positions), self.bos)
    left = jnp.where(index % self.width == 0, class_token, tokens)
    upper = _token_at(slots, positions + 1 - self.width, self.bos)
    above = jnp.where(index >= self.width, upper, self.bos)
    logits = params['table'][left, above].astype(jnp.float32)  # [B, T, V]
    if self.context_weight:
      first = jnp.maximum(2, positions + 1 - self.context_span)  # [B, T] oldest slot pulled
      earlier = slots.visible & (slots.positions[:, None, :] >= first[..., None])  # [B, T, S]
      per_slot = params['context'][slots.tokens]  # [B, S, V]
      logits += self.context_weight * jnp.einsum('bts,bsv->btv', earlier.astype(jnp.float32),
                                                 per_slot)
    background = jnp.where(jnp.arange(self.vocab) == 0, 0.0, -1e4)  # a point mass on 0
    if self.background_pull:
      beside = ((left == 0) | (above == 0)).astype(jnp.float32)  # [B, T]
      logits = logits.at[..., 0].add(self.background_pull * beside)
      logits = jnp.where(((left == 0) & (above == 0))[..., None], background, logits)
    if self.border:
      logits = jnp.where(self._is_border(index)[..., None], background, logits)
    hidden = jnp.concatenate([jax.nn.one_hot(left, self.alphabet),
                              jax.nn.one_hot(above, self.alphabet)], axis=-1)
    return protocol.ForwardOutput(logits=logits, hidden=hidden,
                                  cache=kv.advance(written, tokens.shape[1]))

  def step_logits(self, arrays: dict, class_token: int, sequence, index: int) -> np.ndarray:
    """Logits float32[V] of generated token `index` after `sequence[:index]` (numpy)."""
    left = class_token if index % self.width == 0 else sequence[index - 1]
    above = sequence[index - self.width] if index >= self.width else self.bos
    logits = arrays['table'][left, above]
    if self.context_weight:
      pulling = sequence[max(0, index - self.context_span):index]
      logits = logits + self.context_weight * sum(
          (arrays['context'][token] for token in pulling), np.zeros(self.vocab))
    background = np.where(np.arange(self.vocab) == 0, 0.0, -1e4)
    if self.background_pull:
      if left == 0 or above == 0:
        logits = logits + np.where(np.arange(self.vocab) == 0, self.background_pull, 0.0)
      if left == 0 and above == 0:
        logits = background
    if self.border and self._is_border(index):
      logits = background
    return logits


@dataclasses.dataclass(frozen=True)
class ToyEagle:
  """An EAGLE-style drafter for `MarkovToy` targets (same alphabet).

  forward(params, cache, tokens [B, T], features [B, T, E], window_mask,
  depths): logits = table[prev, token] + features @ feature_head, prev read
  from its own cache; hidden = [one_hot(prev), one_hot(token)] (E = 2A, the
  target's hidden width), so the drafter can feed its own output back.
  `prefix_pairs(cond, target_hidden)` gives the prefix shifted by one
  (P - 1 slots), as EAGLE pairs token t+1 with feature t; `prefill(params,
  cache, tokens, features)` runs them (the signature of models/eagle.py).
  """

  vocab: int = 4
  num_classes: int = 2
  feature_scale: float = 1.0

  @property
  def _target(self) -> MarkovToy:
    return MarkovToy(self.vocab, self.num_classes)

  @property
  def vocab_size(self) -> int:
    return self.vocab

  @property
  def hidden_size(self) -> int:
    return self._target.hidden_size

  def init_params(self, key) -> dict:
    table_key, head_key = jax.random.split(key)
    alphabet = self._target.alphabet
    return {
        'table': jax.random.normal(table_key, (alphabet, alphabet, self.vocab)),
        'feature_head': self.feature_scale * jax.random.normal(
            head_key, (self.hidden_size, self.vocab)),
    }

  def init_cache(self, batch_size: int, capacity: int) -> kv.KVCache:
    return _token_cache(batch_size, capacity)

  def forward(self, params, cache, tokens, features, window_mask=None, depths=None):
    tokens = tokens.astype(jnp.int32)
    previous, logits, cache = _markov_step(params['table'], cache, tokens, window_mask,
                                           depths, self._target.bos)
    logits = logits + jnp.einsum('bte,ev->btv', features.astype(jnp.float32),
                                 params['feature_head'])
    alphabet = self._target.alphabet
    hidden = jnp.concatenate([jax.nn.one_hot(previous, alphabet),
                              jax.nn.one_hot(tokens, alphabet)], axis=-1)
    return protocol.ForwardOutput(logits=logits, hidden=hidden, cache=cache)

  def check_cond(self, cond) -> None:
    """Checks concrete class ids too (`specdec_jax.checks`)."""
    check_class_ids(cond, self.num_classes, 'generate: draft_cond', allow_null=True)

  def prefix_pairs(self, cond, target_hidden):
    """EAGLE pairing of the prefix: token t+1 with target feature t (Pd = P - 1)."""
    check_class_ids(cond, self.num_classes, 'ToyEagle.prefix_pairs', allow_null=True)
    tokens = (self.vocab + cond.astype(jnp.int32))[:, None]  # prefix[1:], [B, 1]
    return tokens, target_hidden[:, :-1]

  def prefill(self, params, cache, tokens, features) -> protocol.ForwardOutput:
    return self.forward(params, cache, tokens, features)
