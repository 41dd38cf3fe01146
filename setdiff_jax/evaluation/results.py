"""The evaluation results file (WORKDIR/eval_results.json by default): its history keys, reading,
writing, and the hardware stamp of each record.

Every result is kept in `history`, keyed by (step, EMA/raw, eval kind, settings, data)
(`history_key`; the data by paths and content hashes, also stored in each entry);
`evaluation/run.py` merges a new evaluation in and writes the record with `write_results`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from typing import Any, Dict, Optional

import jax

from setdiff_jax import errors, paths

EVALS = ("likelihood", "infill", "speed", "samples", "accuracy")
RESULTS_FILE = "eval_results.json"


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
  step: int, use_ema: bool, name: str, settings: Dict[str, Any], data: Optional[Dict] = None
) -> str:
  """The key of one result in the history: step, EMA/raw, eval kind, its settings and, for an
  eval that reads data, the data (`eval_data`: paths and content hashes)."""
  key = f"step={int(step)} params={'ema' if use_ema else 'raw'} eval={name} "
  key += f"settings={_digest(settings)}"
  return key + (f" data={_digest(data)}" if data else "")


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
  """The results file, {} if absent; a damaged one is an error (it is never overwritten)."""
  if not paths.exists(path):
    return {}
  try:
    record = json.loads(paths.read_text(path))
  except (ValueError, OSError) as e:
    raise ValueError(
      f"{path} is unreadable ({e}); it holds earlier evaluation results: move it "
      "away, or pass --output=ANOTHER.json"
    ) from e
  if not isinstance(record, dict):
    raise ValueError(f"{path} is not an evaluation results file; pass --output=ANOTHER.json")
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
    try:
      fd, kept = tempfile.mkstemp(prefix="setdiff_eval_results_", suffix=".json")
      with os.fdopen(fd, "w") as f:
        f.write(text)
      where = f"kept in {kept}. Copy them from there, or"
    except (OSError, FileNotFoundError) as e2:  # the temporary directory fails too
      where = f"no copy could be kept ({errors.write_limit(e2) or e2}); save them from above, or"
    msg = (
      f"could not write the evaluation results to {path} ({why}); the earlier results there "
      f"are intact; the new ones are printed above and {where} pass "
      f"--output=A_WRITABLE_FILE.json next time"
    )
    raise (errors.DiskFullError(msg) if errors.write_limit(e) else OSError(e.errno, msg)) from e


__all__ = [
  "EVALS",
  "RESULTS_FILE",
  "hardware",
  "history_key",
  "file_identity",
  "split_identity",
  "read_record",
  "write_results",
]
