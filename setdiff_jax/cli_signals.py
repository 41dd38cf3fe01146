"""SIGTERM and SIGINT that reach a launcher outside its training loop (whose `Preemption` saves
a checkpoint, then stops).

`catch_startup_signals` (the launchers' first call, before jax is imported) makes them end the
launcher with one `stopped:` line (without it SIGTERM ended the process without a word): at once
while it imports (nothing is written yet; an exception raised inside an import ends in a
traceback, or an abort), through `StartupSignal` (which `cli.run` reports) once its main runs.
The signal is also remembered: one that a library swallowed (a KeyboardInterrupt raised inside
jax's garbage-collection callback is dropped) stops the launcher where `cli.run` starts its main,
or the training loop at its first step, instead of the run going on to the end.
"""

from __future__ import annotations

import os
import signal
from typing import Optional


class StartupSignal(KeyboardInterrupt):
  """SIGTERM or SIGINT before a training loop's own handler (`catch_startup_signals`)."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum


_startup_signum: Optional[int] = None  # the signal a launcher got before its loop's handler
_unwind = False  # False while the launcher imports (nothing written yet): exit at once


def catch_startup_signals(unwind: bool = False):
  """Installs the startup handler for SIGTERM and SIGINT (main thread only). Before `unwind`
  (while a launcher imports its modules) a signal ends the process at once with the `stopped:`
  line; from then on (`cli.run`) it raises `StartupSignal`, which unwinds the launcher."""
  global _unwind
  _unwind = unwind
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, _on_startup_signal)


def stopped_line(signum: int) -> str:
  """The line a launcher stopped by `signum` outside the training loop ends with."""
  if signum == signal.SIGINT:
    what, name = "interrupted by Ctrl-C", "Ctrl-C"
  else:
    name = signal.Signals(signum).name
    what = f"terminated by {name}"
  return (
    f"stopped: {what}; files written before are intact (training saves a checkpoint on {name} "
    "once its loop has started)"
  )


def _on_startup_signal(signum, frame):
  global _startup_signum
  del frame
  _startup_signum = signum
  if not _unwind:  # an exception raised inside an import would end in a traceback (or abort)
    os.write(2, (stopped_line(signum) + "\n").encode())
    os._exit(128 + signum)
  raise StartupSignal(signum)


def startup_signal() -> Optional[int]:
  """The signal number `catch_startup_signals` recorded (None: none arrived)."""
  return _startup_signum


__all__ = ["StartupSignal", "catch_startup_signals", "stopped_line", "startup_signal"]
