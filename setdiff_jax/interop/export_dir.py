"""Where an export may be written (SPEC §9.2).

  check_export_dir(out, workdir, overwrite)   launch/export.py's --out, before anything is restored
  check_out_dir(out_dir, overwrite)           every exporter, after validating, before staging
  stale_weight_files(out_dir)                 the weights an import could read there, any layout

A training run's directory is never an export target (the export's config.json would replace the
run's); a non-empty directory needs `overwrite`. How an export then replaces the files there
(every weight file an import could read: single files, both `*.index.json` and the shards they
list, so the folder never holds two sets of weights) is `staging`'s.
"""

from __future__ import annotations

import json
import os
import re
from typing import List

from setdiff_jax import paths
from setdiff_jax.interop import weight_files
from setdiff_jax.workdir import lock as workdir_lock

# The single weight files an export may hold, and the indexes of sharded ones (HF save_pretrained).
WEIGHT_FILES = (weight_files.SAFETENSORS_FILE, weight_files.BIN_FILE)
INDEX_FILES = tuple(f + ".index.json" for f in WEIGHT_FILES)
# HF shard names, removed even when their index is damaged (then its weight_map is unreadable).
_SHARD_NAME = re.compile(r"^(model|pytorch_model)-\d+-of-\d+\.(safetensors|bin)$")


def _is_run_dir(path: str) -> bool:
  """A training workdir: checkpoints/ (with or without config.json), or config.json + tokenizer/."""
  if os.path.isdir(os.path.join(path, workdir_lock.CHECKPOINT_DIR)):
    return True
  return os.path.isfile(os.path.join(path, weight_files.CONFIG_FILE)) and os.path.isdir(
    os.path.join(path, "tokenizer")
  )


def check_not_run_dir(out_dir: str):
  """ValueError when local `out_dir` is a training workdir or lies inside one: an export there
  replaces the run's config.json, or retention deletes it / a load misreads it."""
  target = os.path.realpath(out_dir)
  if _is_run_dir(target):
    raise ValueError(
      f"{out_dir} is a training workdir (it has checkpoints/ or tokenizer/ beside config.json); "
      f"exporting there would replace the run's config.json. Export to a new directory, e.g. "
      f"{target}_export"
    )
  run = workdir_lock.run_directory_of(target)
  if run is not None:
    raise ValueError(
      f"{out_dir} is inside the training run {run}, whose own files (checkpoints/, tokenizer/) "
      f"an export would replace or retention delete. Export outside any run directory, e.g. "
      f"{run}_export"
    )


def _index_shards(index: str) -> List[str]:
  """The shard names an `*.index.json` lists ([] when it is damaged: the name pattern covers it)."""
  try:
    weight_map = json.loads(paths.read_text(index)).get("weight_map") or {}
    return [s for s in weight_map.values() if isinstance(s, str)]
  except (OSError, ValueError, AttributeError):
    return []


def stale_weight_files(out_dir: str) -> List[str]:
  """Paths of every weight file in `out_dir` (local or an object store) an importer could read
  (`weight_files.weight_files`, `pretrained.weight_shards`): the single files, the indexes, their
  shards, HF-named shards."""
  if not paths.isdir(out_dir):
    return []
  names = set(WEIGHT_FILES + INDEX_FILES)
  for index in INDEX_FILES:
    names.update(_index_shards(paths.join(out_dir, index)))
  names.update(n for n in paths.listdir(out_dir) if _SHARD_NAME.match(n))
  remote, root = paths.is_remote(out_dir), os.path.realpath(out_dir)
  out = []
  for name in sorted(names):
    path = paths.join(out_dir, name)
    # an index naming "../x" must not delete outside the folder
    if remote:
      inside = "/" not in name and name not in ("", ".", "..")
    else:
      inside = os.path.commonpath([root, os.path.realpath(path)]) == root
    if inside and paths.isfile(path):
      out.append(path)
  return out


