"""The decoding engine: one compiled `lax.while_loop` per call, for every mode.

Legend: B images, R cache rows (B, or 2B with CFG: rows 2b, 2b + 1 = image b's
conditional and unconditional rows, see `drafting`), V vocabulary, E hidden
width, P prefix slots, n image tokens to generate, T verify window (vanilla 1,
chain k+1, tree N nodes, Jacobi W), K draft slots (T - 1; tree: depth D).

Loop invariant, per image: `num_generated` tokens are committed; the last of
them is *pending* (sampled but not yet run through the target), and the
target cache holds the prefix and every committed token but the pending one
(length = P + num_generated - 1). One iteration:

  1. verify forward of the mode's window [pending, drafts] (T tokens) at
     each row's length;
  2. CFG combine + processing (`Sampling.probs`) -> target distributions;
  3. the mode verifies per image (vmapped, own keys) and returns the
     accepted path, num_accepted and the next token (a tree also compacts
     the accepted path's KV);
  4. commit the accepted drafts + next token; set the target length to
     old + accepted + 1 (rollback = moving lengths);
  5. the mode drafts for the next iteration.

The loop never asks which mode it runs: modes are `modes.Mode` subclasses
(`mode_base` documents the methods), so a new mode is one new class.

Rows that finish keep iterating harmlessly until all are done: their counters
and lengths are frozen, and what they write lands in slots beyond their
frozen length or beyond the n tokens returned.

Randomness is per image and drawn before the loop (`randomness`): image b's
uniforms come from `row_keys[b]` only, so its tokens do not depend on the
other images in the batch, and the loop body runs no PRNG.
"""

from __future__ import annotations

import dataclasses
import time

from absl import logging
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import categorical
from specdec_jax import checks
from specdec_jax import drafting
from specdec_jax import kv_cache as kv
from specdec_jax import logits as logits_lib
from specdec_jax import metrics as metrics_lib
from specdec_jax import mode_base
from specdec_jax import modes as modes_lib
from specdec_jax import phases
from specdec_jax import program_cache
from specdec_jax import protocol
from specdec_jax import randomness
from specdec_jax import sharding
# XLA options for decodes: part of this module's API (generate(compiler_options=...)).
from specdec_jax.xla_options import CPU_LATENCY_OPTIONS  # pylint: disable=unused-import
from specdec_jax.xla_options import FAST_COMPILE  # pylint: disable=unused-import

Vanilla, ChainDraft, TreeDraft, Jacobi, DynamicTreeDraft, JacobiPAC = (
    modes_lib.Vanilla, modes_lib.ChainDraft, modes_lib.TreeDraft, modes_lib.Jacobi,
    modes_lib.DynamicTreeDraft, modes_lib.JacobiPAC)
DecodeMode = modes_lib.DecodeMode
window_width, draft_slots = modes_lib.window_width, modes_lib.draft_slots
required_capacity = modes_lib.required_capacity
as_rows = drafting.as_rows
vocab_parallel_sampling = sharding.vocab_parallel_sampling
_Plan = mode_base.Plan

# ---------------------------------------------------------------- results and state

@dataclasses.dataclass
class DecodeResult:
  """tokens int32[B, n]; per-image metrics; host timings in seconds."""

  tokens: jax.Array
  metrics: metrics_lib.DecodeMetrics
  compile_seconds: float
  run_seconds: float


@flax.struct.dataclass
class LoopState:
  """What the while_loop carries.

  Attributes:
    step: int32[], iteration counter (indexes the decode's uniforms).
    tokens: int32[B, n + 2(K+1)] committed tokens (padding absorbs overshoot).
    num_generated: int32[B], committed tokens including the pending one.
    target_cache: R rows.
    drafts: the mode's `mode_base.Drafts` (next drafts, their laws, drafter cache).
    metrics: per-image counters.
  """

  step: jax.Array
  tokens: jax.Array
  num_generated: jax.Array
  target_cache: kv.KVCache
  drafts: mode_base.Drafts
  metrics: metrics_lib.DecodeMetrics


# Tests replace this to build a broken rollback (the exactness test must then fail).
def _committed_length(old_length, num_accepted, window: int):
  del window
  return old_length + num_accepted + 1


# ---------------------------------------------------------------- the loop


