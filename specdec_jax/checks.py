"""Argument checks of `decode.generate` that are not a mode's or a model's own.

Legend: B images, R cache rows.

Each raises ValueError naming the argument, the bad value and what to pass,
before anything is traced or compiled. `check_values` is the part a repeated
call cannot skip: the compiled-program cache is keyed on shapes and dtypes,
so values (class ids, padding masks) are checked on every call.

Models may declare two optional hooks (`protocol.DecodeModel`):
  `check_cond(cond)`: validates a concrete condition's values (ids in range,
    left padding); the models' prefill runs the same checks on shapes only
    when traced.
  `max_image_tokens`: the most image tokens one decode may generate (LlamaGen:
    its grid, `block_size`); absent means unbounded.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
import inspect
import re
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, PartitionSpec

from specdec_jax import drafting
from specdec_jax import rule_base


def is_int(value) -> bool:
  """A Python or NumPy int, not a bool (nor a float or string)."""
  return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def check_int_field(owner, name: str) -> None:
  """Raises unless the field `name` of a mode is a Python or NumPy int (not a bool)."""
  value = getattr(owner, name)
  if not is_int(value):
    raise ValueError(f'generate: {type(owner).__name__}.{name} must be an int, got {value!r}.')


def check_num_tokens(num_tokens) -> int:
  """num_tokens as an int >= 1 (a bool, float or string is refused)."""
  if not is_int(num_tokens) or num_tokens < 1:
    raise ValueError(f'generate: num_tokens must be an int >= 1 (image tokens per image), '
                     f'got {num_tokens!r}.')
  return int(num_tokens)


def check_capacity(capacity):
  """capacity as given, if None or an int (target cache slots); else ValueError."""
  if capacity is not None and not is_int(capacity):
    raise ValueError(f'generate: capacity must be an int (target cache slots) or None, got '
                     f'{capacity!r}.')
  return capacity


def check_attention_phases(phases) -> int:
  """`generate`'s attention_phases: an int >= 1 (1: one loop attending over the whole cache)."""
  if not is_int(phases) or phases < 1:
    raise ValueError(f'generate: attention_phases must be an int >= 1 (1 attends over the whole '
                     f'cache in one loop; P > 1 splits the decode into P loops whose '
                     f'attention reads a growing prefix of the cache), got {phases!r}.')
  return int(phases)


def compiler_options_key(options) -> tuple:
  """The XLA options (a dict or None) as sorted (name, value) pairs, the cache key."""
  if options is not None and not isinstance(options, Mapping):
    raise ValueError(f'generate: compiler_options must be a dict of XLA options or None, got '
                     f'{options!r}.')
  return tuple(sorted((options or {}).items()))


def check_max_tokens(model, num_tokens: int, what: str) -> None:
  """Raises if the model declares fewer image tokens than num_tokens."""
  limit = getattr(model, 'max_image_tokens', None)
  if limit is not None and num_tokens > int(limit):
    raise ValueError(f'generate: num_tokens={num_tokens} exceeds the {int(limit)} image tokens '
                     f'{what} {type(model).__name__} has (its image grid); pass at most '
                     f'{int(limit)}.')


def _required_positional(method) -> int | None:
  """How many positional parameters `method` needs (None if it cannot be read)."""
  try:
    parameters = inspect.signature(method).parameters.values()
  except (TypeError, ValueError):
    return None
  return sum(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
             for p in parameters)


def check_drafter_kind(drafter: str, draft) -> None:
  """Raises unless `draft` has the interface its drafter kind feeds.

  'eagle': an EAGLE-style head, forward(params, cache, tokens, features);
  'model': a `DecodeModel` (prefix_length, prefill(params, cache, cond),
  forward(params, cache, tokens)).
  """
  is_head = _required_positional(getattr(draft, 'forward', None)) == 4
  if drafter == drafting.EAGLE and not is_head:
    raise ValueError(
        f"generate: drafter='eagle' needs an EAGLE-style head (forward(params, cache, "
        f'tokens, features), e.g. models.eagle.EagleDrafter), got {type(draft).__name__}; '
        "for a small autoregressive draft model use drafter='model'.")
  if drafter == drafting.MODEL and (is_head or not all(
      callable(getattr(draft, name, None)) for name in ('prefix_length', 'prefill', 'forward'))):
    raise ValueError(
        f"generate: drafter='model' needs a DecodeModel draft (prefix_length, "
        f'prefill(params, cache, cond), forward(params, cache, tokens)), got '
        f"{type(draft).__name__}; for an EAGLE-style head use drafter='eagle'.")


