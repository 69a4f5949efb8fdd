"""Tiny models implementing the decoding protocol, for engine tests and the CPU benchmark.

Legend: B cache rows, T new tokens, S cache slots, V vocabulary, C classes,
A = V + C + 1 alphabet of the Markov toys (image tokens, class tokens, BOS),
E hidden width.

* `MarkovToy`: a second-order Markov chain over image tokens whose next-token
  logits are a table lookup `table[previous, current]`. It stores every token
  it sees in its KV cache and reads the previous token *back from the cache*
  (the visible slot whose position is one less), so a wrong cache length or a
  wrong tree mask changes its law: the property the engine's exactness tests
  rely on. Its exact joint law is `joint_law`.
* `ToyEagle`: an EAGLE-style drafter with the engine's drafter signature
  `forward(params, cache, tokens, features, window_mask, depths)`: logits
  depend on the fed token, the previous token read from its own cache and a
  linear map of the feature (the target's hidden state, or its own output).
* `TinyTransformer`: a class-conditional Llama-shaped transformer built from
  `models/layers.py` (sharding test and CPU benchmark).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import kv_cache as kv
from specdec_jax import protocol
from specdec_jax.models import layers


def _check_class_ids(cond, num_classes: int, what: str, allow_null: bool) -> None:
  """Raises a clear error for conditioning that is not int class ids [B]."""
  shape = jnp.shape(cond)
  if len(shape) != 1 or not jnp.issubdtype(jnp.result_type(cond), jnp.integer):
    raise ValueError(
        f'{what}: cond must be integer class ids of shape [B] (one per cache row; with '
        f'CFG [cond; uncond] rows), got shape {shape} dtype {jnp.result_type(cond)}.')
  if not isinstance(cond, jax.core.Tracer):
    values = np.asarray(cond)
    high = num_classes + (1 if allow_null else 0)
    if values.size and (values.min() < 0 or values.max() >= high):
      raise ValueError(f'{what}: class ids must be in [0, {high}), got {values.tolist()}.')


def _previous_tokens(cache: kv.KVCache, num_new: int, window_mask, depths, bos: int):
  """Token at position-1 of each new query, read from the cache after the write.

  Returns int32[B, T]: among the slots the query may attend to, the one whose
  position id is the query's position minus one (BOS when there is none).
  """
  slots = jnp.arange(cache.capacity, dtype=jnp.int32)  # [S]
  lengths = cache.lengths[:, None]  # [B, 1]
  if depths is None:
    depths = jnp.arange(num_new, dtype=jnp.int32)
  offset = slots[None, :] - lengths  # [B, S]
  in_window = (offset >= 0) & (offset < num_new)
  window_depth = jnp.take(depths, jnp.clip(offset, 0, num_new - 1))
  slot_position = jnp.where(in_window, lengths + window_depth, slots[None, :])
  slot_position = slot_position - cache.position_offset[:, None]  # [B, S]
  query_position = kv.window_positions(cache, num_new, depths)  # [B, T]
  visible = kv.attention_mask(cache, num_new, window_mask)  # [B, T, S]
  match = visible & (slot_position[:, None, :] == query_position[..., None] - 1)
  stored = cache.keys[0][..., 0, 0].astype(jnp.int32)  # [B, S]
  found = jnp.any(match, axis=-1)
  slot = jnp.argmax(match, axis=-1)  # [B, T]
  previous = jnp.take_along_axis(stored, slot, axis=1)
  return jnp.where(found, previous, bos)


def _token_cache(batch_size: int, capacity: int) -> kv.KVCache:
  """One layer, one head, one dim: slot s stores the token id (as float32)."""
  return kv.init_cache(num_layers=1, batch_size=batch_size, capacity=capacity,
                       num_kv_heads=1, head_dim=1)


def _markov_step(table, cache, tokens, window_mask, depths, bos):
  """Writes tokens [B, T], reads their predecessors, returns (prev, logits, cache)."""
  num_new = tokens.shape[1]
  stored = tokens.astype(jnp.float32)[..., None, None]  # [B, T, 1, 1]
  written = kv.update_layer(cache, 0, stored, stored)
  previous = _previous_tokens(written, num_new, window_mask, depths, bos)  # [B, T]
  logits = table[previous, tokens]  # [B, T, V]
  return previous, logits.astype(jnp.float32), kv.advance(written, num_new)


@dataclasses.dataclass(frozen=True)
class MarkovToy:
  """Second-order Markov chain with a class-token prefix, reading through its cache.

  The prefix of class c is [BOS, V + c] (P = 2); generated tokens are in [0, V).
  Class id C is the unconditional ("null") class used for CFG rows.
  Params: {'table': f32[A, A, V]} logits of the next token given
  (previous, current).
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

  def init_cache(self, batch_size: int, capacity: int) -> kv.KVCache:
    return _token_cache(batch_size, capacity)

  def _output(self, params, cache, tokens, window_mask=None, depths=None):
    previous, logits, cache = _markov_step(params['table'], cache, tokens, window_mask,
                                           depths, self.bos)
    hidden = jnp.concatenate([jax.nn.one_hot(previous, self.alphabet),
                              jax.nn.one_hot(tokens, self.alphabet)], axis=-1)
    return protocol.ForwardOutput(logits=logits, hidden=hidden, cache=cache)

  def prefill(self, params, cache, cond) -> protocol.ForwardOutput:
    _check_class_ids(cond, self.num_classes, 'MarkovToy.prefill', allow_null=True)
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
    processing; token index i decides the CFG interval.
    """
    table = np.asarray(params['table'], np.float32)
    law = np.zeros((self.vocab,) * num_tokens)
    cond_prefix = (self.bos, self.vocab + class_id)
    uncond_prefix = (self.bos, self.vocab + self.num_classes)
    for sequence in itertools.product(range(self.vocab), repeat=num_tokens):
      prob = 1.0
      for index in range(num_tokens):
        history_c = cond_prefix + sequence[:index]
        history_u = uncond_prefix + sequence[:index]
        cond_logits = table[history_c[-2], history_c[-1]]
        uncond_logits = table[history_u[-2], history_u[-1]]
        if sampling is None:
          step = jax.nn.softmax(jnp.asarray(cond_logits))
        else:
          step = sampling.probs(jnp.asarray(cond_logits), jnp.asarray(uncond_logits),
                                token_index=index)
        prob *= float(np.asarray(step, np.float64)[sequence[index]])
      law[sequence] = prob
    return law.reshape(-1)


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

  def prefix_pairs(self, cond, target_hidden):
    """EAGLE pairing of the prefix: token t+1 with target feature t (Pd = P - 1)."""
    _check_class_ids(cond, self.num_classes, 'ToyEagle.prefix_pairs', allow_null=True)
    tokens = (self.vocab + cond.astype(jnp.int32))[:, None]  # prefix[1:], [B, 1]
    return tokens, target_hidden[:, :-1]

  def prefill(self, params, cache, tokens, features) -> protocol.ForwardOutput:
    return self.forward(params, cache, tokens, features)


@dataclasses.dataclass(frozen=True)
class TinyConfig:
  vocab_size: int = 32
  num_classes: int = 4
  width: int = 32
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  ffn_dim: int = 64
  dtype: Any = jnp.float32

  @property
  def head_dim(self) -> int:
    return self.width // self.num_heads


class _TinyLM(nn.Module):
  """Embedding (tokens or a class prefix) -> decoder layers -> RMSNorm -> head."""

  config: TinyConfig

  @nn.compact
  def __call__(self, tokens, cache, window_mask=None, depths=None, class_ids=None):
    c = self.config
    embed_tokens = nn.Embed(c.vocab_size, c.width, dtype=c.dtype, name='embed_tokens')
    embed_classes = nn.Embed(c.num_classes + 1, c.width, dtype=c.dtype, name='embed_classes')
    if class_ids is not None:
      x = embed_classes(class_ids)[:, None, :]  # [B, 1, E]
      # Touch the other table so `init` creates both (one init call).
      x = x + 0.0 * embed_tokens(jnp.zeros_like(class_ids))[:, None, :]
    else:
      x = embed_tokens(tokens)  # [B, T, E]
      x = x + 0.0 * embed_classes(jnp.zeros_like(tokens[:, :1]))
    num_new = x.shape[1]
    positions = kv.window_positions(cache, num_new, depths)  # [B, T]
    angles = layers.rope_1d_angles(positions, c.head_dim)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    for index in range(c.num_layers):
      x, cache = layers.DecoderLayer(
          c.num_heads, c.num_kv_heads, c.head_dim, c.ffn_dim, dtype=c.dtype,
          name=f'layers_{index}')(x, cos, sin, cache, index, window_mask)
    hidden = layers.RMSNorm(name='norm')(x)
    logits = nn.Dense(c.vocab_size, use_bias=False, dtype=c.dtype, name='lm_head')(hidden)
    return logits.astype(jnp.float32), hidden, kv.advance(cache, num_new)


@dataclasses.dataclass(frozen=True)
class TinyTransformer:
  """Class-conditional Llama-shaped model (prefix: one class embedding, P = 1).

  Class id `num_classes` is the null class for CFG rows.
  """

  config: TinyConfig = TinyConfig()

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def hidden_size(self) -> int:
    return self.config.width

  def init_params(self, key) -> Any:
    """Random parameters (one jitted init: eager Flax init compiles op by op)."""
    def init(key):
      cache = self.init_cache(1, 2)
      return _TinyLM(self.config).init(key, jnp.zeros((1, 1), jnp.int32), cache)['params']
    return jax.jit(init)(key)

  def prefix_length(self, cond) -> int:
    del cond
    return 1

  def init_cache(self, batch_size: int, capacity: int) -> kv.KVCache:
    c = self.config
    return kv.init_cache(num_layers=c.num_layers, batch_size=batch_size, capacity=capacity,
                         num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, dtype=c.dtype)

  def prefill(self, params, cache, cond) -> protocol.ForwardOutput:
    _check_class_ids(cond, self.config.num_classes, 'TinyTransformer.prefill',
                     allow_null=True)
    logits, hidden, cache = _TinyLM(self.config).apply(
        {'params': params}, None, cache, class_ids=cond.astype(jnp.int32))
    return protocol.ForwardOutput(logits=logits, hidden=hidden, cache=cache)

  def forward(self, params, cache, tokens, window_mask=None, depths=None):
    logits, hidden, cache = _TinyLM(self.config).apply(
        {'params': params}, tokens.astype(jnp.int32), cache, window_mask, depths)
    return protocol.ForwardOutput(logits=logits, hidden=hidden, cache=cache)


def cfg_class_rows(class_ids, num_classes: int) -> jax.Array:
  """[cond; uncond] class-id rows for CFG: the null class is `num_classes`."""
  class_ids = jnp.asarray(class_ids, jnp.int32)
  return jnp.concatenate([class_ids, jnp.full_like(class_ids, num_classes)])
