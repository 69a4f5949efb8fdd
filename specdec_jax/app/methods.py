"""The methods the main command compares: a decoding mode, an acceptance rule, a drafter.

`build_methods(config, family)` turns the names in `config.methods`
(configs/generate.py) into `Method`s with their hyperparameters; the main
command, the sampler and the bench scripts share this one catalogue, so a
method means the same thing everywhere results are compared.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from specdec_jax import decode
from specdec_jax import rules


@dataclasses.dataclass(frozen=True)
class Method:
  """One row of the comparison: a decoding mode, a rule and a drafter."""

  name: str
  mode: Any
  rule: Any = None
  drafter: str | None = None  # 'eagle' | 'draft_model' | None
  seed_offset: int = 0
  hyperparameters: dict = dataclasses.field(default_factory=dict)


METHOD_NAMES = ('vanilla', 'vanilla_seed1', 'eagle', 'draft_model', 'lantern_pp', 'uniform',
                'coolsd', 'eagle2', 'sjd', 'scd', 'sjd_pac', 'gsd', 'csd')
# The drafter each drafting method's `Method.drafter` names (the others draft without one),
# known before any model loads.
DRAFTERS = {'eagle': 'eagle', 'draft_model': 'draft_model', 'lantern_pp': 'eagle',
            'uniform': 'eagle', 'coolsd': 'eagle', 'eagle2': 'eagle'}

# The rules a method's `*_rule` hyperparameter may name (configs/generate.py:
# eagle2_rule, scd_rule, sjd_pac_rule), each built by `build_rule` with the
# hyperparameters of the method of that name. The tree-verified methods take
# those whose class declares the tree mode (GSD has no tree form).
RULE_CLASSES = dict(lossless=rules.Lossless, uniform=rules.UniformRelaxed, coolsd=rules.CoolSD,
                    lantern_pp=rules.LanternPP, csd=rules.ContentAware, gsd=rules.Grouped)
RULE_NAMES = tuple(RULE_CLASSES)
TREE_RULE_NAMES = tuple(name for name, rule in RULE_CLASSES.items()
                        if rules.TREE in rule.supports_modes)


def build_rule(name: str, config, family):
  """The acceptance rule `name` (one of RULE_NAMES) with config's hyperparameters."""
  if name == 'lossless':
    return rules.Lossless()
  if name == 'uniform':
    return rules.UniformRelaxed(omega=config.uniform_omega)
  if name == 'coolsd':
    return rules.CoolSD(delta=config.coolsd_delta)
  if name == 'lantern_pp':
    columns = rules.neighbor_columns(config.lantern_k, config.lantern_residual)
    return rules.LanternPP(neighbors=family.neighbors(columns), k=config.lantern_k,
                           lam=config.lantern_lam, residual_mode=config.lantern_residual)
  if name == 'csd':
    return rules.ContentAware(lam=config.csd_lam, tv_threshold=config.csd_tv_threshold)
  if name == 'gsd':
    return rules.Grouped(embeddings=family.token_embeddings(),
                         prob_threshold=config.gsd_prob_threshold,
                         dist_threshold=config.gsd_dist_threshold)
  raise ValueError(f'unknown rule {name!r}; known: {RULE_NAMES}.')


