"""A whole run on a `gs://` workdir against a local GCS emulator (slow tier; skipped without the
optional `gcp-storage-emulator` and `gcsfs` packages): train on 2 processes, resume on 1, sample,
evaluate and export to `gs://`, every byte through the emulated bucket (orbax / tensorstore via
`TENSORSTORE_GCS_HTTP_URL`, `setdiff_jax.paths` / etils.epath via gcsfs and
`STORAGE_EMULATOR_HOST`), nothing in a local folder named `gs:`. The emulator is started by
tests/gcs_emulator.py, which patches in the object generations tensorstore's conditional writes
(OCDBT manifest updates) need; without them a checkpoint save failed in about half the runs
('Malformed StorageGeneration'). A quick default-tier test checks that patch through tensorstore."""

import json
import os
import socket
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = [
  "--config=" + os.path.join(REPO, "configs", "tiny_sw.py"),
  "--config.log_every_steps=1",
  "--config.eval_every_steps=4",
  "--config.checkpoint_every_steps=2",
  "--config.num_eval_steps=1",
  "--config.num_eval_samples=0",
  "--config.model.hidden_size=32",
  "--config.model.num_layers=1",
  "--config.tokenizer.vocab_size=384",
]


@pytest.fixture
def gcs_server(tmp_path):
  """(a started emulator, its URL, the bucket's folder on disk), `bucket` its only bucket."""
  pytest.importorskip("gcp_storage_emulator.server")
  import gcs_emulator

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  data = tmp_path / "gcs"
  server = gcs_emulator.start(port, data)
  try:
    yield server, f"http://127.0.0.1:{port}", data / ".cloudstorage" / "bucket"
  finally:
    server.stop()


@pytest.fixture
def gcs(gcs_server):
  """(environment for the launchers, the bucket's folder on disk) of a GCS emulator."""
  pytest.importorskip("gcsfs")
  _, url, bucket = gcs_server
  env = dict(
    os.environ,
    STORAGE_EMULATOR_HOST=url,
    TENSORSTORE_GCS_HTTP_URL=url,
    GOOGLE_AUTH_TOKEN_FOR_TESTING="emulator",
  )
  return env, bucket


def test_emulator_gives_tensorstore_object_generations(gcs_server, monkeypatch):
  """The patched emulator answers tensorstore's generation requests as GCS does; the unpatched
  one fails each numbered check (1: generation 0 read back; 2, 3: the condition ignored, 200
  and a stale write accepted; 4: 'Malformed StorageGeneration', as in the chain's saves)."""
  ts = pytest.importorskip("tensorstore")
  server, url, _ = gcs_server
  monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", url)
  monkeypatch.setenv("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")
  kv = ts.KvStore.open({"driver": "gcs", "bucket": "bucket"}, context=ts.Context()).result()
  written = kv.write("a", b"1").result().generation
  read = kv.read("a").result()
  assert read.stamp.generation == written and read.value == b"1"  # 1. a read's generation
  assert kv.read("a", if_not_equal=written).result().state == "unspecified"  # 2. 304
  assert kv.write("a", b"2", if_equal=written).result().generation not in (b"", written)
  assert kv.write("a", b"3", if_equal=written).result().generation == b""  # 3. 412: stale
  assert kv.read("a").result().value == b"2"
  spec = {"driver": "ocdbt", "base": {"driver": "gcs", "bucket": "bucket", "path": "db/"}}
  for key in ("x", "y"):  # 4. a fresh handle updates the manifest another handle wrote
    ts.KvStore.open(spec, context=ts.Context()).result().write(key, b"v").result()
  assert ts.KvStore.open(spec, context=ts.Context()).result().list().result() == [b"x", b"y"]
  assert "db/manifest.ocdbt" in server._storage.objects["bucket"]


def test_an_export_over_another_on_gs_replaces_all_its_files(gcs, monkeypatch):
  """Probe round 13: `export.py --out=gs://... --overwrite` in the other format left the earlier
  export's model.safetensors beside the new pytorch_model.bin, which the import then refused on
  every re-export. The upload now removes config.json, then every export-owned file of the earlier
  export, and uploads config.json last; the user's own files stay; a folder another export
  filled meanwhile is refused without overwrite."""
  from etils import epath

  from setdiff_jax import paths
  from setdiff_jax.interop import staging

  env, _ = gcs
  for k in ("STORAGE_EMULATOR_HOST", "GOOGLE_AUTH_TOKEN_FOR_TESTING"):
    monkeypatch.setenv(k, env[k])
  out = "gs://bucket/exp"

  def publish(files, overwrite):
    with staging.published_remote(out, overwrite) as local:
      for name, data in files.items():
        with open(os.path.join(local, name), "wb") as f:
          f.write(data)

  index = json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}}).encode()
  first = {
    "config.json": b"{}",
    "model.safetensors.index.json": index,
    "model-00001-of-00002.safetensors": b"w",
    "model-00002-of-00002.safetensors": b"w",
    "tokenizer.json": b"t",
  }
  publish(first, overwrite=False)
  paths.write_text(out + "/notes.txt", "mine")
  uploads = []
  write_bytes = epath.Path.write_bytes
  monkeypatch.setattr(
    epath.Path, "write_bytes", lambda self, b: (uploads.append(self.name), write_bytes(self, b))
  )
  publish({"config.json": b'{"x": 2}', "pytorch_model.bin": b"w2"}, overwrite=True)
  assert sorted(paths.listdir(out)) == ["config.json", "notes.txt", "pytorch_model.bin"]
  assert uploads == ["pytorch_model.bin", "config.json"]  # config.json last
  assert paths.read_text(out + "/config.json") == '{"x": 2}'
  with pytest.raises(FileExistsError, match="written by another export while this one ran"):
    publish({"config.json": b"{}"}, overwrite=False)


