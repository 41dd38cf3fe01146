"""Orbax checkpoints: train state + data-iterator state under WORKDIR/checkpoints/<step>/.

Each checkpoint holds two items:
  state  the TrainState (step, params, EMA params, optimizer state), saved by every host;
  data   the grain iterator state, global (`data/iterator.json`, written by process 0; older
         checkpoints hold `process_<i>-of-<n>.json`), so a resumed run, on any number of
         processes, sees exactly the batches the uninterrupted run would have seen.
Inference (sampling, evaluation, export) and `init_from` read parameters only, through
`setdiff_jax.workdir.load`, which uses this module's file layout. Every restore falls back past damaged
steps (`workdir/fallback.py`); a save that runs out of disk raises `errors.DiskFullError`.
"""

from __future__ import annotations

import json
from typing import Optional

from absl import logging
import ml_collections
import orbax.checkpoint as ocp

from setdiff_jax import errors, paths
from setdiff_jax.data import iterator_state
from setdiff_jax.workdir import fallback

CHECKPOINT_DIR = "checkpoints"
CONFIG_FILE = "config.json"


def _quiet_orbax():
  """Orbax logs a dozen INFO lines per save through absl; keep the training log readable."""
  return fallback.absl_verbosity(logging.WARNING)


def checkpoint_dir(workdir: str) -> str:
  return paths.join(paths.resolve(workdir), CHECKPOINT_DIR)


def make_manager(workdir: str, *, keep: int = 3, with_data: bool = True) -> ocp.CheckpointManager:
  """The workdir's checkpoint manager; `save` keeps the newest `keep` (>= 1) steps.

  Orbax's own rotation is off (max_to_keep=None): `save` rotates only after the new step passed
  its integrity check, so the newest verified checkpoint is never deleted.
  """
  if int(keep) < 1:
    raise ValueError(
      f"keep_checkpoints={keep} is out of range; allowed: an integer in [1, inf) "
      "(set --config.keep_checkpoints)"
    )
  items = ("state", "data") if with_data else ("state",)
  handlers = {"state": ocp.StandardCheckpointHandler()}
  if with_data:
    # one global state: any process count
    handlers["data"] = iterator_state.global_iterator_handler()
  options = ocp.CheckpointManagerOptions(
    max_to_keep=None, create=True, enable_async_checkpointing=False
  )
  with _quiet_orbax():
    manager = ocp.CheckpointManager(
      checkpoint_dir(workdir), item_names=items, item_handlers=handlers, options=options
    )
  manager.setdiff_keep = int(keep)  # read by `save` (orbax's rotation is off)
  return manager


def save(
  manager: ocp.CheckpointManager, step: int, state, data_iterator=None, *, force=True, protect=()
) -> bool:
  """Saves `step`, writes its checksums, checks it, then deletes steps beyond the newest
  `keep` (never the one just verified, nor the steps in `protect`). A full disk (or EFBIG) raises
  `errors.DiskFullError` naming what is still intact; a new step that fails its check raises
  DamagedCheckpointError and deletes nothing.
  """
  args = {"state": ocp.args.StandardSave(state)}
  if data_iterator is not None:
    args["data"] = iterator_state.checkpoint_args_save(data_iterator)
  try:
    with _quiet_orbax():
      saved = manager.save(step, args=ocp.args.Composite(**args), force=force)
      manager.wait_until_finished()
    if saved:
      fallback.write_checksums(manager, step)
  except Exception as e:  # noqa: BLE001 - whatever type carries ENOSPC (OSError, tensorstore)
    what = errors.write_limit(e)
    if what is None:
      raise
    previous = [s for s in manager.all_steps() if s < step]
    intact = (
      f"the previous checkpoint (step {max(previous)}) is intact"
      if previous
      else "no earlier checkpoint exists"
    )
    raise errors.DiskFullError(
      f"{what} while saving checkpoint {step} to {manager.directory} ({fallback.short(e)}); "
      f"{intact}. {errors.limit_fix(what).capitalize()} and run the same command again to resume"
    ) from e
  if saved:
    fallback.check_saved(manager, step)  # raises (and deletes nothing) if the new step is bad
    rotate(manager, getattr(manager, "setdiff_keep", None), protect=(step,) + tuple(protect))
  return saved


def rotate(manager: ocp.CheckpointManager, keep: Optional[int], protect=()):
  """Deletes the steps older than the newest `keep`, never those in `protect` (the step just
  saved and verified; the trainer's newest step whose loss was seen healthy)."""
  if not keep:
    return
  steps = sorted(manager.all_steps())
  for s in steps[:-keep]:
    if s not in protect:
      with _quiet_orbax():
        manager.delete(s)


def close(manager: ocp.CheckpointManager):
  """Closes a manager quietly; never raises (it runs while another error propagates)."""
  try:
    with _quiet_orbax():
      manager.close()
  except Exception as e:  # noqa: BLE001
    logging.warning("closing the checkpoint manager of %s failed: %s", manager.directory, e)


def restore(
  manager: ocp.CheckpointManager, abstract_state, data_iterator=None, step: Optional[int] = None
):
  """Restores the given step, or the newest one that loads, into the structure of
  `abstract_state` (`fallback.restore_with_fallback`: damaged newer steps are named in
  a warning and skipped; a structure that does not match the config is an error).

  Returns the restored state, or None if there is no checkpoint. The data iterator, if given, is
  restored in place.
  """
  return fallback.restore_with_fallback(manager, abstract_state, data_iterator, step)[0]


def resolve_step(manager: ocp.CheckpointManager, step: Optional[int] = None) -> int:
  """`step`, or the latest; a missing one is an error that lists the steps there are."""
  steps = sorted(manager.all_steps())
  if not steps:
    raise FileNotFoundError(
      f"no checkpoint under {manager.directory}: train first (or pass the "
      "workdir of a run that saved one)"
    )
  if step is None:
    return steps[-1]
  if step not in steps:
    raise errors.CheckpointError(
      f"no checkpoint at --step={step} in {manager.directory}; the steps there are {steps}"
    )
  return int(step)


def save_config(config: ml_collections.ConfigDict, workdir: str):
  """Writes WORKDIR/config.json (whole-file: a crash never leaves half a file; any
  `paths` location, e.g. gs://). Call it on process 0 only."""
  paths.write_text(
    paths.join(workdir, CONFIG_FILE), config.to_json_best_effort(indent=2, sort_keys=True)
  )


def load_config(workdir: str) -> ml_collections.ConfigDict:
  path = paths.join(workdir, CONFIG_FILE)
  if not paths.exists(path):
    raise FileNotFoundError(
      f"{path} not found: is {workdir!r} a training workdir (written by launch/train.py)?"
    )
  try:
    return ml_collections.ConfigDict(json.loads(paths.read_text(path)))
  except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
    raise ValueError(
      f"{path} is damaged ({e}): it holds the run's config; restore it from a backup or rewrite it"
    ) from e
