"""Bad input to the benchmarks (probe 9b, findings 8-12): refused up front, in one `error:` line.

- 8: a benchmark's training folder is reused only for the settings it was trained with
  (`compare_methods.train_method`, shared by speed_accuracy, tuned_baselines and rl_result);
- 9: compare_methods' count flags below 1 (0 rows gave val NLL 0 / PPL 1);
- 10: speed_accuracy --report_only writes nothing when nothing matches, or over a missing folder;
- 11: attention.py's unknown --masks names and 0 counts;
- 12: every entry point turns expected errors into one line (`benchmarks/inputs.py`), and output
  paths are checked before anything is measured.

Training is faked where a test needs a trained folder: these tests check the benchmarks' own
bookkeeping, not the models.
"""

import ast
import json
import os
import pathlib
import subprocess
import sys

import pytest

from benchmarks import attention, inputs
from benchmarks import compare_methods as cm
from benchmarks import speed_accuracy as sa
from setdiff_jax import cli_storage
from setdiff_jax.experiments.record import RecordError

REPO = pathlib.Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- finding 8
def _config(*flags, method="ar"):
  args = cm.parse_args(["--quick", *flags])
  return cm.method_config(method, args, cm.plan(args))


@pytest.fixture
def fake_training(tmp_path, monkeypatch):
  """`train.train_and_evaluate` replaced by one that leaves a checkpoint folder; returns the
  list of the workdirs it 'trained' and the shared tokenizer folder."""
  trained = []

  def fake(config, workdir):
    trained.append(workdir)
    os.makedirs(os.path.join(workdir, "checkpoints", str(config.num_train_steps)))
    return {"loss": 1.0}

  monkeypatch.setattr(cm.train, "train_and_evaluate", fake)
  tok = tmp_path / "tok"
  tok.mkdir()
  (tok / "special_tokens.json").write_text("{}")
  return trained, str(tok)


@pytest.mark.parametrize(
  "flags, said",
  [
    (["--seed=1"], "seed 0 -> 1"),
    (["--lrs=ar:0.5"], "learning_rate 0.001 -> 0.5"),
    (["--batch_size=4"], "batch_size 8 -> 4"),
  ],
)
def test_a_folder_trained_with_other_settings_is_refused(tmp_path, fake_training, flags, said):
  """The old models were evaluated and labelled with the new seed / learning rate / batch."""
  trained, tok = fake_training
  out = str(tmp_path / "out")
  cm.train_method("ar", _config(), out, tok, log=lambda *a: None)
  with pytest.raises(ValueError) as e:
    cm.train_method("ar", _config(*flags), out, tok, log=lambda *a: None)
  msg = str(e.value)
  assert os.path.join(out, "runs", "ar") in msg and said in msg and "new --output_dir" in msg
  assert len(trained) == 1


def test_a_full_size_run_at_a_quick_runs_steps_is_refused(tmp_path, fake_training):
  _, tok = fake_training
  out = str(tmp_path / "out")
  cm.train_method("ar", _config(), out, tok, log=lambda *a: None)
  args = cm.parse_args(["--steps=3"])  # full size, the quick run's step count
  with pytest.raises(ValueError, match=r"model\.hidden_size 32 -> 128"):
    cm.train_method("ar", cm.method_config("ar", args, cm.plan(args)), out, tok, print)


def test_the_same_settings_reuse_the_folder(tmp_path, fake_training):
  trained, tok = fake_training
  out = str(tmp_path / "out")
  first = cm.train_method("ar", _config(), out, tok, log=lambda *a: None)
  again = cm.train_method("ar", _config(), out, tok, log=lambda *a: None)
  assert again == first and len(trained) == 1


