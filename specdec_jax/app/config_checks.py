"""What the command-line configs' values may be: check tables for `cli.check_fields`.

The sampling and method-hyperparameter tables are shared by the main command
(`configs/generate.py`) and the sampler (`configs/sample_*.py`, under
`hparams`); their ranges are those the rules, modes and `logits.Sampling`
accept, so a bad value stops the command before any model loads. Bounds that
depend on the model family (tokens per image, vocabulary, classes) are
checked by `check_for_family` once it is loaded, before anything compiles.
"""

from __future__ import annotations

from specdec_jax import dynamic_tree
from specdec_jax import jacobi_drafts
from specdec_jax import mode_pac
from specdec_jax import rules
from specdec_jax.app import cli
from specdec_jax.app import family as family_lib
from specdec_jax.app import files
from specdec_jax.app import methods as methods_lib

# jax.random.key takes a uint32 seed (without x64): a larger one is silently
# reduced modulo 2**32, giving another seed's images.
MAX_KEY_SEED = 2**32 - 1
# What the main command adds to config.seed (`generate.quality_pass`,
# `generate._timed_call`): 1000 * a method's seed_offset (at most 1,
# vanilla_seed1), and 7919 * (class + 1) for a latency class.
SEED_OFFSET_STEP, LATENCY_CLASS_SEED_STEP, MAX_METHOD_SEED_OFFSET = 1000, 7919, 1

SAMPLING = dict(
    cfg_scale=cli.number(minimum=1.0, note='1.0 = no guidance'),
    cfg_interval=cli.integer(-1, note='-1 = guide every token'),
    temperature=cli.number(minimum=0.0, note='0 = greedy'),
    top_k=cli.integer(0, note='0 = off'),
    top_p=cli.number(above=0.0, maximum=1.0, note='1.0 = off'))

HYPERPARAMETERS = dict(
    draft_length=cli.integer(1, note='and below the tokens per image'),
    jacobi_window=cli.integer(2, note='and at most the tokens per image'),
    jacobi_init=cli.one_of(*jacobi_drafts.INITS),
    pac_branches=cli.integer(2, note='SJD-PAC candidates per branching draft'),
    pac_depth=cli.integer(1, note='and below jacobi_window'),
    pac_siblings=cli.one_of(*mode_pac.SIBLING_LAWS),
    coolsd_delta=cli.number(above=0.0),
    uniform_omega=cli.number(above=0.0),
    lantern_k=cli.integer(1, note='and below the vocabulary size'),
    lantern_lam=cli.number(minimum=1.0),
    lantern_residual=cli.one_of(*rules._LANTERN_RESIDUALS),  # pylint: disable=protected-access
    csd_lam=cli.number(minimum=0.0),
    csd_tv_threshold=cli.number(minimum=0.0, maximum=1.0),
    gsd_prob_threshold=cli.number(above=0.0),
    gsd_dist_threshold=cli.number(above=0.0),
    eagle2_drafts=cli.one_of(*dynamic_tree.DRAFTS),
    eagle2_total_tokens=cli.integer(2, note='and at most 1 + top_k + depth * top_k^2'),
    eagle2_depth=cli.integer(1),
    eagle2_top_k=cli.integer(1, note='and at most the vocabulary size'),
    eagle2_rule=cli.one_of(*methods_lib.TREE_RULE_NAMES),
    scd_rule=cli.one_of(*methods_lib.RULE_NAMES),
    scd_coupling=cli.one_of(*[c for c in jacobi_drafts.COUPLINGS if c != 'none']),
    sjd_pac_rule=cli.one_of(*methods_lib.TREE_RULE_NAMES))


def main_command(method_names: tuple[str, ...]) -> dict:
  """The table of `configs/generate.py` (methods from `method_names`, 'vanilla' first)."""
  methods = cli.Check(
      lambda v: (isinstance(v, (tuple, list)) and len(v) > 0 and v[0] == 'vanilla'
                 and set(v) <= set(method_names) and len(set(v)) == len(v)),
      f"a tuple of distinct names of {method_names}, 'vanilla' first")
  return dict(
      bundle_dir=cli.STRING,
      seed=cli.integer(0, MAX_KEY_SEED, "less the offsets for the family's classes"),
      images_per_class=cli.integer(1),
      latency_classes=cli.integers(0, nonempty=True), timing_repeats=cli.integer(1),
      compile_threads=cli.integer(1), quality_batch=cli.integer(0),
      side_by_side_per_class=cli.integer(1), grid_scale=cli.integer(1),
      xla_cpu_single_thread=cli.BOOL, xla_cpu_plain_reductions=cli.BOOL,
      compilation_cache=cli.STRING, sampling=SAMPLING, methods=methods, **HYPERPARAMETERS)


def check_bundle_dir(bundle_dir: str, where: str, required: bool = False) -> None:
  """'' (the bundled family; `required`: it must be in this build) or a complete bundle."""
  if (bundle_dir or required) and not family_lib.bundle_available(bundle_dir or None):
    raise cli.ConfigError(f'{where}={bundle_dir!r} is not a complete model bundle (parts '
                          f'{family_lib.PARTS}); leave it empty for the bundled family, or '
                          'build one with `python -m specdec_jax.app.train.family`.')


# The methods that run a rule named by a hyperparameter (`methods.build_methods`).
RULE_FIELDS = dict(eagle2='eagle2_rule', scd='scd_rule', sjd_pac='sjd_pac_rule')


