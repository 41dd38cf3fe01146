"""Run paths holding characters the checkpoint stack reads as patterns (probe round 14a).

orbax merges a save's per-process files with a glob over the checkpoint's own path, and
tensorstore parses object-store paths as URLs. Before: a local workdir with `[ab]` trained, then
every save failed as "unreadable metadata"; `gs://bucket/P/run*` beside `gs://bucket/P/runA`
deleted runA's checkpoint files; `gs://bucket/P/x?y` (or `x#y`) wrote its tensors to
`gs://bucket/P/x/` and hung. Each is now refused before anything is written, by the launchers
(`cli_storage.check_path_flags`) and by the library (`workdir.lock.check_workdir_path`,
`check_new_workdir`, `export_dir.check_export_dir`). Also: an RL run refused on resume is told
the flag that exists for it (`--config.rl.init_from`, not `--config.init_from`).
"""

import json
import os

import ml_collections
import pytest

from setdiff_jax import errors, paths, train
from setdiff_jax.interop import export_dir
from setdiff_jax.workdir import lock as workdir_lock

from test_reliability import REPO, tiny_args, tiny_config
from test_reliability_2 import check_cases

pytestmark = pytest.mark.usefixtures("fast_compile")


@pytest.mark.parametrize(
  "path, refused",
  [
    ("/tmp/x[ab]y/run", "[ ]"),
    ("/tmp/x[0-9]/run", "[ ]"),
    ("/tmp/a\\b/run", "\\"),
    ("gs://bucket/p/run*", "*"),
    ("gs://bucket/p/x?y", "?"),
    ("gs://bucket/p/x#y", "#"),
    ("gs://bucket/h[ab]z", "[ ]"),
  ],
)
def test_pattern_characters_are_refused(path, refused):
  with pytest.raises(ValueError) as e:
    paths.check_plain_name(path, "--workdir")
  assert str(e.value).startswith(f"--workdir={path} holds {refused}, which the checkpoint")
  assert "choose another name" in str(e.value)


@pytest.mark.parametrize(
  "path",
  # what the probe saw train, save and read back: space, unicode, # ? % * locally; space, unicode
  # and a literal %41 on an object store ('[' or ']' alone saved too, but one rule is refused)
  ["/tmp/m n/é#?%*/run", "gs://bucket/g éz", "gs://bucket/h%41z"],
)
def test_plain_names_pass(path):
  paths.check_plain_name(path, "--workdir")


def test_the_library_refuses_before_writing(tmp_path):
  """train_and_evaluate and the export check refuse the path itself: no folder is made, and no
  object store is reached (there is none here)."""
  local = tmp_path / "x[ab]y" / "run"
  with pytest.raises(ValueError, match=r"holds \[ \]"):
    train.train_and_evaluate(tiny_config(), str(local))
  assert not os.path.exists(tmp_path / "x[ab]y")
  with pytest.raises(ValueError, match=r"^--workdir=gs://bucket/p/run\* holds \*"):
    train.train_and_evaluate(tiny_config(), "gs://bucket/p/run*")
  config = tiny_config(init_from="gs://bucket/p/sft?v=2")
  with pytest.raises(ValueError, match=r"^--config.init_from=gs://bucket/p/sft\?v=2 holds \?"):
    train.train_and_evaluate(config, str(tmp_path / "new"))
  assert not os.path.exists(tmp_path / "new")
  with pytest.raises(ValueError, match=r"^--out=gs://bucket/out\* holds \*"):
    export_dir.check_export_dir("gs://bucket/out*", str(tmp_path / "run"))
  export_dir.check_export_dir(str(tmp_path / "model[v2]"), str(tmp_path / "run"))  # local: files


def test_launchers_refuse_in_one_line(tmp_path):
  bracket = tmp_path / "x[ab]y"
  check_cases(
    "train.py",
    [
      (tiny_args(str(bracket / "run")), [f"--workdir={bracket}/run holds [ ]"]),
      # refused before the store is probed (no emulator here: a probe would fail otherwise)
      (tiny_args("gs://bucket/p/run*"), ["--workdir=gs://bucket/p/run* holds *"]),
    ],
  )
  assert not bracket.exists()
  check_cases("sample.py", [(["--workdir=gs://bucket/x#y"], ["--workdir=gs://bucket/x#y holds #"])])
  check_cases(
    "export.py",
    [([f"--workdir={tmp_path}/run", "--out=gs://bucket/o?"], ["--out=gs://bucket/o? holds ?"])],
  )
  rl = ["--config=" + os.path.join(REPO, "configs", "rl_arithmetic.py")]
  check_cases(
    "rl.py",
    [
      (
        rl + [f"--workdir={tmp_path}/rl", "--config.rl.init_from=gs://bucket/sft*"],
        ["--config.rl.init_from=gs://bucket/sft* holds *"],
      )
    ],
  )


def test_rl_resume_refusal_names_the_rl_flag(tmp_path):
  """The probe followed the advice "add --config.init_from=..." on an RL run and got "not a
  config field"; an RL run's starting point is --config.rl.init_from (an RL workdir works)."""
  workdir = tmp_path / "rl"
  (workdir / "checkpoints" / "1").mkdir(parents=True)
  recorded = {"objective": "setdlm", "rl": {"init_from": "/runs/sft"}}
  (workdir / "config.json").write_text(json.dumps(recorded))
  config = ml_collections.ConfigDict({"objective": "setdlm", "rl": {"init_from": "/runs/sft2"}})
  with pytest.raises(errors.ConfigMismatchError) as e:
    workdir_lock.check_resume(config, str(workdir))
  assert 'rl.init_from: "/runs/sft" -> "/runs/sft2"' in str(e.value)
  assert str(e.value).endswith(f"add --config.rl.init_from={workdir}")
  sft = ml_collections.ConfigDict({"objective": "ar"})  # an SFT run: the SFT flag
  (workdir / "config.json").write_text(json.dumps({"objective": "setdlm"}))
  with pytest.raises(errors.ConfigMismatchError) as e:
    workdir_lock.check_resume(sft, str(workdir))
  assert str(e.value).endswith(f"add --config.init_from={workdir}")
