"""The evaluation results file (WORKDIR/eval_results.json by default): its history keys, reading,
writing, and the hardware stamp of each record.

Every result is kept in `history`, keyed by (step, EMA/raw, eval kind, settings, data and, for
the evals that time decoding, the hardware and mesh) (`history_key`; the data by paths and content
hashes, the machine by `hardware`, both also stored in each entry);
`evaluation/run.py` merges a new evaluation in and writes the record with `write_results`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import platform
import tempfile
import time
from typing import Any, Dict, Iterator, Optional

import jax

from setdiff_jax import errors, paths
from setdiff_jax.data.tokenizers import TOKENIZER_SUBDIR
from setdiff_jax.workdir import data_files, metrics
from setdiff_jax.workdir import lock as workdir_lock

EVALS = ("likelihood", "infill", "speed", "samples", "accuracy")
# Evals whose rows carry tokens/s: a number of the machine and mesh, so their history entries are
# keyed by both (another machine's timing is a result of its own, never a replacement).
TIMED_EVALS = ("infill", "speed", "samples", "accuracy")
RESULTS_FILE = "eval_results.json"
# What a training run writes at its top level: an --output of one of these names there would be
# overwritten by the trainer (or read by it as its own), even when it does not exist yet.
RUN_OWNED = (
  workdir_lock.CONFIG_FILE,
  data_files.FILE,
  metrics.METRICS_FILE,
  metrics.DISCARDED_FILE,
  workdir_lock.CHECKPOINT_DIR,
  workdir_lock.LOCK_DIR,
  TOKENIZER_SUBDIR,
  metrics.TENSORBOARD_DIR,
)
LOCK_WAIT_S = 60.0  # the longest wait for another evaluation's write of the same file


def hardware() -> Dict[str, Any]:
  """Where the numbers were measured."""
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          cpu = line.split(":", 1)[1].strip()
          break
  except OSError:
    pass
  dev = jax.devices()[0]
  return {
    "backend": jax.default_backend(),
    "device": getattr(dev, "device_kind", str(dev)),
    "num_devices": jax.device_count(),
    "cpu": cpu,
    "cpu_count": os.cpu_count(),
    "jax": jax.__version__,
    "python": platform.python_version(),
  }


def _digest(value) -> str:
  return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


def history_key(
  step: int,
  use_ema: bool,
  name: str,
  settings: Dict[str, Any],
  data: Optional[Dict] = None,
  machine: Optional[Dict] = None,
) -> str:
  """The key of one result in the history: step, EMA/raw, eval kind, its settings and, for an
  eval that reads data, the data (`eval_data`: paths and content hashes); for a timed eval
  (TIMED_EVALS), `machine`: {"hardware", "mesh"} it ran on (`machine`)."""
  key = f"step={int(step)} params={'ema' if use_ema else 'raw'} eval={name} "
  key += f"settings={_digest(settings)}"
  key += f" data={_digest(data)}" if data else ""
  return key + (f" hardware={_digest(machine)}" if machine else "")


def machine(params=None) -> Dict[str, Any]:
  """{"hardware": `hardware()`, "mesh": {axis: size} of the mesh `params` are placed on (None if
  they carry no mesh)}: where a timed eval ran."""
  mesh = None
  leaves = jax.tree_util.tree_leaves(params) if params is not None else []
  if leaves and getattr(getattr(leaves[0], "sharding", None), "mesh", None) is not None:
    mesh = {str(k): int(v) for k, v in leaves[0].sharding.mesh.shape.items()}
  return {"hardware": hardware(), "mesh": mesh}


def file_identity(path: str) -> Dict[str, Any]:
  """{"path", "sha256"} of one data file (content hash: the same name may hold other data)."""
  digest = hashlib.sha256()
  with paths.open_binary(path) as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      digest.update(chunk)
  return {"path": paths.resolve(path), "sha256": digest.hexdigest()}


def split_identity(data_cfg) -> Dict[str, Any]:
  """What the run's eval split is: its source and files (with content hashes), TFDS dataset and
  split, embedded split, or the procedural task's fields."""
  from setdiff_jax.data import text_files  # pylint: disable=g-import-not-at-top

  source = data_cfg.get("source")
  out: Dict[str, Any] = {"source": source}
  if source in ("text", "jsonl", "pairs_jsonl"):
    out["files"] = [file_identity(p) for p in text_files.parse_paths(data_cfg.get("eval_paths"))]
  elif source in ("tfds", "gsm8k"):
    out.update(
      tfds_name=data_cfg.get("tfds_name") if source == "tfds" else "gsm8k",
      split=data_cfg.get("eval_split"),
      tfds_data_dir=data_cfg.get("tfds_data_dir"),
    )
  elif source == "embedded":
    out["split"] = data_cfg.get("eval_split")
  else:  # a procedural task: its fields define the problems
    out.update({k: v for k, v in data_cfg.items() if str(k).startswith("task_")})
  return out


