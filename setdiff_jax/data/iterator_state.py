"""The data iterator's state in checkpoints: one global state file, the orbax handler and args.

The iterator state is a small JSON-able dict, the same on every process (the global position,
e.g. {'next_index': s}; `pipeline.py`), so a checkpoint resumes on any number of processes. Save
it beside the train state with orbax via ``checkpoint_args_save(it)`` /
``checkpoint_args_restore(it)`` with ``GlobalIteratorHandler`` (process 0 writes
``ITERATOR_FILE``; every process reads it), or by hand with ``iterator_state_json`` /
``restore_iterator_state``.
"""

from __future__ import annotations

import functools
import json
from typing import Any

# The one iterator-state file of a checkpoint's data item (process 0 writes it). Checkpoints
# written before the global order hold `process_<i>-of-<n>.json` instead (grain's default).
ITERATOR_FILE = "iterator.json"


def legacy_iterator_file(process_index: int, process_count: int) -> str:
  return f"process_{process_index}-of-{process_count}.json"


def iterator_state_files(process_index: int, process_count: int) -> tuple:
  """The file names a data item may hold this process's state in, preferred first."""
  return (ITERATOR_FILE, legacy_iterator_file(process_index, process_count))


@functools.lru_cache(maxsize=1)
def _global_iterator_classes():
  """(handler, save args, restore args): built on first use (importing orbax is slow)."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  import grain.checkpoint  # pylint: disable=g-import-not-at-top  (pulls orbax)
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  class GlobalIteratorHandler(grain.checkpoint.CheckpointHandler):
    """Orbax handler of the data item: the iterator state is global (the same on every
    process), so process 0 writes one `ITERATOR_FILE` and every process, whatever their number
    now, restores from it (or from a pre-global checkpoint's own `process_<i>-of-<n>.json`)."""

    def save(self, directory, item=None, args=None):
      item = item or args.item
      if jax.process_index() == 0:
        (directory / ITERATOR_FILE).write_text(json.dumps(item.get_state(), indent=2))

    def restore(self, directory, item=None, args=None):
      item = item or args.item
      for name in iterator_state_files(jax.process_index(), jax.process_count()):
        if (directory / name).exists():
          item.set_state(json.loads((directory / name).read_text()))
          if hasattr(item, "start_prefetch"):  # as grain's own handler does
            item.start_prefetch()
          return item
      raise ValueError(f"no data-iterator state ({ITERATOR_FILE}) in {directory}")

  @ocp.args.register_with_handler(GlobalIteratorHandler, for_save=True)
  @dataclasses.dataclass
  class GlobalIteratorSave(ocp.args.CheckpointArgs):
    item: Any

  @ocp.args.register_with_handler(GlobalIteratorHandler, for_restore=True)
  @dataclasses.dataclass
  class GlobalIteratorRestore(ocp.args.CheckpointArgs):
    item: Any

  return GlobalIteratorHandler, GlobalIteratorSave, GlobalIteratorRestore


def global_iterator_handler():
  """The orbax handler of a checkpoint's `data` item (one global iterator state)."""
  return _global_iterator_classes()[0]()


def checkpoint_args_save(iterator):
  """Orbax save args for a grain iterator, e.g. `mngr.save(step, args=ocp.args.Composite(
  state=ocp.args.StandardSave(state), data=checkpoint_args_save(it)))`: process 0 writes
  `data/ITERATOR_FILE`, the global state, which any number of processes can restore."""
  return _global_iterator_classes()[1](iterator)


def checkpoint_args_restore(iterator):
  """Orbax restore args that set `iterator`'s state in place (from `ITERATOR_FILE`, or a
  checkpoint's `process_<i>-of-<n>.json` written before the global order)."""
  return _global_iterator_classes()[2](iterator)


def iterator_state_json(iterator) -> str:
  """The iterator's state as a JSON string (what the checkpoint's data item holds)."""
  return json.dumps(iterator.get_state())


def restore_iterator_state(iterator, state_json: str):
  """Sets the iterator's state from `iterator_state_json` output."""
  iterator.set_state(json.loads(state_json))
  return iterator
