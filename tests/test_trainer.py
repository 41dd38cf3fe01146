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


def toy_run(workdir, losses, *, total, lag=True, save_every=2, eval_every=0, keep=3, after=None):
  """Runs the loop over `losses[i]` (the loss of step i + 1); returns (state, saved, events)."""
  events = []
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
    log=lambda done, host: events.append(("log", done, host["loss"])),
    evaluate=lambda done, state: events.append(("eval", done, int(state.step))),
    lag=lag,
  )
  schedule = trainer.Schedule(start, total, total, save_every, eval_every)
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
  with pytest.raises(FloatingPointError, match="non-finite training metrics at step 4"):
    toy_run(tmp_path, [1.0, 1.0, 1.0, float("nan"), 1.0], total=5, lag=lag)
  assert checkpoints(tmp_path) == ["2"]


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


def test_restore_falls_back_past_a_damaged_step_and_sets_it_aside(tmp_path):
  toy_run(tmp_path, [1.0] * 4, total=4)
  with open(os.path.join(tmp_path, "checkpoints", "4", "state", "_METADATA"), "w") as f:
    f.write("{")
  state, saved, _ = toy_run(tmp_path, [1.0] * 5, total=5)
  assert saved == 5 and float(state.w[0]) == 5.0  # steps 3 .. 5 rerun from step 2
  assert checkpoints(tmp_path) == ["2", "4", "4.damaged", "5"]  # 4 saved again, 3 never saved
