"""launch/train.py with one fault on one process of a cluster (tests/test_multihost.py).

  SETDIFF_TEST_FAULT=KIND:PROCESS:STEP python tests/multihost_faults.py --config=... --workdir=...

KIND (only process PROCESS is affected; STEP is a training step):
  nan      its metrics of step STEP are non-finite (the others' are fine)
  damaged  its checks find the newest checkpoint damaged at start (STEP unused)
  kill     it kills itself (SIGKILL) in the middle of saving step STEP (orbax has begun writing)
"""

import os
import re
import signal
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "launch"))  # launch/ is no package: its train.py by name

import train as train_launcher  # noqa: E402  (launch/train.py)
from setdiff_jax import cli, errors  # noqa: E402
from setdiff_jax.trainer import loop  # noqa: E402
from setdiff_jax.data import iterator_state  # noqa: E402
from setdiff_jax.workdir import fallback  # noqa: E402

kind, victim, at = os.environ["SETDIFF_TEST_FAULT"].split(":")
victim, at = int(victim), int(at)
mine = int(os.environ.get("SETDIFF_PROCESS_ID", "0")) == victim

if mine and kind == "nan":
  check_finite = loop.check_finite

  def _nan_at(name, step, metrics):
    if step == at:
      metrics = dict(metrics, loss=float("nan"))
    return check_finite(name, step, metrics)

  loop.check_finite = _nan_at
elif mine and kind == "damaged":
  verify = fallback.verify_checksums
  newest = {}

  def _damaged_newest(where, step, with_data=True):
    newest.setdefault("step", step)  # the loop tries the newest step first
    if step == newest["step"]:
      raise errors.DamagedCheckpointError(f"step {step}: injected damage on this process only")
    return verify(where, step, with_data)

  fallback.verify_checksums = _damaged_newest
elif mine and kind == "kill":
  handler = iterator_state._global_iterator_classes()[0]
  save = handler.save

  def _killed_while_saving(self, directory, *args, **kwargs):
    # orbax writes the step in a temporary folder named after it: checkpoints/<step>.orbax-...
    if re.search(rf"checkpoints/{at}(\.|/|$)", str(directory)):
      print(f"fault: SIGKILL while saving step {at}", flush=True)
      os.kill(os.getpid(), signal.SIGKILL)
    return save(self, directory, *args, **kwargs)

  handler.save = _killed_while_saving

if __name__ == "__main__":
  sys.argv[0] = os.path.join(REPO, "launch", "train.py")
  cli.run(train_launcher.main)
