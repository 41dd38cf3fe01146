"""The path flags of a launcher and the storage libraries' noise (`setdiff_jax/cli.py` uses it).

- `check_path_flags`: before a launcher runs, `file://` paths in its path flags and config fields
  (`PATH_FLAGS`, `PATH_FIELDS`) become local paths, other URL schemes than `REMOTE_SCHEMES` are
  refused, and each bucket is probed once (`probe_remote`: bounded, the library's retries
  quiet), so an unreachable store or missing credentials is one line naming the path and flag.
- `HELD` (filled by cli's log filter via `storage_lib_file`): the storage libraries' warnings and tracebacks (orbax, tensorstore, gcsfs
  retries, orbax's failing background threads) are held back from the terminal; `keep_log`
  writes them, with the error's traceback, to WORKDIR/logs/error-*.log after an error.
- `storage_error` / `unreachable_store`: an error raised by those libraries themselves, and a
  store lost during the run, described in one line.
"""

from __future__ import annotations

import collections
import logging as std_logging
import os
import re
import threading
import time
import traceback
import urllib.parse
from typing import Optional

from absl import flags

from setdiff_jax import errors, paths

FLAGS = flags.FLAGS


def _one_line(text: str) -> str:
  return " ".join(str(text).split())


# The storage and checkpoint libraries: their warnings and tracebacks (gcsfs retries, orbax's
# failing background threads) are held back from the terminal unless verbose, and written to a
# log file in the workdir if the run ends with an error (`keep_log`).
STORAGE_LIBS = ("orbax", "tensorstore", "gcsfs", "fsspec", "aiohttp", "google", "etils")
HELD: "collections.deque[str]" = collections.deque(maxlen=500)


def storage_lib_file(pathname: str) -> bool:
  return any(f"{os.sep}{lib}{os.sep}" in (pathname or "") for lib in STORAGE_LIBS)


# The flags and config fields that name files or folders (checked by `check_path_flags`).
PATH_FLAGS = (
  "workdir",
  "out",
  "output",
  "eval_paths",
  "tfds_data_dir",
  "accuracy_data",
  "cloze_path",
  "judge_workdir",
)
PATH_FIELDS = (
  "init_from",
  "init_from_hf",
  "data.paths",
  "data.eval_paths",
  "data.tfds_data_dir",
  "tokenizer.vocab_path",
  "tokenizer.merges_path",
  "rl.init_from",
)
# Of those, the ones that hold a run's checkpoints (and --out on an object store, whose publish
# deletes by pattern): `paths.check_plain_name`.
RUN_PATHS = ("--workdir", "--judge_workdir", "--config.init_from", "--config.rl.init_from")
REMOTE_SCHEMES = ("gs",)  # object stores the path layer (etils.epath + gcsfs) and orbax reach
STORAGE_TIMEOUT_ENV = "SETDIFF_STORAGE_TIMEOUT_S"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


class StorageError(errors.SetdiffError):
  """An object store that cannot be reached (network, credentials, bucket)."""


def _config_field(config, name):
  node = config
  for part in name.split("."):
    if not hasattr(node, "get") or node.get(part) is None:
      return None
    node = node[part]
  return node


def _set_config_field(config, name, value):
  *parents, leaf = name.split(".")
  node = config
  for part in parents:
    node = node[part]
  node[leaf] = value


def _path_values():
  """[(label, current value, setter)] of the path flags and config fields given."""
  out = []
  for name in PATH_FLAGS:
    if name in FLAGS and FLAGS[name].value not in (None, "", []):
      value = FLAGS[name].value

      def set_flag(v, name=name):
        FLAGS[name].value = v

      out.append((f"--{name}", value, set_flag))
  config = FLAGS["config"].value if "config" in FLAGS else None
  if hasattr(config, "keys"):
    for name in PATH_FIELDS:
      value = _config_field(config, name)
      if isinstance(value, str) and value:
        out.append(
          (f"--config.{name}", value, lambda v, name=name: _set_config_field(config, name, v))
        )
  return out


def _listed(value):
  return value if isinstance(value, list) else [value or ""]


def _local_file_url(url: str) -> str:
  parsed = urllib.parse.urlparse(url)
  if parsed.netloc not in ("", "localhost"):
    raise ValueError(
      f"{url}: a file:// URL names a local path (file:///abs/path); host {parsed.netloc!r} "
      "is not supported"
    )
  return urllib.parse.unquote(parsed.path)


def check_path_flags(show_logs: bool = False):
  """Before a launcher runs: an empty path flag is refused; `file://` paths become local paths; a
  URL scheme the path layer does not support is refused, and so is a run or export path holding
  a pattern character (`RUN_PATHS`); every object-store path is probed once (bounded by
  $SETDIFF_STORAGE_TIMEOUT_S, default 60 s; the library's retries quiet), so an unreachable
  store or missing credentials is one line naming the path and the flag."""
  for name in PATH_FLAGS:  # "--workdir=$RUN" with RUN unset would mean the current directory
    if (
      name in FLAGS
      and FLAGS[name].present
      and not "".join(map(str, _listed(FLAGS[name].value))).strip()
    ):
      raise ValueError(f"--{name} is empty (an unset shell variable?): pass a path")
  probed = set()
  for label, value, set_value in _path_values():
    items = value if isinstance(value, list) else str(value).split(",")
    new = []
    for item in items:
      item = str(item).strip()
      m = _SCHEME.match(item)
      if m and m.group(1) != m.group(1).lower() and m.group(1).lower() in REMOTE_SCHEMES:
        raise ValueError(  # the object-store libraries know the scheme in lower case only
          f"{label}={item}: write the scheme in lower case, "
          f"{m.group(1).lower()}://{item[len(m.group(0)) :]}"
        )
      if m and m.group(1).lower() == "file":
        item = _local_file_url(item)
      elif m and m.group(1).lower() not in REMOTE_SCHEMES:
        raise ValueError(
          f"{label}={item}: the {m.group(1)}:// scheme is not supported; use a local path, "
          f"file:///abs/path or {', '.join(s + '://bucket/path' for s in REMOTE_SCHEMES)}"
        )
      if label in RUN_PATHS or (label == "--out" and paths.is_remote(item)):
        paths.check_plain_name(item, label)
      if paths.is_remote(item):
        bucket = item.split("/")[2] if item.count("/") >= 2 else item
        if bucket not in probed:
          probed.add(bucket)
          probe_remote(item, label, show_logs=show_logs)
      new.append(item)
    if new != items:
      set_value(new if isinstance(value, list) else ",".join(new))