def test_an_interrupted_run_resumes_only_with_its_settings(tmp_path, fake_training, monkeypatch):
  """The fingerprint is written before training: a resume of a killed run is checked too."""
  trained, tok = fake_training
  out = str(tmp_path / "out")

  def killed(config, workdir):
    os.makedirs(os.path.join(workdir, "checkpoints", "1"))
    raise KeyboardInterrupt

  with monkeypatch.context() as m:
    m.setattr(cm.train, "train_and_evaluate", killed)
    with pytest.raises(KeyboardInterrupt):
      cm.train_method("ar", _config(), out, tok, log=lambda *a: None)
  with pytest.raises(ValueError, match="seed 0 -> 1"):
    cm.train_method("ar", _config("--seed=1"), out, tok, log=lambda *a: None)
  cm.train_method("ar", _config(), out, tok, log=lambda *a: None)  # the same settings go on
  assert len(trained) == 1


def test_a_fingerprint_write_killed_midway_leaves_the_old_one(tmp_path, fake_training, monkeypatch):
  """A kill while the fingerprint is written (before a resume) left half a JSON file: every
  rerun then failed reading it. The write is atomic: the earlier fingerprint stays whole."""
  trained, tok = fake_training
  out = str(tmp_path / "out")
  workdir = os.path.join(out, "runs", "ar")
  os.makedirs(os.path.join(workdir, "checkpoints", "1"))  # an interrupted run
  cm.write_fingerprint(workdir, _config())
  real_dump = json.dump

  def killed(obj, f, **kw):
    f.write(json.dumps(obj)[:20])  # part of it reaches the file, then the kill
    raise KeyboardInterrupt

  with monkeypatch.context() as m:
    m.setattr(cm.json, "dump", killed)
    with pytest.raises(KeyboardInterrupt):
      cm.train_method("ar", _config(), out, tok, log=lambda *a: None)
  assert json.dump is real_dump
  with open(os.path.join(workdir, cm.FINGERPRINT)) as f:
    assert json.load(f) == cm.fingerprint(_config())
  cm.train_method("ar", _config(), out, tok, log=lambda *a: None)  # resumes
  assert len(trained) == 1


def test_an_rl_arm_is_reused_only_for_its_settings(tmp_path, monkeypatch):
  """rl_result's RL runs skipped training on a matching step count alone, as train_method did."""
  from benchmarks import rl_result
  from setdiff_jax.rl import grpo

  trained = []

  def fake(config, workdir):
    trained.append(workdir)
    os.makedirs(os.path.join(workdir, "checkpoints", str(config.num_train_steps)))

  monkeypatch.setattr(grpo, "train_rl", fake)
  workdir = str(tmp_path / "rl")
  first = rl_result.train_rl_arm(workdir, _config(), log=lambda *a: None)
  assert rl_result.train_rl_arm(workdir, _config(), log=lambda *a: None) == first
  with pytest.raises(ValueError, match="seed 0 -> 1"):
    rl_result.train_rl_arm(workdir, _config("--seed=1"), log=lambda *a: None)
  assert len(trained) == 1
  os.remove(os.path.join(workdir, cm.FINGERPRINT))  # a folder from before fingerprints
  with pytest.raises(ValueError, match="trained before its settings were recorded"):
    rl_result.train_rl_arm(workdir, _config(), log=lambda *a: None)


@pytest.mark.parametrize("what", ["train_info.json", "checkpoints/3"])
def test_a_folder_from_before_fingerprints_is_refused(tmp_path, fake_training, what):
  _, tok = fake_training
  workdir = tmp_path / "out" / "runs" / "ar"
  (workdir / what).parent.mkdir(parents=True, exist_ok=True)
  if what.endswith(".json"):
    (workdir / what).write_text(json.dumps({"steps": 3, "train_seconds": 1.0}))
  else:
    (workdir / what).mkdir()
  with pytest.raises(ValueError, match=f"{workdir} holds a model trained before its settings"):
    cm.train_method("ar", _config(), str(tmp_path / "out"), tok, log=lambda *a: None)


