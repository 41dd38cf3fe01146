"""Restoring a checkpoint step, telling damaged files from a different structure, with fallback.

`restore_with_fallback(manager, abstract_state, data_iterator)` restores the newest step that
loads. Every step is checked in three stages, so the cause is named:
  1. files: `state/` (and this process's data-iterator file, when an iterator is restored) exist,
     and every file has the size and CRC-32 recorded in the step's `checksums.json` at save time
     (`write_checksums`; steps of older runs have none);
  2. metadata: orbax's `_METADATA` reads, and its array names and shapes equal those of the
     abstract state; if they differ the files are fine but the *config* does not match them, so
     `CheckpointStructureError` is raised at once (an older step would not match either);
  3. data: the arrays (and the iterator state) restore.
A failure in stage 1 or 3, or an unreadable metadata file, is damage: the step is named in a
warning and the next older step is tried. With an explicit `step` there is no fallback. Used by
the train loop (`checkpoints.restore`) and by inference loading (sample, evaluate, export).
On several processes each step's verdict is agreed (`_agreed`): a step one process finds
damaged is skipped by all, so they restore the same step.
"""

from __future__ import annotations

import contextlib
import json
import os
import zlib
from typing import Any, Callable, List, Optional, Tuple

from absl import logging
import jax

from setdiff_jax import errors, paths, sharding

DAMAGED_SUFFIX = (
  ".damaged"  # checkpoints/<step>.damaged: set aside by the trainer, ignored by orbax
)


@contextlib.contextmanager
def absl_verbosity(level):
  """Runs a block with absl logging at `level` (orbax logs through absl), then restores it."""
  previous = logging.get_verbosity()
  logging.set_verbosity(level)
  try:
    yield
  finally:
    logging.set_verbosity(previous)


def _silent_orbax():
  """Orbax logs warnings (e.g. an item it was not asked for) while probing a step."""
  return absl_verbosity(logging.ERROR)


def short(e: BaseException) -> str:
  """The first line of an orbax / tensorstore error, without the multi-kilobyte spec dump."""
  text = str(e) or type(e).__name__
  for cut in (" [tensorstore_spec", "See full TensorStore details", "\n"):
    text = text.split(cut)[0]
  text = text.strip().rstrip(".")
  return text[:200] + ("..." if len(text) > 200 else "")


def _name(entry) -> str:
  for attr in ("name", "key", "idx"):
    if hasattr(entry, attr):
      return str(getattr(entry, attr))
  return str(entry)


def abstract_shapes(abstract_state) -> dict:
  """{'params.blocks_0.attn_out.kernel': shape, ...}: orbax's names for the state's arrays."""
  leaves = jax.tree_util.tree_flatten_with_path(abstract_state)[0]
  return {
    ".".join(_name(k) for k in path): tuple(leaf.shape)
    for path, leaf in leaves
    if hasattr(leaf, "shape")
  }


def stored_shapes(tree) -> dict:
  """The same names and shapes from a checkpoint's tree metadata."""
  out = {}

  def walk(node):
    if isinstance(node, dict):
      for v in node.values():
        walk(v)
    elif isinstance(node, (list, tuple)):
      for v in node:
        walk(v)
    elif node is not None and hasattr(node, "shape") and hasattr(node, "name"):
      out[str(node.name)] = tuple(node.shape)

  walk(tree)
  return out


def structure_diff(stored: dict, wanted: dict, limit: int = 4) -> List[str]:
  """The first differences, the parameters' before their EMA and optimizer copies."""
  order = lambda k: (not k.startswith("params."), k)  # noqa: E731
  diffs = [
    f"{k}: checkpoint {stored[k]}, config {wanted[k]}"
    for k in sorted(wanted, key=order)
    if k in stored and stored[k] != wanted[k]
  ]
  diffs += [f"{k}: only in the config" for k in sorted(set(wanted) - set(stored))]
  diffs += [f"{k}: only in the checkpoint" for k in sorted(set(stored) - set(wanted))]
  if len(diffs) > limit:
    diffs = diffs[:limit] + [f"... {len(diffs) - limit} more"]
  return diffs