def test_an_output_on_gs_is_checked_against_run_folders(gcs, monkeypatch):
  """Probe 17c: `evaluate.py --output=gs://...` was checked only for a name this run owns: it
  wrote into another run's top level (whose own evaluation then merged the other run's results
  under its name) and into checkpoints/ folders. The run folders are found on the object store
  as on a local disk (`workdir.lock.run_directory_of` through the path layer)."""
  from setdiff_jax import paths
  from setdiff_jax.evaluation import results
  from setdiff_jax.workdir import lock

  env, _ = gcs
  for k in ("STORAGE_EMULATOR_HOST", "GOOGLE_AUTH_TOKEN_FOR_TESTING"):
    monkeypatch.setenv(k, env[k])
  for run, folder in (("sft", "checkpoints/4"), ("rl", "tokenizer")):
    paths.write_text(f"gs://bucket/{run}/config.json", "{}")
    paths.write_text(f"gs://bucket/{run}/{folder}/x", "x")
  assert lock.run_directory_of("gs://bucket/sft/checkpoints/4/y.json") == "gs://bucket/sft"
  assert lock.run_directory_of("gs://bucket/other/y.json") is None
  assert paths.parent("gs://bucket") == "gs://bucket"
  rl = "gs://bucket/rl"
  for out, refusal in (
    ("gs://bucket/sft/eval_results.json", "is in the run directory gs://bucket/sft, not in this"),
    ("gs://bucket/sft/checkpoints/x.json", "is inside checkpoints/ of the run directory gs://"),
    ("gs://bucket/rl/tokenizer/x.json", "is inside tokenizer/ of the run directory gs://bucket/rl"),
    ("gs://bucket/rl/config.json", "is not an evaluation results file: config.json belongs"),
  ):
    with pytest.raises(ValueError, match=refusal):
      results.check_output_path(out, rl)
  for out in ("gs://bucket/rl/mine.json", "gs://bucket/elsewhere/r.json", "gs://bucket/r.json"):
    results.check_output_path(out, rl)  # this run's top level, or outside any run


def launch(env, cwd, args, timeout=600):
  r = subprocess.run(
    [sys.executable] + args, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
  )
  text = r.stdout + r.stderr
  # Both ends: a failing process's own error line may come before the other's long traceback.
  assert r.returncode == 0, text if len(text) < 9000 else text[:4000] + "\n...\n" + text[-4000:]
  return text


@pytest.mark.slow
def test_train_resume_sample_evaluate_export_on_gs(gcs, tmp_path):
  env, bucket = gcs
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  cluster = os.path.join(REPO, "launch", "local_cluster.py")
  train = [os.path.join(REPO, "launch", "train.py"), "--workdir=gs://bucket/run"] + ARGS
  out = launch(
    env,
    cwd,
    [cluster, "--num_processes=2", "--devices_per_process=2", "--timeout=500", "--", sys.executable]
    + train
    + ["--config.num_train_steps=4"],
  )
  assert out.count("done: step 4") == 1, out[-3000:]
  assert sorted(os.listdir(bucket / "run" / "checkpoints")) == ["2", "4"]
  assert (bucket / "run" / "tokenizer" / "tokenizer.json").is_file()  # trained once
  config = json.loads((bucket / "run" / "config.json").read_text())
  assert config["num_train_steps"] == 4
  out = launch(
    env,
    cwd,
    [cluster, "--num_processes=1", "--devices_per_process=4", "--timeout=500", "--", sys.executable]
    + train
    + ["--config.num_train_steps=6"],
  )
  assert "resumed from" in out and "at step 4" in out and "done: step 6" in out, out[-3000:]
  steps = [
    json.loads(l)["step"] for l in (bucket / "run" / "metrics.jsonl").read_text().splitlines()
  ]
  assert steps == [1, 2, 3, 4, 4, 5, 6, 6], steps  # train lines + eval lines, both runs
  out = launch(
    env,
    cwd,
    [
      os.path.join(REPO, "launch", "sample.py"),
      "--workdir=gs://bucket/run",
      "--num_samples=1",
      "--max_new_tokens=8",
    ],
  )
  assert "=== sample 1 ===" in out, out[-3000:]
  launch(
    env,
    cwd,
    [
      os.path.join(REPO, "launch", "evaluate.py"),
      "--workdir=gs://bucket/run",
      "--eval=likelihood",
      "--max_rows=8",
    ],
  )
  results = json.loads((bucket / "run" / "eval_results.json").read_text())
  assert "6" in json.dumps(results) and "likelihood" in json.dumps(results)
  launch(
    env,
    cwd,
    [
      os.path.join(REPO, "launch", "export.py"),
      "--workdir=gs://bucket/run",
      "--out=gs://bucket/export",
    ],
  )
  assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(
    os.listdir(bucket / "export")
  )
  assert json.loads((bucket / "export" / "config.json").read_text())["setdiff_jax"]["step"] == 6
  assert os.listdir(cwd) == []  # no local `gs:` folder, nothing else either
