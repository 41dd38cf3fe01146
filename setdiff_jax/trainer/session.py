"""A run's hold on its workdir: the lock and resume checks around the whole run, and the state
it starts from (the newest checkpoint that loads, damaged newer ones set aside, else a fresh
initialisation)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, TypeVar

import hashlib
import json
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
  check_same_config(config)
  workdir = paths.resolve(workdir)
  workdir_lock.check_new_workdir(config, workdir)
  if jax.process_index() == 0:
    paths.makedirs(workdir)
  with workdir_lock.WorkdirLock(workdir, jax.process_index()):
    check_shared_workdir(workdir)
    config = workdir_lock.absolute_paths(config)
    workdir_lock.check_resume(config, workdir, unread=unread_settings)
    return body(config, workdir)


def unread_settings(old_config) -> set:
  """The flattened keys of the settings the run of `old_config` (a config.json) never read: no
  part of its checkpoints' structure (an older config recorded them all): the `loss.*` fields of
  other methods, `tokenizer.vocab_size` of a tokenizer it did not train."""
  unread = {f"loss.{f}" for f in objectives.unread_loss_fields(old_config.get("objective"))}
  if (old_config.get("tokenizer") or {}).get("kind", "trained") != "trained":
    unread.add("tokenizer.vocab_size")
  return unread


def _digest(text: str, n: int) -> str:
  return hashlib.sha256(text.encode("utf-8")).hexdigest()[:n]


def fields_of(config) -> Dict[str, str]:
  """{flattened field name: its value as canonical JSON}."""
  flat = workdir_lock.flatten(json.loads(config.to_json_best_effort()))
  return {k: json.dumps(flat[k], sort_keys=True) for k in sorted(flat)}


def summary(fields: Dict[str, str]):
  """(a digest of the whole config, 'name:value,...' with 6 hex digits of each) for `agree`."""
  whole = _digest(json.dumps(fields, sort_keys=True), 32)
  return whole, ",".join(f"{_digest(k, 6)}:{_digest(f'{k}={v}', 6)}" for k, v in fields.items())


def _differences(fields: Dict[str, str], lists: List[str]) -> List[str]:
  """'process P: field, field, ...' for each process whose fields differ from process 0's (the
  names this process knows; a field only other processes have is said so)."""
  name_of = {_digest(k, 6): k for k in fields}
  parse = lambda text: dict(i.split(":") for i in text.split(",") if len(i.split(":")) == 2)
  first, out = parse(lists[0]), []
  for p, text in enumerate(lists[1:], start=1):
    other = parse(text)
    keys = set(first) | set(other)
    names = {
      name_of.get(k, "a field this process lacks") for k in keys if first.get(k) != other.get(k)
    }
    if names:
      out.append(f"process {p}: {', '.join(sorted(names)[:8])}")
  return out


def check_same_config(config):
  """ValueError on every process when the processes of a multi-process run were started with
  different configs: the run would record process 0's config.json while the others train their
  own (another learning rate: a wrong model reported as done; another step count: a hang at the
  end). The configs as given (before local paths are made absolute) are compared by digest, then,
  when they differ, field by field (6 hex digits of each name and value: ~1.3 kB for 93 fields)."""
  if jax.process_count() == 1:
    return
  fields = fields_of(config)
  whole, by_field = summary(fields)
  if len(set(sharding.agree("config", whole))) == 1:
    return
  lists = sharding.agree("config fields", by_field)
  raise ValueError(
    "the processes of this run were started with different configs (differing from process 0: "
    f"{'; '.join(_differences(fields, lists)) or 'fields'}); start every process with the same "
    "command: the same --config and --config.* flags"
  )


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


__all__ = ["locked", "restore", "check_same_config", "check_shared_workdir", "unread_settings"]
