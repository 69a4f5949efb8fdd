"""Reading a compiled decode's optimized HLO text: its loop, collectives and host transfers.

`compiled.as_text()` of an SPMD-partitioned program is the per-device module:
shapes are the shards one device holds. This module finds the decode's
`lax.while_loop` in it and lists what runs inside its body (nested
computations included), so a benchmark or a test can say what one iteration
communicates.

Collectives are counted where they are issued: an async pair
(`all-gather-start` / `all-gather-done`) counts once, at its start. A
collective inside a nested while loop with a `known_trip_count` is counted
that many times per iteration; one whose nested trip count XLA does not know
is counted once and flagged (`unknown_trip_counts`); a trip count is also
read off a loop condition of the form `counter < constant` (XLA's scatter
loops), assuming the counter starts at 0.

The optimized text prints operands by name only, so operand bytes are looked
up from the operands' own result types in the same computation.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import re

COLLECTIVES = ('all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all', 'collective-permute',
               'ragged-all-to-all', 'collective-broadcast')
# Ops that move data between host and device.
HOST_OPS = ('send', 'recv', 'send-done', 'recv-done', 'infeed', 'outfeed')
# custom-call targets of host callbacks (jax.pure_callback / io_callback /
# debug.print) and of host memory offloading.
HOST_CALL_PATTERN = re.compile(r'callback|MoveToHost|MoveToDevice|host', re.IGNORECASE)

_BYTES = {'pred': 1, 's4': 0.5, 'u4': 0.5, 's8': 1, 'u8': 1, 's16': 2, 'u16': 2, 'f16': 2,
          'bf16': 2, 's32': 4, 'u32': 4, 'f32': 4, 's64': 8, 'u64': 8, 'f64': 8, 'c64': 8,
          'c128': 16}
_SHAPE = re.compile(r'\b(pred|[subfc]\d+|f8e\w+|bf16)\[([\d,]*)\]')
# A shape with its optional layout; memory space S(k) (k > 0: not HBM) sits in the layout.
_SHAPE_LAYOUT = re.compile(r'\b(pred|[subfc]\d+|f8e\w+|bf16)\[([\d,]*)\](\{[^}]*\})?')
_HEADER = re.compile(r'^(ENTRY )?%?([\w.\-]+) \(.*\) -> .*\{$')
_INSTRUCTION = re.compile(r'^\s*(ROOT )?%?([\w.\-]+) = (.*)$')
_CALLED = re.compile(r'\b(?:calls|to_apply|body|condition|true_computation|false_computation|'
                     r'select|scatter)=%?([\w.\-]+)')
_BRANCHES = re.compile(r'branch_computations=\{([^}]*)\}')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def shape_bytes(text: str) -> int:
  """Bytes of every array shape written in `text` (e.g. a tuple type)."""
  total = 0.0
  for dtype, dims in _SHAPE.findall(text):
    size = _BYTES.get(dtype, 1)
    total += size * math.prod(int(d) for d in dims.split(',') if d)
  return int(total)


def hbm_shapes_bytes(text: str) -> int:
  """Bytes of the shapes in `text` that live in HBM (no memory space S(k), k > 0)."""
  total = 0.0
  for dtype, dims, layout in _SHAPE_LAYOUT.findall(text):
    space = re.search(r'S\((\d+)\)', layout or '')
    if space and space.group(1) != '0':
      continue
    total += _BYTES.get(dtype, 1) * math.prod(int(d) for d in dims.split(',') if d)
  return int(total)


def _tuple_elements(type_text: str) -> list[str]:
  """Top-level elements of a tuple type text '(a, (b), c)'."""
  inner, parts, depth, current = type_text[1:-1], [], 0, ''
  for char in inner:
    depth += {'(': 1, ')': -1, '{': 1, '}': -1, '[': 1, ']': -1}.get(char, 0)
    if char == ',' and depth == 0:
      parts.append(current)
      current = ''
    else:
      current += char
  return parts + [current] if current.strip() else parts


@dataclasses.dataclass
class Instruction:
  name: str
  result_type: str  # the result type text (a tuple type keeps its parentheses)
  opcode: str
  operands: str  # the operand list text (names only in optimized HLO)
  attributes: str  # everything after the operand list
  root: bool = False

  @property
  def operand_names(self) -> list[str]:
    return re.findall(r'%([\w.\-]+)', self.operands)

  @property
  def called(self) -> list[str]:
    names = _CALLED.findall(self.attributes)
    for group in _BRANCHES.findall(self.attributes):
      names += [n.strip().lstrip('%') for n in group.split(',') if n.strip()]
    return names

  @property
  def op_name(self) -> str:
    match = _OP_NAME.search(self.attributes)
    return match.group(1) if match else ''


def _split_type(rest: str) -> tuple[str, str]:
  """'(a, b) opcode(...)' or 'f32[2]{0} opcode(...)' -> (type text, the rest)."""
  if rest.startswith('('):
    depth = 0
    for i, char in enumerate(rest):
      depth += {'(': 1, ')': -1}.get(char, 0)
      if depth == 0:
        return rest[:i + 1], rest[i + 1:].lstrip()
  head, _, tail = rest.partition(' ')
  return head, tail


def _split_call(text: str) -> tuple[str, str, str]:
  """'opcode(operands), attrs' -> (opcode, operands, attrs)."""
  opcode, _, rest = text.partition('(')
  depth = 1
  for i, char in enumerate(rest):
    depth += {'(': 1, ')': -1}.get(char, 0)
    if depth == 0:
      return opcode.strip(), rest[:i], rest[i + 1:]
  return opcode.strip(), rest, ''


def parse(hlo_text: str) -> tuple[dict[str, list[Instruction]], str]:
  """(computation name -> instructions, name of the entry computation)."""
  computations: dict[str, list[Instruction]] = {}
  entry, current = '', None
  for line in hlo_text.splitlines():
    header = _HEADER.match(line)
    if header:
      current = header.group(2)
      computations[current] = []
      if header.group(1):
        entry = current
      continue
    if line.strip() == '}':
      current = None
      continue
    match = _INSTRUCTION.match(line) if current is not None else None
    if match:
      result_type, rest = _split_type(match.group(3))
      opcode, operands, attributes = _split_call(rest)
      computations[current].append(Instruction(match.group(2), result_type, opcode, operands,
                                               attributes, bool(match.group(1))))
  return computations, entry


def decode_loop(computations, entry: str) -> Instruction | None:
  """The decode's `lax.while_loop`: the entry computation's while traced as `.../while`.

  Loops of the prefill (a `scan` over caption tokens) and of XLA's own
  rewrites (scatter loops) carry longer op names ('.../scan', '.../while/body/...');
  if no name matches, the while with the most reachable instructions is taken.
  """
  loops = [i for i in computations.get(entry, []) if i.opcode == 'while']
  named = [i for i in loops if re.search(r'(^|/)while$', i.op_name)]
  candidates = named or loops
  if not candidates:
    return None
  return max(candidates, key=lambda i: len(_reachable(computations, i.called)))


def _reachable(computations, names) -> set[str]:
  seen, stack = set(), list(names)
  while stack:
    name = stack.pop()
    if name in seen or name not in computations:
      continue
    seen.add(name)
    for instruction in computations[name]:
      stack.extend(instruction.called)
  return seen


def _trip_count(computations, loop: Instruction) -> int | None:
  """known_trip_count from the backend config, else `i < constant` in the condition."""
  known = _TRIP_COUNT.search(loop.attributes)
  if known:
    return int(known.group(1))
  condition = re.search(r'condition=%?([\w.\-]+)', loop.attributes)
  body = computations.get(condition.group(1), []) if condition else []
  compares = [i for i in body if i.opcode == 'compare' and 'direction=LT' in i.attributes]
  constants = [i for i in body if i.opcode == 'constant']
  if len(compares) == 1 and len(constants) == 1:
    value = re.fullmatch(r'-?\d+', constants[0].operands.strip())
    return int(value.group(0)) if value else None
  return None


def _walk(computations, name: str, multiplicity: int, out: list, unknown: list, depth=0):
  """(instruction, times per iteration) for everything reachable from `name`."""
  if depth > 64 or name not in computations:
    return
  for instruction in computations[name]:
    out.append((name, instruction, multiplicity))
    times = multiplicity
    if instruction.opcode == 'while':
      trip = _trip_count(computations, instruction)
      if trip is not None:
        times = multiplicity * trip
      else:
        unknown.append(instruction.name)
    for called in instruction.called:
      _walk(computations, called, times, out, unknown, depth + 1)


def _collective_kind(opcode: str) -> str | None:
  base = opcode[:-len('-start')] if opcode.endswith('-start') else opcode
  return base if base in COLLECTIVES else None


def operand_bytes(computations, computation: str, instruction: Instruction) -> int:
  """Bytes of an instruction's operands (looked up by name in its computation)."""
  types = {i.name: i.result_type for i in computations.get(computation, [])}
  names = re.findall(r'%([\w.\-]+)', instruction.operands)
  return sum(shape_bytes(types.get(name, '')) for name in names)


