"""benchmarks/official.py without the official code: argument checks, errors and the table.

The side-by-side run itself needs an extracted kuleshov-group/setdlms checkout and is a
benchmark (benchmarks/README.md); nothing here imports torch or the official code.
"""

import importlib.util
import json
import os

import pytest

from setdiff_jax.experiments.record import RecordError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def bench():
  spec = importlib.util.spec_from_file_location(
    "official_bench", os.path.join(REPO, "benchmarks", "official.py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _fake_checkout(bench, root, skip=()):
  """Empty files at the paths the benchmark checks for (all but `skip`)."""
  for rel in bench.REQUIRED_FILES:
    if rel not in skip:
      (root / rel).parent.mkdir(parents=True, exist_ok=True)
      (root / rel).write_text("")
  return root


def test_missing_official_dir_names_the_flag_and_the_fix(bench, tmp_path):
  with pytest.raises(SystemExit, match=r"--official_dir=.*no such directory.*setdlms"):
    bench.parse_args([f"--official_dir={tmp_path / 'absent'}"])


def test_official_dir_without_the_expected_files_lists_them(bench, tmp_path):
  root = _fake_checkout(bench, tmp_path / "setdlms", skip=("src/denoiser/setdlm.py",))
  with pytest.raises(SystemExit, match=r"lacks src/denoiser/setdlm\.py: not a setdlms checkout"):
    bench.check_official_dir(str(root))
  _fake_checkout(bench, root)
  assert bench.check_official_dir(str(root)) == str(root)


def test_official_dir_inside_the_repository_is_refused(bench):
  with pytest.raises(SystemExit, match="inside this repository"):
    bench.check_official_dir(os.path.join(REPO, "benchmarks"))


def test_arguments(bench, tmp_path):
  root = _fake_checkout(bench, tmp_path / "setdlms")
  args = bench.parse_args([f"--official_dir={root}", "--quick", "--train=ar", "--decode="])
  assert (args.rounds, args.steps, args.train, args.decode) == (1, 1, ["ar"], [])
  assert args.sizes["seq_len"] == 16 and args.threads >= 1
  args = bench.parse_args([f"--official_dir={root}", "--vocab_size=4096"])
  assert args.sizes == dict(
    num_layers=4, hidden_size=256, num_heads=4, seq_len=128, batch_size=16, vocab_size=4096
  )
  with pytest.raises(SystemExit, match=r"--train: \['gpt'\] not in"):
    bench.parse_args([f"--official_dir={root}", "--train=ar,gpt"])
  with pytest.raises(SystemExit):  # argparse error: vocabulary below the random-token range
    bench.parse_args([f"--official_dir={root}", "--vocab_size=100"])


def test_transformers_5_is_refused_with_the_venv_recipe(bench):
  with pytest.raises(SystemExit, match=r"transformers 5\.24\.0.*4\.52\.4.*--official_python"):
    bench.check_official_env({"transformers": "5.24.0"}, "/usr/bin/python")
  bench.check_official_env({"transformers": "4.52.4"}, "/venv/bin/python")


def test_markdown_table(bench):
  rows = [
    {"work": "AR train step", "official": 1310.4, "ours": 978.0},
    {"work": "set W=4 decoding, batch 8", "official": 72.0, "ours": 418.0, "mark": " †"},
    {"work": "no official", "ours": 5.0},
  ]
  assert bench.markdown(rows).splitlines() == [
    "| work | official | ours | ours / official |",
    "| --- | ---: | ---: | ---: |",
    "| AR train step | 1,310 | 978 | 0.75 |",
    "| set W=4 decoding, batch 8 | 72 † | 418 | 5.81 |",
    "| no official | – | 5 | – |",
  ]


def _works():
  """Two rounds of a train work and the set W=4 batch-1 / batch-8 decode works, as main keeps them."""
  train_off = {"clean": 100.0, "times": [2.0, 1.0]}
  train_ours = {"clean": 20.0, "times": [0.1, 0.4]}  # per-step clean tokens and seconds
  b1_off, b1 = {"times": [(127, 10.0), (127, 12.7)]}, {"times": [(127, 1.0), (127, 0.5)]}
  b8 = {"times": [(1016, 2.0), (1016, 1.0)]}
  return [
    ("train", "ar", train_off, train_ours),
    ("decode", "set4", b1_off, b1),
    ("decode", "set4_b8", None, b8),
  ]


def test_report_rows_and_record_file(bench, tmp_path):
  """Medians over the rounds (every round's times kept), the batch-8 row borrows the official
  batch-1 rate with its dagger, and --out writes the JSON a record is published from, with the
  official side's local paths replaced in the command."""
  root = _fake_checkout(bench, tmp_path / "setdlms")
  out = tmp_path / "out"
  argv = [
    f"--official_dir={root}",
    "--official_python=/venv/bin/python",
    "--rounds=2",
    f"--out={out}",
  ]
  args = bench.parse_args(argv)
  args.steps = 5
  rows = bench.table_rows(_works(), args)
  assert [r["official"] for r in rows] == [(500 + 250) / 2, 11.35, 11.35]  # medians of rates
  assert [r["ours"] for r in rows] == [(200 + 50) / 2, 190.5, 762.0]
  assert rows[0]["official_seconds"] == [2.0, 1.0] and rows[2]["mark"] == " †"
  info = {"torch": "2.13.0", "threads": 2, "interop": 2, "transformers": "4.52.4", "python": "3.11"}
  lines = bench.summary_lines(rows, _works(), args, info, (1.0, 1.0, 1.0), (2.0, 2.0, 2.0))
  assert "ours set W=4: batch 8 / batch 1 tok/s = 4.00x" in lines
  bench.write_report(args, argv, rows, _works(), "\n".join(lines))
  report = json.loads((out / "official_speed.json").read_text())
  assert report["command"] == (
    "python -m benchmarks.official --official_dir=OFFICIAL_DIR "
    f"--official_python=OFFICIAL_PYTHON --rounds=2 --out={out}"
  )
  assert report["markdown"].startswith(bench.TITLE) and "| 11 † | 762 |" in report["markdown"]
  assert report["rows"] == json.loads(json.dumps(rows)) and "official_dir" not in report["args"]


def test_record_is_refused_before_anything_is_measured(bench, tmp_path):
  root = _fake_checkout(bench, tmp_path / "setdlms")  # empty files: measuring would fail
  with pytest.raises(SystemExit, match="error: --record needs --out=DIR"):
    bench.main([f"--official_dir={root}", "--record=x"])
  # the record checks run first (a bad name here: no git state involved, so any clone agrees)
  with pytest.raises(RecordError, match="record name 'Bad Name'"):
    bench.main([f"--official_dir={root}", "--record=Bad Name", f"--out={tmp_path}"])


@pytest.fixture(scope="module")
def checks():
  spec = importlib.util.spec_from_file_location(
    "official_checks", os.path.join(REPO, "benchmarks", "official_checks.py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_check_flag(bench, tmp_path):
  root = _fake_checkout(bench, tmp_path / "setdlms")
  assert bench.parse_args([f"--official_dir={root}"]).check == "speed"
  args = bench.parse_args([f"--official_dir={root}", "--check=exports", "--export_steps=3"])
  assert (args.check, args.export_steps) == ("exports", 3)
  with pytest.raises(SystemExit):
    bench.parse_args([f"--official_dir={root}", "--check=logits"])
  with pytest.raises(SystemExit):  # argparse error: nothing to export
    bench.parse_args([f"--official_dir={root}", "--check=exports", "--export_steps=0"])


def test_restore_targets_is_the_official_eval_loaders_rule(checks):
  assert checks.restore_targets({"_target_": "backbone_dit.DIT"}) == {
    "_target_": "src.backbone.dit.DIT"
  }
  assert checks.restore_targets({"_target_": "backbone_automodel.AutoModelFromPreTrained"}) == {
    "_target_": "src.backbone.automodel.AutoModelFromPreTrained"
  }
  assert checks.restore_targets(
    {"_target_": "noise_schedule_noise_schedules.StaggeredNoise", "eps": 1e-3}
  ) == {"_target_": "src.noise_schedule.noise_schedules.StaggeredNoise", "eps": 1e-3}
  assert checks.restore_targets({"_target_": "src.backbone.dit.DIT"}) == {
    "_target_": "src.backbone.dit.DIT"
  }  # already restored: unchanged


def test_compare_rows_counts_position_by_position_over_the_longer_row(checks):
  official = [[5, 6, 7], [1, 2, 3, 4], [9]]
  ours = [[5, 6, 7], [1, 2, 0], [9, 9]]
  # rows equal: the first only; tokens: 3 + 2 + 1 equal of 3 + 4 + 2 positions.
  assert checks.compare_rows(official, ours) == (1, 3, 6, 9)


def test_check_tables(checks):
  table = checks.align_table(
    [
      dict(
        method="bd3lm",
        g=4,
        n=10,
        align="on",
        group="P % G != 0",
        lengths=[1, 2],
        cmp=(3, 4, 30, 32),
        gen=(9.5, 9.0),
      )
    ]
  )
  assert table.splitlines()[-1] == (
    "| bd3lm | 4 | 10 | on | P % G != 0 | 1,2 | 3/4 | 30/32 | 9.5 / 9.0 |"
  )
  table = checks.exports_table(
    [
      dict(
        kind="dit",
        cls="x",
        shape=(3, 64, 2048),
        err=1.5e-6,
        scale=3.0,
        missing_keys=["a"],
        unexpected_keys=[],
        static_mask_intact=True,
        backbone="src.backbone.dit.DIT",
        **{"class": "src.denoiser.setdlm.SetDLM"},
      )
    ]
  )
  assert table.splitlines()[-1] == (
    "| dit | src.denoiser.setdlm.SetDLM (src.backbone.dit.DIT) | "
    "a / 0 (static mask intact) | 3 x 64 x 2048 | 1.50e-06 | 3.00 | "
    "5.00e-07 |"
  )
