"""the AR baseline (causal DiT) on the procedural arithmetic reasoning task (prompt/answer rows).

Run:  python launch/train.py --config=configs/reasoning_ar.py --workdir=/tmp/reasoning_ar
Then: python launch/evaluate.py --workdir=/tmp/reasoning_ar --eval=accuracy

The shared recipe is configs/reasoning_common.py (2 x 128 DiT, L = 32, batch 32, 1200 steps, lr 2e-3);
a few minutes on 2 CPU cores. benchmarks/speed_accuracy.py trains all four and sweeps tau.
"""

from configs import reasoning_common


def get_config():
  return reasoning_common.get_config("ar")
