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


class DiskFullError(SetdiffError):
  """A write failed with ENOSPC; the message says what is still intact."""


__all__ = ["SetdiffError", "WorkdirInUseError", "ConfigMismatchError", "CheckpointError",
           "CheckpointStructureError", "DamagedCheckpointError", "MissingIteratorStateError",
           "DiskFullError"]
