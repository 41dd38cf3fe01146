"""Repeatability of multi-process training over gloo: one run of 1 process x 8 devices, then the
same run on 2 processes x 4 devices several times; a table of each repeat's worst train-loss
and grad-norm difference and its final-parameter distance (norm-relative) to the 1-process run.

  python -m benchmarks.multihost_repeat                       # fsdp=8, SetDLM, 20 steps, 5 x
  python -m benchmarks.multihost_repeat --mesh=data=2,fsdp=2,tensor=2 --objective=ar --repeats=3

The model is the tiny one of tests/test_multihost.py (d=32, 1 layer, vocab 384). Every process
runs on one compute thread (launch/local_cluster.py), so on a shared machine the wall times are
mostly compilation; what matters is that every repeat gives the same numbers (no flaky gloo
collective, no order that changes from run to run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

if __name__ == "__main__" and not __package__:  # a file run cannot import benchmarks/
  sys.exit(
    "error: run it from the repository root as `python -m benchmarks.multihost_repeat [flags]`"
  )

from benchmarks import inputs  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  )

ARGS = [
  "--config=configs/tiny_sw.py",
  "--config.log_every_steps=1",
  "--config.num_eval_steps=1",
  "--config.num_eval_samples=0",
  "--config.model.hidden_size=32",
  "--config.model.num_layers=1",
  "--config.tokenizer.vocab_size=384",
]


def run(workdir: str, processes: int, devices: int, extra) -> float:
  t0 = time.time()
  cmd = (
    [
      sys.executable,
      os.path.join(REPO, "launch", "local_cluster.py"),
      f"--num_processes={processes}",
      f"--devices_per_process={devices}",
      "--timeout=900",
      "--",
      sys.executable,
      "launch/train.py",
      f"--workdir={workdir}",
    ]
    + ARGS
    + extra
  )
  r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1000)
  if r.returncode != 0:
    sys.exit(
      f"error: {processes} x {devices} failed (status {r.returncode}):\n"
      f"{(r.stdout + r.stderr)[-3000:]}"
    )
  return time.time() - t0


def metrics(workdir: str) -> dict:
  out = {}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      out.setdefault(row.pop("step"), {}).update(row)
  return out


def param_distance(a_dir: str, b_dir: str) -> float:
  import jax
  import numpy as np
  from setdiff_jax.workdir import load

  a = jax.tree_util.tree_leaves(load.load_inference_state(a_dir, use_ema=False).params)
  b = jax.tree_util.tree_leaves(load.load_inference_state(b_dir, use_ema=False).params)
  num = sum(float(np.sum((np.float64(x) - np.float64(y)) ** 2)) for x, y in zip(a, b))
  return (num / sum(float(np.sum(np.float64(y) ** 2)) for y in b)) ** 0.5


def worst(got: dict, want: dict, name: str) -> float:
  return max(abs(got[s][name] / want[s][name] - 1) for s in want if name in want[s])


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--mesh", default="data=1,fsdp=8,tensor=1")
  p.add_argument("--objective", default="setdlm")
  p.add_argument("--steps", type=int, default=20)
  p.add_argument("--repeats", type=int, default=5)
  a = p.parse_args()
  mesh = dict(kv.split("=") for kv in a.mesh.split(","))
  extra = [f"--config.mesh.{k}={v}" for k, v in mesh.items()] + [
    f"--config.objective={a.objective}",
    f"--config.num_train_steps={a.steps}",
    f"--config.checkpoint_every_steps={a.steps}",
    f"--config.eval_every_steps={a.steps}",
  ]
  with tempfile.TemporaryDirectory() as tmp:
    one = os.path.join(tmp, "one")
    t_one = run(one, 1, 8, extra)
    want = metrics(one)
    print(f"mesh {a.mesh}, {a.objective}, {a.steps} steps; 1 x 8 reference: {t_one:.0f}s\n")
    print(
      "| repeat | 2 x 4 wall s | worst loss rel | worst grad-norm rel | eval NLL rel | params rel |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for i in range(a.repeats):
      two = os.path.join(tmp, f"two{i}")
      t = run(two, 2, 4, extra)
      got = metrics(two)
      print(
        f"| {i + 1} | {t:.0f} | {worst(got, want, 'train/loss'):.1e} | "
        f"{worst(got, want, 'train/grad_norm'):.1e} | {worst(got, want, 'eval/nll'):.1e} | "
        f"{param_distance(two, one):.1e} |",
        flush=True,
      )


if __name__ == "__main__":
  inputs.run(main)
