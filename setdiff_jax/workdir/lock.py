"""Protects a training workdir: one trainer at a time, and no resume that would break it.

- `WorkdirLock`: an exclusive `fcntl.flock` on WORKDIR/.lock/process_<i>.lock, one file per
  process of a (multi-host) job, so a second job fails on every host at once. The kernel drops
  the lock when the process ends in any way (also `kill -9`), so a stale file never blocks; the
  file holds the owner's pid and host for the error message. On NFS, flock is forwarded to the
  server's locks (Linux >= 2.6.12); object stores (gs://) have no locks and are not locked.
- `check_resume(config, workdir)`: before anything is written, compares the new config with the
  workdir's config.json when it already has checkpoints, and refuses a change to a field the
  checkpoints depend on (`STRUCTURAL`), listing every such field (old -> new) and the ways out.
- `absolute_paths(config)`: data / vocabulary paths made absolute, so config.json works from any
  directory (`launch/evaluate.py` run elsewhere).
"""

from __future__ import annotations

import copy
import errno
import fcntl
import json
import os
import socket
import time
from typing import Any, Dict, List, Optional, Tuple

from absl import logging

from setdiff_jax import errors, paths
from setdiff_jax.config import fields

LOCK_DIR = ".lock"
CONFIG_FILE = "config.json"  # = checkpointing.CONFIG_FILE (not imported: no jax here)
CHECKPOINT_DIR = "checkpoints"

# Fields the saved state depends on: parameter and optimizer-state shapes, the tokenizer's ids,
# the data stream the iterator state indexes into, and what the objective trains. A "*" entry
# covers a whole sub-config. Everything else (steps, learning rate, eval/log/checkpoint cadence,
# mesh, dtype, attention, remat, dropout, EMA decay, ...) may change on resume.
STRUCTURAL = (
  "objective",
  "seed",  # the data order the iterator state indexes into (another seed repeats / skips rows)
  "seq_len",
  "batch_size",
  "model.vocab_size",
  "model.hidden_size",
  "model.num_layers",
  "model.num_heads",
  "model.mlp_ratio",
  "model.cond_dim",
  "model.adaln",
  "model.backbone",
  "model.head_dim",
  "model.intermediate_size",
  "model.num_kv_heads",
  "model.tie_embeddings",
  "model.scan_layers",
  "model.rope_base",  # not a shape, but what the saved parameters compute (and were trained for)
  "model.rms_norm_eps",
  "loss.*",
  "tokenizer.*",
  "data.source",
  "data.tfds_name",
  "data.train_split",
  "data.paths",
  "data.text_unit",
  "data.jsonl_field",
  "data.preprocess",
  "data.wrap_style",
  "data.overlong",
  "data.prompt_field",
  "data.answer_field",
  "data.prompt_style",
  "data.overflow",
  "data.pad_targets",
  "data.task_operands",
  "data.task_max_operand",
  "data.task_train_examples",
  "data.task_seed",
  "rl.init_from",  # an RL run's SFT run: its parameters are the KL reference, its data the prompts
  "rl.init_step",  # and the SFT step it started from (recorded at the first start)
)
# Zero / non-zero adds or removes an optimizer-chain element (a different state structure).
ON_OFF = ("grad_clip_norm", "weight_decay")
RUN_PATH_FIELDS = ("init_from", "rl.init_from")  # config fields naming a run's checkpoints
PATH_FIELDS = (
  "data.paths",
  "data.eval_paths",
  "data.tfds_data_dir",
  "tokenizer.vocab_path",
  "tokenizer.merges_path",
  "init_from",
  "rl.init_from",
)


# ----------------------------------------------------------------------------- lock
def _remote(path: str) -> bool:
  return paths.is_remote(path)


class WorkdirLock:
  """`with WorkdirLock(workdir, jax.process_index()):` holds the workdir for this process."""

  def __init__(self, workdir: str, process_index: int = 0):
    self.workdir = workdir
    self.path = os.path.join(workdir, LOCK_DIR, f"process_{int(process_index)}.lock")
    self._fd: Optional[int] = None

  def _holder(self) -> str:
    try:
      with open(self.path, encoding="utf-8") as f:
        info = json.load(f)
      return f"pid {info['pid']} on {info['host']} (since {info['since']})"
    except (OSError, ValueError, KeyError):
      return "another process (its pid is not recorded yet)"

  def acquire(self) -> "WorkdirLock":
    if _remote(self.workdir):
      logging.warning(
        "workdir %s is not a local/NFS path: it cannot be locked; make sure no "
        "other trainer uses it",
        self.workdir,
      )
      return self
    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      os.close(fd)
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        raise errors.WorkdirInUseError(
          f"workdir {self.workdir} in use by {self._holder()}: wait for that run to end (or "
          "stop it), or train into another --workdir"
        ) from None
      logging.warning("cannot lock %s (%s); continuing without a workdir lock", self.path, e)
      return self
    info = {
      "pid": os.getpid(),
      "host": socket.gethostname(),
      "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(info).encode())
    self._fd = fd
    return self

  def release(self):
    if self._fd is not None:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc):
    self.release()