def read_record(path: str) -> Dict[str, Any]:
  """The results file, {} if absent; a damaged one, or a JSON file that is not a results file (a
  run's config.json, a tokenizer), is an error: it is never overwritten."""
  if not paths.exists(path):
    return {}
  if paths.isdir(path):
    raise ValueError(
      f"{path} is a directory, not a results file: pass a file path, e.g. "
      f"--output={paths.join(path, RESULTS_FILE)}"
    )
  try:
    text = paths.read_text(path)
  except (OSError, UnicodeDecodeError) as e:
    raise ValueError(
      f"{path} cannot be read ({e}); it is left as it is: fix its permissions, or pass "
      "--output=ANOTHER.json"
    ) from e
  try:
    record = json.loads(text)
  except ValueError as e:  # another kind of file, or a damaged results file: never overwritten
    raise ValueError(
      f"{path} is not a JSON file ({e}), so not a results file to add to; it is left as it is: "
      "pass --output=A_NEW_FILE.json, or move it away"
    ) from e
  results_file = isinstance(record, dict) and (
    not record
    or "history" in record
    or (record.get("step") is not None and any(e in record for e in EVALS))
  )
  if not results_file:
    raise ValueError(
      f"{path} is not an evaluation results file (it would be overwritten); pass "
      "--output=A_NEW_FILE.json"
    )
  if "history" not in record and record.get("step") is not None:  # a file of an older version
    options = record.get("options", {})
    record["history"] = {
      history_key(record["step"], record.get("use_ema", True), e, options.get(e, {})): {
        "step": record["step"],
        "use_ema": record.get("use_ema", True),
        "eval": e,
        "settings": options.get(e, {}),
        "time": record.get("time"),
        "result": record[e],
      }
      for e in EVALS
      if e in record
    }
  return record


def check_output_path(path: str, workdir: str):
  """ValueError for a results file inside one of a run directory's folders (checkpoints/,
  tokenizer/, ...: checkpoint retention would delete it, or a load would read it as the run's
  own file), or at a run's top level under a name the run owns (RUN_OWNED: config.json,
  metrics.jsonl, ...; refused even before the trainer has written it), or at the top level of
  another run than `workdir` (its own evaluation would replace them). Another file at this run's
  top level is allowed (read_record checks its content)."""
  remote = paths.is_remote(path)
  real = path.rstrip("/") if remote else os.path.realpath(path)
  this = workdir.rstrip("/") if remote else os.path.realpath(workdir)
  folder, name = paths.parent(real), real.rsplit("/", 1)[-1]
  run = workdir_lock.run_directory_of(real)
  if name in RUN_OWNED and folder == (run or this):  # this run's, even before the trainer writes
    _refuse_owned(path, name, run or workdir)
  if run is not None and folder == run != this:
    raise ValueError(  # that run's own evaluation would later replace these results
      f"--output={path} is in the run directory {run}, not in this run's ({workdir}): write it "
      f"in this run's directory ({paths.join(workdir, RESULTS_FILE)} is the default) or "
      "outside any run"
    )
  if run is not None and folder != run:
    raise ValueError(
      f"--output={path} is inside {folder[len(run) + 1 :]}/ of the run directory {run}, where "
      f"the run keeps its own files: write it at the run's top level "
      f"({paths.join(workdir, RESULTS_FILE)} is the default) or outside the run"
    )


def _refuse_owned(path: str, name: str, run: str):
  raise ValueError(
    f"--output={path} is not an evaluation results file: {name} belongs to the training run "
    f"{run} (the trainer writes it, over any results there): pass another name, e.g. "
    f"--output={paths.join(run, RESULTS_FILE)}"
  )


def _flock_within(fd: int, seconds: float) -> bool:
  """Takes an exclusive flock on fd, waiting at most `seconds` (a holder only reads, merges and
  writes one file); False if it did not come free."""
  deadline = time.monotonic() + seconds
  while True:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      return True
    except BlockingIOError:
      if time.monotonic() > deadline:
        return False
      time.sleep(0.05)


