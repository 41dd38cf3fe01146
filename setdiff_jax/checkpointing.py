"""Orbax checkpoints: train state + data-iterator state under WORKDIR/checkpoints/<step>/.

Each checkpoint holds two items:
  state  the TrainState (step, params, EMA params, optimizer state), saved by every host;
  data   the grain iterator state of each process (`process_<i>-of-<n>.json`), so a resumed run
         sees exactly the batches the uninterrupted run would have seen.
Inference (sampling, evaluation, export) and `init_from` read parameters only, through
`setdiff_jax.workdir`, which uses this module's file layout.
"""
from __future__ import annotations

import contextlib
import json
import os
from typing import Optional

from absl import logging
import grain
import ml_collections
import orbax.checkpoint as ocp

CHECKPOINT_DIR = "checkpoints"
CONFIG_FILE = "config.json"


@contextlib.contextmanager
def _quiet_orbax():
  """Orbax logs a dozen INFO lines per save through absl; keep the training log readable."""
  previous = logging.get_verbosity()
  logging.set_verbosity(logging.WARNING)
  try:
    yield
  finally:
    logging.set_verbosity(previous)


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)


def make_manager(workdir: str, *, keep: int = 3, with_data: bool = True) -> ocp.CheckpointManager:
  items = ("state", "data") if with_data else ("state",)
  handlers = {"state": ocp.StandardCheckpointHandler()}
  if with_data:
    handlers["data"] = grain.checkpoint.CheckpointHandler()
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                         enable_async_checkpointing=False)
  with _quiet_orbax():
    return ocp.CheckpointManager(checkpoint_dir(workdir), item_names=items,
                                 item_handlers=handlers, options=options)


def save(manager: ocp.CheckpointManager, step: int, state, data_iterator=None, *, force=True) -> bool:
  args = {"state": ocp.args.StandardSave(state)}
  if data_iterator is not None:
    args["data"] = grain.checkpoint.CheckpointSave(data_iterator)
  with _quiet_orbax():
    saved = manager.save(step, args=ocp.args.Composite(**args), force=force)
    manager.wait_until_finished()
  return saved


def restore(manager: ocp.CheckpointManager, abstract_state, data_iterator=None,
            step: Optional[int] = None):
  """Restores the given (or latest) step into the structure of `abstract_state`.

  Returns the restored state, or None if there is no checkpoint. The data iterator, if given, is
  restored in place.
  """
  step = manager.latest_step() if step is None else step
  if step is None:
    return None
  args = {"state": ocp.args.StandardRestore(abstract_state)}
  if data_iterator is not None:
    args["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
  try:
    with _quiet_orbax():
      restored = manager.restore(step, args=ocp.args.Composite(**args))
  except (ValueError, KeyError) as e:
    raise ValueError(
        f"checkpoint {manager.directory}/{step} does not match this config's model/optimizer "
        f"structure ({e}). Use a fresh --workdir, or the config the checkpoint was trained with "
        f"(saved in the workdir's {CONFIG_FILE}).") from e
  return restored["state"]


def save_config(config: ml_collections.ConfigDict, workdir: str):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, CONFIG_FILE), "w") as f:
    f.write(config.to_json_best_effort(indent=2, sort_keys=True))


def load_config(workdir: str) -> ml_collections.ConfigDict:
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: is {workdir!r} a training workdir "
                            f"(written by launch/train.py)?")
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))
