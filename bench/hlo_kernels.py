"""Counting the kernels one decode iteration launches, from a compiled program's HLO text.

A kernel here is what a backend runs as one step of the loop body: every
instruction of the decode loop's body (and of the computations it calls as
control flow: nested loops, conditionals, calls) except the free ones
(parameters, constants, tuples, bitcasts, the `-done` halves of async ops). A
fusion is one kernel, however many ops it fused; a nested `while` is counted
as a loop and its body's kernels are counted its trip count times (once if
XLA does not know the trip count: `unknown_trip_counts`). Asynchronous data
moves that TPU programs start between kernels (`slice-start`, `copy-start`:
weights and cache slices prefetched into faster memory) are counted apart,
as `async_moves`, not as kernels.

Each kernel is attributed to the piece of the loop that emitted it: the first
op-name scope after the decode loop's `while/body/` (`decode._decode` names
its pieces with `jax.named_scope`: window, target_forward, target_probs,
verify, commit, draft, metrics). Pieces outside the model forwards are what
the loop itself costs.

Works on any backend's optimized HLO (`compiled.as_text()`): XLA:CPU and the
deviceless TPU programs of `bench/tpu_compile.py`.
"""

from __future__ import annotations

import collections
import re

import tpu_compile_hlo as hlo  # bench/tpu_compile_hlo.py

FREE_OPCODES = frozenset({'parameter', 'constant', 'get-tuple-element', 'tuple', 'bitcast',
                          'after-all', 'partition-id', 'replica-id', 'opt-barrier'})
ASYNC_MOVES = frozenset({'slice-start', 'copy-start'})
# TPU custom calls that only reinterpret a buffer's layout (no kernel of their own).
FREE_CUSTOM_CALLS = ('custom_call_target="ConcatBitcast"',)
# Scopes that hold the model forwards (the rest is the loop's own work).
FORWARD_SCOPES = ('target_forward',)
# A drafter's forwards run inside the 'draft' scope under the drafter's module name.
DRAFTER_MODULES = ('DrafterModule', 'GPTModule', '_TinyLM', 'ChameleonLM', 'JanusGenLM')
# Code without the named scopes (before they were added): a target module
# right after 'while/body/' is the target forward, an EAGLE head the drafter's.
TARGET_MODULES = ('GPTModule', 'ChameleonLM', 'JanusGenLM', '_TinyLM')
_CONTROL = re.compile(r'\b(?:body|condition|true_computation|false_computation)=%?([\w.\-]+)')


def kernel_kind(instruction: hlo.Instruction) -> str:
  """fusion / custom-call / copy / while / conditional / scatter / ... (the opcode,
  with copy-start folded into copy and async collectives into their start)."""
  opcode = instruction.opcode
  if opcode in ('copy', 'copy-start'):
    return 'copy'
  if opcode.endswith('-start'):
    return opcode[:-len('-start')]
  return opcode


def scope_of(op_name: str) -> str:
  """The decode-loop piece of an op name: the scope after the first 'while/body/'."""
  marker = 'while/body/'
  index = op_name.find(marker)
  if index < 0:
    return 'unattributed'
  rest = op_name[index + len(marker):]
  scope = rest.split('/', 1)[0]
  if scope == 'draft' and any(m in rest for m in DRAFTER_MODULES):
    return 'draft/forward'
  if scope == 'DrafterModule':
    return 'draft/forward'
  if scope in TARGET_MODULES:
    return 'target_forward'
  return scope or 'unattributed'


def _control_callees(instruction: hlo.Instruction) -> list[str]:
  names = _CONTROL.findall(instruction.attributes)
  for group in hlo._BRANCHES.findall(instruction.attributes):  # pylint: disable=protected-access
    names += [n.strip().lstrip('%') for n in group.split(',') if n.strip()]
  if instruction.opcode == 'call':
    names += re.findall(r'to_apply=%?([\w.\-]+)', instruction.attributes)
  return names


