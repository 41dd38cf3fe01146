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
    return str(root / p[len("gs://bucket/"):]) if p.startswith("gs://bucket") else p

  def one(fn, path, *args, **kw):
    return fn(local(path), *args, **kw)

  def two(fn, src, dst, *args, **kw):
    return fn(local(src), local(dst), *args, **kw)

  names = ("open", "exists", "isdir", "listdir", "makedirs", "mkdir", "remove", "rmtree", "stat",
           "glob", "walk")
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
  for steps in ((1, 2), (3,)):  # a run, then its resume
    writer = metrics.MetricWriter(GS, enabled=True)
    for s in steps:
      writer.scalars(s, {"train/loss": 1.0 / s})
    writer.close()
  lines = (bucket / "runs/r1/metrics.jsonl").read_text().splitlines()
  assert [json.loads(l)["step"] for l in lines] == [1, 2, 3]
  assert json.loads(lines[1])["train/loss"] == 0.5
  assert not os.path.exists(bucket / "runs/r1/tensorboard")  # local workdirs only


def test_tokenizer_trained_once_then_read_from_gs(bucket):
  cfg = tokenizers.default_tokenizer_config()
  cfg.vocab_size = 300
  texts = sources.embedded_corpus("validation")[:200]
  tok = tokenizers.get_tokenizer(cfg, GS, train_texts=texts)
  assert sorted(os.listdir(bucket / "runs/r1/tokenizer")) == ["special_tokens.json",
                                                              "tokenizer.json"]

  def no_training():
    raise AssertionError("the saved tokenizer must be read, not trained again")

  again = tokenizers.get_tokenizer(cfg, GS, train_texts=no_training)
  assert again.encode("It is a truth") == tok.encode("It is a truth")
  assert again.special_ids() == tok.special_ids()
