"""How an evaluation set is split over processes, rounds and decode steps.

Legend: N images in the set, C chunk size (images per chunk), P processes,
G global batch (images per decode call, over every device), b local batch
(G / P, the rows of one process), D data-parallel devices.

The set is cut into chunks of C consecutive image indices (the last may be
shorter). A *round* gives each process that owns batch rows (a writer) at most
one chunk not yet committed; a writer decodes its chunk in `steps_per_chunk` = ceil(C / b) global
decode calls, filling its own rows of the global batch (the rows its devices
hold) with its chunk's images and padding the rest with dummy rows (index -1,
decoded and thrown away). Every process computes the same plan from the same
list of pending chunks, so all of them make the same collective calls.

Image i's result depends only on (seed, i), the method and the per-device
batch shape: its key is fold_in(key(seed), i) and the engine gives every row
the law of batch size 1 with its own key.
"""

from __future__ import annotations

import dataclasses

import numpy as np

DUMMY = -1  # image index of a padding row


def num_chunks(num_images: int, chunk_size: int) -> int:
  return -(-num_images // chunk_size)


def chunk_range(chunk: int, num_images: int, chunk_size: int) -> range:
  """The image indices of one chunk."""
  return range(chunk * chunk_size, min((chunk + 1) * chunk_size, num_images))


def rounds(pending: list[int], writers: list[int], num_processes: int
           ) -> list[list[int | None]]:
  """Round r -> the chunk of each process (None: idle, or not a writer).

  Args:
    pending: chunks not committed yet, in order.
    writers: the processes that own batch rows (`rows_by_process`).
  """
  out = []
  for start in range(0, len(pending), len(writers)):
    chunks = [None] * num_processes
    for writer, chunk in zip(writers, pending[start:start + len(writers)]):
      chunks[writer] = chunk
    out.append(chunks)
  return out


def rows_by_process(devices_indices: dict, global_batch: int) -> list[list[int]]:
  """Global batch rows each process writes, from a [G] sharding's device -> index map.

  A row held by devices of several processes (the 'model' axis spanning
  processes) belongs to the lowest process index among them; a process may
  then own no rows (it still takes part in every decode call).

  Args:
    devices_indices: `NamedSharding.devices_indices_map((G,))`.
    global_batch: G.
  Returns:
    rows[p]: sorted global rows of process p; processes that own rows own the
    same number.
  Raises:
    ValueError: if processes would own different (nonzero) numbers of rows.
  """
  owner = np.full((global_batch,), -1)
  for device, index in devices_indices.items():
    rows = np.arange(global_batch)[index[0]]
    process = device.process_index
    owner[rows] = np.where((owner[rows] < 0) | (owner[rows] > process), process, owner[rows])
  num_processes = 1 + max(device.process_index for device in devices_indices)
  rows = [np.flatnonzero(owner == p).tolist() for p in range(num_processes)]
  if len({len(r) for r in rows if r}) != 1:
    raise ValueError(f'processes own different numbers of batch rows {[len(r) for r in rows]}; '
                     'every process needs the same number of devices on the data axis.')
  return rows


@dataclasses.dataclass(frozen=True)
class StepPlan:
  """The global batch of one decode call.

  Attributes:
    index: int64[G], the image index of each global row (DUMMY for padding).
  """

  index: np.ndarray

  def condition_ids(self, count: int) -> np.ndarray:
    """int64[G]: image i is conditioned on entry i % count (dummies on entry 0)."""
    return np.maximum(self.index, 0) % count

  def key_indices(self) -> np.ndarray:
    """int32[G]: the index each row's key is folded with (dummies reuse 0)."""
    return np.maximum(self.index, 0).astype(np.int32)


def steps_per_chunk(chunk_size: int, local_batch: int) -> int:
  return -(-chunk_size // local_batch)


def step_plan(chunks: list[int | None], step: int, rows: list[list[int]], num_images: int,
              chunk_size: int) -> StepPlan:
  """The global batch of decode call `step` of a round.

  Args:
    chunks: chunk of each process in this round (None: idle).
    step: 0 <= step < steps_per_chunk(chunk_size, b).
    rows: `rows_by_process` (b rows per writing process).
  """
  global_batch = sum(len(r) for r in rows)
  index = np.full((global_batch,), DUMMY, np.int64)
  for process_rows, chunk in zip(rows, chunks):
    if chunk is None:
      continue
    local_batch = len(process_rows)
    images = chunk_range(chunk, num_images, chunk_size)[step * local_batch:
                                                        (step + 1) * local_batch]
    index[process_rows[:len(images)]] = list(images)
  return StepPlan(index=index)
