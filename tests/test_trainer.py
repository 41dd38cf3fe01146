"""The one loop of SFT and GRPO (`setdiff_jax/trainer`), on a toy state without a model.

The state is a counter and a vector; its "loss" is scripted per step, so the schedule of saves and
evaluations, the one-step-behind metrics, the NaN check, the divergence guard, a signal and the
restore with fallback are checked on exact step numbers, for lagged (SFT) and host (RL) metrics.
The end-to-end versions run through `train.py` (tests/test_safety.py, test_multihost.py) and
`rl/grpo.py` (tests/test_rl_grpo.py).
"""

import os
import signal

import flax.struct
import jax
import jax.numpy as jnp
import pytest

from setdiff_jax import errors, trainer
from setdiff_jax.workdir import checkpoints as checkpointing
from setdiff_jax.config.sections import Divergence
from setdiff_jax.workdir.divergence import DivergenceGuard


class Toy(flax.struct.PyTreeNode):
  step: jax.Array
  w: jax.Array


class Writer:
  def __init__(self):
    self.closed = False

  def close(self):
    self.closed = True


def guard_config(**kw):
  return Divergence(**dict(dict(factor=10.0, ceiling=0.0, patience=2), **kw))


def toy_run(
  workdir,
  losses,
  *,
  total,
  lag=True,
  save_every=2,
  eval_every=0,
  keep=3,
  after=None,
  on_log=None,
  eval_first=False,
  events=None,
):
  """Runs the loop over `losses[i]` (the loss of step i + 1); returns (state, saved, events).
  `after(i)` runs in step i's call, `on_log(done)` in the log hook; `events`: a list to fill."""
  events = [] if events is None else events
  manager = checkpointing.make_manager(str(workdir), keep=keep, with_data=False)
  state = trainer.restore(manager, Toy(step=jnp.int32(0), w=jnp.zeros(3)))
  start = int(state.step)

  def step(state, i):
    metrics = {"loss": jnp.float32(losses[i])} if lag else {"loss": float(losses[i])}
    if after is not None:
      after(i)
    return Toy(step=state.step + 1, w=state.w + 1.0), metrics

  hooks = trainer.Hooks(
    step=step,
    log=lambda done, host: (events.append(("log", done, host["loss"])), on_log and on_log(done)),
    flush_log=lambda done: events.append(("flush_log", done)),
    evaluate=lambda done, state: events.append(("eval", done, int(state.step))),
    lag=lag,
  )
  schedule = trainer.Schedule(start, total, total, save_every, eval_every, eval_first)
  writer = Writer()
  state, saved = trainer.run(
    state, hooks, schedule, manager=manager, writer=writer, guard=DivergenceGuard(guard_config())
  )
  assert writer.closed
  return state, saved, events


def checkpoints(workdir):
  return sorted(os.listdir(os.path.join(workdir, "checkpoints")))


@pytest.mark.parametrize("lag", [True, False])
def test_schedule_logs_every_step_once_in_order_and_resumes(tmp_path, lag):
  state, saved, events = toy_run(tmp_path, [1.0] * 5, total=5, lag=lag, eval_every=2)
  assert int(state.step) == 5 and saved == 5
  assert [e for e in events if e[0] == "log"] == [("log", s, 1.0) for s in range(1, 6)]
  # evaluations after the step's metrics were checked, on the state of that step
  assert [e for e in events if e[0] == "eval"] == [("eval", 2, 2), ("eval", 4, 4), ("eval", 5, 5)]
  assert events.index(("eval", 2, 2)) > events.index(("log", 2, 1.0))
  assert checkpoints(tmp_path) == ["2", "4", "5"]
  state, saved, events = toy_run(tmp_path, [1.0] * 7, total=7, lag=lag)  # a resume
  assert int(state.step) == 7 and saved == 7 and events[0] == ("log", 6, 1.0)
  assert float(state.w[0]) == 7.0


@pytest.mark.parametrize("lag", [True, False])
def test_non_finite_metric_stops_before_the_save(tmp_path, lag):
  with pytest.raises(FloatingPointError, match="non-finite training metrics at step 4") as e:
    toy_run(tmp_path, [1.0, 1.0, 1.0, float("nan"), 1.0], total=5, lag=lag)
  assert checkpoints(tmp_path) == ["2"]
  assert "checkpoint step 2 (the newest whose loss was seen healthy) is intact" in str(e.value)


@pytest.mark.parametrize("lag", [True, False])
def test_non_finite_metric_says_what_was_kept_and_sets_the_unchecked_save_aside(tmp_path, lag):
  """The NaN guard said "the last saved checkpoint is intact" also when none was saved, and
  when the newest one was the state whose loss came out non-finite (step 2's loss is that of the
  state saved as step 1: exploded parameters). Now it says what is kept, as the divergence
  guard does, and that state moves aside (a resume would only fail again)."""
  with pytest.raises(FloatingPointError, match="at step 1.*no healthy checkpoint was saved"):
    toy_run(tmp_path / "a", [float("inf"), 1.0], total=2, lag=lag)
  assert not os.path.isdir(tmp_path / "a" / "checkpoints") or checkpoints(tmp_path / "a") == []
  with pytest.raises(FloatingPointError, match=r"at step 2.*step\(s\) \[1\], saved before"):
    toy_run(tmp_path / "b", [1.0, float("nan"), 1.0], total=3, lag=lag, save_every=1)
  assert checkpoints(tmp_path / "b") == ["1.diverged"]


