"""The workdir path layer (setdiff_jax/paths.py) on a `gs://` workdir, with a local stand-in for
the bucket (etils.epath.testing.mock_epath maps gs://bucket/... to a temporary folder): config,
tokenizer, metrics, resume checks and fallback renames reach the "bucket", and nothing lands in a
local folder named `gs:`."""

import json
import os

import ml_collections
import pytest
from etils.epath import testing as epath_testing

from setdiff_jax import paths
from setdiff_jax.data import sources, tokenizers
from setdiff_jax.workdir import checkpoints as checkpointing
from setdiff_jax.workdir import divergence
from setdiff_jax.workdir import lock as workdir_lock
from setdiff_jax.workdir import metrics

GS = "gs://bucket/runs/r1"


@pytest.fixture
def bucket(tmp_path, monkeypatch):
  """gs://bucket/... -> tmp_path/bucket/... for every epath operation; cwd = tmp_path/cwd."""
  root = tmp_path / "bucket"
  root.mkdir()
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  monkeypatch.chdir(cwd)

  def local(p):
    p = os.fspath(p)
    return str(root / p[len("gs://bucket/") :]) if p.startswith("gs://bucket") else p

  def one(fn, path, *args, **kw):
    return fn(local(path), *args, **kw)

  def two(fn, src, dst, *args, **kw):
    return fn(local(src), local(dst), *args, **kw)

  names = (
    "open",
    "exists",
    "isdir",
    "listdir",
    "makedirs",
    "mkdir",
    "remove",
    "rmtree",
    "stat",
    "glob",
    "walk",
  )
  with epath_testing.mock_epath(**{n: one for n in names}, rename=two, replace=two, copy=two):
    yield root
  assert not os.path.exists(cwd / "gs:"), "a local gs: folder was created"
  assert os.listdir(cwd) == []


def test_paths_basics(bucket):
  assert paths.is_remote(GS) and not paths.is_remote("/tmp/x")
  assert paths.resolve(GS) == GS and paths.resolve("rel") == os.path.abspath("rel")
  assert paths.join(GS, "a", "b.json") == GS + "/a/b.json"
  paths.write_text(paths.join(GS, "a", "b.json"), "{}")
  assert (bucket / "runs/r1/a/b.json").read_text() == "{}"
  assert paths.isfile(paths.join(GS, "a", "b.json")) and paths.isdir(paths.join(GS, "a"))
  assert paths.listdir(paths.join(GS, "a")) == ["b.json"]
  paths.rename(paths.join(GS, "a"), paths.join(GS, "c"))
  assert paths.listdir(GS) == ["c"]


def test_config_metrics_and_resume_checks_on_gs(bucket):
  config = ml_collections.ConfigDict({"seed": 3, "model": {"hidden_size": 32}})
  checkpointing.save_config(config, GS)
  assert json.loads((bucket / "runs/r1/config.json").read_text())["seed"] == 3
  assert checkpointing.load_config(GS).model.hidden_size == 32
  assert checkpointing.checkpoint_dir(GS) == GS + "/checkpoints"
  assert workdir_lock.saved_steps(GS) == []
  (bucket / "runs/r1/checkpoints/4").mkdir(parents=True)
  assert workdir_lock.saved_steps(GS) == [4]
  with workdir_lock.WorkdirLock(GS, 0):  # object stores cannot be locked: a warning, no file
    pass
  # metrics.jsonl: object stores cannot append, the writer re-uploads the whole file.
  for steps in ((1, 2, 3), (3,)):  # a run, then its resume from step 2 (step 3 logged, not saved)
    writer = metrics.MetricWriter(GS, enabled=True, start_step=steps[0] - 1)
    for s in steps:
      writer.scalars(s, {"train/loss": 1.0 / s})
    writer.close()
  lines = (bucket / "runs/r1/metrics.jsonl").read_text().splitlines()
  assert [json.loads(l)["step"] for l in lines] == [1, 2, 3]
  assert json.loads(lines[1])["train/loss"] == 0.5
  lost = (bucket / "runs/r1/metrics.discarded.jsonl").read_text().splitlines()
  assert [json.loads(l) for l in lost] == [
    {"step": 3, "train/loss": 1.0 / 3, "resumed_from_step": 2}
  ]
  assert not os.path.exists(bucket / "runs/r1/tensorboard")  # local workdirs only
  # A resume reads the history back from the bucket (it read none before: a local open).
  assert divergence.logged_losses(GS, 2) == [1.0, 0.5]
  assert metrics.logged_at(GS, 3, "train/loss") and not metrics.logged_at(GS, 3, "eval/nll")


