"""The evaluation results file (WORKDIR/eval_results.json by default): its history keys, reading,
writing, and the hardware stamp of each record.

Every result is kept in `history`, keyed by (step, EMA/raw, eval kind, settings) (`history_key`);
`evaluation/run.py` merges a new evaluation in and writes the record with `write_results`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from typing import Any, Dict

import jax

from setdiff_jax import paths

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


def history_key(step: int, use_ema: bool, name: str, settings: Dict[str, Any]) -> str:
  """The key of one result in the history: step, EMA/raw, eval kind and its settings."""
  text = json.dumps(settings, sort_keys=True, default=str)
  digest = hashlib.sha1(text.encode()).hexdigest()[:12]
  return f"step={int(step)} params={'ema' if use_ema else 'raw'} eval={name} settings={digest}"


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
    fd, kept = tempfile.mkstemp(prefix="setdiff_eval_results_", suffix=".json")
    with os.fdopen(fd, "w") as f:
      f.write(text)
    raise OSError(
      e.errno,
      f"could not write the evaluation results to {path} ({e.strerror or e})"
      f"; they are printed above and kept in {kept}. Copy them from there, or pass "
      f"--output=A_WRITABLE_FILE.json next time",
      path,
    ) from e


__all__ = ["EVALS", "RESULTS_FILE", "hardware", "history_key", "read_record", "write_results"]
