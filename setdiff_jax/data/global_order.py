"""The global data order: which rows of each global batch a process reads.

Every process builds the same seeded sequence of examples (documents, rows or pairs); global
batch s is its elements s*G .. s*G+G-1 and process p of P reads rows p*G/P .. (p+1)*G/P-1 of it.
The data a run sees therefore does not depend on its number of processes.
"""

from __future__ import annotations

import grain


def process_rows(
  ds: grain.MapDataset,
  *,
  global_batch_size: int,
  process_index: int,
  process_count: int,
  drop_remainder: bool,
) -> grain.MapDataset:
  """Global batch s of the example sequence `ds` -> this process's share of it, as a list.

  Element s lists `ds[s*G + p*b + r]` for r < b (G = global_batch_size, b = G // P, p =
  process_index), the indices past the end of a finite `ds` left out (a short final batch,
  kept only without `drop_remainder`; a process may then get fewer rows, or none).
  """
  g, b = global_batch_size, global_batch_size // process_count
  n = len(ds)
  num = n // g if drop_remainder else -(-n // g)
  first = process_index * b

  def rows(s: int) -> list:
    start = s * g + first
    return [ds[k] for k in range(start, min(start + b, n))]

  return grain.MapDataset.range(num).map(rows)