def test_tokenizer_trained_once_then_read_from_gs(bucket):
  cfg = tokenizers.default_tokenizer_config()
  cfg.vocab_size = 300
  texts = sources.embedded_corpus("validation")[:200]
  tok = tokenizers.get_tokenizer(cfg, GS, train_texts=texts)
  assert sorted(os.listdir(bucket / "runs/r1/tokenizer")) == [
    "special_tokens.json",
    "tokenizer.json",
  ]

  def no_training():
    raise AssertionError("the saved tokenizer must be read, not trained again")

  again = tokenizers.get_tokenizer(cfg, GS, train_texts=no_training)
  assert again.encode("It is a truth") == tok.encode("It is a truth")
  assert again.special_ids() == tok.special_ids()


def test_export_to_gs(bucket, monkeypatch):
  """launch/export.py's export_workdir with --out on the bucket: the files land there (written
  locally, uploaded when complete), a second export needs --overwrite, a training workdir on the
  bucket is refused, and the export imports back bit for bit."""
  import numpy as np
  from setdiff_jax.interop import export_workdir, import_checkpoint
  from setdiff_jax.workdir import load as workdir_lib
  from setdiff_jax.config.run import default_config
  from setdiff_jax import models
  from setdiff_jax.interop import name_map

  config = default_config()
  config.seq_len, config.model.vocab_size, config.model.hidden_size = 12, 64, 32
  config.model.num_layers, config.model.num_heads, config.model.cond_dim = 1, 4, 16
  config.loss.desired_set_size = 2
  rng = np.random.default_rng(0)
  shapes = name_map.flatten(models.param_shapes(models.backbone_config(config.model.to_dict(), 64)))
  params = name_map.unflatten(
    {k: rng.standard_normal(s.shape).astype(np.float32) for k, s in shapes.items()}
  )

  class Tok:
    bos_id, eos_id, pad_id, mask_id, vocab_size = 2, 3, 0, 4, 64

    def save(self, d):
      os.makedirs(d, exist_ok=True)
      with open(os.path.join(d, "tokenizer.json"), "w") as f:
        f.write("{}")

  monkeypatch.setattr(
    workdir_lib,
    "load_inference_state",
    lambda workdir, step=None, use_ema=True: workdir_lib.InferenceState(
      config, None, None, params, Tok(), 5
    ),
  )
  out = "gs://bucket/exports/e1"
  assert export_workdir(GS, out)[0] == out
  files = sorted(os.listdir(bucket / "exports/e1"))
  assert "model.safetensors" in files and "config.json" in files and "tokenizer.json" in files
  assert json.loads((bucket / "exports/e1/config.json").read_text())["setdiff_jax"]["step"] == 5
  _, back = import_checkpoint(str(bucket / "exports/e1"))
  for k, v in name_map.flatten(params).items():
    assert np.array_equal(np.asarray(name_map.flatten(back)[k]), v), k
  with pytest.raises(ValueError, match="not empty"):
    export_workdir(GS, out)
  export_workdir(GS, out, overwrite=True)
  (bucket / "runs/r1/checkpoints").mkdir(parents=True)
  with pytest.raises(ValueError, match="training workdir"):
    export_workdir("/tmp/elsewhere", GS, overwrite=True)
  with pytest.raises(ValueError, match="training workdir"):
    export_workdir(GS, GS + "/export", overwrite=True)