def check_rule(rule, what: str = 'generate') -> None:
  """Raises unless rule is an acceptance rule (`rules.Rule`); None only for generate."""
  if (rule is not None or what != 'generate') and not isinstance(rule, rule_base.Rule):
    raise ValueError(f'{what}: rule must be an acceptance rule from specdec_jax.rules '
                     f'(e.g. rules.Lossless(), rules.CoolSD(delta=2.0)), got {rule!r}.')


def float_hyperparameters(rule):
  """The rule with its concrete scalar hyperparameters as Python floats.

  Every scalar leaf of a rule is a real-valued hyperparameter; as traced arguments an
  int (delta=2), a float (delta=2.5) and a 0-d jnp array differ in dtype, weak type or
  sharding and would each compile the decode anew. Tracers, arrays of one or more
  dimensions (neighbour tables, embeddings) and bools stay as they are; anything
  that is not a rule is returned unchanged (`check_rule` names it).
  """
  if not isinstance(rule, rule_base.Rule):
    return rule

  def as_float(x):
    number = None if isinstance(x, (bool, np.bool_)) else rule_base._concrete(x)  # pylint: disable=protected-access
    return x if number is None else number

  return jax.tree.map(as_float, rule)


def warn_host_params(target_params, draft_params) -> None:
  """Warns when parameters hold NumPy arrays (the converters' loaders give them):
  every call then copies them to the devices again."""
  if any(isinstance(x, np.ndarray) for x in jax.tree.leaves((target_params, draft_params))):
    warnings.warn(
        'generate: the parameters hold NumPy arrays, which every call copies to the '
        'devices again; place them once with jax.device_put(params) (with a mesh: '
        'sharding.shard_params(params, mesh)) and pass the result.', stacklevel=3)


def check_key(key, num_images: int) -> None:
  """Raises unless key is one PRNG key or B per-image keys.

  Accepted: a typed key (`jax.random.key(seed)`) or typed keys [B]
  (`jax.random.split(key, B)`), or raw uint32 keys [2] / [B, 2]
  (`jax.random.PRNGKey`).
  """
  shape = tuple(jnp.shape(key)) if hasattr(key, 'shape') else None
  dtype = getattr(key, 'dtype', None)
  typed = dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)
  if typed and shape in ((), (num_images,)):
    return
  if not typed and dtype == jnp.uint32 and shape in ((2,), (num_images, 2)):
    return
  raise ValueError(
      f'generate: key must be jax.random.key(seed), per-image keys [B={num_images}] '
      f'(jax.random.split(key, {num_images})) or raw uint32 keys [2] / [{num_images}, 2]; '
      f'got {type(key).__name__} of shape {shape} and dtype {dtype}.')


def check_mesh(mesh, target_rules=None, draft_rules=None) -> tuple:
  """Raises unless mesh is None or a ('data', 'model') Mesh, with partition rules
  (None: not checked). Returns (target_rules, draft_rules), a one-shot iterable
  (a generator) read into a tuple, as the rules are read more than once."""
  target_rules, draft_rules = (tuple(rules) if isinstance(rules, Iterator) else rules
                               for rules in (target_rules, draft_rules))
  if mesh is None:
    return target_rules, draft_rules
  if not isinstance(mesh, Mesh):
    raise ValueError(f'generate: mesh must be a jax.sharding.Mesh with axes (data, model) '
                     f'(sharding.make_mesh(data, model)) or None, got {mesh!r}.')
  missing = [axis for axis in ('data', 'model') if axis not in mesh.axis_names]
  if missing:
    raise ValueError(f'generate: mesh axes {tuple(mesh.axis_names)} lack {missing}; the engine '
                     "splits images over 'data' and heads over 'model': build the mesh with "
                     'sharding.make_mesh(data, model) (size 1 for an unused axis).')
  not_auto = {axis: kind.name for axis, kind in zip(mesh.axis_names, mesh.axis_types)
              if axis in ('data', 'model') and kind != AxisType.Auto}
  if not_auto:
    raise ValueError(f'generate: mesh axes {not_auto} must be AxisType.Auto (jax.make_mesh '
                     'makes Explicit axes by default): build the mesh with '
                     'sharding.make_mesh(data, model), or pass axis_types=(AxisType.Auto,) * '
                     '2 to jax.make_mesh (docs/sharding.md).')
  for name, rules in (('target_rules', target_rules), ('draft_rules', draft_rules)):
    if rules is not None:
      check_partition_rules(name, rules, mesh)
  return target_rules, draft_rules