def uses_rule(hyperparameters, rule: str, methods) -> bool:
  """Whether one of `methods` (None: every method) runs the acceptance rule `rule`,
  as the method of that name or through its *_rule hyperparameter."""
  if methods is None:
    return True
  return rule in methods or any(hyperparameters[field] == rule
                                for method, field in RULE_FIELDS.items() if method in methods)


def lantern_k_accepted(residual: str, vocab: int) -> str:
  """The words for the lantern_k a vocabulary of `vocab` tokens allows."""
  extra = rules.neighbor_columns(0, residual)  # columns read beyond lantern_k
  if not extra:
    return f'below the vocabulary size {vocab}'
  return (f'below {vocab - extra}: with lantern_residual={residual!r} the rule reads '
          f'lantern_k + {extra} nearest neighbours of a token among the other {vocab - 1} '
          f'of the vocabulary (or pass lantern_residual=\'optimal\')')


def main_seed_limit(num_classes: int) -> int:
  """The largest seed of the main command whose every key seed (seed + the method's
  and the latency class's offsets, any class of the family) fits in uint32."""
  return (MAX_KEY_SEED - SEED_OFFSET_STEP * MAX_METHOD_SEED_OFFSET
          - LATENCY_CLASS_SEED_STEP * num_classes)


def check_main_seed(seed: int, family: family_lib.Family, where: str) -> None:
  limit = main_seed_limit(family.num_classes)
  if seed > limit:
    raise cli.ConfigError(
        f'{where}={seed}: must be at most {limit}. The main command adds up to '
        f'{MAX_KEY_SEED - limit} to it ({SEED_OFFSET_STEP} for vanilla_seed1, '
        f'{LATENCY_CLASS_SEED_STEP} * (class + 1) for a latency class; this family has '
        f'{family.num_classes} classes), and a key seed above 2**32 - 1 would be taken '
        'modulo 2**32, repeating a smaller seed\'s images.')


def check_for_family(hyperparameters, family: family_lib.Family, where: str,
                     methods=None) -> None:
  """The bounds that depend on the loaded family: draft_length < L, jacobi_window <=
  L (L tokens per image), eagle2_top_k <= V (vocabulary), the EAGLE-2 tree's node
  budget; when `methods` (the names that will run; None: all) run LANTERN++ (as a
  method or a *_rule), the neighbour columns it reads (`rules.neighbor_columns`)
  below V; when they include sjd_pac, pac_depth < jacobi_window (SJD-PAC's tree
  lies inside the Jacobi window) and the tree's size (`mode_pac.MAX_TREE_NODES`);
  and with a `seed` (the main command's config), `main_seed_limit`."""
  if 'seed' in hyperparameters:  # the sampler's seed has no offsets: its table bounds it
    check_main_seed(hyperparameters.seed, family, f'{where}.seed')
  tokens, vocab = family.num_tokens, family.target.vocab_size
  lantern_k, residual = hyperparameters.lantern_k, hyperparameters.lantern_residual
  lantern = uses_rule(hyperparameters, 'lantern_pp', methods)
  most_tree_tokens = 1 + dynamic_tree.num_candidates(hyperparameters.eagle2_top_k,
                                                     hyperparameters.eagle2_depth)
  pac = methods is None or 'sjd_pac' in methods
  window, depth = hyperparameters.jacobi_window, hyperparameters.pac_depth
  pac_nodes = (mode_pac.pac_tree_nodes(window, hyperparameters.pac_branches, depth)
               if depth < window <= tokens else 0)  # else refused below
  for field, ok, accepted in (
      ('draft_length', hyperparameters.draft_length < tokens,
       f'below the {tokens} tokens per image'),
      ('jacobi_window', hyperparameters.jacobi_window <= tokens,
       f'at most the {tokens} tokens per image'),
      ('lantern_k', not lantern or rules.neighbor_columns(lantern_k, residual) < vocab,
       lantern_k_accepted(residual, vocab)),
      ('eagle2_top_k', hyperparameters.eagle2_top_k <= vocab,
       f'at most the vocabulary size {vocab}'),
      ('eagle2_total_tokens', hyperparameters.eagle2_total_tokens <= most_tree_tokens,
       'at most 1 + eagle2_top_k + eagle2_depth * eagle2_top_k^2'),
      ('pac_depth', not pac or depth < window, f'below jacobi_window={window}'),
      ('pac_branches', not pac or pac_nodes <= mode_pac.MAX_TREE_NODES,
       f'small enough that SJD-PAC\'s tree, pac_branches + ... + pac_branches**pac_depth + '
       f'jacobi_window - pac_depth = {pac_nodes} nodes, is at most '
       f'{mode_pac.MAX_TREE_NODES} (or pass a smaller pac_depth)')):
    if not ok:
      raise cli.ConfigError(f'{where}.{field}={hyperparameters[field]!r}: must be {accepted}.')


def check_output_folder(path: str, where: str) -> None:
  """Raises ConfigError when the output folder `path` cannot be made (it, or a
  folder above it, is a file, or the name is empty)."""
  problem = 'an empty name' if not str(path).strip() else files.folder_problem(path)
  if problem:
    raise cli.ConfigError(f'{where}={path!r}: {problem}. Name a folder (a new one, or one '
                          'this command wrote).')


def check_classes(classes, family: family_lib.Family, where: str) -> None:
  bad = [c for c in classes if c >= family.num_classes]
  if bad:
    raise cli.ConfigError(f'{where} has {bad}, outside [0, {family.num_classes}) for this '
                          'model.')