class LockBusy(OSError):
  """Another evaluation held a results file's lock past `LOCK_WAIT_S`."""


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
  """Holds an exclusive flock on a hidden file beside `path` (local and NFS paths), so two
  evaluations writing one results file merge instead of one replacing the other. Raises
  `LockBusy` when the lock does not come free within LOCK_WAIT_S: a merge without it would let the
  holder's later write drop this result. Object-store paths have no locks (the re-read at write
  time narrows the window there, it cannot close it); where the lock file cannot be made, the
  write goes on and `write_results` reports its failure."""
  fd = lock_file = None
  if not paths.is_remote(path):
    directory, name = os.path.split(os.path.abspath(path))
    lock_file = os.path.join(directory, f".{name}.lock")
    try:
      os.makedirs(directory, exist_ok=True)
      fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
      fd = None
  try:
    if fd is not None and not _flock_within(fd, LOCK_WAIT_S):
      raise LockBusy(
        errno.EBUSY,
        f"another evaluation has held {lock_file} for {LOCK_WAIT_S:.0f} s (a stopped process, "
        "or a hung file system)",
      )
    yield
  finally:
    if fd is not None:
      os.close(fd)  # releases the lock


def _kept_copy(text: str) -> str:
  """Where a copy of results that could not be written went, in words."""
  try:
    fd, kept = tempfile.mkstemp(prefix="setdiff_eval_results_", suffix=".json")
    with os.fdopen(fd, "w") as f:
      f.write(text)
    return f"kept in {kept}. Copy them from there, or"
  except (OSError, FileNotFoundError) as e:  # the temporary directory fails too
    return f"no copy could be kept ({errors.write_limit(e) or e}); save them from above, or"


def unwritten(record: Dict[str, Any], path: str, why: str, fix: str) -> str:
  """The message for results not written to `path`: they are kept in a temporary file."""
  where = _kept_copy(json.dumps(record, indent=2, default=str))
  return (
    f"could not write the evaluation results to {path} ({why}); the earlier results there "
    f"are intact; the new ones are printed above and {where} {fix}"
  )


def write_results(record: Dict[str, Any], path: str):
  """Writes `record` to `path` (`paths.write_text`: write-then-rename, or one object upload).
  If that fails, the results go to a file in the temporary directory and the OSError raised names
  both paths."""
  text = json.dumps(record, indent=2, default=str)
  try:
    if not paths.is_remote(path):
      os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    paths.write_text(path, text)
  except OSError as e:
    why = errors.write_limit(e) or (e.strerror or str(e))
    msg = unwritten(record, path, why, "pass --output=A_WRITABLE_FILE.json next time")
    raise (errors.DiskFullError(msg) if errors.write_limit(e) else OSError(e.errno, msg)) from e


def merged(record, top, entries, options, data_of, results) -> Dict[str, Any]:
  """The results file's `record` with an evaluation's history `entries` added; its top level
  mirrors that evaluation (`top`: workdir, step, use_ema, ...), merged with earlier evals of the
  same step and parameters (`run.evaluate_workdir`)."""
  history = record.pop("history", {})
  history.update(entries)
  if record.get("step") != top["step"] or record.get("use_ema", True) != top["use_ema"]:
    record = {}  # the top level mirrors one (step, parameters) only
  record.update(top)
  record.setdefault("options", {}).update(options)
  record.setdefault("data", {}).update(data_of)
  record.update(results)
  record["history"] = history
  return record


def save_evaluation(path: str, writer: bool, **parts) -> Dict[str, Any]:
  """`merged(record at path, **parts)`, written by the `writer` process (every process computed
  the same results) under the file's lock, re-read there: another evaluation may have written it
  meanwhile. Returns the merged record."""
  try:
    with locked(path) if writer else contextlib.nullcontext():
      record = merged(read_record(path), **parts)
      if writer:
        write_results(record, path)
  except LockBusy as e:  # merging without the lock could lose one of the two results
    raise LockBusy(
      e.errno,
      unwritten(merged({}, **parts), path, e.strerror, "run the evaluation again when it is free"),
    ) from e
  return record


__all__ = [
  "EVALS",
  "TIMED_EVALS",
  "RESULTS_FILE",
  "RUN_OWNED",
  "hardware",
  "machine",
  "history_key",
  "file_identity",
  "split_identity",
  "read_record",
  "check_output_path",
  "locked",
  "LockBusy",
  "unwritten",
  "write_results",
  "merged",
  "save_evaluation",
]
