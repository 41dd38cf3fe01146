"""What every launcher in `launch/` shares: one-line errors, quiet logs, strict arguments.

  if __name__ == "__main__":
    cli.run(main)          # instead of absl's app.run(main)

- Expected errors (`EXPECTED`: bad config, input, data, checkpoint, disk) end the process with a
  single `error: ...` line on stderr and exit status 1 (2 for flag / argument errors). A run
  stopped by SIGTERM / SIGINT after saving ends with one `stopped: ...` line and 128 + the signal
  number (143 / 130). Their
  traceback is printed only with `--verbose` or `SETDIFF_VERBOSE=1`. Any other exception is a bug
  and keeps its traceback.
- After an error the process ends with `os._exit`: background threads of orbax / tensorstore
  cannot add shutdown noise (`Event loop is closed`, `sys.meta_path is None`) after the line.
- Positional arguments are rejected (every option is a `--flag=value`), and an unknown
  `--config.field` names the closest valid fields.
- INFO lines of the libraries (jax backend probing, orbax, grain) are dropped unless verbose;
  warnings and the package's own INFO lines stay. The storage libraries' warnings and tracebacks
  (orbax, tensorstore, gcsfs: retries, failing background threads) are held back: after an error
  they go to WORKDIR/logs/error-*.log (named on the error line) when the workdir is a local
  folder. An error raised by those libraries themselves is one line too.
- Path flags and fields (`PATH_FLAGS`, `PATH_FIELDS`): `file://` URLs become local paths, other
  schemes than gs:// are refused, and each bucket is probed once before the launcher runs (one
  line naming the path and the flag when it cannot be reached; bounded, retries quiet).

`call(main, argv)` does the same in-process and returns the exit status (for tests).
"""

from __future__ import annotations

import difflib
import errno
import logging as std_logging
import os
import re
import signal
import sys
import time
import traceback
import warnings
from typing import Callable, Dict, List, Optional, Sequence

from absl import app, flags
from absl import logging

from setdiff_jax import cli_signals, cli_storage, errors
from setdiff_jax.config import fields as ranges

VERBOSE_ENV = "SETDIFF_VERBOSE"
EXPECTED = (errors.SetdiffError, ValueError, OSError, FloatingPointError, app.UsageError)

FLAGS = flags.FLAGS
if "verbose" not in FLAGS:
  flags.DEFINE_bool(
    "verbose", False, f"Full tracebacks and library INFO logs on errors (or set {VERBOSE_ENV}=1)."
  )
# A multi-process run (read by `sharding.initialize_distributed`; default: the environment,
# e.g. what launch/local_cluster.py sets, or the TPU / GPU cluster's auto-detection).
if "coordinator_address" not in FLAGS:
  flags.DEFINE_string(
    "coordinator_address",
    None,
    "HOST:PORT of process 0 of a multi-process "
    "run (or $SETDIFF_COORDINATOR_ADDRESS); default: auto-detect.",
  )
  flags.DEFINE_integer(
    "num_processes", None, "Processes of a multi-process run (or $SETDIFF_NUM_PROCESSES)."
  )
  flags.DEFINE_integer(
    "process_id", None, "This process's index in a multi-process run (or $SETDIFF_PROCESS_ID)."
  )


class UsageError(errors.SetdiffError):
  """A bad command line (unknown flag or config field, bad value, stray argument)."""


def verbose() -> bool:
  env = os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")
  try:
    return env or bool(FLAGS.verbose)
  except flags.UnparsedFlagAccessError:
    return env


def one_line(text: str) -> str:
  return " ".join(str(text).split())


# How a collective or the coordination service reports a process of the run that is gone.
_LOST_PROCESS = re.compile(
  r"gloo [\w-]+ failed|connection reset by peer|connection refused|"
  r"heartbeat timeout|stopped sending heartbeats|coordination service",
  re.IGNORECASE,
)


def _cluster():
  """(process index, process count) of a multi-process JAX run, else None."""
  jax = sys.modules.get("jax")
  try:
    if jax is None or not jax.distributed.is_initialized() or jax.process_count() < 2:
      return None
    return jax.process_index(), jax.process_count()
  except Exception:  # noqa: BLE001 - the runtime itself may be broken by now
    return None


def _missing_processes(count: int) -> str:
  """'process 1', 'processes 0, 2' (those the coordination service no longer sees), or ''."""
  try:
    from jax._src import distributed  # pylint: disable=g-import-not-at-top

    live = distributed.global_state.client.get_live_nodes(list(range(count)))
    lost = [i for i in range(count) if i not in live]
  except Exception:  # noqa: BLE001 - e.g. the coordinator (process 0) is the one gone
    lost = []
  if not lost:
    return ""
  return ("process " if len(lost) == 1 else "processes ") + ", ".join(map(str, lost))