def iterator_files() -> tuple:
  """Names the data item may hold this process's iterator state in (the global file first)."""
  from setdiff_jax.data import iterator_state  # pylint: disable=g-import-not-at-top

  return iterator_state.iterator_state_files(jax.process_index(), jax.process_count())


CHECKSUM_FILE = "checksums.json"  # checkpoints/<step>/checksums.json: {path: [size, crc32]}


def _file_crc(path: str) -> int:
  crc = 0
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 22), b""):
      crc = zlib.crc32(chunk, crc)
  return crc


def _step_files(where: str) -> List[str]:
  out = []
  for root, _, files in os.walk(where):
    out += [
      os.path.relpath(os.path.join(root, f), where)
      for f in files
      if not (root == where and f == CHECKSUM_FILE)
    ]
  return sorted(out)


def write_checksums(manager, step: int):
  """Writes checkpoints/<step>/checksums.json (process 0; size and CRC-32 of every file of the
  step), so `restore_step` names a file damaged in place (e.g. garbage inside a data file, which
  orbax reads without complaint). Object-store workdirs have no checksums."""
  where = os.path.join(str(manager.directory), str(step))
  if jax.process_index() == 0 and not paths.is_remote(where):
    sums = {
      f: [os.path.getsize(os.path.join(where, f)), _file_crc(os.path.join(where, f))]
      for f in _step_files(where)
    }
    tmp = os.path.join(where, CHECKSUM_FILE + ".tmp")
    with open(tmp, "w") as fh:
      json.dump(sums, fh, indent=0, sort_keys=True)
    os.replace(tmp, os.path.join(where, CHECKSUM_FILE))
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(f"setdiff_jax: checksums of step {step}")


def verify_checksums(where: str, step: int, with_data: bool = True):
  """Raises DamagedCheckpointError naming the first file whose size or CRC-32 differs from the
  step's checksums.json (or that is gone); a step without the file (older runs) passes. Without
  `with_data` the data-iterator files (not read by inference) are not checked."""
  path = os.path.join(where, CHECKSUM_FILE)
  if paths.is_remote(where) or not os.path.isfile(path):
    return
  try:
    with open(path, encoding="utf-8") as fh:
      sums = json.load(fh)
  except ValueError as e:
    raise errors.DamagedCheckpointError(f"step {step}: {path} is damaged ({e})") from e
  for rel, (size, crc) in sorted(sums.items()):
    if not with_data and rel.startswith("data" + os.sep):
      continue
    f = os.path.join(where, rel)
    if not os.path.isfile(f):
      raise errors.DamagedCheckpointError(f"step {step}: {f} is missing")
    if os.path.getsize(f) != size:
      raise errors.DamagedCheckpointError(
        f"step {step}: {f} has {os.path.getsize(f)} bytes, {size} when it was saved"
      )
    if _file_crc(f) != crc:
      raise errors.DamagedCheckpointError(
        f"step {step}: {f} differs from what was saved (checksum mismatch)"
      )


def check_saved(manager, step: int):
  """The integrity check of a step just saved: its `state/` files and metadata read back. On
  several processes process 0 checks (it finalises the step: on an object store another process
  can read the metadata before process 0 has marked the items complete) and every process gets
  its verdict."""
  error = None
  if jax.process_index() == 0:
    try:
      _check_saved(manager, step)
    except errors.DamagedCheckpointError as e:
      error = e
  _agreed(step, error)


def _check_saved(manager, step: int):
  where = paths.join(str(manager.directory), str(step))
  if not paths.isdir(paths.join(where, "state")):
    raise errors.DamagedCheckpointError(f"step {step}: {where}/state is missing after the save")
  try:
    with _silent_orbax():
      metadata = manager.item_metadata(step)["state"]
  except Exception as e:  # noqa: BLE001 - unreadable metadata is damage
    raise errors.DamagedCheckpointError(
      f"step {step}: unreadable metadata right after the save ({short(e)})"
    ) from e
  if not stored_shapes(getattr(metadata, "tree", metadata)):
    raise errors.DamagedCheckpointError(f"step {step}: no array metadata after the save")


