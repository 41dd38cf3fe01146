"""The one training loop of SFT (`setdiff_jax.train`) and GRPO (`setdiff_jax.rl.grpo`).

  state = trainer.locked(config, workdir, body)         # lock, new-workdir and resume checks
  state = trainer.restore(manager, state, data_iter, initialise)   # newest loadable step, else init
  state, saved = trainer.run(state, hooks, schedule, manager=..., writer=..., guard=...)

A run differs from another only in its step function and hooks (`Hooks`): what a step computes,
how its metrics are logged, what is evaluated and what is saved. The loop owns the rest, once for
both: metrics pulled one step behind, the NaN check, the divergence guard (checkpoints deferred
while a loss is over, never rotating out the newest healthy one), the stop agreement across
processes (signals and errors), evaluations and saves on their schedule, and the cleanup.
"""

from setdiff_jax.trainer.loop import Hooks, Schedule, run
from setdiff_jax.trainer.session import locked, restore

__all__ = ["Hooks", "Schedule", "run", "locked", "restore"]