def check_out_dir(out_dir: str, overwrite: bool):
  """Refuses an export target: a run directory (`check_not_run_dir`), a file, or a non-empty
  folder without `overwrite` (FileExistsError). Call it after validating the inputs."""
  check_not_run_dir(out_dir)
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise ValueError(f"{out_dir} is a file, not a directory: choose a directory to export to")
  if os.path.isdir(out_dir) and os.listdir(out_dir) and not overwrite:
    raise FileExistsError(
      f"{out_dir} is not empty; choose a new directory or pass overwrite=True (--overwrite) "
      "to replace the files there"
    )


def check_export_dir(out: str, workdir: str, *, overwrite: bool = False):
  """Refuses an export target that would damage a run or silently replace weight_files.

  A training workdir (the source itself, or any directory with checkpoints/) is always refused:
  the export's config.json would replace the run's. So is any path inside the source workdir,
  existing or not (symlinks and relative paths resolved): checkpoint retention would delete an
  export under checkpoints/, and one at checkpoints/<step> would read as a damaged checkpoint.
  A non-empty directory needs `overwrite`. (`export_checkpoint` repeats the run-directory check
  for every caller: `check_out_dir`.)
  """
  if paths.is_remote(out):  # the object store's glob deletes (an export over another) and URLs
    paths.check_plain_name(out, "--out")
  if paths.is_remote(out) or paths.is_remote(workdir):  # an object store: no realpath, no files
    return _check_remote_export_dir(out, workdir, overwrite)
  target, source = os.path.realpath(out), os.path.realpath(workdir)
  if target == source or os.path.isdir(os.path.join(target, "checkpoints")):
    raise ValueError(
      f"--out={out} is a training workdir; exporting there would replace its "
      "config.json. Choose a new directory for --out"
    )
  if os.path.commonpath([target, source]) == source:  # by path components: W2 is not inside W
    raise ValueError(
      f"--out={out} is inside the training workdir {workdir}; its checkpoint retention and "
      "loads would delete or misread the export. Export outside the run directory, e.g. "
      f"--out={source}_export"
    )
  other = workdir_lock.run_directory_of(target)
  if other is not None:  # another run's tokenizer/ or checkpoints/ would be replaced
    raise ValueError(
      f"--out={out} is inside the training run {other}, whose own files (tokenizer/, "
      "checkpoints/) an export would replace or retention delete. Export outside any run "
      f"directory, e.g. --out={source}_export"
    )
  node = target
  while not os.path.exists(node) and os.path.dirname(node) != node:
    node = os.path.dirname(node)
  if node != target and not os.path.isdir(node):
    raise ValueError(f"--out={out} is inside {node}, which is a file: choose a directory for --out")
  if os.path.isdir(target) and os.listdir(target) and not overwrite:
    raise ValueError(
      f"--out={out} is not empty; choose a new directory or pass overwrite=True "
      "(--overwrite) to replace the files there"
    )
  if os.path.exists(target) and not os.path.isdir(target):
    raise ValueError(f"--out={out} is a file, not a directory")


def _check_remote_export_dir(out: str, workdir: str, overwrite: bool):
  """`check_export_dir` for an object-store --out (or workdir), through `setdiff_jax.paths`."""
  target, source = out.rstrip("/"), paths.resolve(workdir).rstrip("/")
  if (
    target == source
    or target.startswith(source + "/")
    or paths.isdir(paths.join(target, "checkpoints"))
  ):
    raise ValueError(
      f"--out={out} is a training workdir (or inside one); exporting there would "
      "replace its config.json. Choose a new directory for --out"
    )
  if paths.isdir(target) and paths.listdir(target) and not overwrite:
    raise ValueError(
      f"--out={out} is not empty; choose a new directory or pass overwrite=True "
      "(--overwrite) to replace the files there"
    )
  if paths.isfile(target):
    raise ValueError(f"--out={out} is a file, not a directory")


__all__ = [
  "check_export_dir",
  "check_not_run_dir",
  "check_out_dir",
  "stale_weight_files",
  "WEIGHT_FILES",
  "INDEX_FILES",
]