def test_fingerprint_is_the_whole_training_config_but_paths_and_is_stable():
  a, b = cm.fingerprint(_config("--seed=2")), cm.fingerprint(_config("--seed=2"))
  assert a == b and list(a) == sorted(a)
  assert json.loads(json.dumps(a, sort_keys=True)) == a
  for key in ("seed", "learning_rate", "batch_size", "num_train_steps", "objective"):
    assert key in a
  assert {"model.hidden_size", "model.num_layers", "data.source", "loss.block_size"} <= set(a)
  assert not set(a) & set(cli_storage.PATH_FIELDS)
  assert cm.fingerprint(_config(method="setdlm4")) != cm.fingerprint(_config(method="setdlm8"))


def test_compare_methods_refuses_before_anything_is_trained(tmp_path, fake_training):
  trained, tok = fake_training
  out = tmp_path / "out"
  cm.train_method("ar", _config(), str(out), tok, log=lambda *a: None)
  with pytest.raises(ValueError, match="seed 0 -> 1"):
    cm.main(["--quick", "--methods=ar,mdlm", "--seed=1", f"--output_dir={out}"], log=print)
  assert len(trained) == 1 and not (out / "results.json").exists()


def test_speed_accuracy_and_tuned_baselines_train_through_the_same_check():
  from benchmarks import tuned_baselines as tb

  assert sa.train_method is cm.train_method and tb.cm.train_method is cm.train_method
  p = sa.plan(sa.parse_args(["--quick"]))
  base = cm.fingerprint(sa.method_config("setdlm4", p, 0, True))
  other = cm.fingerprint(sa.method_config("setdlm4", dict(p, lr=0.5), 0, True))
  assert inputs.differences(base, other).startswith("learning_rate ")


# ----------------------------------------------------------------------------- finding 9
@pytest.mark.parametrize(
  "flag",
  [
    "--max_rows=0",
    "--num_orders=0",
    "--num_samples=0",
    "--num_infill=0",
    "--steps=0",
    "--batch_size=0",
    "--repeats=0",
    "--num_orders=-1",
  ],
)
def test_compare_methods_refuses_counts_below_one(flag):
  with pytest.raises(ValueError, match=f"^{flag} must be >= 1$"):
    cm.parse_args(["--quick", flag])


def _other_benchmarks():
  from benchmarks import rl_result, tuned_baselines

  return {"speed_accuracy": sa, "tuned_baselines": tuned_baselines, "rl_result": rl_result}


@pytest.mark.parametrize(
  "module, flag, said",
  [
    ("speed_accuracy", "--num_test=0", "--num_test=0 must be >= 1"),
    ("speed_accuracy", "--bootstrap=0", "--bootstrap=0 must be >= 1"),
    ("speed_accuracy", "--decode_batch=-2", "--decode_batch=-2 must be >= 1"),
    ("speed_accuracy", "--speed_examples=-1", "--speed_examples=-1 must be >= 0"),
    ("speed_accuracy", "--lr=0", "--lr=0.0 must be > 0"),
    ("tuned_baselines", "--num_val=0", "--num_val=0 must be >= 1"),
    ("tuned_baselines", "--widen=-1", "--widen=-1 must be >= 0"),
    ("rl_result", "--group_size=1", "--group_size=1 must be >= 2"),
    ("rl_result", "--rl_steps=0", "--rl_steps=0 must be >= 1"),
    ("rl_result", "--step_cost=-0.1", "--step_cost=-0.1 must be >= 0"),
    ("rl_result", "--cost_adv_eps=0", "--cost_adv_eps=0.0 must be > 0"),
  ],
)
def test_the_other_benchmarks_refuse_counts_below_their_minimum(module, flag, said):
  """Probe 9b left these unchecked: 0 test problems gave an accuracy over none, 0 resamples a
  nan interval, G = 1 a run of all-zero advantages."""
  argv = [flag] + (["--task=arithmetic"] if module == "tuned_baselines" else [])
  with pytest.raises(ValueError, match="^" + said.replace("+", r"\+") + "$"):
    _other_benchmarks()[module].parse_args(argv)
  _other_benchmarks()[module].parse_args(argv[1:])  # the defaults pass