def _split_uniforms(uniforms, mode):
  """A step's f32[B, U] uniforms -> (the target side's [B, verify_uniforms], the drafts')."""
  return uniforms[:, :mode.verify_uniforms], uniforms[:, mode.verify_uniforms:]


def _decode(plan: _Plan, target_params, draft_params, cond, draft_cond, row_keys, rule,
            sampling=None):
  """The jitted body: prefill, first token, first drafts, then the while_loop.

  sampling: the traced `Sampling` (its float fields are loop inputs, not
  constants); None uses the plan's own (then its values are compiled in).
  """
  if sampling is not None:
    plan = dataclasses.replace(plan, sampling=sampling)
  mode, cfg, num_images, mesh = plan.mode, plan.cfg, plan.num_images, plan.mesh
  # [cond; uncond] halves -> interleaved rows (an image's rows on one device).
  cond, draft_cond = drafting.cfg_rows(cond, cfg), drafting.cfg_rows(draft_cond, cfg)

  # Prefill and the first token (always plain AR); with attention phases the
  # cache starts at the first phase's span (`phases`).
  pairs, slots = plan.rows_per_image, (plan.attention_spans + (plan.target_capacity,))[0]
  cache = plan.shared_lengths(plan.target.init_cache(num_images * pairs, slots))
  out = protocol.prefill_last(plan.target, target_params,  # logits [R, 1, V]
                              sharding.constrain_cache(cache, mesh, pairs), cond)
  # Every random number of the decode, drawn now: the loop body runs no PRNG.
  noise = randomness.loop_uniforms(row_keys, plan.num_tokens,
                                   mode.verify_uniforms + mode.draft_uniforms)  # [B, n, U]
  first_uniforms, start_uniforms = _split_uniforms(noise[:, 0], mode)
  first_probs = drafting.guided_probs(plan.sampling, out.logits,
                                      jnp.zeros((num_images, 1), jnp.int32), cfg)[:, 0]
  first = categorical.sample(first_uniforms[:, 0], first_probs)
  buffer = jnp.zeros((num_images, plan.num_tokens + 2 * (mode.slots + 1)), jnp.int32)
  buffer = buffer.at[:, 0].set(first)
  num_generated = jnp.ones((num_images,), jnp.int32)
  drafts, forwards = mode.start(plan, draft_params, draft_cond, out, first, num_generated,
                                start_uniforms)
  metrics = metrics_lib.DecodeMetrics.zeros(num_images, mode.slots).added(draft_forwards=forwards)
  metrics = metrics.record_nonfinite(jnp.ones((num_images,), bool), first_probs).record_nonfinite(
      num_generated < plan.num_tokens, None, drafts.probs)  # those the first step verifies
  state = LoopState(step=jnp.int32(1), tokens=buffer, num_generated=num_generated,
                    target_cache=out.cache, drafts=drafts, metrics=metrics)

  def unfinished(state):
    return jnp.any(state.num_generated < plan.num_tokens)

  def body(state: LoopState) -> LoopState:
    # Named scopes label each piece in the compiled program's op names
    # (bench/loop_profile.py attributes kernels and time to them).
    with jax.named_scope('window'):
      verify_uniforms, draft_uniforms = _split_uniforms(
          randomness.step_uniforms(noise, state.step), mode)
      active = state.num_generated < plan.num_tokens  # [B]
      old_length = drafting.image_rows(state.target_cache.lengths, cfg)
      pending = jnp.take_along_axis(state.tokens, state.num_generated[:, None] - 1, axis=1)
      window = mode.verify_window(pending, state.drafts)  # [B, T]
      window_mask, depths = mode.layout(state.drafts)
      offsets = kv.row_depths(depths, num_images, window.shape[1])  # [B, T]
      if depths is not None and depths.ndim == 2:  # a tree per image: [B, T] -> rows
        window_mask, depths = as_rows(window_mask, cfg), as_rows(depths, cfg)
    with jax.named_scope('target_forward'):
      out = plan.target.forward(target_params, state.target_cache, as_rows(window, cfg),
                                window_mask=window_mask, depths=depths)
    with jax.named_scope('target_probs'):
      token_index = state.num_generated[:, None] + offsets  # [B, T]
      # Split by image, as the rows it came from (no logits move).
      target_probs = sharding.constrain_batch(
          mode.target_probs(plan, out.logits, token_index), mesh)
    with jax.named_scope('verify'):
      verdict, cache = mode.verify(plan, rule, verify_uniforms, window, state.drafts,
                                   target_probs, out.cache, old_length)
    with jax.named_scope('commit'):
      commit = mode.commit(window, verdict)  # [B, K+1]
      tokens = kv.write_window(state.tokens, commit, state.num_generated)
      # Tokens this step adds inside the image (its last step may accept past it).
      emitted = jnp.where(active, jnp.minimum(verdict.num_accepted + 1,
                                              plan.num_tokens - state.num_generated), 0)
      num_generated = state.num_generated + emitted
      # Rows that are (now) finished keep their old length: their cache is not
      # needed again, and frozen lengths bound the slots any later write touches.
      keep = active & (num_generated < plan.num_tokens)
      new_length = jnp.where(
          keep, _committed_length(old_length, verdict.num_accepted, window.shape[1]), old_length)
      cache = kv.set_lengths(cache, as_rows(new_length, cfg))

    step = mode_base.Step(window=window, hidden=out.hidden, target_probs=target_probs,
                          verdict=verdict, commit=commit, num_generated=num_generated, keep=keep)
    with jax.named_scope('draft'):
      drafts, forwards = mode.advance(plan, draft_params, state.drafts, step, draft_uniforms)
    with jax.named_scope('metrics'):
      metrics = state.metrics.record(active, verdict.num_accepted, emitted, forwards)
      # Drafts are checked where made, for the rows verifying them next: no old drafts kept.
      metrics = metrics.record_nonfinite(active, target_probs, committed=(verdict.path, emitted))
      metrics = metrics.record_nonfinite(keep, None, drafts.probs)
    return LoopState(
        step=state.step + 1,
        tokens=sharding.constrain_batch(tokens, mesh),
        num_generated=num_generated,
        target_cache=sharding.constrain_cache(cache, mesh, pairs),
        drafts=drafts.replace(cache=sharding.constrain_cache(drafts.cache, mesh, pairs)),
        metrics=metrics)

  state = phases.run(  # one while_loop per attention phase (one without phases)
      state, body, unfinished, phase_spans=plan.attention_spans,
      capacity=plan.target_capacity, width=window_width(mode),
      lengths=lambda s: s.target_cache.lengths,
      grown=lambda s, slots: s.replace(target_cache=sharding.constrain_cache(
          phases.grow(s.target_cache, slots), mesh, pairs)))
  return state.tokens[:, :plan.num_tokens], state.metrics


