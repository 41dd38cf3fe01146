"""The data files a run trains on, fingerprinted so a resume notices when one changed.

A checkpoint stores the data iterator's position: a count into the documents of `data.paths`. A
file edited, replaced or truncated between two calls would make the resume continue at that
count in other documents (some seen twice, some never), with no error. So the first start writes
WORKDIR/data_files.json ({absolute path: {"bytes": n, "sha256": hex}} for `data.paths` and
`data.eval_paths`), and a resume recomputes it:
- a training file that differs refuses the resume (`DataFilesChangedError`), naming each file;
- an evaluation file that differs is a warning (the eval curve changes data at this step).

  prints = data_files.check(cfg.data, workdir, resuming)   # before anything is written
  ...
  data_files.save(workdir, prints)                          # process 0, beside config.json

The whole file is hashed (sha256, ~1 GB/s): the text sources read every file whole anyway.
"""

from __future__ import annotations

import hashlib
import json
from typing import Dict, List, Optional

from absl import logging

from setdiff_jax import errors, paths
from setdiff_jax.data import data_flags, text_files

FILE = "data_files.json"
_CHUNK = 1 << 20
# field -> whether a change refuses the resume (training data) or only warns (evaluation data)
_FIELDS = {"paths": True, "eval_paths": False}

Fingerprint = Dict[str, object]  # {"bytes": int, "sha256": str}


class DataFilesChangedError(errors.ConfigMismatchError):
  """A training data file differs from the one the run's checkpoints were trained on."""


def fingerprint(path: str) -> Fingerprint:
  """{"bytes": size, "sha256": hex digest} of the file's stored bytes (local or remote)."""
  digest, size = hashlib.sha256(), 0
  with paths.open_binary(path) as f:
    while chunk := f.read(_CHUNK):
      digest.update(chunk)
      size += len(chunk)
  return {"bytes": size, "sha256": digest.hexdigest()}


def fingerprints(data_cfg) -> Dict[str, Dict[str, Fingerprint]]:
  """{field: {path: fingerprint}} of the data-path fields the run's source reads (`data.paths`,
  `data.eval_paths`); empty for sources without files (embedded, tfds, the procedural tasks)."""
  out = {}
  for field in _FIELDS:
    if data_cfg.get("source") not in data_flags.READERS[field]:
      continue
    files = text_files.parse_paths(data_cfg.get(field))
    if files:
      # a missing file is the data loader's error to name (with its flag)
      out[field] = {p: fingerprint(p) for p in files if paths.isfile(p)}
  return out


def load(workdir: str) -> Optional[Dict[str, Dict[str, Fingerprint]]]:
  """WORKDIR/data_files.json, None when absent (a new run, or one from before this file)."""
  path = paths.join(workdir, FILE)
  if not paths.isfile(path):
    return None
  try:
    return json.loads(paths.read_text(path))
  except ValueError as e:
    raise errors.ConfigMismatchError(
      f"{path} is damaged ({e}): it records the data files this run's checkpoints were trained "
      f"on. Restore it, or delete it to accept the files as they are now"
    ) from e


def _differences(old: Dict[str, Fingerprint], new: Dict[str, Fingerprint]) -> List[str]:
  out = []
  for path in sorted(set(old) & set(new)):
    a, b = old[path], new[path]
    if a != b:
      how = f"{a['bytes']} -> {b['bytes']} bytes" if a["bytes"] != b["bytes"] else "same size"
      out.append(f"{path} ({how}, other content)")
  return out


def check(data_cfg, workdir: str, resuming: bool) -> Dict[str, Dict[str, Fingerprint]]:
  """The fingerprints of the run's data files now; raises DataFilesChangedError when `resuming`
  and a training file differs from WORKDIR/data_files.json (a path that is new or gone there is
  the structural check's business: `data.paths` cannot change on resume)."""
  now = fingerprints(data_cfg)
  old = load(workdir) if resuming else None
  if not old:
    return now
  changed = _differences(old.get("paths", {}), now.get("paths", {}))
  if changed:
    raise DataFilesChangedError(
      f"refusing to resume {workdir}: training data changed since its checkpoints were saved: "
      f"{'; '.join(changed)}. The checkpoints' data position counts documents of the old files, "
      f"so the run would skip or repeat documents. Restore the files; or to go on from these "
      f"checkpoints with the files as they are, delete {paths.join(workdir, FILE)}; or start a "
      f"new run from these parameters with --config.init_from={workdir} in another --workdir"
    )
  for line in _differences(old.get("eval_paths", {}), now.get("eval_paths", {})):
    logging.warning(
      "evaluation file changed since the last start of %s: %s; eval metrics from here on are "
      "on other data than the earlier ones",
      workdir,
      line,
    )
  return now


def save(workdir: str, prints: Dict[str, Dict[str, Fingerprint]]):
  """Writes WORKDIR/data_files.json (whole-file; process 0 only), unless it already says this."""
  if prints and load(workdir) != prints:
    paths.write_text(paths.join(workdir, FILE), json.dumps(prints, indent=2, sort_keys=True))


__all__ = ["FILE", "DataFilesChangedError", "fingerprint", "fingerprints", "check", "save", "load"]
