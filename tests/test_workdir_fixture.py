"""A run written before the layout move (tests/fixtures/workdir_wave2, made by commit 9af0940 with
`launch/train.py --config=configs/tiny_sw.py` at d=32, 1 layer, V=300, 4 steps, EMA 0.9) still
loads for inference with the same parameters, and still resumes training.

The parameter sums were computed by that commit's `workdir.load_inference_state`; the checkpoint
layout (orbax tree paths, config.json fields, tokenizer files) is a promise to users' runs.
"""

import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from setdiff_jax.workdir import load as workdir_lib
from conftest import REPO_ROOT

FIXTURE = REPO_ROOT / "tests" / "fixtures" / "workdir_wave2"
# sum of |parameter| over the 12 leaves, as the writing commit loaded them
ABS_SUMS = {True: 1859.1052392760453, False: 1859.8390729342036}


@pytest.mark.parametrize("use_ema", [True, False])
def test_old_workdir_loads_the_same_parameters(use_ema):
  state = workdir_lib.load_inference_state(str(FIXTURE), use_ema=use_ema)
  leaves = jax.tree_util.tree_leaves(state.params)
  assert state.step == 4 and len(leaves) == 12
  total = sum(float(np.abs(np.asarray(x, np.float64)).sum()) for x in leaves)
  np.testing.assert_allclose(total, ABS_SUMS[use_ema], rtol=1e-12)
  assert state.tokenizer.vocab_size == 300


@pytest.mark.slow
def test_old_workdir_resumes_training(tmp_path):
  """The writing command, one step further, on one device like the original run (~15 s)."""
  workdir = tmp_path / "run"
  shutil.copytree(FIXTURE, workdir)
  overrides = dict(
    **{
      "model.hidden_size": 32,
      "model.num_heads": 2,
      "model.num_layers": 1,
      "tokenizer.vocab_size": 300,
      "batch_size": 4,
      "seq_len": 32,
      "eval_every_steps": 4,
      "num_eval_steps": 1,
      "checkpoint_every_steps": 4,
      "num_eval_samples": 0,
      "ema_decay": 0.9,
    },
    num_train_steps=5,
  )
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  res = subprocess.run(
    [sys.executable, "launch/train.py", "--config=configs/tiny_sw.py", f"--workdir={workdir}"]
    + [f"--config.{k}={v}" for k, v in overrides.items()],
    cwd=REPO_ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert res.returncode == 0, res.stderr[-3000:]
  assert res.stdout.strip().splitlines()[-1].startswith("done: step 5")
  # the old step is still there and loadable beside the new one
  assert workdir_lib.load_inference_state(str(workdir), step=4).step == 4
  assert workdir_lib.load_inference_state(str(workdir)).step == 5