EXIT_WAIT_S = 30  # how long the processes of a run stopped by an error wait for each other


def _leave_together():
  """After an error line of a multi-process run (e.g. an error agreed by all processes): wait
  (bounded) until every process has printed its own, then process 0 leaves last. Process 0 runs
  the coordination service; a process that finds it gone is aborted by JAX at once, before it
  could print its line."""
  cluster = _cluster()
  if cluster is None:
    return
  try:
    from jax._src import distributed  # pylint: disable=g-import-not-at-top

    distributed.global_state.client.wait_at_barrier("setdiff_jax/exit", EXIT_WAIT_S * 1000)
  except Exception:  # noqa: BLE001 - another process did not stop this way: leave now
    return
  if cluster[0] == 0:
    time.sleep(1.0)  # the others are in os._exit by now


def lost_process(exc: BaseException) -> bool:
  """True for the error of a multi-process run whose peer died (a collective or the
  coordination service failed)."""
  return _cluster() is not None and bool(_LOST_PROCESS.search(str(exc)))


def _describe_lost_process(exc: BaseException) -> str:
  index, count = _cluster()
  who = _missing_processes(count) or "another process (or the coordinator, process 0)"
  cause = one_line(str(exc))[:200]
  return (
    f"process {index} of {count} stopped: {who} of this run is gone ({cause}). The last "
    "saved checkpoint is intact; restart every process with the same command to resume "
    "($SETDIFF_HEARTBEAT_TIMEOUT_S bounds how long a silent process is waited for)"
  )


def describe(exc: BaseException) -> str:
  """The one-line message of an expected error."""
  if lost_process(exc):
    return _describe_lost_process(exc)
  remote = (
    "" if isinstance(exc, cli_storage.StorageError) else cli_storage.unreachable_store(exc)
  )  # not named twice
  if remote:
    return remote
  if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EFBIG):
    what = errors.write_limit(exc)
    where = f" writing {exc.filename}" if exc.filename else ""
    return one_line(
      f"{what}{where} ({exc}); {errors.limit_fix(what)} and run the same command again"
    )
  return one_line(str(exc) or type(exc).__name__)


# ----------------------------------------------------------------------------- config fields
def config_field_names(config, prefix: str = "") -> List[str]:
  """Every dotted field name of a ConfigDict (parents included)."""
  names = []
  for key in config.keys():
    name = f"{prefix}{key}"
    names.append(name)
    child = config[key]
    if hasattr(child, "keys") and hasattr(child, "to_dict"):
      names += config_field_names(child, name + ".")
  return names


def closest_fields(name: str, names: Sequence[str], n: int = 3) -> List[str]:
  """Closest dotted names: whole-name matches, then fields whose last part is close."""
  out = difflib.get_close_matches(name, names, n=n, cutoff=0.6)
  leaf = name.rsplit(".", 1)[-1]
  leaves = {}
  for full in names:
    leaves.setdefault(full.rsplit(".", 1)[-1], []).append(full)
  for match in difflib.get_close_matches(leaf, list(leaves), n=n, cutoff=0.6):
    out += [f for f in leaves[match] if f not in out]
  return out[:n]


def unknown_config_fields(argv: Sequence[str], config, flag: str = "config") -> List[str]:
  """'--config.foo is not a config field (closest: ...)' for each unknown override in argv."""
  names = config_field_names(config)
  problems = []
  for arg in argv:
    m = re.match(rf"^--?(?:no)?{flag}\.([^=]+)", arg)
    if not m or m.group(1) in names:
      continue
    close = closest_fields(m.group(1), names)
    hint = (
      f"closest: {', '.join('--' + flag + '.' + c for c in close)}"
      if close
      else (f"the fields are: {', '.join(n for n in names if '.' not in n)}")
    )
    problems.append(f"--{flag}.{m.group(1)} is not a config field ({hint})")
  return problems


# ----------------------------------------------------------------------------- ranges
def check_flag_ranges(flag_fields: Dict[str, str], also: Optional[Dict[str, tuple]] = None):
  """Every flag of `flag_fields` ({flag: field of `ranges.SHARED`}) that has a value (None is
  "unset"; a list flag: each item) is checked against the shared range of its field, so every
  launcher taking the field refuses the same values (`also`: extra values a flag allows)."""
  for flag, field in flag_fields.items():
    value = FLAGS[flag].value
    for v in value if isinstance(value, list) else [value]:
      if isinstance(v, str):  # a list flag's item
        try:
          v = int(v)
        except ValueError:
          raise UsageError(f"--{flag}={','.join(value)}: {v!r} is not an integer") from None
      if v is not None:
        ranges.check(field, v, f"--{flag}", (also or {}).get(flag, ()))