def _async_outputs(instruction: Instruction) -> list[str]:
  """Result types an instruction produces; an async start's tuple is (operands...,
  outputs..., scalar sync flags), of which only the outputs are kept."""
  if not (instruction.opcode.endswith('-start') and instruction.result_type.startswith('(')):
    return [instruction.result_type]
  elements = [e for e in _tuple_elements(instruction.result_type) if not re.fullmatch(
      r'\s*[a-z0-9]+\[\](\{[^}]*\})?\s*', e)]
  num_operands = len(re.findall(r'%[\w.\-]+', instruction.operands))
  return elements[num_operands:] or elements


# Instructions that move no data themselves (their callees are walked).
_NO_TRAFFIC = {'parameter', 'get-tuple-element', 'tuple', 'bitcast', 'constant', 'while',
               'conditional', 'call', 'after-all', 'opt-barrier', 'partition-id', 'replica-id',
               'copy-done', 'slice-done', 'iota'}


def hbm_traffic(computations, computation: str, instruction: Instruction) -> int:
  """Estimated HBM bytes one top-level instruction reads and writes.

  Operands and results in HBM count in full, except in fusions, where an
  operand that is only sliced costs its slices and a buffer updated in place
  costs the update (`_fusion_traffic`); VMEM (S(1)) buffers do not count.
  Non-fused scatters and gathers still count their whole operands. Async
  copies count their HBM source or destination once; async slices count the
  slice; async collectives count their operands and outputs (their `-done`
  halves are skipped).
  """
  opcode = instruction.opcode
  if opcode in _NO_TRAFFIC or opcode.endswith('-done'):
    return 0
  types = {i.name: i.result_type for i in computations.get(computation, [])}
  operands = ' '.join(types.get(n, '') for n in re.findall(r'%([\w.\-]+)', instruction.operands))
  if opcode in ('copy-start', 'slice-start'):
    elements = _tuple_elements(instruction.result_type)
    destination = elements[1] if opcode == 'slice-start' else elements[0]
    read = shape_bytes(destination) if hbm_shapes_bytes(operands) else 0
    return read + hbm_shapes_bytes(destination)
  if opcode.endswith('-start'):
    return hbm_shapes_bytes(operands) + hbm_shapes_bytes(' '.join(_async_outputs(instruction)))
  if opcode == 'fusion':
    return _fusion_traffic(computations, instruction, types)
  return hbm_shapes_bytes(operands) + hbm_shapes_bytes(instruction.result_type)


