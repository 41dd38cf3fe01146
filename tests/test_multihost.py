"""Several JAX processes on this machine: launch/local_cluster.py, `initialize_distributed`'s
cluster settings, and (slow tier) real 2-process clusters with gloo CPU collectives."""
import os
import re
import subprocess
import sys
import time

import pytest

from setdiff_jax import sharding

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(REPO, "launch", "local_cluster.py")


def cluster(args, timeout=600, env=None):
  t0 = time.time()
  r = subprocess.run([sys.executable, CLUSTER] + args, capture_output=True, text=True,
                     timeout=timeout, cwd=REPO, env=env)
  return r, time.time() - t0


# ------------------------------------------------------------------------- the launcher (fast)
def test_local_cluster_environment_and_prefixes():
  code = ("import os; e = os.environ; print(e['SETDIFF_PROCESS_ID'], e['SETDIFF_NUM_PROCESSES'],"
          " e['SETDIFF_COORDINATOR_ADDRESS'], e['JAX_NUM_CPU_DEVICES'],"
          " e['JAX_CPU_COLLECTIVES_IMPLEMENTATION'], 'force' in e['XLA_FLAGS'])")
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
  r, _ = cluster(["--num_processes=3", "--devices_per_process=2", "--port=23456", "--",
                  sys.executable, "-c", code], timeout=60, env=env)
  assert r.returncode == 0, r.stderr
  lines = sorted(r.stdout.splitlines())
  assert lines == [f"[p{i}] {i} 3 127.0.0.1:23456 2 gloo False" for i in range(3)]


def test_local_cluster_fails_fast_and_names_the_process():
  code = ("import os, sys, time; i = int(os.environ['SETDIFF_PROCESS_ID']); print('up', i, "
          "flush=True); time.sleep(0.5); sys.exit(3) if i == 1 else time.sleep(120)")
  r, elapsed = cluster(["--num_processes=3", "--grace_s=5", "--", sys.executable, "-c", code],
                       timeout=60)
  assert r.returncode == 3
  errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "process 1 of 3 exited with status 3" in errors[0], r.stderr
  assert elapsed < 30  # not the 120 s the others would have slept


def test_local_cluster_timeout_and_usage_errors():
  r, elapsed = cluster(["--num_processes=2", "--timeout=1", "--grace_s=2", "--", sys.executable,
                        "-c", "import time; time.sleep(120)"], timeout=60)
  assert r.returncode == 124 and "--timeout=1s" in r.stderr and elapsed < 30
  for args, needle in ((["--num_processes=2", sys.executable], "after `--`"),
                       (["--num_processes=0", "--", "true"], "--num_processes=0"),
                       (["--port=70000", "--", "true"], "--port=70000")):
    r, _ = cluster(args, timeout=60)
    assert r.returncode == 2
    assert r.stderr.startswith("error:") and len(r.stderr.strip().splitlines()) == 1
    assert needle in r.stderr


def test_cluster_settings_from_environment(monkeypatch):
  for name in (sharding.COORDINATOR_ENV, sharding.NUM_PROCESSES_ENV, sharding.PROCESS_ID_ENV,
               sharding.INIT_TIMEOUT_ENV, sharding.HEARTBEAT_TIMEOUT_ENV):
    monkeypatch.delenv(name, raising=False)
  assert sharding.cluster_settings() is None  # auto-detection
  monkeypatch.setenv(sharding.COORDINATOR_ENV, "127.0.0.1:1234")
  with pytest.raises(ValueError, match="SETDIFF_NUM_PROCESSES"):
    sharding.cluster_settings()
  monkeypatch.setenv(sharding.NUM_PROCESSES_ENV, "2")
  monkeypatch.setenv(sharding.PROCESS_ID_ENV, "1")
  monkeypatch.setenv(sharding.HEARTBEAT_TIMEOUT_ENV, "7")
  got = sharding.cluster_settings()
  assert got == {"coordinator_address": "127.0.0.1:1234", "num_processes": 2, "process_id": 1,
                 "initialization_timeout": sharding.DEFAULT_INIT_TIMEOUT_S,
                 "heartbeat_timeout_seconds": 7}
  assert sharding.cluster_settings(process_id=0)["process_id"] == 0  # arguments win
  with pytest.raises(ValueError, match="process_id=2 must be < --num_processes=2"):
    sharding.cluster_settings(process_id=2)
  monkeypatch.setenv(sharding.COORDINATOR_ENV, "nohostport")
  with pytest.raises(ValueError, match="HOST:PORT"):
    sharding.cluster_settings()