# ----------------------------------------------------------------------------- parsing
def parse_flags(argv: Sequence[str]) -> List[str]:
  """FLAGS(argv) with every failure turned into a one-line `UsageError`; returns the positional
  arguments (argv[0] included). ml_collections reads config overrides from sys.argv, so it is
  set to `argv` meanwhile."""
  argv = list(argv)
  saved = sys.argv
  sys.argv = argv
  try:
    return FLAGS(argv)
  except Exception as e:  # noqa: BLE001 - flag and config-override errors of every kind
    config = _config_of(argv)
    problems = unknown_config_fields(argv, config) if hasattr(config, "keys") else []
    msg = "; ".join(problems) if problems else _config_file_error(e) or describe(e)
    msg = msg.replace("Unknown command line flag", "unknown flag")
    required = re.search(r"Flag --(\w+) must have a value other than None", msg)
    if required:
      msg = f"--{required.group(1)} is required"
    raise UsageError(f"{msg} (see --helpshort)") from e
  finally:
    sys.argv = saved


def _config_file_error(exc: BaseException) -> str:
  """The config file's own error, when ml_collections wrapped it with its whole traceback
  ("flag --config=F: Error whilst parsing config file: Traceback ... ValueError: why"): the flag and
  the last exception's message (its type too, unless a ValueError), else ''."""
  text = str(exc)
  if "Error whilst parsing config file" not in text:
    return ""
  flag = re.match(r"flag (--\w+=\S+): ", text)
  raised = re.findall(r"^\s*(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.*)$", text, re.M)
  if not flag or not raised:
    return ""
  kind, why = raised[-1]
  return one_line(f"{flag.group(1)}: {why if kind == 'ValueError' else f'{kind}: {why}'}")


def _config_of(argv: Sequence[str]):
  """The config named by --config=FILE.py (before overrides), or None."""
  value = FLAGS["config"].value if "config" in FLAGS else None
  if hasattr(value, "keys"):
    return value
  for arg in argv:
    m = re.match(r"^--?config=(.+\.py)(?::(.*))?$", arg)  # FILE.py or FILE.py:VARIANT
    if m and os.path.isfile(m.group(1)):
      import importlib.util

      try:
        spec = importlib.util.spec_from_file_location("_setdiff_cli_config", m.group(1))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.get_config(m.group(2)) if m.group(2) else module.get_config()
      except Exception:  # noqa: BLE001 - the original error is reported instead
        return None
  return None


def check_no_positional(args: Sequence[str]):
  if len(args) > 1:
    raise UsageError(
      f"unexpected argument(s) {' '.join(args[1:])!r}: every option is a "
      "--flag=value (see --helpshort)"
    )


# ----------------------------------------------------------------------------- logs
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class _LibraryInfoFilter(std_logging.Filter):
  """Drops INFO (and lower) records that do not come from this repository's code: the package's
  folder and the launchers' beside it, by absolute path (a clone named setdiff_jax with its venv
  inside, .../setdiff_jax/.venv/.../orbax/..., is not ours); holds the storage libraries'
  warnings and errors back (`cli_storage.HELD`)."""

  _OURS = (_PACKAGE_DIR + os.sep, os.path.join(os.path.dirname(_PACKAGE_DIR), "launch") + os.sep)

  def filter(self, record):
    if record.levelno >= std_logging.WARNING and _from_storage_lib(record):
      text = f"{record.levelname} {record.pathname}:{record.lineno} {record.getMessage()}"
      if record.exc_info:
        text += "\n" + "".join(traceback.format_exception(*record.exc_info))
      cli_storage.HELD.append(text)
      return False
    if record.levelno >= std_logging.WARNING:
      return True
    return bool(record.pathname) and os.path.abspath(record.pathname).startswith(self._OURS)


def _traceback_files(tb) -> List[str]:
  """The source files of a traceback's frames, outermost first."""
  files = []
  while tb is not None:
    files.append(tb.tb_frame.f_code.co_filename)
    tb = tb.tb_next
  return files


def _from_storage_lib(record) -> bool:
  """A record of a storage library, or one whose exception passed through one (asyncio's "Task
  exception was never retrieved" for orbax's failed background writes)."""
  tb = record.exc_info[2] if record.exc_info else None
  return any(map(cli_storage.storage_lib_file, [record.pathname, *_traceback_files(tb)]))


_FILTER = _LibraryInfoFilter()
_SHOW_WARNING = warnings.showwarning
# A full disk (or `ulimit -f`) also fails jax's persistent compilation-cache writes: held back
# like the storage libraries' warnings, since the run's own error line names the disk problem.
_DISK_FULL = ("File too large", "No space left on device")


def _show_warning(message, category, filename, lineno, file=None, line=None):
  text = str(message)
  if "compilation cache" in text and any(d in text for d in _DISK_FULL):
    cli_storage.HELD.append(f"{category.__name__} {filename}:{lineno} {text}")
    return
  _SHOW_WARNING(message, category, filename, lineno, file, line)