def _sliced_bytes(computations, computation: str, parameter: str, depth: int = 0):
  """Bytes read of a fused parameter used only through (dynamic-)slices, else None.

  Follows the parameter into nested fusions (a slice fused one level down).
  """
  body = computations.get(computation, [])
  uses = [i for i in body if parameter in i.operand_names]
  if not uses or depth > 8:
    return None
  total = 0
  for use in uses:
    if use.opcode in ('dynamic-slice', 'slice') and use.operand_names[0] == parameter:
      total += shape_bytes(use.result_type)
      continue
    if use.opcode != 'fusion' or not use.called:
      return None
    inner = {int(i.operands): i.name for i in computations.get(use.called[0], [])
             if i.opcode == 'parameter' and i.operands.strip().isdigit()}
    for index, name in enumerate(use.operand_names):
      if name == parameter:
        read = _sliced_bytes(computations, use.called[0], inner.get(index, ''), depth + 1)
        if read is None:
          return None
        total += read
  return total


# Root ops that update their first operand in place; the update is operand `n`.
_IN_PLACE_UPDATE = {'dynamic-update-slice': 1, 'scatter': 2}


def _fusion_traffic(computations, fusion: Instruction, types: dict) -> int:
  """A fusion's HBM bytes, reading only the slices of operands it only slices.

  An operand whose fused parameter feeds nothing but (dynamic-)slices costs
  the slices (a scanned layer's weights out of the stacked array); the buffer
  of a dynamic-update-slice or scatter at the root, updated in place, costs
  the update, read and written.
  """
  called = fusion.called[0] if fusion.called else ''
  body = computations.get(called, [])
  by_index = {int(i.operands): i.name for i in body
              if i.opcode == 'parameter' and i.operands.strip().isdigit()}
  fused_types = {i.name: i.result_type for i in body}
  root = next((i for i in body if i.root), None)
  in_place, update = None, 0
  if root is not None and root.opcode in _IN_PLACE_UPDATE:
    in_place = root.operand_names[0]
    update = shape_bytes(fused_types.get(root.operand_names[_IN_PLACE_UPDATE[root.opcode]], ''))
  total = 0
  for index, name in enumerate(fusion.operand_names):
    full = hbm_shapes_bytes(types.get(name, ''))
    parameter = by_index.get(index, '')
    if full and parameter == in_place:
      full = update
    elif full:
      read = _sliced_bytes(computations, called, parameter)
      full = full if read is None else min(full, read)
    total += full
  written = hbm_shapes_bytes(fusion.result_type)
  return total + (min(written, update) if in_place is not None else written)


