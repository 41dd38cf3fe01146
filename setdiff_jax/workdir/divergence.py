"""The divergence guard of the train loop (beside its NaN guard): `DivergenceGuard` decides, step
by step, whether the loss has left its recent range for long enough to stop the run before it
saves; `logged_losses` seeds it from WORKDIR/metrics.jsonl on a resume.

The guard is pure Python on host floats (no jax): the loop calls `check(step, loss)` for every
step's loss and `should_defer(step, final)` before every save.
"""

from __future__ import annotations

import collections
from typing import Callable

from absl import logging
import numpy as np

from setdiff_jax import errors
from setdiff_jax.config.sections import Divergence
from setdiff_jax.workdir import metrics


class DivergenceGuard:
  """Stops a diverging run before it saves (beside the NaN guard `trainer.loop.check_finite`).

  A step's loss is *over* when it exceeds `divergence_factor` x the median of the last
  `divergence_window` accepted step losses (a median below MEDIAN_FLOOR counts as the floor), or
  `divergence_ceiling`; over losses are not added to
  the window. `divergence_patience` consecutive over steps raise DivergenceError; while any step
  is over, checkpoints are deferred (`suspicious`), so neither the diverging state is saved nor
  an older checkpoint rotated out. A resumed run seeds the window from WORKDIR/metrics.jsonl.
  factor 0 and ceiling 0 turn the guard off.
  """

  MEDIAN_FLOOR = 1.0

  def __init__(self, settings: Divergence, history=()):
    self.factor = float(settings.factor)
    self.ceiling = float(settings.ceiling)
    self.patience = int(settings.patience)
    window = int(settings.window)
    self.recent = collections.deque(list(history)[-window:], maxlen=window)
    self.strikes = 0

  @property
  def suspicious(self) -> bool:
    return self.strikes > 0

  def check(self, step: int, loss: float, on_diverged: Callable[[], str] = lambda: "") -> bool:
    """True if `loss` is healthy; False while over the threshold; DivergenceError (its message
    ending with `on_diverged()`, which says what was kept) after `patience` over steps."""
    median = float(np.median(self.recent)) if self.recent else None
    # A near-zero median (a task the model has learnt) would make noise look like divergence:
    # the ratio is taken to at least MEDIAN_FLOOR (nats per token).
    over_ratio = (
      self.factor > 0 and median is not None and loss > self.factor * max(median, self.MEDIAN_FLOOR)
    )
    over_ceiling = self.ceiling > 0 and loss > self.ceiling
    if not (over_ratio or over_ceiling):
      self.strikes = 0
      self.recent.append(loss)
      return True
    self.strikes += 1
    if self.strikes < self.patience:
      logging.warning(
        "loss %.4g at step %d is above the divergence threshold (%d of %d); "
        "checkpoints wait until it recovers",
        loss,
        step,
        self.strikes,
        self.patience,
      )
      return False
    why = (
      f"above divergence_factor={self.factor:g} x the median {median:.4g} of the last "
      f"{len(self.recent)} step losses"
      if over_ratio
      else f"above divergence_ceiling={self.ceiling:g}"
    )
    raise errors.DivergenceError(
      f"training diverged at step {step}: loss {loss:.4g} {why} for {self.patience} "
      f"consecutive steps. Stopped before saving; {on_diverged()}. Lower learning_rate, or "
      f"turn the guard off with --config.divergence_factor=0 --config.divergence_ceiling=0"
    )

  def should_defer(self, step: int, final: bool) -> bool:
    """True while a loss is over the threshold (the final step's save raises instead)."""
    if not self.suspicious:
      return False
    if final:
      raise errors.DivergenceError(
        f"the loss at the final step {step} is above the divergence threshold: its checkpoint "
        "was not saved and the earlier ones are intact. Lower learning_rate, or turn the guard "
        "off with --config.divergence_factor=0 --config.divergence_ceiling=0"
      )
    return True  # the warning of `check` said so


def logged_losses(workdir: str, up_to_step: int, key: str = "train/loss") -> list:
  """The finite `key` values (the loss the guard watches) of WORKDIR/metrics.jsonl at steps <=
  up_to_step (the resumed history), local or object-store workdir alike."""
  return [
    float(row[key])
    for row in metrics.rows(workdir)
    if key in row and row["step"] <= up_to_step and np.isfinite(row[key])
  ]


__all__ = ["DivergenceGuard", "logged_losses"]