# ---------------------------------------------------------------- public API

_COMPILED = program_cache.ProgramCache()  # (plan, options, argument signature) -> program
_PREPARED: dict = {}  # generate()'s call signature -> (plan, compiled program)

def clear_compile_cache() -> None:
  """Forgets compiled decodes (tests that monkeypatch the loop use it)."""
  _COMPILED.clear()
  _PREPARED.clear()


def _signature(tree):
  """What a compiled decode depends on in its traced arguments: the tree structure and each
  leaf's shape, dtype, weak type and sharding (NumPy and Python leaves: a generic path)."""
  leaves, treedef = jax.tree.flatten(tree)
  return treedef, tuple(
      (x.shape, x.dtype, getattr(x, 'weak_type', False), x.sharding)
      if isinstance(x, jax.Array) else (np.shape(x), jnp.result_type(x), None)
      for x in leaves)


def _arguments(plan: _Plan, target_params, cond, key, rule, sampling, draft_params, draft_cond,
               target_rules, draft_rules) -> tuple:
  """The traced arguments of the compiled decode for one call."""
  # COOL-SD's mean-normalised schedule needs the window length; Vanilla has no rule.
  rule = None if plan.mode.rule_mode is None or rule is None else rule.for_window(plan.mode.slots)
  draft_cond = cond if draft_cond is None else draft_cond
  row_keys = (randomness.per_image_keys(key, plan.num_images) if modes_lib.is_single_key(key)
              else key)
  if (mesh := plan.mesh) is not None:
    target_params = sharding.shard_params(target_params, mesh, target_rules)
    if draft_params is not None:
      draft_params = sharding.shard_params(draft_params, mesh, draft_rules)
    place = lambda tree: jax.device_put(tree, jax.tree.map(
        lambda x: sharding.batch_sharding(x, mesh, plan.rows_per_image), tree))
    cond, draft_cond = place(cond), place(draft_cond)
  return (target_params, draft_params, cond, draft_cond, row_keys, rule, sampling)


