"""A run's hold on its workdir: the lock and resume checks around the whole run, and the state
it starts from (the newest checkpoint that loads, damaged newer ones set aside, else a fresh
initialisation)."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import secrets

from absl import logging
import jax

from setdiff_jax import objectives, paths, sharding
from setdiff_jax.workdir import checkpoints as checkpointing
from setdiff_jax.workdir import fallback
from setdiff_jax.workdir import lock as workdir_lock

T = TypeVar("T")


def locked(config, workdir: str, body: Callable[[Any, str], T]) -> T:
  """`body(config, workdir)` under WORKDIR's lock (one run per workdir), with WORKDIR resolved and
  created (process 0), local paths of `config` made absolute, and refused before anything is
  written: a new workdir that would train nothing, a resume whose config changes a field the
  checkpoints depend on."""
  workdir_lock.check_workdir_path(workdir)  # before resolving: "" would become the cwd
  workdir = paths.resolve(workdir)
  workdir_lock.check_new_workdir(config, workdir)
  if jax.process_index() == 0:
    paths.makedirs(workdir)
  with workdir_lock.WorkdirLock(workdir, jax.process_index()):
    check_shared_workdir(workdir)
    config = workdir_lock.absolute_paths(config)
    workdir_lock.check_resume(config, workdir, unread=unread_loss_settings)
    return body(config, workdir)


def unread_loss_settings(old_config) -> set:
  """The flattened `loss.*` keys the method of `old_config` (a config.json) never read: no part of
  its checkpoints' structure (an older config recorded them for every method)."""
  return {f"loss.{f}" for f in objectives.unread_loss_fields(old_config.get("objective"))}


START_FILE = "start"  # WORKDIR/.lock/start: this start's token, written by process 0


def check_shared_workdir(workdir: str):
  """ValueError on every process when the processes of a multi-process run do not all see one
  WORKDIR: process 0 writes a fresh token into WORKDIR/.lock/start, the others read it back. A
  copy of the workdir per host would otherwise resume alike on every host (the same files) and
  hang at the first save, where orbax waits for the other hosts' writes in vain."""
  if jax.process_count() == 1:
    return
  me, path = jax.process_index(), paths.join(workdir, workdir_lock.LOCK_DIR, START_FILE)
  token = secrets.token_hex(16) if me == 0 else ""
  if me == 0:
    paths.write_text(path, token)
  token = sharding.agree("workdir start", token)[0]
  sharding.check_all_see(
    "workdir seen",
    token,
    lambda: paths.read_text(path).strip() if paths.isfile(path) else "",
    f"the file process 0 wrote into --workdir={workdir}",
    "another start token there",
  )


def restore(manager, state, data_iterator=None, initialise: Callable[[Any], Any] = lambda s: s):
  """The newest checkpoint of `manager` that loads into `state`'s structure (with the data
  iterator's state), damaged newer steps set aside so they can be saved again; without a
  checkpoint, `initialise(state)` (e.g. parameters from another run). Closes the manager before
  an error propagates (no orbax noise at exit)."""
  try:
    restored, _, damaged = fallback.restore_with_fallback(manager, state, data_iterator)
    fallback.set_aside(manager, damaged)
    if restored is not None:
      logging.info("resumed from %s at step %d", manager.directory, int(restored.step))
      return restored
    return initialise(state)
  except BaseException:
    checkpointing.close(manager)
    raise


__all__ = ["locked", "restore", "check_shared_workdir", "unread_loss_settings"]
