"""Preemption of a run: `Preemption` turns SIGTERM / Ctrl-C into a request to save and stop.

The train loop polls `requested` after every step (through `stopping.StopAgreement`, so a signal
to one process stops them all), saves a checkpoint, then raises `errors.StoppedBySignal` (exit
status 128 + signal).

Before that loop, `catch_startup_signals` (the launchers' first call, before jax is imported)
makes SIGTERM and SIGINT end the launcher with one `stopped:` line (without it SIGTERM ended the
process without a word): at once while it imports, through `StartupSignal` (which `cli.run`
reports) once its main runs. The signal is also remembered: one that a
library swallowed (a KeyboardInterrupt raised inside jax's garbage-collection callback is
dropped) stops the launcher where `cli.run` starts its main, or the training loop at its first
step (`Preemption` picks it up), instead of the run going on to the end.
"""

from __future__ import annotations

import os
import signal
from typing import Optional

from absl import logging


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
  for sig in Preemption.SIGNALS:
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


class Preemption:
  """Records SIGTERM and a first SIGINT (Ctrl-C) so the loop saves a checkpoint and stops; a
  second SIGINT aborts at once (exit status 130; checkpoints saved before are intact)."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.requested = False
    self.signum: Optional[int] = None
    self._previous = {}

  def __enter__(self):
    for sig in self.SIGNALS:
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread
        pass
    if _startup_signum is not None:  # arrived before, and a library swallowed its exception
      self.requested, self.signum = True, _startup_signum
    return self

  @property
  def name(self) -> str:
    return signal.Signals(self.signum).name if self.signum else "a signal"

  def _handle(self, signum, frame):
    del frame
    if self.requested and signum == signal.SIGINT:
      os.write(
        2,
        b"aborted: second SIGINT; checkpoints saved before are intact (the one being "
        b"written, if any, is not used)\n",
      )
      os._exit(128 + signal.SIGINT)
    logging.warning(
      "%s received: saving a checkpoint, then exiting%s.",
      signal.Signals(signum).name,
      " (Ctrl-C again aborts at once)" if signum == signal.SIGINT else "",
    )
    self.requested = True
    self.signum = signum

  def __exit__(self, *exc):
    for sig, previous in self._previous.items():
      if previous is not None:
        signal.signal(sig, previous)