def quiet_library_logs():
  """Hides the libraries' INFO lines (jax backend probing, orbax, grain) unless verbose."""
  handler = logging.get_absl_handler()
  if verbose():
    handler.removeFilter(_FILTER)
  elif _FILTER not in handler.filters:
    handler.addFilter(_FILTER)
  for name in ("jax._src.xla_bridge", "jax._src.distributed", "orbax", "grain", "gcsfs"):
    std_logging.getLogger(name).setLevel(std_logging.DEBUG if verbose() else std_logging.WARNING)
  sys.unraisablehook = sys.__unraisablehook__ if verbose() else _quiet_unraisable
  warnings.showwarning = _SHOW_WARNING if verbose() else _show_warning


def _quiet_unraisable(unraisable):
  """Orbax's abandoned read coroutines report their (already raised) error again when they are
  garbage-collected, with a multi-kilobyte TensorStore spec, or find their event loop closed;
  keep only other reports."""
  files = _traceback_files(unraisable.exc_traceback)
  closed_loop = "Event loop is closed" in str(unraisable.exc_value)  # their loop, shut down
  if not closed_loop and not any("orbax" in f or "tensorstore" in f for f in files):
    sys.__unraisablehook__(unraisable)


def report(exc: BaseException, stream=None) -> int:
  """Prints the error line (after the traceback when verbose); returns the exit status."""
  stream = stream or sys.stderr
  if verbose():
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=stream)
  line = describe(exc)
  if not verbose():
    log = cli_storage.keep_log(exc)
    if log:
      line += f" (library details: {log})"
  stream.write(f"{getattr(exc, 'prefix', 'error')}: {line}\n")
  stream.flush()
  if getattr(exc, "exit_code", None):
    return int(exc.exit_code)  # e.g. 143 / 130: stopped by SIGTERM / SIGINT after saving
  return 2 if isinstance(exc, (UsageError, app.UsageError)) else 1


# ----------------------------------------------------------------------------- entry points
def call(main: Callable[[List[str]], Optional[int]], argv: Sequence[str], stream=None) -> int:
  """Parses `argv` and runs `main` in-process; returns the exit status (errors as in `run`)."""
  FLAGS.unparse_flags()
  for name in [n for n in FLAGS if n.startswith("config.")]:  # the previous call's overrides
    delattr(FLAGS, name)
  try:
    args = parse_flags(argv)
    check_no_positional(args)
    quiet_library_logs()
    cli_storage.check_path_flags(verbose())
    return int(main(args) or 0)
  except Exception as e:  # noqa: BLE001
    if not isinstance(e, EXPECTED) and not cli_storage.storage_error(e):
      raise  # a bug: keep its traceback
    return report(e, stream)


def run(main: Callable[[List[str]], Optional[int]]):
  """`absl.app.run(main)` with the behaviour of the module doc."""
  cli_signals.catch_startup_signals(unwind=True)  # train.py and rl.py: also while importing

  def stop(e: KeyboardInterrupt):  # a signal outside the training loop (which saves, then stops)
    signum = getattr(e, "signum", signal.SIGINT)
    sys.stdout.flush()
    sys.stderr.write(cli_signals.stopped_line(signum) + "\n")
    sys.stderr.flush()
    os._exit(128 + signum)  # no interpreter shutdown under running compiler threads

  def parser(argv):
    try:
      return parse_flags(argv)  # runs the --config file's get_config(): any code at all
    except UsageError as e:
      sys.exit(report(e))
    except KeyboardInterrupt as e:  # else a traceback through absl
      stop(e)

  def guarded(args):
    try:
      if cli_signals.startup_signal() is not None:  # one a library swallowed while importing
        raise cli_signals.StartupSignal(cli_signals.startup_signal())
      check_no_positional(args)
      quiet_library_logs()
      cli_storage.check_path_flags(verbose())
      return main(args)
    except KeyboardInterrupt as e:
      stop(e)
    except Exception as e:  # noqa: BLE001
      if not isinstance(e, EXPECTED) and not lost_process(e) and not cli_storage.storage_error(e):
        raise  # a bug: keep its traceback
      code = report(e)
      sys.stdout.flush()
      if not lost_process(e):
        _leave_together()
      # No interpreter shutdown: library threads cannot print after the line, and a
      # multi-process run does not wait at the shutdown barrier for a process that is gone.
      os._exit(code)

  app.run(guarded, flags_parser=parser)


__all__ = [
  "EXPECTED",
  "UsageError",
  "verbose",
  "describe",
  "closest_fields",
  "unknown_config_fields",
  "check_flag_ranges",
  "parse_flags",
  "check_no_positional",
  "quiet_library_logs",
  "report",
  "call",
  "run",
]