_CHECKPOINT_ERRORS = {
  c.__name__: c
  for c in (
    errors.CheckpointStructureError,
    errors.MissingIteratorStateError,
    errors.DamagedCheckpointError,
  )
}


def _agreed(step: int, error: Optional[errors.CheckpointError]):
  """Raises, on every process, the error of the first process that found one in this step's
  checks (none: every process goes on), so all of them restore, or fall back from, the same
  step: a process that fell back alone would wait in orbax's restore for the others. A no-op
  exchange on one process."""
  if jax.process_count() == 1:
    if error is not None:
      raise error
    return
  mine = {"kind": type(error).__name__, "error": str(error)} if error is not None else {}
  seen = [json.loads(v) for v in sharding.agree(f"checkpoint step {step}", json.dumps(mine))]
  failed = [i for i, x in enumerate(seen) if x]
  if not failed:
    return
  i = failed[0]
  if i == jax.process_index() and error is not None:
    raise error
  raise _CHECKPOINT_ERRORS[seen[i]["kind"]](
    f"{seen[i]['error']} (found by process {i} of {len(seen)})"
  )


def restore_step(
  manager,
  step: int,
  abstract_state,
  data_iterator=None,
  *,
  restore_fn: Optional[Callable[[int], Any]] = None,
  partial: bool = False,
):
  """Restores one step (stages of the module doc); returns the restored state.

  `restore_fn(step)` replaces the default full restore of the `state` item (and of the data
  iterator); with `partial` (e.g. parameters only) arrays the checkpoint has beyond
  `abstract_state` are not a mismatch.
  """
  import orbax.checkpoint as ocp
  from setdiff_jax.data import iterator_state  # pylint: disable=g-import-not-at-top

  try:
    _check_step(manager, step, abstract_state, data_iterator, partial)
  except errors.CheckpointError as e:
    _agreed(step, e)
  _agreed(step, None)
  if restore_fn is None:
    args = {"state": ocp.args.StandardRestore(abstract_state)}
    if data_iterator is not None:
      args["data"] = iterator_state.checkpoint_args_restore(data_iterator)
    restore_fn = lambda s: manager.restore(s, args=ocp.args.Composite(**args))["state"]  # noqa
  restored, error = None, None
  try:
    with _silent_orbax():
      restored = restore_fn(step)
  except Exception as e:  # noqa: BLE001 - the structure matched, so the files are damaged
    error = errors.DamagedCheckpointError(f"step {step}: {short(e)}")
    error.__cause__ = e
  _agreed(step, error)
  return restored


def _check_step(manager, step: int, abstract_state, data_iterator, partial: bool):
  """Stages 1 and 2 of the module doc (files, metadata) of one step on this process."""
  where = paths.join(str(manager.directory), str(step))
  if not paths.isdir(paths.join(where, "state")):
    raise errors.DamagedCheckpointError(f"step {step}: {where}/state is missing")
  if data_iterator is not None and not any(
    paths.isfile(paths.join(where, "data", name)) for name in iterator_files()
  ):
    raise errors.MissingIteratorStateError(
      f"step {step}: no data-iterator state {where}/data/{iterator_files()[0]}"
    )
  verify_checksums(where, step, with_data=data_iterator is not None)
  try:
    with _silent_orbax():
      metadata = manager.item_metadata(step)["state"]
    stored = stored_shapes(getattr(metadata, "tree", metadata))
  except Exception as e:  # noqa: BLE001 - any unreadable metadata is damage
    raise errors.DamagedCheckpointError(f"step {step}: unreadable metadata ({short(e)})") from e
  if not stored:
    raise errors.DamagedCheckpointError(f"step {step}: no array metadata in {where}/state")
  wanted = abstract_shapes(abstract_state)
  if partial:  # only what is asked for (e.g. the parameters, not the optimizer state)
    stored = {k: v for k, v in stored.items() if k in wanted}
  if stored != wanted:
    raise errors.CheckpointStructureError(
      f"checkpoint {where} holds a different model/optimizer structure than this config ("
      + "; ".join(structure_diff(stored, wanted))
      + "). Its files are intact: use the config "
      "it was trained with (the workdir's config.json), or train into another --workdir"
    )


