"""What the benchmark entry points share: one `error:` line for bad input, checked up front.

  if __name__ == "__main__":
    inputs.run(main)       # instead of a bare main()

- `run(main)`: an expected error (`setdiff_jax.cli.EXPECTED`: a bad flag value, a missing file, a
  record that cannot be written, a full disk) ends the process with the library's one `error: ...`
  line on stderr and exit status 1 (the traceback too with SETDIFF_VERBOSE=1); any other
  exception is a bug and keeps its traceback.
- `check_output_dir` / `check_output_file`: an output flag is checked before anything is measured
  (a folder flag that names a file, a path inside a file, a folder that cannot be written).
- `check_at_least`: count flags below their minimum.
- `differences`: what differs between two flat settings dicts, for an error line.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, Optional

from setdiff_jax import cli


def run(main: Callable[[], Any]) -> Any:
  """Calls `main()` (it reads sys.argv); returns what it returns, or exits after an expected
  error with its one line."""
  try:
    return main()
  except Exception as e:  # noqa: BLE001
    if not isinstance(e, cli.EXPECTED):
      raise  # a bug: keep its traceback
    sys.stdout.flush()
    sys.exit(cli.report(e))


def _writable_ancestor(path: str, flag: str, value: str) -> None:
  """The nearest existing folder above `path` (or `path` itself) must be a writable folder."""
  above = path
  while not os.path.exists(above):
    above = os.path.dirname(above)
  if not os.path.isdir(above):
    raise ValueError(f"{flag}={value} lies inside the file {above}: give a path in a folder")
  if not os.access(above, os.W_OK | os.X_OK):
    raise ValueError(f"{flag}={value}: the folder {above} is not writable; give another path")


def check_output_dir(value: Optional[str], flag: str = "--output_dir") -> None:
  """An output folder flag (unset: nothing to check): it must be a folder or creatable."""
  if not value:
    return
  path = os.path.abspath(value)
  if os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f"{flag}={value} is a file, not a folder: give a new or existing folder")
  _writable_ancestor(path, flag, value)


def check_output_file(value: Optional[str], flag: str = "--out") -> None:
  """An output file flag (unset: nothing to check): not a folder, its folder creatable."""
  if not value:
    return
  path = os.path.abspath(value)
  if os.path.isdir(path):
    raise ValueError(f"{flag}={value} is a folder: give a file name")
  _writable_ancestor(os.path.dirname(path), flag, value)


def check_at_least(args, minimum: int, *names: str) -> None:
  """Each flag `names` of `args` that is set (not None) must be >= `minimum`."""
  for name in names:
    value = getattr(args, name)
    if value is not None and value < minimum:
      raise ValueError(f"--{name}={value} must be >= {minimum}")


def differences(old: Dict[str, Any], new: Dict[str, Any], shown: int = 8) -> str:
  """'seed 0 -> 1, learning_rate 0.001 -> 0.5' for the keys whose values differ (sorted; a key
  only one side has reads 'unset' on the other), at most `shown` of them."""
  unset = object()
  keys = [k for k in sorted(set(old) | set(new)) if old.get(k, unset) != new.get(k, unset)]
  text = ", ".join(f"{k} {old.get(k, 'unset')} -> {new.get(k, 'unset')}" for k in keys[:shown])
  return text + (f" and {len(keys) - shown} more" if len(keys) > shown else "")
