"""Writing an export so that its folder holds one whole export or none (SPEC §9.2).

  with staged(out_dir, overwrite) as stage:   # an empty folder on out_dir's file system
    ...write every file of the export into stage...
  # here out_dir holds exactly that export

The exporter writes into a hidden staging folder; only a finished export is published:
- out_dir absent or empty: the staging folder is renamed to it in one step, so a reader sees all of
  it or nothing, and a second export racing for the same new folder finds it taken (refused
  without `overwrite`).
- out_dir holds files (`overwrite`): its config.json goes first, then every file an export writes
  (weights of any layout, generation and tokenizer files, the Qwen3 template folder), then the new
  files move in, config.json last. A kill in between leaves a folder without config.json, which no
  importer reads as a checkpoint; the user's own other files stay.
An error or Ctrl-C before publishing removes the staging folder: out_dir is as it was. A staging
folder that a killed process left is removed by the next export to the same place.

An object-store out_dir (`published_remote`) has no rename: the export is written to a local
folder, then published in the same order (config.json removed, every export-owned file of an
earlier export removed, the new files uploaded, config.json last); an upload cut short leaves no
config.json, or (cut while removing) files the export id tells apart (`import_._check_export_id`:
the id in a model.safetensors' header, or recomputed from a pytorch_model.bin's tensors).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import tempfile
from typing import Iterator, List

from etils import epath

from setdiff_jax import paths
from setdiff_jax.interop import export_dir, qwen3_hf, weight_files

# Every name an export of ours writes besides its weights (which `export_dir.stale_weight_files`
# finds in any layout): removed from the folder an export replaces.
EXPORT_NAMES = (
  weight_files.CONFIG_FILE,
  weight_files.GENERATION_CONFIG_FILE,
  "tokenizer.json",
  "special_tokens.json",
  "tokenizer_config.json",
  "special_tokens_map.json",
  qwen3_hf.TEMPLATE_DIR,
)
_STAGE = ".export-"  # staging folders: <parent>/.<name>.export-<host>-<pid>-* or <out>/.export-...


def _host_prefix(target: str, inside: bool) -> str:
  """The staging folders' name up to the pid: this host's, for `target`."""
  base = _STAGE if inside else f".{os.path.basename(target)}{_STAGE}"
  return f"{base}{socket.gethostname()}-"


def _stage_parent(target: str) -> str:
  """Where to stage: beside an absent or empty `target` (then published by one rename), else
  inside it (the same file system, also for a mount point or an unwritable parent)."""
  parent = os.path.dirname(target)
  if not os.path.isdir(target):
    return parent
  if _entries(target) or not os.access(parent, os.W_OK):
    return target
  return parent if os.stat(parent).st_dev == os.stat(target).st_dev else target


def _is_stage(name: str) -> bool:
  return name.startswith(".") and _STAGE in name


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process
    return True
  return True


def _remove_abandoned(folder: str, prefix_without_pid: str):
  """Removes staging folders in `folder` of this host's processes that no longer run."""
  if not os.path.isdir(folder):
    return
  for name in os.listdir(folder):
    if not name.startswith(prefix_without_pid):
      continue
    pid = name[len(prefix_without_pid) :].split("-", 1)[0]
    if pid.isdigit() and not _alive(int(pid)):
      shutil.rmtree(os.path.join(folder, name), ignore_errors=True)


def _entries(target: str) -> List[str]:
  """The names in folder `target` other than staging folders."""
  if not os.path.isdir(target):
    return []
  return [n for n in os.listdir(target) if not _is_stage(n)]


def _make_readable(stage: str):
  """mkdtemp and some writers create 0700 / 0600 entries: give the export's own folder and files
  the mode a plain write would (umask); files already in out_dir are never touched."""
  umask = os.umask(0)
  os.umask(umask)
  for root, dirs, files in os.walk(stage):
    os.chmod(root, 0o777 & ~umask)
    for name in files:
      os.chmod(os.path.join(root, name), 0o666 & ~umask)