def test_compare_methods_refuses_a_top_p_outside_0_1():
  for bad in ("0", "1.5"):
    with pytest.raises(ValueError, match="--top_p"):
      cm.parse_args([f"--top_p={bad}"])


# ----------------------------------------------------------------------------- finding 10
POLICY_ARGV = ["--policies=threshold", "--methods=setdlm4", "--tasks=chain", "--seeds=0"]


def test_report_only_over_a_missing_folder_writes_nothing(tmp_path):
  missing = tmp_path / "missing"
  argv = POLICY_ARGV + ["--quick", "--report_only", f"--output_dir={missing}"]
  with pytest.raises(ValueError, match=f"--report_only: {missing} does not exist"):
    sa.main(argv, log=lambda *a: None)
  assert not missing.exists()


@pytest.fixture
def fake_policy_runs(monkeypatch):
  """speed_accuracy's policy mode with training and evaluation faked (every planned row one
  record)."""
  slim = {"accuracy": 0.5, "kept_tokens_per_call": 1.0, "tokens_per_second": 1.0}
  slim.update(copy_fraction=0.0, policy_arg=None)
  pe = {"correct": [1, 0], "kept": [2, 2], "calls": [1, 2]}

  def fake_eval(method, workdir, task, p, seed, log, prior=(), save=None):
    return [
      dict(task=task, method=method, seed=seed, window=4, policy=policy, chosen_arg=None)
      | dict(val=[dict(slim)], val_pick=dict(slim), test=dict(slim), per_example=pe)
      | dict(ref_test=dict(slim), ref_per_example=pe)
      | dict(grid_test=[{"arg": None, "test": dict(slim), "per_example": pe}])
      for policy in p["policies"]
    ]

  monkeypatch.setattr(sa, "policy_eval", fake_eval)
  monkeypatch.setattr(sa, "shared_tokenizer", lambda sub, c: "tok")
  monkeypatch.setattr(
    sa, "train_method", lambda m, c, sub, tok, log: {"workdir": sub, "train_seconds": 1.0}
  )
  monkeypatch.setattr(sa, "plot_policies", lambda rows, curve, path: None)


def test_report_only_that_matches_nothing_keeps_the_finished_report(tmp_path, fake_policy_runs):
  """--quick forgotten: no cache matches these flags; the finished report stays as it was."""
  argv = POLICY_ARGV + [f"--output_dir={tmp_path}", "--bootstrap=10"]
  sa.main(argv + ["--quick"], log=lambda *a: None)
  report = tmp_path / "speed_accuracy_policies.md"
  before = report.read_text()
  assert "| chain |" in before
  with pytest.raises(ValueError) as e:
    sa.main(argv + ["--report_only"], log=lambda *a: None)
  msg = str(e.value)
  assert "no evaluation cache" in msg and "chain/seed0/policy_records_setdlm4.json" in msg
  assert "batch_size 32 -> 8" in msg  # this run's plan -> the cache's (a --quick run)
  assert report.read_text() == before
  again = sa.main(argv + ["--quick", "--report_only"], log=lambda *a: None)
  assert again["finished"] == ["chain setdlm4 seed 0"]