def restore_with_fallback(
  manager,
  abstract_state,
  data_iterator=None,
  step: Optional[int] = None,
  *,
  restore_fn: Optional[Callable[[int], Any]] = None,
  partial: bool = False,
) -> Tuple[Optional[Any], Optional[int], List[Tuple[int, str]]]:
  """(restored state, its step, [(damaged newer step, reason)]) for the newest step that loads,
  or for `step`; `restore_fn` / `partial` as in `restore_step`.

  (None, None, []) when there is no checkpoint. Raises CheckpointStructureError for a config that
  does not match, DamagedCheckpointError when no step loads (or the explicit `step` does not).
  """
  steps = sorted(manager.all_steps(), reverse=True)
  if not steps:
    return None, None, []
  if step is not None and step not in steps:
    raise errors.CheckpointError(
      f"no checkpoint at --step={step} in {manager.directory}; the steps there are {sorted(steps)}"
    )
  damaged: List[Tuple[int, str]] = []
  causes: List[errors.DamagedCheckpointError] = []
  for s in [step] if step is not None else steps:
    try:
      state = restore_step(
        manager, s, abstract_state, data_iterator, restore_fn=restore_fn, partial=partial
      )
    except errors.DamagedCheckpointError as e:
      if step is not None:
        raise errors.DamagedCheckpointError(
          f"checkpoint {e}; other steps there: {[t for t in sorted(steps) if t != s]}"
        ) from e
      damaged.append((s, str(e)))
      causes.append(e)
      continue
    if damaged:
      logging.warning(
        "damaged checkpoint(s) in %s: %s; falling back to step %d",
        manager.directory,
        "; ".join(r for _, r in damaged),
        s,
      )
    return state, s, damaged
  reasons = "; ".join(r for _, r in damaged)
  if all(isinstance(e, errors.MissingIteratorStateError) for e in causes):
    raise errors.MissingIteratorStateError(
      f"no checkpoint in {manager.directory} has this process's data-iterator state ({reasons})"
      f". It was saved by an older version with another number of processes, or the files "
      f"were deleted. Resume with that number of processes, or start a new run from its "
      f"parameters: "
      f"--workdir=NEW --config.init_from={os.path.dirname(str(manager.directory))}"
    )
  error = errors.DamagedCheckpointError(
    f"no checkpoint in {manager.directory} loads: {reasons}. Train into another --workdir (or "
    f"move the damaged checkpoints/<step> folders away to start this one afresh)"
  )
  error.none_loads = f"no checkpoint in {manager.directory} loads: {reasons}"  # without advice
  raise error


def set_aside(
  manager,
  damaged: List[Tuple[int, str]],
  suffix: str = DAMAGED_SUFFIX,
  log: bool = True,
  sync: bool = False,
):
  """Renames damaged steps to checkpoints/<step>.damaged (or another `suffix`; process 0), so
  training can save those steps again; orbax ignores the renamed folders. Every process then
  re-reads the step list. The processes meet at a barrier when there is something to move, or
  always with `sync` (when they may disagree on the list, e.g. an agreed stop)."""
  if damaged and jax.process_index() == 0:
    for s, _ in damaged:
      src = paths.join(str(manager.directory), str(s))
      if not paths.isdir(src):
        continue
      dst = src + suffix
      n = 1
      while paths.exists(dst):
        n += 1
        dst = f"{src}{suffix}{n}"
      paths.rename(src, dst)
      if log:
        logging.warning(
          "moved %s checkpoint %s to %s (delete it when no longer needed)",
          suffix.strip("."),
          src,
          dst,
        )
  if (damaged or sync) and jax.process_count() > 1:
    sharding.barrier("damaged checkpoints set aside")
  if damaged:
    manager.reload()


__all__ = [
  "write_checksums",
  "verify_checksums",
  "check_saved",
  "restore_step",
  "restore_with_fallback",
  "set_aside",
  "abstract_shapes",
  "stored_shapes",
  "structure_diff",
  "short",
]