# ----------------------------------------------------------------------------- config checks
def flatten(tree: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def _as_json(config) -> Dict[str, Any]:
  if isinstance(config, dict):
    return json.loads(json.dumps(config, default=str))
  return json.loads(config.to_json_best_effort())


def _normalized(name: str, value):
  """Paths compared as absolute paths (config.json of older runs stored them as given)."""
  if name not in PATH_FIELDS or not value:
    return value
  parts = value.split(",") if isinstance(value, str) else list(value)
  return [p if _remote(p) else os.path.abspath(p.strip()) for p in parts if p.strip()]


def structural(name: str) -> bool:
  return any(name == f or (f.endswith(".*") and name.startswith(f[:-1])) for f in STRUCTURAL)


def structural_changes(old, new, unread=None) -> List[Tuple[str, Any, Any]]:
  """(field, old value, new value) for every structural difference; fields that only one side
  has (a config of an older version of the code) are not compared, nor the fields `unread(old)`
  names (flattened keys of settings the old run's method never read: `trainer.locked` passes
  the objectives' table, which this plumbing does not import)."""
  from setdiff_jax.data import data_flags  # here: the data layer loads jax

  a, b = flatten(_as_json(old)), flatten(_as_json(new))
  old_data = _as_json(old).get("data") or {}
  unread = set(unread(_as_json(old)) if unread else ())  # a setting never read: no part of it
  unread |= {f"data.{field}" for field, _ in data_flags.unread_settings(old_data)}
  out = []
  for name in sorted((set(a) & set(b)) - unread):
    va, vb = _normalized(name, a[name]), _normalized(name, b[name])
    if name in ON_OFF:
      if (float(va or 0) > 0) != (float(vb or 0) > 0):
        out.append((name, a[name], b[name]))
    elif structural(name) and va != vb:
      out.append((name, a[name], b[name]))
  return out


def saved_steps(workdir: str) -> List[int]:
  """Steps with a checkpoint folder (complete or not; orbax writes into temporary names)."""
  d = paths.join(workdir, CHECKPOINT_DIR)
  if not paths.isdir(d):
    return []
  return sorted(int(s) for s in paths.listdir(d) if s.isdigit())


def check_workdir_path(workdir: str, flag: str = "--workdir"):
  """ValueError if `workdir` is empty (it would mean the current directory), holds a character the
  checkpoint library reads as a pattern (`paths.check_plain_name`), or it (or a folder above it)
  is an existing regular file."""
  if not str(workdir or "").strip():
    raise ValueError(f"{flag} is empty (an unset shell variable?): pass the run directory")
  paths.check_plain_name(workdir, flag)
  if paths.is_remote(workdir):
    return
  node = os.path.abspath(workdir)
  while not os.path.exists(node) and os.path.dirname(node) != node:
    node = os.path.dirname(node)
  if os.path.exists(node) and not os.path.isdir(node):
    what = "is" if node == os.path.abspath(workdir) else f"is inside {node}, which is"
    raise ValueError(
      f"{flag}={workdir} {what} a regular file, not a directory: pass a directory (a new one, "
      "or a run's)"
    )


def run_directory_of(path: str) -> Optional[str]:
  """The nearest directory above `path` (local or an object store's) that is a training run (its
  config.json beside checkpoints/ or tokenizer/), None if there is none: a file written there
  could be deleted by retention or read as one of the run's own."""
  node = paths.parent(path)
  while True:
    if paths.isfile(paths.join(node, CONFIG_FILE)) and any(
      paths.isdir(paths.join(node, d)) for d in (CHECKPOINT_DIR, "tokenizer")
    ):
      return node
    above = paths.parent(node)
    if above == node:
      return None
    node = above


def check_new_workdir(config, workdir: str):
  """ValueError for a workdir that is a file, or for num_train_steps < 1 on a workdir without
  checkpoints (nothing would be trained or saved); called before anything is written."""
  check_workdir_path(workdir)
  for name in RUN_PATH_FIELDS:  # a checkpoint read through a pattern could be another run's
    value = fields.lookup(config, name)  # MISSING where a level lacks it
    if isinstance(value, str) and value:
      paths.check_plain_name(value, f"--config.{name}")
  if not saved_steps(workdir) and int(config.get("num_train_steps", 1)) < 1:
    raise ValueError(
      f"invalid config: num_train_steps={config.num_train_steps} on the new "
      f"workdir {workdir} would train nothing and save no checkpoint; allowed: "
      "an integer in [1, inf) (set --config.num_train_steps)"
    )


def check_resume(config, workdir: str, unread=None):
  """Raises ConfigMismatchError if `config` would resume WORKDIR's checkpoints with a different
  structure, or if WORKDIR has checkpoints but no config.json (their structure cannot be checked)
  unless `config.accept_missing_config`. `unread`: `structural_changes`'."""
  steps = saved_steps(workdir)
  path = paths.join(workdir, CONFIG_FILE)
  if not steps:
    return
  if not paths.isfile(path):
    if config.get("accept_missing_config", False):
      logging.warning(
        "%s is missing: resuming checkpoint steps %s with this run's config as "
        "its reconstruction (accept_missing_config=True)",
        path,
        steps,
      )
      return
    raise errors.ConfigMismatchError(
      f"{path} is missing but {workdir} has checkpoint steps {steps}: the structure they were "
      "trained with cannot be checked. Restore config.json from a backup, or pass the exact "
      "config they were trained with and --config.accept_missing_config=True to accept it as "
      "the reconstruction"
    )
  try:
    old = json.loads(paths.read_text(path))
  except ValueError as e:
    raise errors.ConfigMismatchError(
      f"{path} is damaged ({e}); it records the config of the checkpoints in {workdir}. "
      "Restore it, or train into another --workdir"
    ) from e
  _check_same_kind(old, config, workdir, steps)
  changes = structural_changes(old, config, unread)
  if not changes:
    _log_other_changes(old, config, workdir, steps)
    return
  diff = "; ".join(f"{k}: {json.dumps(o)} -> {json.dumps(n)}" for k, o, n in changes)
  rl = config.get("rl")  # an RL run starts from --config.rl.init_from (an SFT or RL workdir)
  init_flag = "rl.init_from" if rl is not None and rl.get("init_from") else "init_from"
  raise errors.ConfigMismatchError(
    f"refusing to resume {workdir} (checkpoint steps {steps}): the config differs from its "
    f"{CONFIG_FILE} in fields the checkpoints depend on: {diff}. Nothing was written. To "
    f"resume, drop these overrides; for a new run use another --workdir; to start a new run "
    f"from this one's parameters (same model shape) add --config.{init_flag}={workdir}"
  )


def _check_same_kind(old, new, workdir: str, steps):
  """An RL run's checkpoints resumed by launch/train.py, or a training run's by launch/rl.py: the
  structures differ in ways the restore would blame on versions or deleted files; named here."""
  was_rl, is_rl = isinstance(old.get("rl"), dict), new.get("rl") is not None
  if was_rl == is_rl:
    return
  if was_rl:
    raise errors.ConfigMismatchError(
      f"{workdir} (checkpoint steps {steps}) is an RL run (its {CONFIG_FILE} has an rl section): "
      "resume it with launch/rl.py, or train into another --workdir"
    )
  raise errors.ConfigMismatchError(
    f"{workdir} (checkpoint steps {steps}) is a training run (launch/train.py), not an RL run: "
    f"give the RL run a new --workdir (--config.rl.init_from={workdir} starts it from this one)"
  )


def _log_other_changes(old, new, workdir: str, steps):
  """One warning naming the settings a resume changes (old -> new; config.json then records the
  new ones only): the metrics after the resume step were made under them."""
  a, b = flatten(_as_json(old)), flatten(_as_json(new))
  changed = [
    f"{k}: {json.dumps(a[k])} -> {json.dumps(b[k])}"
    for k in sorted(set(a) & set(b))
    if _normalized(k, a[k]) != _normalized(k, b[k])
  ]
  if changed:
    logging.warning(
      "resuming %s from step %d with changed settings: %s", workdir, max(steps), "; ".join(changed)
    )


def absolute_paths(config):
  """A copy of `config` whose local file paths (`PATH_FIELDS`) are absolute."""
  config = copy.deepcopy(config)
  for name in PATH_FIELDS:
    *parents, leaf = name.split(".")
    node = config
    for p in parents:
      node = node.get(p) if hasattr(node, "get") else None
      if node is None:
        break
    if node is None or leaf not in node or not node[leaf]:
      continue
    value = node[leaf]
    if isinstance(value, str):
      node[leaf] = ",".join(
        p.strip() if _remote(p.strip()) else os.path.abspath(p.strip())
        for p in value.split(",")
        if p.strip()
      )
    elif isinstance(value, (list, tuple)):
      node[leaf] = type(value)(p if _remote(p) else os.path.abspath(p) for p in value)
  return config


__all__ = [
  "WorkdirLock",
  "STRUCTURAL",
  "structural_changes",
  "check_workdir_path",
  "run_directory_of",
  "check_new_workdir",
  "check_resume",
  "absolute_paths",
  "saved_steps",
]