# ------------------------------------------------------------------------- real clusters (slow)
@pytest.mark.slow
def test_two_processes_sum_over_all_devices():
  probe = os.path.join(REPO, "tests", "multihost_probe.py")
  r, elapsed = cluster(["--num_processes=2", "--devices_per_process=2", "--timeout=300", "--",
                        sys.executable, probe], timeout=400)
  assert r.returncode == 0, r.stdout + r.stderr
  # devices: process 0 holds 0, 1; process 1 holds 100, 101.
  for i in range(2):
    assert re.search(rf"\[p{i}\] process {i} of 2: devices 4 local 2 sum 202 ", r.stdout), r.stdout
  print(f"2 x 2 cluster psum: {elapsed:.1f}s wall")


# ------------------------------------------------------------------------- training (slow)
TRAIN_ARGS = ["--config=configs/tiny_sw.py", "--config.num_train_steps=6",
              "--config.log_every_steps=1", "--config.eval_every_steps=6",
              "--config.checkpoint_every_steps=3", "--config.num_eval_steps=1",
              "--config.num_eval_samples=0", "--config.model.hidden_size=32",
              "--config.model.num_layers=1", "--config.tokenizer.vocab_size=384"]


def train_on_cluster(workdir, processes, devices, extra=()):
  r, elapsed = cluster([f"--num_processes={processes}", f"--devices_per_process={devices}",
                        "--timeout=500", "--", sys.executable, "launch/train.py",
                        f"--workdir={workdir}"] + TRAIN_ARGS + list(extra), timeout=600)
  assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
  print(f"train {processes} x {devices}: {elapsed:.1f}s")
  return r


def metrics(workdir):
  """{step: {name: value}} of metrics.jsonl, later lines (a resumed run's) winning."""
  import json
  out = {}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      out.setdefault(row.pop("step"), {}).update(row)
  return out


def assert_same_run(got, want, steps):
  for step in steps:
    for name in ("train/loss", "train/grad_norm", "eval/nll"):
      if name in want.get(step, {}):
        assert got[step][name] == pytest.approx(want[step][name], rel=1e-5, abs=0), (step, name)


@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path):
  """2 processes x 2 devices = 1 process x 4 devices: the same losses, grad norms and eval NLL
  (<= 1e-5 relative); checkpoints of either resume on the other, continuing exactly."""
  import shutil
  one, two = str(tmp_path / "one"), str(tmp_path / "two")
  out = train_on_cluster(one, 1, 4).stdout
  assert "done: step 6" in out
  out = train_on_cluster(two, 2, 2).stdout
  assert out.count("done: step 6") == 1  # one run's summary (process 0)
  want, got = metrics(one), metrics(two)
  assert sorted(want) == list(range(1, 7)) and "eval/nll" in want[6]
  assert_same_run(got, want, range(1, 7))
  assert os.listdir(os.path.join(two, "tokenizer"))  # trained once, by process 0
  # Resume across process counts from step 3: 2 -> 1 x 4 and 1 -> 2 x 2.
  for src, processes, devices in ((two, 1, 4), (one, 2, 2)):
    resumed = str(tmp_path / f"resume_{processes}")
    shutil.copytree(src, resumed)
    shutil.rmtree(os.path.join(resumed, "checkpoints", "6"))
    out = train_on_cluster(resumed, processes, devices).stdout
    assert "resumed from" in out and "at step 3" in out
    assert_same_run(metrics(resumed), want, range(4, 7))
