"""`run`: the step loop that SFT and GRPO share (the package doc says what it owns).

The loop is plain Python around the caller's jitted step: `hooks.step(state, i)` returns the next
state and the step's metrics (device scalars, pulled one step behind so the host never waits on
the step it just dispatched, or host floats with `Hooks.lag=False`). Every stop decision is agreed
across processes (`workdir.stopping`): a signal to any process saves the same step everywhere,
an error seen by one process (a non-finite metric, divergence) stops all of them.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from absl import logging
import jax
import numpy as np

from setdiff_jax import errors
from setdiff_jax.workdir import checkpoints as checkpointing
from setdiff_jax.workdir import fallback, stopping
from setdiff_jax.workdir.divergence import DivergenceGuard
from setdiff_jax.workdir.preemption import Preemption


@dataclasses.dataclass(frozen=True)
class Schedule:
  """Which steps one call runs and when it evaluates and saves.

  start: steps done at entry (the restored state's step); the call runs steps start+1 .. stop.
  stop: the last step of this call (saved); total: the run's last step (num_train_steps), whose
  save is never deferred by the divergence guard. eval_every 0: no evaluation.
  eval_first: evaluate the entry state (step `start`) before the first step: a resume whose
  entry step is due an evaluation that the history lacks (a signal stopped the run there).
  """

  start: int
  stop: int
  total: int
  save_every: int
  eval_every: int = 0
  eval_first: bool = False

  def save_at(self, done: int) -> bool:
    return done % self.save_every == 0 or done == self.stop

  def eval_at(self, done: int) -> bool:
    return self.eval_every > 0 and (done % self.eval_every == 0 or done == self.total)


@dataclasses.dataclass(frozen=True)
class Hooks:
  """What one kind of run adds to the loop.

  step(state, i) -> (state, metrics): step i (0-based) of the run; metrics a flat dict of
    scalars, `monitor` among them (the value the divergence guard watches).
  log(done, host_metrics): the checked host metrics of step `done` (write / print them).
  flush_log(done): a signal stops the run after step `done`: write what `log` still holds (e.g. a
    windowed mean over the steps since its last row), so no step's metrics are lost.
  evaluate(done, state): at `Schedule.eval_at` steps, after the metrics were checked.
  to_save(state): the pytree a checkpoint holds (RL: EMA = the raw parameters).
  on_pause(kind, seconds): time that was not training ("compile", "eval", "save"): throughput.
  name / unit: in messages ("non-finite training metrics at step 3"; "SIGTERM at RL step 2/4").
  lag: metrics are device values pulled one step behind (False: host values, checked at once).
  """

  step: Callable[[Any, int], Tuple[Any, Mapping[str, Any]]]
  log: Callable[[int, Dict[str, float]], None]
  flush_log: Callable[[int], None] = lambda done: None
  evaluate: Optional[Callable[[int, Any], None]] = None
  to_save: Callable[[Any], Any] = lambda state: state
  on_pause: Callable[[str, float], None] = lambda kind, seconds: None
  monitor: str = "loss"
  name: str = "training"
  unit: str = "step"
  lag: bool = True


def check_finite(name: str, step: int, metrics: Dict[str, float]):
  """FloatingPointError naming the non-finite metrics of `step` (the loop's NaN guard; the loop
  adds what was kept)."""
  bad = {k: v for k, v in metrics.items() if not np.isfinite(v)}
  if bad:
    raise FloatingPointError(f"non-finite {name} metrics at step {step}: {bad}")


class _Saves:
  """The checkpoints of a run as the loop sees them: the steps saved, and the newest whose loss
  was seen healthy (the loss of step s + 1 is that of the state saved as step s), which rotation
  never deletes and a stop error (divergence, a non-finite metric) keeps; the steps saved after
  it are set aside then (their own loss was not seen healthy: e.g. exploded parameters)."""

  def __init__(self, manager, schedule: Schedule, guard: DivergenceGuard, data_iterator):
    self.manager, self.schedule, self.guard = manager, schedule, guard
    self.data_iterator = data_iterator
    self.steps = [schedule.start] if schedule.start else []
    self.healthy = schedule.start or None
    self.newest = None  # the newest step this call saved

  def checked(self, done: int, healthy: bool):
    if healthy and done - 1 in self.steps:
      self.healthy = done - 1

  def save(self, done: int, state):
    if self.guard.should_defer(done, final=done == self.schedule.total):
      return
    checkpointing.save(self.manager, done, state, self.data_iterator, protect=(self.healthy,))
    self.steps.append(done)
    self.newest = done
    logging.info("saved checkpoint %s/%d", self.manager.directory, done)

  def _suspect(self) -> list:
    return [s for s in self.steps if self.healthy is None or s > self.healthy]

  def set_aside_suspects(self):
    """An agreed stop error (`stop.on_error`, on every process): the saved steps after the
    newest healthy one move to checkpoints/<step>.diverged (the error line says so)."""
    fallback.set_aside(
      self.manager, [(s, "diverged") for s in self._suspect()], ".diverged", log=False, sync=True
    )

  def kept(self) -> str:
    """What a stop error keeps (`set_aside_suspects` does the moving)."""
    suspect = self._suspect()
    kept = (
      f"checkpoint step {self.healthy} (the newest whose loss was seen healthy) is intact"
      if self.healthy
      else "no healthy checkpoint was saved"
    )
    moved = (
      f"; step(s) {suspect}, saved before their loss was seen, were moved to "
      f"checkpoints/<step>.diverged"
      if suspect
      else ""
    )
    return kept + moved

  def after_signal(self, done: int) -> str:
    if self.steps and self.steps[-1] == done:
      return f"checkpoint {self.manager.directory}/{done} saved"
    return f"no checkpoint saved at this step (last: {self.steps[-1:] or 'none'})"


def _timed(hooks: Hooks, kind: str, fn, *args):
  t0 = time.time()
  fn(*args)
  hooks.on_pause(kind, time.time() - t0)


def run(
  state,
  hooks: Hooks,
  schedule: Schedule,
  *,
  manager,
  writer,
  guard: DivergenceGuard,
  data_iterator=None,
) -> Tuple[Any, Optional[int]]:
  """Runs `schedule`'s steps; returns (the last state, the newest step this call saved or None).

  Closes `writer` and `manager` on the way out, whatever happens. Raises StoppedBySignal (after
  saving the step) on SIGTERM / Ctrl-C, FloatingPointError / DivergenceError as agreed."""
  saves = _Saves(manager, schedule, guard, data_iterator)
  t_start = time.time()
  stopped: Optional[errors.StoppedBySignal] = None
  try:
    with Preemption() as preemption:
      stop = stopping.StopAgreement(preemption)  # the loop acts on what `agree` returns

      stop.on_error = saves.set_aside_suspects

      def flush(done: int, metrics):
        host = {k: float(v) for k, v in jax.device_get(metrics).items()}
        try:
          check_finite(hooks.name, done, host)
        except FloatingPointError as e:
          raise FloatingPointError(
            f"{e}. Training stopped; {saves.kept()}. Try a lower learning_rate, "
            "grad_clip_norm > 0, or model.dtype=float32"
          ) from None
        saves.checked(done, guard.check(done, host[hooks.monitor], saves.kept))
        hooks.log(done, host)

      if schedule.eval_first and hooks.evaluate is not None:
        _timed(hooks, "eval", hooks.evaluate, schedule.start, state)

      pending = None  # (step, metrics) of the previous step, pulled one step behind
      for step in range(schedule.start, schedule.stop):
        t_dispatch = time.time()
        state, metrics = hooks.step(state, step)
        if step == schedule.start:
          jax.block_until_ready(metrics)
          hooks.on_pause("compile", time.time() - t_dispatch)  # steps/s without compilation
          logging.info("first step (compile + run) took %.1fs", time.time() - t_dispatch)
        done = step + 1
        if pending is not None:
          stop.check(flush, *pending)
        pending = (done, metrics)
        if not hooks.lag:
          stop.check(flush, *pending)
          pending = None
        need_save, need_eval = schedule.save_at(done), schedule.eval_at(done)
        signalled = stop.agree()
        if pending is not None and (need_save or need_eval or signalled):
          stop.check(flush, *pending)  # never save or evaluate a state whose loss was not checked
          pending = None
          again = stop.agree()  # always: it raises an error the flush found, on every process
          signalled = signalled or again  # the first agreement names the receiving process
        if signalled:  # save first: the grace period after SIGTERM is short
          saves.save(done, hooks.to_save(state))
          hooks.flush_log(done)
          stopped = errors.StoppedBySignal(
            f"{signalled} at {hooks.unit} {done}/{schedule.total}; {saves.after_signal(done)}. "
            "Run the same command again to resume",
            preemption.signum,
          )
          if need_eval and hooks.evaluate is not None:  # after the save: a kill here loses
            _timed(hooks, "eval", hooks.evaluate, done, state)  # only this (`eval_first` redoes it)
          break
        if need_eval and hooks.evaluate is not None:
          _timed(hooks, "eval", hooks.evaluate, done, state)
        if need_save:
          _timed(hooks, "save", saves.save, done, hooks.to_save(state))
      if pending is not None:
        stop.check(flush, *pending)
        stop.agree()
    if schedule.start >= schedule.total > 0:
      logging.info(
        "nothing to do: checkpoint step %d >= num_train_steps %d", schedule.start, schedule.total
      )
    logging.info("%s finished in %.1fs", hooks.name, time.time() - t_start)
  finally:
    try:
      writer.close()
    except OSError as e:  # e.g. the disk is full: do not hide the error that got us here
      logging.warning("closing the metric writer failed: %s", e)
    checkpointing.close(manager)
  if stopped is not None:  # after the cleanup: one `stopped:` line, exit status 128 + signal
    raise stopped
  return state, saves.newest


__all__ = ["Hooks", "Schedule", "run", "check_finite"]
