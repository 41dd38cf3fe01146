"""Expected errors: bad input a user can fix. The launchers (`setdiff_jax/cli.py`) print these as
one `error: ...` line without a traceback; everything else keeps its traceback.

Besides `SetdiffError`, the launchers treat ValueError (config and input checks everywhere in the
package raise it), OSError (missing files, disk full, permissions) and FloatingPointError (the NaN
guard) as expected: see `cli.EXPECTED`.
"""

from __future__ import annotations


class SetdiffError(Exception):
  """Base of the package's own expected errors; the message names the problem and the fix."""


class WorkdirInUseError(SetdiffError):
  """Another live process holds the workdir's lock."""


class ConfigMismatchError(SetdiffError, ValueError):
  """A resume whose config differs from the workdir's in a field the checkpoint depends on."""


class CheckpointError(SetdiffError, ValueError):
  """A checkpoint that cannot be used (damaged files, wrong structure, missing step)."""


class CheckpointStructureError(CheckpointError):
  """The files are intact but hold a different model/optimizer structure than the config's."""


class DamagedCheckpointError(CheckpointError):
  """Files of a checkpoint step are missing or truncated."""


class MissingIteratorStateError(DamagedCheckpointError):
  """A step without this process's data-iterator file (deleted, or another process count)."""


class DivergenceError(SetdiffError, FloatingPointError):
  """The training loss stayed far above its recent median (or a ceiling): stopped before saving."""


class StoppedBySignal(SetdiffError):
  """Training stopped on SIGTERM / SIGINT after saving: not a failure of the input, but not
  "done" either. The launchers print one `stopped: ...` line and exit with 128 + the signal
  number (143 for SIGTERM, 130 for SIGINT), what a scheduler reads as "preempted, requeue"."""

  prefix = "stopped"

  def __init__(self, message: str, signum: int):
    super().__init__(message)
    self.exit_code = 128 + int(signum)


class DiskFullError(SetdiffError):
  """A write failed with ENOSPC or EFBIG (`write_limit`); the message says what is intact."""


# How ENOSPC / EFBIG read when a library wraps them in its own error (tensorstore, orbax).
_LIMITS = (
  (28, ("No space left on device", "RESOURCE_EXHAUSTED", "ENOSPC"), "disk full"),
  (
    27,
    ("File too large", "EFBIG", "os_error_code='27'"),
    "file too large (EFBIG: over the file system's or `ulimit -f`'s largest file size)",
  ),
)


def write_limit(exc: BaseException):
  """'disk full' / 'file too large (...)' if ENOSPC / EFBIG is anywhere in the exception's
  chain (as an OSError's errno or in a wrapping library error's text), else None."""
  seen = set()
  e = exc
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    text = str(e)
    for code, words, what in _LIMITS:
      if (isinstance(e, OSError) and e.errno == code) or any(w in text for w in words):
        return what
    e = e.__cause__ or e.__context__
  return None


def limit_fix(what: str) -> str:
  """The fix for a `write_limit` kind."""
  if what.startswith("disk full"):
    return "free space (or use a larger disk)"
  return "raise the file size limit (ulimit -f) or use a file system that allows larger files"


class MissingExtraError(SetdiffError, ImportError):
  """An optional dependency is not installed; the message names the extra that installs it."""


def install_line(extra: str) -> str:
  """The command that installs setup.py's extra `extra` (from the checkout)."""
  return f'pip install -e ".[{extra}]" (from the checkout; the extras are listed in setup.py)'


def require_extra(module: str, extra: str, needed_by: str):
  """Imports and returns `module`, or raises MissingExtraError naming `extra`.

  `needed_by` says what needs it (a flag, a launcher), e.g. "--verify". Only a missing `module`
  itself (or a submodule) becomes the one-line error; an import error *inside* an installed
  package keeps its traceback (a broken install is not a missing extra).
  """
  import importlib

  try:
    return importlib.import_module(module)
  except ModuleNotFoundError as e:
    missing_extra(e, module, extra, needed_by)
    raise


def missing_extra(e: ModuleNotFoundError, module: str, extra: str, needed_by: str):
  """Raises MissingExtraError if `e` is `module` (or a submodule of it) not being installed;
  returns otherwise (the caller re-raises `e`)."""
  top = module.split(".")[0]
  if e.name is not None and e.name.split(".")[0] == top:
    raise MissingExtraError(
      f"{needed_by} needs the Python package {top!r}, which is not installed: {install_line(extra)}"
    ) from e


__all__ = [
  "SetdiffError",
  "WorkdirInUseError",
  "ConfigMismatchError",
  "CheckpointError",
  "CheckpointStructureError",
  "DamagedCheckpointError",
  "MissingIteratorStateError",
  "DivergenceError",
  "StoppedBySignal",
  "DiskFullError",
  "write_limit",
  "limit_fix",
  "MissingExtraError",
  "require_extra",
  "missing_extra",
  "install_line",
]
