"""Train a Set Diffusion (or AR / MDLM / BD3LM) model.

  python launch/train.py --config=configs/tiny_sw.py --workdir=/tmp/setdiff_tiny \
      [--config.num_train_steps=1000 ...]

Re-running with the same workdir resumes from its latest checkpoint. On a multi-host TPU pod or
GPU cluster run the same command on every host; `jax.distributed.initialize()` picks up the
cluster from the environment (and is skipped on a single host).
"""

import os
import shlex
import sys

# The repository root: the --config files import `configs.*` (not part of the package).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if __name__ == "__main__":  # before jax loads: a signal from here on ends in one `stopped:` line
  from setdiff_jax import cli_signals

  cli_signals.catch_startup_signals()

from absl import flags, logging  # noqa: E402
import jax  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from setdiff_jax import cli, paths, sharding, train  # noqa: E402
from setdiff_jax.config import run as run_config  # noqa: E402
from setdiff_jax.data import pairs  # noqa: E402

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Training config file.", lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and the tokenizer.")
flags.mark_flags_as_required(["config", "workdir"])


def summary(result, workdir: str, cfg: run_config.RunConfig) -> str:
  """The last line of a run: where it stopped, its eval PPL, its checkpoint, the next command
  (for a prompt/answer run: the accuracy eval and a prompted sample)."""
  workdir = paths.resolve(workdir)
  step = int(result.get("step", 0))
  parts = [f"done: step {step}"]
  if "eval/ppl" in result:
    parts.append(f"eval PPL {result['eval/ppl']:.2f} (NLL {result['eval/nll']:.4f})")
  parts.append(f"checkpoint {paths.join(workdir, 'checkpoints', str(step))}")
  # Sample (and evaluate) with the parameters training evaluated (with ema_decay = 0 the EMA copy
  # is the raw parameters: nothing to choose).
  ema_is_raw = cfg.optimization.ema_decay == 0.0
  raw = " --nouse_ema" if cfg.evaluation.eval_params == "raw" and not ema_is_raw else ""
  if str(cfg.data.get("source", "")) in pairs.PAIR_SOURCES:  # a conditional (prompt) run
    parts.append(
      f"evaluate with: python launch/evaluate.py --workdir={shlex.quote(workdir)} --eval=accuracy; "
      f"sample a prompt with: python launch/sample.py --workdir={shlex.quote(workdir)}{raw} "
      "--prompt='<a prompt like the training prompts>'"
    )
  else:
    parts.append(f"sample with: python launch/sample.py --workdir={shlex.quote(workdir)}{raw}")
  return "; ".join(parts)


def main(argv):
  del argv  # cli.run rejects positional arguments
  sharding.initialize_distributed()
  logging.debug(
    "JAX devices: %s (process %d of %d)", jax.devices(), jax.process_index(), jax.process_count()
  )
  result = train.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  if jax.process_index() == 0:
    cfg = run_config.from_config_dict(FLAGS.config, check_data=False)  # checked by training
    print(summary(result, FLAGS.workdir, cfg), flush=True)


if __name__ == "__main__":
  cli.run(main)
