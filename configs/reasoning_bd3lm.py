"""the BD3LM-4 baseline (block 4, adaLN DiT) on the procedural arithmetic reasoning task (prompt/answer rows).

Run:  python launch/train.py --config=configs/reasoning_bd3lm.py --workdir=/tmp/reasoning_bd3lm
Then: python launch/evaluate.py --workdir=/tmp/reasoning_bd3lm --eval=accuracy

The shared recipe is configs/reasoning_common.py (2 x 128 DiT, L = 32, batch 32, 1200 steps, lr 2e-3);
a few minutes on 2 CPU cores. benchmarks/speed_accuracy.py trains all four and sweeps tau.
"""

from configs import reasoning_common


def get_config():
  return reasoning_common.get_config("bd3lm")