@pytest.mark.parametrize("lag", [True, False])
def test_divergence_keeps_the_newest_healthy_checkpoint(tmp_path, lag):
  """Loss 1e3 from step 4 (patience 2, a save every step, keep 1): step 4's save waits, step 5
  stops the run; step 2 (its successor's loss seen healthy) stays, step 3 is set aside."""
  with pytest.raises(errors.DivergenceError, match=r"diverged at step 5.*step 2 \(the newest"):
    toy_run(tmp_path, [1.0, 1.0, 1.0, 1e3, 1e3, 1.0], total=6, lag=lag, save_every=1, keep=1)
  assert checkpoints(tmp_path) == ["2", "3.diverged"]


@pytest.mark.parametrize("lag", [True, False])
def test_sigterm_saves_the_step_and_stops(tmp_path, lag):
  def term_at_step_3(i):
    if i == 2:
      os.kill(os.getpid(), signal.SIGTERM)

  with pytest.raises(errors.StoppedBySignal, match=r"SIGTERM at step 3/6; checkpoint .*/3 saved"):
    toy_run(tmp_path, [1.0] * 6, total=6, lag=lag, save_every=4, after=term_at_step_3)
  assert checkpoints(tmp_path) == ["3"]
  state, _, _ = toy_run(tmp_path, [1.0] * 6, total=6, lag=lag)
  assert int(state.step) == 6 and float(state.w[0]) == 6.0


@pytest.mark.parametrize("lag", [True, False])
def test_a_signal_at_an_eval_step_saves_then_evaluates_then_stops(tmp_path, lag):
  """SIGTERM during step 4, an eval step: the checkpoint first, then step 4's evaluation (it
  was skipped: the resume started after it and the evaluation never happened), the windowed
  log flushed; nothing after."""

  def term_at_step_4(i):
    if i == 3:
      os.kill(os.getpid(), signal.SIGTERM)

  events = []
  with pytest.raises(errors.StoppedBySignal, match="SIGTERM at step 4/6"):
    toy_run(
      tmp_path,
      [1.0] * 6,
      total=6,
      lag=lag,
      save_every=6,
      eval_every=2,
      after=term_at_step_4,
      events=events,
    )
  assert checkpoints(tmp_path) == ["4"]
  assert [e for e in events if e[0] in ("eval", "flush_log")][-2:] == [
    ("flush_log", 4),
    ("eval", 4, 4),
  ]
  _, _, events = toy_run(tmp_path, [1.0] * 6, total=6, lag=lag, eval_every=2)
  assert [e for e in events if e[0] == "eval"] == [("eval", 6, 6)]  # 4's was done before


def test_eval_first_evaluates_the_entry_state_before_any_step(tmp_path):
  """A resume whose entry step's evaluation is missing (the process was killed during it):
  `eval_first` evaluates the restored state, then trains on; at the final step it is the
  only thing left to do."""
  toy_run(tmp_path, [1.0] * 4, total=4, save_every=4)
  _, _, events = toy_run(tmp_path, [1.0] * 6, total=6, eval_every=2, eval_first=True)
  assert events[0] == ("eval", 4, 4) and [e for e in events if e[0] == "eval"][1:] == [
    ("eval", 6, 6)
  ]
  _, saved, events = toy_run(tmp_path, [1.0] * 6, total=6, eval_every=2, eval_first=True)
  assert events == [("eval", 6, 6)] and saved is None


@pytest.mark.parametrize("lag", [True, False])
def test_a_signal_while_a_save_step_is_checked_stops_at_that_step(tmp_path, lag):
  """SIGTERM while the loop waits for a save step's metrics (the second agreement): it was
  dropped, so the loop ran that step's evaluation and save, one more step, and only then the
  preemption save. Now it saves that step and stops there."""

  def term(done):
    if done == 4:
      os.kill(os.getpid(), signal.SIGTERM)

  with pytest.raises(errors.StoppedBySignal, match="SIGTERM at step 4/8"):
    toy_run(tmp_path, [1.0] * 8, total=8, lag=lag, save_every=2, eval_every=4, on_log=term)
  assert checkpoints(tmp_path) == ["2", "4"]


@pytest.mark.parametrize("lag", [True, False])
def test_a_signal_flushes_the_log_after_the_save(tmp_path, lag):
  """The training log's windowed mean over the steps since its last row was dropped at a
  signal (those steps' losses were in no row); `flush_log` writes it, after the save."""

  def term_at_step_3(i):
    if i == 2:
      os.kill(os.getpid(), signal.SIGTERM)

  events = []
  with pytest.raises(errors.StoppedBySignal):
    toy_run(
      tmp_path, [1.0] * 6, total=6, lag=lag, save_every=4, after=term_at_step_3, events=events
    )
  assert events[-1] == ("flush_log", 3) and events.count(("flush_log", 3)) == 1
  assert ("log", 3, 1.0) in events


def test_restore_falls_back_past_a_damaged_step_and_sets_it_aside(tmp_path):
  toy_run(tmp_path, [1.0] * 4, total=4)
  with open(os.path.join(tmp_path, "checkpoints", "4", "state", "_METADATA"), "w") as f:
    f.write("{")
  state, saved, _ = toy_run(tmp_path, [1.0] * 5, total=5)
  assert saved == 5 and float(state.w[0]) == 5.0  # steps 3 .. 5 rerun from step 2
  assert checkpoints(tmp_path) == ["2", "4", "4.damaged", "5"]  # 4 saved again, 3 never saved