def loop_kernels(hlo_text: str) -> dict:
  """Kernels per decode iteration, by piece and by kind.

  Returns:
    {'found_loop': bool, 'total': int, 'outside_forwards': int,
     'by_scope': {scope: {kind: count}}, 'by_kind': {kind: count},
     'nested_loops': [(scope, op name, trip count or None)],
     'unknown_trip_counts': int, 'instructions': {instruction name: scope}}
    Counts are per iteration (nested loop bodies times their trip counts).
  """
  computations, entry = hlo.parse(hlo_text)
  loop = hlo.decode_loop(computations, entry)
  if loop is None:
    return {'found_loop': False}
  by_scope = collections.defaultdict(collections.Counter)
  moves = collections.Counter()
  nested, names = [], {}
  unknown = 0

  def walk(name: str, times: int, outer_scope: str, depth: int = 0):
    nonlocal unknown
    if depth > 32 or name not in computations:
      return
    local = {}  # instruction name -> scope, in this computation
    for instruction in computations[name]:
      scope = scope_of(instruction.op_name)
      if scope == 'unattributed':
        # No op name (XLA rewrote the op, or it is loop plumbing): the piece
        # of its first attributed operand, else of the enclosing loop or call.
        inherited = [local[o] for o in instruction.operand_names
                     if local.get(o, 'unattributed') != 'unattributed']
        scope = inherited[0] if inherited else outer_scope
      local[instruction.name] = scope
      if instruction.opcode in FREE_OPCODES or instruction.opcode.endswith('-done'):
        continue
      if instruction.opcode == 'custom-call' and any(
          target in instruction.attributes for target in FREE_CUSTOM_CALLS):
        continue
      names[instruction.name] = scope
      if instruction.opcode in ASYNC_MOVES:
        moves[scope] += times
        continue
      if instruction.opcode in ('call',):
        for callee in _control_callees(instruction):
          walk(callee, times, scope, depth + 1)
        continue
      by_scope[scope][kernel_kind(instruction)] += times
      inner = times
      if instruction.opcode == 'while':
        trip = hlo._trip_count(computations, instruction)  # pylint: disable=protected-access
        nested.append((scope, instruction.op_name, trip))
        if trip is None:
          unknown += 1
        else:
          inner = times * trip
      for callee in _control_callees(instruction):
        walk(callee, inner, scope, depth + 1)

  for callee in _control_callees(loop):
    walk(callee, 1, 'unattributed')
  by_kind = collections.Counter()
  for counts in by_scope.values():
    by_kind.update(counts)
  forwards = sum(sum(by_scope[s].values()) for s in by_scope
                 if s in FORWARD_SCOPES or s == 'draft/forward')
  total = sum(by_kind.values())
  return {'found_loop': True, 'total': total, 'outside_forwards': total - forwards,
          'by_scope': {s: dict(c) for s, c in sorted(by_scope.items())},
          'by_kind': dict(by_kind), 'nested_loops': nested, 'unknown_trip_counts': unknown,
          'async_moves': sum(moves.values()), 'instructions': names}


def summary_row(counts: dict) -> dict:
  """The headline numbers of `loop_kernels` (no per-instruction map), for JSON tables."""
  if not counts.get('found_loop'):
    return {'found_loop': False}
  outside = collections.Counter()
  for scope, kinds in counts['by_scope'].items():
    if scope not in FORWARD_SCOPES and scope != 'draft/forward':
      outside.update(kinds)
  return {
      'total': counts['total'],
      'outside_forwards': counts['outside_forwards'],
      'outside_by_kind': dict(outside),
      'nested_loops_outside_forwards': sum(
          1 for scope, _, _ in counts['nested_loops']
          if scope not in FORWARD_SCOPES and scope != 'draft/forward'),
      'nested_loops': len(counts['nested_loops']),
      'by_scope': {s: sum(k.values()) for s, k in counts['by_scope'].items()},
      'unknown_trip_counts': counts['unknown_trip_counts'],
      'async_moves': counts['async_moves'],
      # Nested loops by what emitted them: XLA's own loops around partitioned
      # matmuls (collective/windowed einsums), or anything else (per-row writes...).
      'nested_matmul_loops': sum(1 for _, op, _ in counts['nested_loops'] if 'dot_general' in op),
  }