class _Capture(std_logging.Handler):
  """The gcsfs records of a probe (its retry messages name the failure)."""

  def __init__(self):
    super().__init__(std_logging.DEBUG)
    self.messages = []
    self.failed = threading.Event()

  def emit(self, record):
    message = record.getMessage()
    self.messages.append(message)
    if "exception" in message or "error" in message.lower():
      self.failed.set()


def probe_remote(path: str, label: str, timeout_s: Optional[float] = None, show_logs=False):
  """Raises StorageError naming `path` and `label` unless the object store answers whether
  `path` exists. Returns at the first connection or credential failure (no retries), or after
  `timeout_s`."""
  if timeout_s is None:
    timeout_s = float(os.environ.get(STORAGE_TIMEOUT_ENV, "60"))
  logger = std_logging.getLogger("gcsfs")
  capture, saved = _Capture(), (logger.level, logger.propagate)
  logger.addHandler(capture)
  logger.setLevel(std_logging.DEBUG)
  logger.propagate = show_logs
  result = {}

  def run():
    try:
      result["exists"] = paths.exists(path)
    except BaseException as e:  # noqa: BLE001 - reported below
      result["error"] = e
    capture.failed.set()

  t0 = time.monotonic()
  threading.Thread(target=run, daemon=True).start()
  capture.failed.wait(timeout_s)
  logger.removeHandler(capture)
  logger.setLevel(saved[0])
  logger.propagate = saved[1]
  if "exists" in result:
    return
  cause = result.get("error") or (capture.messages[-1] if capture.messages else None)
  if cause is None:
    cause = f"no answer within {timeout_s:g}s (${STORAGE_TIMEOUT_ENV})"
  cause = _one_line(str(cause)).split(" retrying after exception: ")[-1]
  raise StorageError(
    f"{label}={path}: cannot reach the object store after {time.monotonic() - t0:.1f}s "
    f"({cause[:200]}); check the network, the credentials (gcloud auth application-default "
    "login, or $GOOGLE_APPLICATION_CREDENTIALS) and the bucket name"
  )


_CONNECTION = re.compile(
  r"Cannot connect to host|credentials were not found|DefaultCredentialsError|"
  r"Name or service not known|Temporary failure in name resolution",
  re.IGNORECASE,
)


def unreachable_store(exc: BaseException) -> str:
  """For a connection or credential failure of an object store met during the run (after the
  probe passed): the line naming the remote path flags; '' otherwise."""
  try:
    remote = [
      f"{label}={value}"
      for label, value, _ in _path_values()
      if any(_SCHEME.match(str(v).strip()) for v in (value if isinstance(value, list) else [value]))
    ]
  except Exception:  # noqa: BLE001 - flags not parsed (a library caller)
    remote = []
  if not remote or not _CONNECTION.search(str(exc)):
    return ""
  return _one_line(
    f"cannot reach the object store of {', '.join(remote)} ({str(exc)[:200]}); check the "
    "network, the credentials (gcloud auth application-default login, or "
    "$GOOGLE_APPLICATION_CREDENTIALS) and the bucket name, then run the same command again"
  )


def storage_error(exc: BaseException) -> bool:
  """An exception raised by a storage library itself (not one of ours wrapping it)."""
  module = type(exc).__module__ or ""
  return module.split(".")[0] in STORAGE_LIBS


def keep_log(exc: BaseException) -> Optional[str]:
  """Writes the held library records and the traceback of `exc` to
  WORKDIR/logs/error-<time>-<pid>.log when the run's workdir is a local folder and there is
  something a user would want (held records, or a storage library's error); returns its path."""
  if not HELD and not storage_error(exc):
    return None
  workdir = FLAGS["workdir"].value if "workdir" in FLAGS else None
  if not workdir or paths.is_remote(workdir) or not os.path.isdir(workdir):
    return None
  path = os.path.join(
    os.path.abspath(workdir), "logs", f"error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
  )
  text = (
    "\n".join(HELD) + "\n" + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
  )
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
  except OSError:  # e.g. the disk that is full: the line alone has to do
    return None
  HELD.clear()
  return path


__all__ = [
  "STORAGE_LIBS",
  "HELD",
  "storage_lib_file",
  "PATH_FLAGS",
  "PATH_FIELDS",
  "REMOTE_SCHEMES",
  "StorageError",
  "check_path_flags",
  "probe_remote",
  "unreachable_store",
  "storage_error",
  "keep_log",
]
