"""EAGLE-1 static draft trees: the structure one tree-verification forward reads.

Legend: N tree nodes (node 0 is the root: the last committed token), D tree
depth. `verify.verify_tree_with_uniforms` walks such a tree; `verify.StaticTree`
is this class.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class StaticTree:
  """An EAGLE-1 static draft tree, built from choice paths.

  A path (i_1, ..., i_d) names the node reached by taking the i_1-th sampled
  child of the root, then its i_2-th sampled child, ...; EAGLE's
  `mc_sim_7b_63` is such a list. Every prefix of a path must be a path too.
  Node 0 is the root (the last committed token); nodes are ordered by depth,
  then by path, so siblings appear in sampling order.

  Attributes:
    paths: the choice paths, sorted.
    parents: int32[N], parents[0] = -1.
    depths: int32[N], depths[0] = 0.
    sibling_index: int32[N], which sample of its parent a node is.
    children: int32[N, max_children] child ids in sibling order, -1 padded.
    ancestor_mask: bool[N, N], [i, j] = j is i or an ancestor of i (the
      attention mask of one tree-verification forward).
  """

  paths: tuple

  @classmethod
  def from_paths(cls, paths) -> 'StaticTree':
    normalized = tuple(sorted({tuple(int(i) for i in p) for p in paths},
                              key=lambda p: (len(p), p)))
    if not normalized:
      raise ValueError('StaticTree.from_paths: give at least one path, e.g. ((0,),).')
    known = set(normalized)
    for path in normalized:
      if not path or min(path) < 0:
        raise ValueError(f'StaticTree: bad path {path}; paths are non-empty tuples of '
                         'sibling indices >= 0.')
      if len(path) > 1 and path[:-1] not in known:
        raise ValueError(f'StaticTree: path {path} has no parent path {path[:-1]}.')
      if path[-1] > 0 and path[:-1] + (path[-1] - 1,) not in known:
        raise ValueError(f'StaticTree: path {path} skips sibling {path[-1] - 1}; '
                         'siblings must be numbered 0, 1, ... without gaps.')
    return cls(normalized)

  @property
  def num_nodes(self) -> int:
    return len(self.paths) + 1

  @property
  def max_depth(self) -> int:
    return max(len(p) for p in self.paths)

  def _index(self):
    return {p: i + 1 for i, p in enumerate(self.paths)} | {(): 0}

  @property
  def parents(self) -> np.ndarray:
    index = self._index()
    return np.array([-1] + [index[p[:-1]] for p in self.paths], np.int32)

  @property
  def depths(self) -> np.ndarray:
    return np.array([0] + [len(p) for p in self.paths], np.int32)

  @property
  def sibling_index(self) -> np.ndarray:
    return np.array([0] + [p[-1] for p in self.paths], np.int32)

  @property
  def max_children(self) -> int:
    return int(max(self.sibling_index)) + 1

  @property
  def children_per_depth(self) -> tuple:
    """(c_1, ..., c_D): the most children any node of depth d - 1 has."""
    counts = [0] * self.max_depth
    for path in self.paths:
      counts[len(path) - 1] = max(counts[len(path) - 1], path[-1] + 1)
    return tuple(counts)

  @property
  def chain_tail(self) -> np.ndarray:
    """int32[L]: the nodes of the deepest levels that hold one node each, shallowest
    first (each the only child of the one before; [] when the deepest level holds
    several). Verification tests them at once, as a chain (SJD-PAC's main chain
    past its branching levels)."""
    by_depth = [[] for _ in range(self.max_depth + 1)]
    for node, depth in enumerate(self.depths):
      by_depth[depth].append(node)
    tail = []
    for depth in range(self.max_depth, 0, -1):
      if len(by_depth[depth]) != 1:
        break
      tail.insert(0, by_depth[depth][0])
    return np.array(tail, np.int32)

  @property
  def children(self) -> np.ndarray:
    table = -np.ones((self.num_nodes, self.max_children), np.int32)
    for node, (parent, sibling) in enumerate(zip(self.parents, self.sibling_index)):
      if node:
        table[parent, sibling] = node
    return table

  @property
  def ancestor_mask(self) -> np.ndarray:
    parents = self.parents
    mask = np.eye(self.num_nodes, dtype=bool)
    for node in range(1, self.num_nodes):
      mask[node] |= mask[parents[node]]
    return mask