def test_a_report_with_rows_this_run_lacks_is_kept_aside(tmp_path, fake_policy_runs):
  """A rerun over fewer methods (or seeds, tasks, policies) replaced the report holding more;
  now the earlier report is moved aside whole and the log names it. A rerun of the same or
  more rows replaces it as before."""
  two = ["--policies=threshold", "--methods=ar,setdlm4", "--tasks=chain", "--seeds=0"]
  argv = [f"--output_dir={tmp_path}", "--bootstrap=10", "--quick"]
  said = []
  first = sa.main(two + argv, log=said.append)
  assert first["finished"] == ["chain ar seed 0", "chain setdlm4 seed 0"]
  sa.main(two + argv, log=said.append)  # the same rows: replaced, nothing kept aside
  assert not list(tmp_path.glob("*.replaced_*")) and not any("kept the" in x for x in said)
  sa.main(POLICY_ARGV + argv, log=said.append)  # setdlm4 only
  kept = list(tmp_path.glob("speed_accuracy_policies.replaced_*.json"))
  assert len(kept) == 1 and list(tmp_path.glob("speed_accuracy_policies.replaced_*.md"))
  assert json.loads(kept[0].read_text())["finished"] == first["finished"]
  assert [x for x in said if x.startswith("kept the earlier report")] == [
    f"kept the earlier report as {kept[0].name}: it holds 1 row(s) these flags do not report "
    "(chain ar 0 threshold)"
  ]
  now = json.loads((tmp_path / "speed_accuracy_policies.json").read_text())
  assert now["finished"] == ["chain setdlm4 seed 0"]


# ----------------------------------------------------------------------------- finding 11
@pytest.mark.parametrize(
  "flag, said",
  [
    ("--masks=set,sett", r"--masks=set,sett: unknown \['sett'\]; choose from set, block"),
    ("--impls=dense,flash", r"unknown \['flash'\]; choose from dense, xla"),
    ("--repeats=0", "--repeats=0 must be >= 1"),
    ("--num_heads=0", "--num_heads=0 must be >= 1"),
    ("--block_size=0", "--block_size=0 must be >= 1"),
    ("--lengths=0", "--lengths=0: give comma-separated integers >= 1"),
    ("--lengths=a", "--lengths=a: give comma-separated integers >= 1"),
    ("--batch_size=-1", "--batch_size=-1 must be >= 0"),
  ],
)
def test_attention_refuses_unknown_masks_and_bad_counts(flag, said):
  with pytest.raises(ValueError, match=said):
    attention.parse_args([flag])


def test_attention_builds_each_named_mask():
  args = attention.parse_args(["--masks=set,block", "--lengths=8"])
  assert args.lengths == [8]
  set_mask, block_mask = (attention.MASKS[k](8, 4) for k in ("set", "block"))
  assert set_mask.shape == block_mask.shape and (set_mask != block_mask).any()


# ----------------------------------------------------------------------------- finding 12
EXEMPT = {"accelerator_check.py", "compare_seeds.py"}  # the last has its own


def _main_block_calls(path: pathlib.Path):
  """The calls made in the module's trailing `if __name__ == "__main__":` block."""
  tree = ast.parse(path.read_text())
  blocks = [
    n
    for n in tree.body
    if isinstance(n, ast.If)
    and "__main__" in ast.unparse(n.test)
    and "__package__" not in ast.unparse(n.test)
  ]
  if not blocks:
    return None
  return {ast.unparse(c.func) for c in ast.walk(blocks[-1]) if isinstance(c, ast.Call)}


def test_compare_methods_checks_every_config_before_training(tmp_path, fake_training):
  """--methods=ar,setdlm0 trained AR before S = 0 was refused."""
  trained, _ = fake_training
  with pytest.raises(ValueError, match="loss.desired_set_size=0 is out of range"):
    cm.main(["--quick", "--methods=ar,setdlm0", f"--output_dir={tmp_path / 'out'}"], log=print)
  assert trained == [] and not (tmp_path / "out").exists()


def test_every_entry_point_reports_expected_errors_in_one_line():
  entries = {}
  for path in sorted((REPO / "benchmarks").glob("*.py")):
    calls = _main_block_calls(path)
    if calls is not None and path.name not in EXEMPT:
      entries[path.name] = calls
  assert len(entries) >= 14, sorted(entries)
  bare = [n for n, calls in entries.items() if not calls & {"inputs.run", "cli.run"}]
  assert bare == [], f"entry points that call main() bare: {bare}"


