"""Reinforcement learning (GRPO with exact trajectory likelihoods) from an SFT workdir.

  python launch/rl.py --config=configs/rl_arithmetic.py --workdir=/tmp/rl_arith \
      --config.rl.init_from=/tmp/reasoning_sw [--config.rl.group_size=8 ...]

The SFT workdir is a launch/train.py run on a prompt/answer task (configs/reasoning_sw.py or
reasoning_ar.py); its model, tokenizer and task come with it, the prompts from the task's train
split. Re-running with the same workdir resumes exactly. The fields: setdiff_jax/rl/config.py.
"""

import os
import shlex
import sys

# The repository root: the --config files import `configs.*` (not part of the package).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if __name__ == "__main__":  # before jax loads: a signal from here on ends in one `stopped:` line
  from setdiff_jax import cli_signals

  cli_signals.catch_startup_signals()

from absl import flags  # noqa: E402
import jax  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from setdiff_jax import cli, paths, sharding  # noqa: E402
from setdiff_jax.rl import grpo  # noqa: E402

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file(
  "config", None, "RL config file (configs/rl_*.py).", lock_config=True
)
flags.DEFINE_string("workdir", None, "Directory for the RL run's checkpoints and metrics.")
flags.mark_flags_as_required(["config", "workdir"])


def summary(result, workdir: str) -> str:
  workdir = paths.resolve(workdir)
  parts = [f"done: RL step {int(result.get('step', 0))}"]
  if "rl/reward_mean" in result:
    parts.append(
      f"reward {result['rl/reward_mean']:.3f}, sampled accuracy "
      f"{result['rl/accuracy']:.3f}, kept tokens per call "
      f"{result['rl/kept_tokens_per_call']:.2f}"
    )
  if "checkpoint" in result:
    parts.append(f"checkpoint {paths.join(workdir, 'checkpoints', str(int(result['checkpoint'])))}")
  parts.append(
    f"evaluate with: python launch/evaluate.py --workdir={shlex.quote(workdir)} --eval=accuracy"
  )
  return "; ".join(parts)


def main(argv):
  del argv
  sharding.initialize_distributed()
  result = grpo.train_rl(FLAGS.config, FLAGS.workdir)
  if jax.process_index() == 0:
    print(summary(result, FLAGS.workdir), flush=True)


if __name__ == "__main__":
  cli.run(main)