def plan_for(target, target_params, cond, num_tokens, key, mode, sampling, rule, draft,
             draft_params, draft_cond, capacity, mesh, attention_phases: int = 1) -> _Plan:
  """Validates one call's arguments and builds its static plan (the compile key).

  The plan holds `sampling=None`: the sampling values are traced arguments
  (`_decode`'s last), so only their CFG flag is static here and the
  arguments' signature holds the Sampling's tree structure (top_k,
  cfg_interval, its flags). Parameters may be abstract (`jax.ShapeDtypeStruct`,
  as `bench/tpu_compile.py` passes them).
  """
  num_images = modes_lib.validate(target, target_params, draft, mode, sampling, rule, cond,
                                  draft_cond, num_tokens, key, draft_params)
  prefix = int(target.prefix_length(cond))
  needed = required_capacity(prefix, num_tokens, mode)
  capacity = needed if checks.check_capacity(capacity) is None else int(capacity)
  kv.check_capacity(capacity, needed, 'generate: target cache')
  draft_capacity = mode.draft_capacity(
      draft=draft, cond=cond if draft_cond is None else draft_cond, prefix=prefix,
      num_tokens=num_tokens)
  return _Plan(target=target, draft=draft, mode=mode, sampling=None, num_tokens=num_tokens,
               num_images=num_images, cfg=sampling.uses_cfg, target_capacity=capacity,
               draft_capacity=draft_capacity, mesh=mesh,
               attention_spans=phases.spans(prefix, num_tokens, window_width(mode), capacity,
                                            attention_phases))


def _prepare(target, target_params, cond, num_tokens, key, mode, sampling, rule, draft,
             draft_params, draft_cond, capacity, mesh, target_rules, draft_rules,
             options, attention_phases: int = 1) -> tuple:
  """Validates one call's arguments and compiles (or reuses) its program; returns
  (plan, compiled program, this call's traced arguments)."""
  checks.check_devices(mesh, target_params=target_params, draft_params=draft_params,
                       cond=cond, draft_cond=draft_cond, key=key)
  plan = plan_for(target, target_params, cond, num_tokens, key, mode, sampling, rule, draft,
                  draft_params, draft_cond, capacity, mesh, attention_phases)
  args = _arguments(plan, target_params, cond, key, rule, sampling, draft_params, draft_cond,
                    target_rules, draft_rules)

  def compile_program():
    start = time.perf_counter()
    # A fresh wrapper (our cache is the only one): no trace of a patched `_decode` is reused.
    program = jax.jit(lambda *a: _decode(*a), static_argnums=0)
    compiled = program.lower(plan, *args).compile(compiler_options=dict(options) or None)
    logging.info('generate: compiled %s for %d images x %d tokens in %.2f s',
                 type(mode).__name__, plan.num_images, num_tokens, time.perf_counter() - start)
    return compiled

  return plan, _COMPILED.get_or_compile((plan, options, _signature(args)), compile_program), args


