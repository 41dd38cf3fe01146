"""Preemption of a run: `Preemption` turns SIGTERM / Ctrl-C into a request to save and stop.

The train loop polls `requested` after every step (through `stopping.StopAgreement`, so a signal
to one process stops them all), saves a checkpoint, then raises `errors.StoppedBySignal` (exit
status 128 + signal).

A signal that reached the launcher before the loop and that a library swallowed
(`cli_signals.startup_signal`) is picked up on entry: the loop saves at its first step and stops.
"""

from __future__ import annotations

import os
import signal
from typing import Optional

from absl import logging

from setdiff_jax import cli_signals


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
    if cli_signals.startup_signal() is not None:  # arrived before; a library swallowed it
      self.requested, self.signum = True, cli_signals.startup_signal()
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
