"""When a training run stops, decided alike on every process: the signals it saves on (SIGTERM, a
first SIGINT) and the errors that stop it (non-finite metrics, divergence).

A signal may reach one host of a pod only, and an error may be seen by one process only; if that
process saved or stopped alone, the others would wait in its next collective (or orbax's save
barrier) until a timeout. So the loop keeps what each process saw locally (`Preemption`,
`StopAgreement.check`) and acts only on `StopAgreement.agree()`, which every process calls at
the same points: the first process's error stops all of them (each with that error), a signal
to any process makes all of them save the same step and stop. The exchange is
`sharding.agree` (bounded by `$SETDIFF_BARRIER_TIMEOUT_S`); one process exchanges nothing.
"""

from __future__ import annotations

import json
import signal
from typing import Callable, Optional

from absl import logging
import jax

from setdiff_jax import errors, sharding
from setdiff_jax.workdir.preemption import Preemption

# The local errors that stop a run at a step (the train loop's NaN check and divergence guard).
STOP_ERRORS = {"FloatingPointError": FloatingPointError, "DivergenceError": errors.DivergenceError}


class StopAgreement:
  """The loop's stop decisions, the same on every process (module doc).

  stop = StopAgreement(preemption)
  stop.check(flush, step, metrics)     # a stop error is kept, not raised
  signal_name = stop.agree()           # raises the agreed error; else the agreed signal
  """

  def __init__(self, preemption: Preemption):
    self.preemption = preemption
    self.error: Optional[BaseException] = None
    self.on_error: Optional[Callable[[], None]] = None  # run before an agreed error is raised

  def check(self, fn: Callable, *args):
    """Runs a local check; its stop error (STOP_ERRORS) is kept for `agree`, others raise."""
    if self.error is not None:
      return
    try:
      fn(*args)
    except tuple(STOP_ERRORS.values()) as e:
      self.error = e

  def agree(self) -> Optional[str]:
    """Exchanges (signal seen, error seen) of every process. Raises the error of the first
    process that saw one (on every process, after `on_error`); else returns the name of the
    signal the first process that got one received (None: go on). Sets the preemption's
    `requested`/`signum` alike on every process."""
    mine = {
      "signal": self.preemption.signum if self.preemption.requested else 0,
      "error": "",
      "kind": "",
    }
    if self.error is not None:
      mine.update(error=str(self.error), kind=type(self.error).__name__)
    seen = [json.loads(v) for v in sharding.agree("stop", json.dumps(mine))]
    count = len(seen)
    failed = [i for i, s in enumerate(seen) if s["error"]]
    if failed:
      i = failed[0]
      if self.on_error is not None:
        self.on_error()
      if i == jax.process_index() and self.error is not None:
        raise self.error
      raise STOP_ERRORS[seen[i]["kind"]](f"process {i} of {count}: {seen[i]['error']}")
    signalled = [i for i, s in enumerate(seen) if s["signal"]]
    if not signalled:
      return None
    i = signalled[0]
    if not self.preemption.requested or self.preemption.signum != seen[i]["signal"]:
      logging.warning(
        "%s reached process %d of %d: every process saves and stops",
        signal.Signals(seen[i]["signal"]).name,
        i,
        count,
      )
    self.preemption.requested, self.preemption.signum = True, seen[i]["signal"]
    return self.preemption.name if count == 1 else f"{self.preemption.name} (to process {i})"


__all__ = ["StopAgreement", "STOP_ERRORS"]
