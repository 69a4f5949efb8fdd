"""Pieces of a batch-1 SD iteration on the bundled family, shared by the bench scripts
that time them (bench/iteration_cost.py) and count their instructions
(bench/forward_instructions.py).

One image with CFG (2 cache rows), the main command's XLA options; callers
set XLA:CPU's flags (`generate.use_single_thread_xla`) before calling these.
"""

from __future__ import annotations

K = 4  # EAGLE-1 chain draft length
NUM_TOKENS = 196  # image tokens of the bundle
CACHE_LENGTH = 100  # where the forwards write, mid-image


def decode_mode(method: str):
  """The decode mode of `decode_call`'s method 'vanilla' or 'chain'."""
  from specdec_jax import decode  # pylint: disable=g-import-not-at-top
  if method == 'vanilla':
    return decode.Vanilla()
  if method == 'chain':
    return decode.ChainDraft(k=K, drafter='eagle')
  raise ValueError(f"method must be 'vanilla' or 'chain', got {method!r}.")


def forward_caches(family, cond, method: str = 'chain'):
  """(target cache, EAGLE cache): 2 rows at length CACHE_LENGTH, sharing it
  (`KVCache.shared_length`, as the decode writes one image's rows), with the
  slots that `decode_call(method)`'s whole-image decode allocates (its
  attention reads all of them, so its forwards cost what these do)."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specdec_jax import decode  # pylint: disable=g-import-not-at-top
  from specdec_jax import kv_cache as kv  # pylint: disable=g-import-not-at-top
  target, eagle = family.target, family.eagle
  mode, prefix = decode_mode(method), int(target.prefix_length(cond))
  target_slots = decode.required_capacity(prefix, NUM_TOKENS, mode)
  eagle_slots = decode_mode('chain').draft_capacity(draft=eagle, cond=cond, prefix=prefix,
                                                    num_tokens=NUM_TOKENS)
  lengths = jnp.array([CACHE_LENGTH, CACHE_LENGTH])
  cache = target.prefill(family.target_params, target.init_cache(2, target_slots), cond).cache
  cache = kv.set_lengths(cache, lengths).replace(shared_length=True)
  eagle_cache = kv.set_lengths(eagle.init_cache(2, eagle_slots), lengths).replace(
      shared_length=True)
  return cache, eagle_cache


def moved_lengths(lengths, index):
  """Cache lengths after loop step `index` of a moving-position loop: L, L + 1, L, ...
  (+1 after even steps, -1 after odd ones), so each forward writes at a new position."""
  return lengths + 1 - 2 * (index % 2)


def forward_loop(forward, iters: int, options: dict | None, moving_positions: bool = False):
  """A jitted call running `iters` forwards at a fixed cache length.

  forward(cache, tokens, features) -> output with .cache, .logits (and .hidden
  when features is not None). The returned function takes the carry
  (cache, tokens [2, T], features [2, T, E] or None); each forward's argmax
  tokens and hidden states feed the next, and the cache lengths are reset.
  With moving_positions, the lengths alternate between L and L + 1: each
  forward writes at another position than the last, as in a decode. At one
  fixed position the lengths pass through the loop unchanged, and XLA hoists
  what depends only on them (RoPE rows, attention masks, write offsets) out
  of the loop, so such a forward costs less than a decode's.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specdec_jax import kv_cache as kv  # pylint: disable=g-import-not-at-top

  def body(index, carry):
    cache, tokens, features = carry
    out = forward(cache, tokens, features)
    next_tokens = jnp.argmax(out.logits, -1).astype(jnp.int32)
    next_features = features if features is None else out.hidden
    lengths = moved_lengths(cache.lengths, index) if moving_positions else cache.lengths
    return kv.set_lengths(out.cache, lengths), next_tokens, next_features

  return jax.jit(lambda carry: jax.lax.fori_loop(0, iters, body, carry),
                 compiler_options=options)


def decode_call(family, cond, options: dict | None, method: str):
  """A no-argument call of one whole-image decode, key 0: method 'vanilla' or
  'chain' (the EAGLE-1 chain, k = K, with UniformRelaxed(omega 2))."""
  import jax  # pylint: disable=g-import-not-at-top
  from specdec_jax import decode, logits, rules  # pylint: disable=g-import-not-at-top
  kwargs = dict(mode=decode_mode(method))
  if method == 'chain':
    kwargs.update(draft=family.eagle, draft_params=family.eagle_params,
                  rule=rules.UniformRelaxed(omega=2.0))
  return lambda: decode.generate(family.target, family.target_params, cond,
                                 num_tokens=NUM_TOKENS, key=jax.random.key(0),
                                 sampling=logits.Sampling(cfg_scale=2.0),
                                 compiler_options=options, **kwargs)
