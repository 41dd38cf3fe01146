"""One path layer for the files of a workdir, local or on an object store (`gs://...`).

Every file the library itself writes or reads in a workdir (config.json, tokenizer/,
metrics.jsonl, eval results, the lock folder, fallback renames) goes through these functions,
which use `etils.epath` (what orbax uses for the checkpoints): on `gs://bucket/run` they reach the
bucket instead of creating a local folder named `gs:`. Local paths are made absolute; remote ones
are kept as given. Writes are whole-file (write then rename locally; one object upload remotely),
so a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Iterator, List

from etils import epath


def is_remote(path) -> bool:
  """True for URLs such as gs://bucket/dir (object stores), False for local / NFS paths."""
  return "://" in str(path)


# Characters the checkpoint stack reads as patterns, not names: orbax merges a save's per-process
# files with a glob over the checkpoint's own path, and tensorstore parses object-store paths as
# URLs. '[...]' (a glob class) or '\\' makes every save unreadable; on an object store '*' / '?'
# also match other folders (a save deleted a sibling run's checkpoint) and '?' / '#' end the
# name (the tensors land in a folder cut at them). Refused in workdirs, the config's path fields
# (`workdir.lock.RUN_PATH_FIELDS`), export folders and the launchers' storage flags.
PATTERN_CHARS = "[]\\"
REMOTE_PATTERN_CHARS = PATTERN_CHARS + "*?#"


def check_plain_name(path, label: str):
  """ValueError naming `label` if `path` holds a character the checkpoint stack would read as a
  pattern (`PATTERN_CHARS`, on object stores `REMOTE_PATTERN_CHARS`)."""
  path = str(path)
  remote = is_remote(path)
  found = sorted({c for c in path if c in (REMOTE_PATTERN_CHARS if remote else PATTERN_CHARS)})
  if found:
    where = "an object-store path" if remote else "a local path"
    refused = " ".join(REMOTE_PATTERN_CHARS if remote else PATTERN_CHARS)
    raise ValueError(
      f"{label}={path} holds {' '.join(found)}, which the checkpoint library reads as a pattern "
      f"(a save there would fail, write elsewhere or reach another run's files): in {where} "
      f"use none of {refused} (choose another name)"
    )


def resolve(path) -> str:
  """A workdir as stored and logged: absolute when local, unchanged when remote."""
  path = str(path)
  return path if is_remote(path) else os.path.abspath(path)


def join(base, *parts) -> str:
  base = str(base)
  if is_remote(base):
    return "/".join([base.rstrip("/")] + [str(p).strip("/") for p in parts])
  return os.path.join(base, *map(str, parts))


def parent(path) -> str:
  """The folder holding `path` (local: of its real path), or `path` itself at the top (/, or an
  object store's bucket gs://bucket)."""
  path = str(path)
  if not is_remote(path):
    return os.path.dirname(os.path.realpath(path))
  scheme, rest = path.rstrip("/").split("://", 1)
  return f"{scheme}://{rest.rsplit('/', 1)[0]}" if "/" in rest else f"{scheme}://{rest}"


def _p(path) -> epath.Path:
  return epath.Path(str(path))


def exists(path) -> bool:
  return _p(path).exists()


def isdir(path) -> bool:
  return _p(path).is_dir()


def isfile(path) -> bool:
  p = _p(path)
  return p.exists() and not p.is_dir()


def makedirs(path):
  _p(path).mkdir(parents=True, exist_ok=True)


def listdir(path) -> List[str]:
  return sorted(p.name for p in _p(path).iterdir())


def read_text(path) -> str:
  return _p(path).read_text(encoding="utf-8")


def read_bytes(path) -> bytes:
  return _p(path).read_bytes()


def open_binary(path):
  """The file for reading bytes (a context manager), local or remote."""
  return _p(path).open("rb")


def write_text(path, text: str):
  """Writes a whole file: locally to a temporary file renamed into place, remotely as one
  object (uploads are atomic)."""
  if is_remote(path):
    parent = _p(path).parent
    parent.mkdir(parents=True, exist_ok=True)
    _p(path).write_text(text, encoding="utf-8")
    return
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fd, tmp = tempfile.mkstemp(
    dir=os.path.dirname(os.path.abspath(path)), prefix=os.path.basename(path) + ".tmp"
  )
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(tmp, path)
  except BaseException:  # disk full, file too large, ...: no half-written temporary file stays
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise


def rename(src, dst):
  _p(src).rename(str(dst))


def remove(path):
  _p(path).unlink()


@contextlib.contextmanager
def local_copy(directory) -> Iterator[str]:
  """A local folder with `directory`'s files (itself when local; a temporary copy of a remote
  one), for readers that need local files (e.g. the Rust tokenizer loader)."""
  if not is_remote(directory):
    yield str(directory)
    return
  tmp = tempfile.mkdtemp(prefix="setdiff_jax_copy_")
  try:
    for name in listdir(directory):
      src = _p(join(directory, name))
      if not src.is_dir():
        with open(os.path.join(tmp, name), "wb") as f:
          f.write(src.read_bytes())
    yield tmp
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def staged_dir(directory) -> Iterator[str]:
  """A local folder whose files are uploaded to `directory` when the block ends without error
  (itself when local), for writers that need local files."""
  if not is_remote(directory):
    os.makedirs(directory, exist_ok=True)
    yield str(directory)
    return
  tmp = tempfile.mkdtemp(prefix="setdiff_jax_stage_")
  try:
    yield tmp
    makedirs(directory)
    for name in sorted(os.listdir(tmp)):
      with open(os.path.join(tmp, name), "rb") as f:
        _p(join(directory, name)).write_bytes(f.read())
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


class AppendFile:
  """A text file appended to line by line (metrics.jsonl). Locally an ordinary append; object
  stores cannot append, so remotely the whole file (what it held before + the new lines) is
  uploaded again at each `flush`: metrics files are small."""

  def __init__(self, path):
    self.path = str(path)
    self._remote = is_remote(self.path)
    if self._remote:
      self._lines = read_text(self.path) if isfile(self.path) else ""
      self._dirty = False
      self._f = None
    else:
      os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
      self._f = open(self.path, "a", encoding="utf-8")

  def write(self, text: str):
    if self._remote:
      self._lines += text
      self._dirty = True
    else:
      self._f.write(text)

  def flush(self):
    if self._remote:
      if self._dirty:
        write_text(self.path, self._lines)
        self._dirty = False
    else:
      self._f.flush()

  def close(self):
    self.flush()
    if self._f is not None:
      self._f.close()
      self._f = None


__all__ = [
  "is_remote",
  "resolve",
  "join",
  "exists",
  "isdir",
  "isfile",
  "makedirs",
  "listdir",
  "read_text",
  "write_text",
  "rename",
  "remove",
  "local_copy",
  "staged_dir",
  "AppendFile",
]