def is_host_transfer(instruction: Instruction) -> bool:
  if instruction.opcode in HOST_OPS:
    return True
  if instruction.opcode == 'custom-call':
    target = re.search(r'custom_call_target="([^"]*)"', instruction.attributes)
    return bool(target and HOST_CALL_PATTERN.search(target.group(1)))
  return False


@dataclasses.dataclass
class LoopReport:
  """What one decode iteration runs, per device.

  collectives: kind -> {'count', 'operand_bytes', 'result_bytes'} per iteration.
  largest: the largest collectives, (kind, operand bytes, result bytes, op name).
  host_transfers: host ops / host custom-calls inside the loop (names).
  host_transfers_anywhere: the same in the whole program.
  hbm_bytes: estimated HBM bytes read and written per iteration (`hbm_traffic`
    summed over the loop's top-level instructions, nested loops times their
    trip counts).
  unknown_trip_counts: nested while loops counted once (trip count unknown).
  """

  found_loop: bool
  collectives: dict
  largest: list
  host_transfers: list
  host_transfers_anywhere: list
  unknown_trip_counts: list
  hbm_bytes: int = 0

  def total(self, field: str = 'operand_bytes') -> int:
    return sum(entry[field] for entry in self.collectives.values())

  def to_json(self) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(self)))


def loop_report(hlo_text: str, num_largest: int = 5) -> LoopReport:
  """Collectives and host transfers inside the decode loop of a compiled program."""
  computations, entry = parse(hlo_text)
  everywhere = [i.name for body in computations.values() for i in body if is_host_transfer(i)]
  loop = decode_loop(computations, entry)
  if loop is None:
    return LoopReport(False, {}, [], [], everywhere, [])
  walked, unknown = [], []
  for name in loop.called:
    _walk(computations, name, 1, walked, unknown)
  fused = set()
  for _, instruction, _ in walked:
    if instruction.opcode == 'fusion':
      fused |= _reachable(computations, instruction.called)
  hbm = sum(times * hbm_traffic(computations, computation, instruction)
            for computation, instruction, times in walked if computation not in fused)
  collectives = collections.defaultdict(
      lambda: {'count': 0, 'operand_bytes': 0, 'result_bytes': 0})
  largest = []
  for computation, instruction, times in walked:
    kind = _collective_kind(instruction.opcode)
    if kind is None:
      continue
    sent = operand_bytes(computations, computation, instruction)
    result_bytes = shape_bytes(' '.join(_async_outputs(instruction)))
    entry_ = collectives[kind]
    entry_['count'] += times
    entry_['operand_bytes'] += times * sent
    entry_['result_bytes'] += times * result_bytes
    largest.append((kind, sent, result_bytes, instruction.op_name))
  largest.sort(key=lambda item: -max(item[1], item[2]))
  host = [i.name for _, i, _ in walked if is_host_transfer(i)]
  return LoopReport(True, dict(collectives), largest[:num_largest], host, everywhere, unknown,
                    hbm)


def oversized_collectives(report: LoopReport, limit_bytes: int) -> list:
  """Collectives in the loop whose operand or result reaches `limit_bytes`."""
  return [item for item in report.largest if max(item[1], item[2]) >= limit_bytes]