def _remove(path: str):
  if os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path)
  elif os.path.lexists(path):
    os.remove(path)


def _taken(target: str) -> FileExistsError:
  return FileExistsError(
    f"{target} was written by another export while this one ran; this export was not "
    "published (nothing there changed): choose a new directory or pass overwrite=True "
    "(--overwrite) to replace the files there"
  )


def _clear_earlier_export(target: str):
  """Removes an earlier export from `target` (local or an object store): config.json first (no
  longer a checkpoint), then its weights of any layout and every other file an export writes; the
  user's own files stay."""
  remote = paths.is_remote(target)

  def remove(path):
    if not remote:
      _remove(path)
    elif paths.isfile(path):  # files only: a Qwen3 export (its template folder) stays local
      paths.remove(path)

  remove(paths.join(target, weight_files.CONFIG_FILE))
  for path in export_dir.stale_weight_files(target):
    remove(path)
  for name in EXPORT_NAMES:
    remove(paths.join(target, name))


def _publish_order(folder: str) -> List[str]:
  """The names of the finished export in local `folder`, config.json last."""
  return sorted(os.listdir(folder), key=lambda n: (n == weight_files.CONFIG_FILE, n))


def _publish(stage: str, target: str, overwrite: bool):
  """Moves the finished export in `stage` to `target` (module doc)."""
  _make_readable(stage)
  if os.path.dirname(stage) != target and not _entries(target):
    try:
      os.rename(stage, target)  # atomic; replaces an empty folder
      return
    except OSError as e:
      if e.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EBUSY, errno.EXDEV):
        raise
  if _entries(target) and not overwrite:
    raise _taken(target)
  os.makedirs(target, exist_ok=True)
  _clear_earlier_export(target)
  for name in _publish_order(stage):
    os.replace(os.path.join(stage, name), os.path.join(target, name))


@contextlib.contextmanager
def staged(out_dir: str, overwrite: bool) -> Iterator[str]:
  """Yields an empty folder to write an export into; publishes it at `out_dir` when the block
  ends without error (module doc). Refuses a run directory, a file, or a non-empty folder
  without `overwrite` first (`export_dir.check_out_dir`)."""
  export_dir.check_out_dir(out_dir, overwrite)
  target = os.path.realpath(out_dir)  # a symlinked out_dir keeps its link: its target is replaced
  parent = _stage_parent(target)
  os.makedirs(parent, exist_ok=True)
  for folder, inside in ((os.path.dirname(target), False), (target, True)):
    _remove_abandoned(folder, _host_prefix(target, inside))
  prefix = f"{_host_prefix(target, parent == target)}{os.getpid()}-"
  stage = tempfile.mkdtemp(prefix=prefix, dir=parent)
  try:
    yield stage
    _publish(stage, target, overwrite)
  finally:
    shutil.rmtree(stage, ignore_errors=True)


def _publish_remote(local: str, out: str, overwrite: bool):
  """Uploads the finished export in the local folder `local` to the object-store folder `out`."""
  if paths.isdir(out) and paths.listdir(out):
    if not overwrite:
      raise _taken(out)
    _clear_earlier_export(out)
  paths.makedirs(out)
  for name in _publish_order(local):
    with open(os.path.join(local, name), "rb") as f:
      epath.Path(paths.join(out, name)).write_bytes(f.read())  # one object: atomic


@contextlib.contextmanager
def published_remote(out: str, overwrite: bool) -> Iterator[str]:
  """`staged` for an object-store `out`: yields a local folder to write the export into, uploaded
  to `out` when the block ends without error (module doc); `out` is checked by the caller."""
  local = tempfile.mkdtemp(prefix="setdiff_jax_export_")
  try:
    yield local
    _publish_remote(local, out, overwrite)
  finally:
    shutil.rmtree(local, ignore_errors=True)


__all__ = ["staged", "published_remote", "EXPORT_NAMES"]