def check_devices(mesh, **trees) -> None:
  """Without a mesh the program runs on one set of devices, so every committed array
  (placed by jax.device_put) must sit on the same ones; raises naming where each is."""
  if mesh is not None:
    return
  where = {}
  for name, tree in trees.items():
    for leaf in jax.tree.leaves(tree):
      if isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer) and leaf.committed:
        ids = tuple(sorted(device.id for device in leaf.sharding.device_set))
        where.setdefault(ids, []).append(name)
  if len(where) > 1:
    listed = '; '.join(f'{", ".join(dict.fromkeys(names))} on device ids {list(ids)}'
                       for ids, names in where.items())
    raise ValueError(
        f'generate: without a mesh every array must be on the same devices, but {listed}. '
        'Put them on one device (jax.device_put(params, jax.devices()[0])), or pass '
        'mesh=sharding.make_mesh(data, model) to split images and heads over devices '
        '(README, "Sharding").')


def check_partition_rules(name: str, rules, mesh: Mesh) -> None:
  """Raises unless rules are (regex, PartitionSpec) pairs naming only mesh axes."""
  try:
    pairs = [tuple(rule) for rule in rules]
  except TypeError:
    pairs = None
  for pair in pairs or [None]:
    ok = (pair is not None and len(pair) == 2 and isinstance(pair[0], (str, re.Pattern))
          and isinstance(pair[1], PartitionSpec))
    if ok:
      axes = {axis for entry in pair[1] if entry is not None
              for axis in (entry if isinstance(entry, tuple) else (entry,))}
      ok = axes <= set(mesh.axis_names)
    if not ok:
      raise ValueError(f'generate: {name} must be (regex, PartitionSpec) pairs over the mesh '
                       f'axes {tuple(mesh.axis_names)}, as sharding.LLAMA_RULES; got '
                       f'{rules!r}.')


def call_signature(build) -> Any:
  """build(), hashable; where an argument of the wrong kind breaks it, a fresh object
  that matches no cached program (the validation that follows names the argument)."""
  try:
    signature = build()
    hash(signature)
  except TypeError:
    return object()
  return signature


def rules_key(mesh, target_rules, draft_rules) -> Any:
  """What the partition rules add to the compiled-program key (None without a mesh)."""
  if mesh is None:
    return None
  return tuple(tuple(rule) for rule in target_rules), tuple(tuple(rule) for rule in draft_rules)


def _concrete(tree) -> bool:
  """Every leaf holds values (not a tracer or a `jax.ShapeDtypeStruct`)."""
  return all(isinstance(x, (np.ndarray, np.generic, jax.Array, int, float))
             and not isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))


def check_values(target, draft, mode, cond, draft_cond, guided: bool = False) -> None:
  """The value checks of the conditioning (`check_cond` hooks, then
  `check_cfg_cond` when sampling guides, `check_unguided_cond` when it does
  not), run on every call."""
  if _concrete(cond):
    for hook in ('check_cond', 'check_cfg_cond' if guided else 'check_unguided_cond'):
      check = getattr(target, hook, None)
      if check is not None:
        check(cond)
  if draft is not None and getattr(mode, 'drafter', None) is not None:
    draft_cond = cond if draft_cond is None else draft_cond
    check = getattr(draft, 'check_cond', None)
    if check is not None and _concrete(draft_cond):
      check(draft_cond)