def generate(target, target_params, cond, *, num_tokens: int, key, mode=Vanilla(),
             sampling: logits_lib.Sampling = logits_lib.Sampling(), rule=None, draft=None,
             draft_params=None, draft_cond=None, capacity: int | None = None,
             mesh=None, target_rules=sharding.LLAMA_RULES, draft_rules=sharding.LLAMA_RULES,
             compiler_options: dict | None = None, attention_phases: int = 1) -> DecodeResult:
  """Generates num_tokens image tokens per image in one compiled while_loop.

  Args:
    target: a `DecodeModel` (frozen dataclass, static under jit).
    target_params: its parameters, placed once by `jax.device_put` or `sharding.shard_params`.
    cond: conditioning of every cache row (model-specific, e.g. class ids
      int32[R]); with CFG (sampling.cfg_scale > 1) rows are [cond; uncond]
      halves (as the models' `cfg_cond` builds them). The engine interleaves
      them once (image b's rows become cache rows 2b, 2b + 1, so over a
      'data' mesh an image's two rows share a device); nothing outside
      the compiled decode sees that layout.
    num_tokens: n image tokens per image.
    key: one PRNG key, or per-image keys [B] (then image b's tokens depend
      only on key[b], whatever the batch).
    mode: Vanilla(), ChainDraft(k, drafter), TreeDraft(tree, drafter),
      Jacobi(window, init), or any other `modes.Mode` subclass.
    sampling: CFG and logits processing, applied identically to target and draft.
      Its cfg_scale, temperature and top_p are traced: a sweep over their
      values reuses one compiled program (crossing cfg_scale = 1,
      temperature = 0 or top_p = 1, or changing top_k, compiles a new one).
    rule: acceptance rule (`specdec_jax.rules`) for every mode but Vanilla.
    draft, draft_params, draft_cond: the drafter (EAGLE-style head or a small
      `DecodeModel`), its parameters and conditioning (default: cond).
    capacity: target cache slots (default: exactly what the decode needs).
    mesh: optional ('data', 'model') mesh; parameters are placed by
      target_rules / draft_rules (regex -> PartitionSpec, see
      `sharding.LLAMA_RULES`) and the loop state is pinned every iteration.
      With a 'model' axis of size m > 1 dividing the vocabulary and
      sampling.topk_blocks left at 1, top-k runs with topk_blocks = m (the
      same tokens, found per vocabulary shard: no all-gather of the logits;
      docs/engine.md "Top-k and top-p").
    compiler_options: passed to XLA when compiling (part of the cache key);
      e.g. `FAST_COMPILE` for tests on CPU, `CPU_LATENCY_OPTIONS` for
      batch-1 decoding on CPU.
    attention_phases: P > 1 runs P loops on a target cache that grows between
      them, so attention reads only the slots each can reach (`phases`): the
      same law, P times the loop's compilation (docs/engine.md).
  Returns:
    DecodeResult(tokens int32[B, n], metrics, compile_seconds, run_seconds);
    compile_seconds (validation plus compilation) is 0.0 when a call with the
    same models, mode, shapes, dtypes, shardings, mesh, partition rules, rule and
    sampling structure ran before: only the conditioning's values are checked
    then (host overhead a few ms: README, "Results").
  Raises:
    ValueError (naming a bad argument, before any compilation), or
    metrics.NonFiniteProbabilitiesError (NaN/inf in a target law that gave a token).
  """
  num_tokens = checks.check_num_tokens(num_tokens)  # before it keys the cache
  options = checks.compiler_options_key(compiler_options)
  target_rules, draft_rules = checks.check_mesh(mesh, target_rules, draft_rules)
  if isinstance(sampling, logits_lib.Sampling):  # static: in the signature
    sampling = vocab_parallel_sampling(sampling, target, mesh)
  rule = checks.float_hyperparameters(rule)  # delta=2 then delta=2.5: one program
  cond, draft_cond = jax.tree.map(  # NumPy conditioning as device arrays: one signature
      lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x, (cond, draft_cond))
  # A repeated call skips validation and compilation: its cheap signature finds the program
  # (new values of rule hyperparameters, cfg_scale, temperature and top_p reuse it).
  call_signature = checks.call_signature(lambda: (
      target, draft, mode, num_tokens, capacity, mesh, options, attention_phases,
      checks.rules_key(mesh, target_rules, draft_rules),
      _signature((target_params, draft_params, cond, draft_cond, key, rule, sampling))))
  prepared = _PREPARED.get(call_signature)
  compile_seconds = 0.0
  if prepared is None:
    start = time.perf_counter()
    plan, compiled, args = _prepare(target, target_params, cond, num_tokens, key, mode,
                                    sampling, rule, draft, draft_params, draft_cond, capacity,
                                    mesh, target_rules, draft_rules, options, attention_phases)
    compile_seconds = time.perf_counter() - start
    _PREPARED[call_signature] = (plan, compiled)
    checks.warn_host_params(target_params, draft_params)  # once per signature
  else:
    plan, compiled = prepared
    checks.check_values(target, draft, mode, cond, draft_cond, plan.cfg)  # every call
    args = _arguments(plan, target_params, cond, key, rule, sampling, draft_params, draft_cond,
                      target_rules, draft_rules)
  start = time.perf_counter()
  tokens, metrics = jax.block_until_ready(compiled(*args))
  return metrics_lib.report_nonfinite(DecodeResult(
      tokens=tokens, metrics=metrics, compile_seconds=compile_seconds,
      run_seconds=time.perf_counter() - start))