def build_methods(config, family) -> list[Method]:
  """The methods named in config.methods, with their hyperparameters."""
  unknown = [m for m in config.methods if m not in METHOD_NAMES]
  if unknown:
    raise ValueError(f'config.methods has unknown names {unknown}; known: {METHOD_NAMES}.')
  if config.methods[0] != 'vanilla':
    raise ValueError("config.methods must start with 'vanilla' (the speed/drift reference).")
  k, window, init = config.draft_length, config.jacobi_window, config.jacobi_init
  eagle_chain = decode.ChainDraft(k=k, drafter='eagle')
  jacobi = decode.Jacobi(window=window, init=init)
  jacobi_settings = dict(window=window, init=init)
  # Built on demand, so the LANTERN table and GSD's embeddings exist only for
  # the methods that are run.
  def rule(name):
    return build_rule(name, config, family)

  catalogue = {
      'vanilla': lambda: Method('vanilla', decode.Vanilla()),
      'vanilla_seed1': lambda: Method('vanilla_seed1', decode.Vanilla(), seed_offset=1),
      'eagle': lambda: Method('eagle', eagle_chain, rules.Lossless(), 'eagle',
                              hyperparameters=dict(draft_length=k)),
      'draft_model': lambda: Method('draft_model', decode.ChainDraft(k=k, drafter='model'),
                                    rules.Lossless(), 'draft_model',
                                    hyperparameters=dict(draft_length=k)),
      'lantern_pp': lambda: Method('lantern_pp', eagle_chain, rule('lantern_pp'), 'eagle',
                                   hyperparameters=dict(draft_length=k)),
      'uniform': lambda: Method('uniform', eagle_chain, rule('uniform'), 'eagle',
                                hyperparameters=dict(draft_length=k)),
      'coolsd': lambda: Method('coolsd', eagle_chain, rule('coolsd'), 'eagle',
                               hyperparameters=dict(draft_length=k)),
      'eagle2': lambda: Method(
          'eagle2', decode.DynamicTreeDraft(total_tokens=config.eagle2_total_tokens,
                                            depth=config.eagle2_depth,
                                            top_k=config.eagle2_top_k, drafter='eagle',
                                            drafts=config.eagle2_drafts),
          rule(config.eagle2_rule), 'eagle',
          hyperparameters=dict(total_tokens=config.eagle2_total_tokens,
                               depth=config.eagle2_depth, top_k=config.eagle2_top_k,
                               drafts=config.eagle2_drafts, rule=config.eagle2_rule)),
      'sjd': lambda: Method('sjd', jacobi, rules.Lossless(), hyperparameters=dict(jacobi_settings)),
      'scd': lambda: Method('scd', decode.Jacobi(window=window, init=init,
                                                 coupling=config.scd_coupling),
                            rule(config.scd_rule),
                            hyperparameters=dict(jacobi_settings, rule=config.scd_rule,
                                                 coupling=config.scd_coupling)),
      'sjd_pac': lambda: Method('sjd_pac', decode.JacobiPAC(
          window=window, branches=config.pac_branches, depth=config.pac_depth, init=init,
          sibling_law=config.pac_siblings),
          rule(config.sjd_pac_rule),
          hyperparameters=dict(jacobi_settings, branches=config.pac_branches,
                               depth=config.pac_depth, siblings=config.pac_siblings,
                               rule=config.sjd_pac_rule)),
      'gsd': lambda: Method('gsd', jacobi, rule('gsd'), hyperparameters=dict(jacobi_settings)),
      'csd': lambda: Method('csd', jacobi, rule('csd'), hyperparameters=dict(jacobi_settings)),
  }
  return [catalogue[m]() for m in config.methods]


def build_variant(config, family, name: str, **fields) -> Method:
  """Method `name` as `build_methods` builds it from a copy of config with `fields`
  set (e.g. scd_coupling='gumbel'); config itself is unchanged."""
  variant = config.copy_and_resolve_references()
  variant.update(dict(fields, methods=('vanilla', name)))
  return build_methods(variant, family)[-1]


def parse_pac_tree(text: str) -> tuple[int, int]:
  """(K, D) of an SJD-PAC tree written 'KxD' (K candidates at each of the first D drafts)."""
  branches, _, depth = text.partition('x')
  if not (branches.isdigit() and depth.isdigit()):
    raise ValueError(f"SJD-PAC trees are written 'KxD' (e.g. 4x2), got {text!r}.")
  return int(branches), int(depth)


def pac_tree_variants(config, family, texts) -> list[Method]:
  """SJD-PAC methods with other proactive trees: one per 'KxD' in texts, named
  'sjd_pac_KxD', built as `build_variant` builds them (the benches' --pac_trees)."""
  variants = []
  for text in texts:
    branches, depth = parse_pac_tree(text)
    method = build_variant(config, family, 'sjd_pac', pac_branches=branches, pac_depth=depth)
    variants.append(dataclasses.replace(method, name=f'sjd_pac_{text}'))
  return variants


def rule_hyperparameters(rule) -> dict:
  """The scalar fields of a rule (floats, ints, strings, bools) for results.json."""
  if rule is None or not dataclasses.is_dataclass(rule):
    return {}
  out = {}
  for field in dataclasses.fields(rule):
    value = getattr(rule, field.name)
    if isinstance(value, (bool, int, float, str)) or value is None:
      out[field.name] = value
    elif hasattr(value, 'ndim') and getattr(value, 'ndim') == 0:
      out[field.name] = float(value)
  return out