@pytest.mark.parametrize(
  "error",
  [
    ValueError("bad flag"),
    FileNotFoundError("no such file: x"),
    RecordError("record name taken"),
  ],
)
def test_run_turns_expected_errors_into_one_line(error, capsys):
  def main():
    print("started")
    raise error

  with pytest.raises(SystemExit) as e:
    inputs.run(main)
  assert e.value.code == 1
  assert capsys.readouterr().err == f"error: {error}\n"


def test_run_keeps_a_bugs_traceback_and_returns_mains_value():
  def bug():
    raise KeyError("a bug")

  with pytest.raises(KeyError):
    inputs.run(bug)
  assert inputs.run(lambda: [1]) == [1]


def test_output_paths_are_checked(tmp_path):
  a_file = tmp_path / "a_file"
  a_file.write_text("x")
  with pytest.raises(ValueError, match=f"--out={a_file} is a file, not a folder"):
    inputs.check_output_dir(str(a_file), "--out")
  with pytest.raises(ValueError, match=f"lies inside the file {a_file}"):
    inputs.check_output_dir(str(a_file / "sub" / "dir"))
  with pytest.raises(ValueError, match="is a folder: give a file name"):
    inputs.check_output_file(str(tmp_path), "--out")
  with pytest.raises(ValueError, match=f"lies inside the file {a_file}"):
    inputs.check_output_file(str(a_file / "rows.json"), "--out")
  inputs.check_output_dir(str(tmp_path / "new" / "nested"))  # created later: fine
  inputs.check_output_file(str(tmp_path / "new" / "rows.json"))
  inputs.check_output_file(str(a_file))  # a file output is overwritten
  inputs.check_output_dir(None)
  assert not (tmp_path / "new").exists()


def test_aot_compile_checks_its_out_file_before_compiling(tmp_path):
  from benchmarks import aot_compile

  with pytest.raises(ValueError, match="is a folder"):
    aot_compile.parse_args([f"--out={tmp_path}"])


def test_official_checks_its_out_folder_before_measuring(tmp_path):
  from benchmarks import official

  root = tmp_path / "setdlms"
  for rel in official.REQUIRED_FILES:  # empty files: measuring would fail
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text("")
  a_file = tmp_path / "a_file"
  a_file.write_text("x")
  with pytest.raises(ValueError, match="is a file, not a folder"):
    official.main([f"--official_dir={root}", f"--out={a_file}"])


def _bench(*argv, timeout=240):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  env.pop("SETDIFF_VERBOSE", None)
  return subprocess.run(
    [sys.executable, "-m", *argv],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def test_bad_input_is_one_error_line_from_the_command_line(tmp_path):
  """The probe's cases: each ended in a traceback (the last only after the whole measurement)."""
  a_file = tmp_path / "a_file"
  a_file.write_text("x")
  cases = [
    (
      ["benchmarks.compare_methods", "--quick", "--methods=foo", f"--output_dir={tmp_path / 'cm'}"],
      "error: ",
    ),
    (
      ["benchmarks.decode_weights", f"--tuned_dirs={tmp_path / 'none'}"],
      "error: " + str(tmp_path / "none" / "tuned_baselines.json") + " not found",
    ),
    (["benchmarks.training", "--objectives=ar,foo"], "error: --objectives: 'foo' is not one of"),
    (["benchmarks.training", "--vocab_size=50"], "error: --vocab_size=50 must exceed 104"),
    (
      ["benchmarks.continuous_batching", "--rows=2", "--slots=2", "--max_answer=4"]
      + ["--repeats=1", "--samplers=ar", f"--out={a_file}"],
      f"error: --out={a_file} is a file, not a folder",
    ),
  ]
  for argv, said in cases:
    proc = _bench(*argv)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith(said), (
      argv,
      proc.stderr[-2000:],
    )
  assert not (tmp_path / "cm").exists()  # refused before the output folder was made
