"""launch/evaluate.py inputs that were accepted and gave a wrong, empty or lost result (probe 6).

Two tiny runs (SetDLM and AR, EMA 0.9, training evaluated the raw parameters) are trained
in-process once; the launcher's command lines run in one process (tests/cli_harness.py), the
library cases in this one.
"""

import json
import os
import types

import pytest

from setdiff_jax import train
from setdiff_jax.evaluation import infill
from setdiff_jax.evaluation import results as results_lib
from setdiff_jax.evaluation import run as eval_run
from setdiff_jax.evaluation import tables
from setdiff_jax.workdir import load as workdir_lib

from helpers import new_workdir
from test_reliability import REPO, assert_one_error_line, tiny_config
from test_reliability_2 import harness

pytestmark = pytest.mark.usefixtures("fast_compile")

CLOZE = os.path.join(REPO, "tests", "data", "cloze_fixture.csv")
PAIRS = ['{"prompt": "1 + 2 =", "answer": "#### 3"}', '{"prompt": "4 + 4 =", "answer": "#### 8"}']


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tokenizer_dir):
  """{"setdlm", "ar": workdir, "pairs", "root"}: 2-step runs (seq_len 64, EMA 0.9, training
  evaluated the raw parameters at step 2) and a JSONL of test pairs."""
  root = tmp_path_factory.mktemp("eval_inputs")
  out = {"root": root}
  for objective in ("setdlm", "ar"):
    workdir = new_workdir(root, objective, tokenizer_dir)
    config = tiny_config(objective=objective, ema_decay=0.9, eval_params="raw")
    assert train.train_and_evaluate(config, workdir)["step"] == 2
    out[objective] = workdir
  (root / "pairs.jsonl").write_text("\n".join(PAIRS) + "\n")
  out["pairs"] = str(root / "pairs.jsonl")
  return out


def _logged_eval(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if "eval/nll" in r][-1]


@pytest.fixture(scope="module")
def launched(runs):
  """{name: harness result} of every launcher case, run in one process."""
  w, ar, pairs, root = runs["setdlm"], runs["ar"], runs["pairs"], runs["root"]
  os.makedirs(root / "a_folder", exist_ok=True)
  cases = {
    # 1: names the trainer owns at a run's top level, existing or not
    "data_files": [f"--workdir={w}", f"--output={w}/data_files.json"],
    "discarded": [f"--workdir={w}", f"--output={w}/metrics.discarded.jsonl"],
    # 3: the default parameters are the run's eval_params, and the header says so
    "default_params": [f"--workdir={w}", "--max_rows=8", f"--output={root}/lik.json"],
    # 4
    "eval_paths": [
      f"--workdir={w}",
      "--eval=accuracy",
      f"--accuracy_data={pairs}",
      f"--eval_paths={pairs}",
    ],
    # 5: settings the run's sampler cannot use; the defaults work on AR (speed and accuracy)
    "ar_thresholds": [f"--workdir={ar}", "--eval=speed", "--thresholds=0.5"],
    "ar_infill_thresholds": [
      f"--workdir={ar}",
      "--eval=infill",
      "--infill_thresholds=0.9",
      f"--cloze_path={CLOZE}",
    ],
    "noalign": [
      f"--workdir={w}",
      "--eval=accuracy",
      f"--accuracy_data={pairs}",
      "--noalign_to_blocks",
    ],
    "align": [f"--workdir={w}", "--eval=accuracy", f"--accuracy_data={pairs}", "--align_to_blocks"],
    "ar_defaults": [
      f"--workdir={ar}",
      "--eval=speed,accuracy",
      "--batch_sizes=1",
      "--repeats=1",
      "--max_new_tokens=4",
      f"--accuracy_data={pairs}",
      "--speed_examples=0",
      f"--output={root}/ar.json",
    ],
    # 6
    "empty_thresholds": [f"--workdir={w}", "--eval=speed", "--thresholds="],
    "empty_eval": [f"--workdir={w}", "--eval="],
    "empty_batch_sizes": [f"--workdir={w}", "--eval=speed", "--batch_sizes="],
    "word_batch_sizes": [f"--workdir={w}", "--eval=speed", "--batch_sizes=1,abc"],
    "empty_infill_settings": [f"--workdir={w}", "--eval=infill", "--infill_settings="],
    "empty_infill_thresholds": [f"--workdir={w}", "--eval=infill", "--infill_thresholds="],
    # probe 17a: a setting given twice ran twice (the second warm: 130x the compile-inclusive
    # tok/s) and was stored twice; --policy_args deduplicated without a word
    "twice_thresholds": [f"--workdir={w}", "--eval=speed", "--thresholds=off,0.9,none"],
    "twice_eval": [f"--workdir={w}", "--eval=likelihood,speed,Likelihood"],
    "twice_batch_sizes": [f"--workdir={w}", "--eval=speed", "--batch_sizes=1,2,1"],
    "twice_policy_args": [f"--workdir={w}", "--eval=speed", "--policy=topk", "--policy_args=2,2.0"],
    # 9
    "folder": [f"--workdir={w}", f"--output={root}/a_folder"],
    # 11: every fixture story is longer than seq_len = 64
    "cloze_too_long": [
      f"--workdir={w}",
      "--eval=infill",
      "--infill_settings=1sent",
      "--num_infill=4",
      f"--cloze_path={CLOZE}",
      f"--output={root}/infill.json",
    ],
  }
  return dict(zip(cases, harness("evaluate.py", list(cases.values()))))


def _error(launched, name, *expected):
  assert_one_error_line(launched[name], expected, name)


# ----------------------------------------------------------------------------- 1, 9: --output
def test_output_named_like_a_run_file_is_refused(runs, launched):
  w = runs["setdlm"]
  for name in ("data_files.json", "metrics.discarded.jsonl", "metrics.jsonl", "config.json"):
    with pytest.raises(ValueError, match=f"{name} belongs to the training run"):
      results_lib.check_output_path(os.path.join(w, name), w)
  results_lib.check_output_path(os.path.join(w, "eval_raw.json"), w)  # a name of its own
  _error(launched, "data_files", "data_files.json belongs to the training run")
  _error(launched, "discarded", "metrics.discarded.jsonl belongs to the training run")
  assert not os.path.exists(os.path.join(w, "data_files.json"))


def test_output_that_is_a_folder_or_not_json_says_what_it_is(runs, launched, tmp_path):
  _error(launched, "folder", "is a directory", "pass a file path")
  text = tmp_path / "notes.txt"
  text.write_text("not json\n")
  with pytest.raises(ValueError) as e:
    results_lib.read_record(str(text))
  assert "not a JSON file" in str(e.value) and "holds earlier evaluation results" not in str(
    e.value
  )
  assert text.read_text() == "not json\n"


# ----------------------------------------------------------------------------- 2: history
def test_timing_results_of_two_machines_are_both_kept(runs, tmp_path, monkeypatch):
  w = runs["ar"]
  out = str(tmp_path / "r.json")
  legacy = {"workdir": os.path.realpath(w), "step": 2, "speed": [{"old": 1}], "hardware": {}}
  with open(out, "w") as f:  # a file of an older version (no history) still reads
    json.dump(legacy, f)
  opts = eval_run.EvalOptions(batch_sizes=(1,), repeats=1, max_new_tokens=4, max_rows=8)
  real = results_lib.hardware()
  for device in ("machine A", "machine B"):
    monkeypatch.setattr(results_lib, "hardware", lambda d=device: dict(real, device=d))
    eval_run.evaluate_workdir(w, ["likelihood", "speed"], opts, log=None, output=out)
  history = json.load(open(out))["history"]
  speed = [h for h in history.values() if h["eval"] == "speed" and "hardware" in h]
  assert sorted(h["hardware"]["device"] for h in speed) == ["machine A", "machine B"]
  assert all(sorted(h["mesh"]) == ["data", "fsdp", "tensor"] for h in speed)  # and its mesh
  likelihood = [k for k, h in history.items() if h["eval"] == "likelihood"]
  assert len(likelihood) == 1 and "hardware=" not in likelihood[0]  # not a timing: one entry
  assert any(h["result"] == [{"old": 1}] for h in history.values())  # the legacy entry is kept


def test_a_stop_in_a_later_eval_keeps_the_finished_ones(runs, tmp_path, monkeypatch):
  """Probe 17a: Ctrl-C during --eval=likelihood,accuracy threw away the finished likelihood result
  (the file was written once, after every eval), though the stopped line says files written
  before are intact. Each eval is now saved, its table shown first, as soon as it ends."""
  out = str(tmp_path / "r.json")
  opts = eval_run.EvalOptions(batch_sizes=(1,), repeats=1, max_new_tokens=4, max_rows=8)

  def interrupted(*args, **kwargs):
    raise KeyboardInterrupt

  monkeypatch.setattr(eval_run, "run_speed", interrupted)
  shown = []
  with pytest.raises(KeyboardInterrupt):
    eval_run.evaluate_workdir(
      runs["ar"], ["likelihood", "speed"], opts, log=None, output=out, show=shown.append
    )
  saved = json.load(open(out))
  assert [h["eval"] for h in saved["history"].values()] == ["likelihood"]
  assert saved["likelihood"]["nll"] > 0 and "speed" not in saved
  assert len(shown) == 1 and shown[0].startswith("workdir: ") and "NLL" in shown[0]
  monkeypatch.undo()  # the same command again: both, the likelihood entry refreshed, not doubled
  record = eval_run.evaluate_workdir(
    runs["ar"], ["likelihood", "speed"], opts, log=None, output=out, show=shown.append
  )
  history = json.load(open(out))["history"]
  assert sorted(h["eval"] for h in history.values()) == ["likelihood", "speed"]
  same = lambda r: {k: v for k, v in r["likelihood"].items() if k != "seconds"}  # noqa: E731
  assert same(record) == same(saved) and record["speed"]
  assert shown[1].startswith("workdir: ") and not shown[2].startswith("workdir: ")  # one header


# ----------------------------------------------------------------------------- 3: parameters
def test_default_parameters_are_the_ones_training_evaluated(runs, launched):
  result = launched["default_params"]
  assert result["rc"] == 0, result["stderr"][-2000:]
  assert "params: raw (the run's eval_params" in result["stdout"]
  lik = json.load(open(runs["root"] / "lik.json"))["likelihood"]
  logged = _logged_eval(runs["setdlm"])
  assert lik["num_tokens"] == logged["eval/num_tokens"]
  assert lik["nll"] == pytest.approx(logged["eval/nll"], rel=1e-5)  # the training log's value
  shown = []
  opts = eval_run.EvalOptions(num_orders=1, max_rows=8)
  out = str(runs["root"] / "ema.json")
  eval_run.evaluate_workdir(
    runs["setdlm"], ["likelihood"], opts, use_ema=True, log=None, output=out, show=shown.append
  )
  assert "params: EMA (training evaluated the raw ones; --nouse_ema" in shown[0]  # chosen: kept
  shown.clear()  # the library's default is the launcher's: the run's eval_params
  eval_run.evaluate_workdir(runs["setdlm"], ["likelihood"], opts, log=None, show=shown.append)
  assert "params: raw (the run's eval_params" in shown[0]


def test_judge_takes_its_own_runs_eval_params(runs):
  judge = eval_run.load_judge(runs["ar"])
  raw = workdir_lib.load_inference_state(runs["ar"], use_ema=False)
  same = [(a == b).all() for a, b in zip(*map(_leaves, (judge.params, raw.params)))]
  assert all(same)


def _leaves(tree):
  import jax

  return jax.tree_util.tree_leaves(jax.device_get(tree))


# ----------------------------------------------------------------------------- 4, 5, 6: flags
def test_eval_paths_with_accuracy_data_is_refused(launched):
  _error(launched, "eval_paths", "--eval_paths would be unused", "--accuracy_data")


def test_decoding_flags_the_sampler_cannot_use_are_refused(launched):
  _error(launched, "ar_thresholds", "--thresholds would be ignored", "ar run")
  _error(launched, "ar_infill_thresholds", "--infill_thresholds would be ignored", "ar run")
  _error(launched, "noalign", "--align_to_blocks would be ignored", "setdlm run")
  _error(launched, "align", "--align_to_blocks would be ignored", "setdlm run")
  result = launched["ar_defaults"]  # the defaults work on AR
  assert result["rc"] == 0, result["stderr"][-2000:]


def test_empty_list_flags_are_refused(launched):
  for flag in ("thresholds", "eval", "batch_sizes", "infill_settings", "infill_thresholds"):
    _error(launched, f"empty_{flag}", f"--{flag} is empty")
  # probe round 11: "invalid literal for int() with base 10: 'abc'" named no flag
  _error(launched, "word_batch_sizes", "--batch_sizes=1,abc: 'abc' is not an integer")
  for flag, twice in (
    ("thresholds", "'off' and 'none'"),
    ("eval", "'likelihood' and 'Likelihood'"),
    ("batch_sizes", "'1'"),
    ("policy_args", "'2' and '2.0'"),
  ):
    _error(launched, f"twice_{flag}", f"--{flag}=", f" gives {twice} (one setting) twice: give")


# ----------------------------------------------------------------------------- 7: tables
def test_speed_heading_names_the_real_n(launched):
  row = {
    "method": "ar",
    "setting": "-",
    "batch_size": 1,
    "tokens_per_second": 1.0,
    "tokens_per_step": 1.0,
    "forward_calls": 4,
    "compile_seconds": 0.0,
    "new_tokens": 4,
  }
  assert "Decoding speed (unconditional, N = 4, no EOS stop)" in tables.format_results(
    {"speed": [row]}
  )
  assert "N = 4, no EOS stop" in launched["ar_defaults"]["stdout"]


# ----------------------------------------------------------------------------- 10, 11: data
def test_accuracy_data_with_other_field_names_says_to_rename_them(tmp_path):
  path = tmp_path / "q.jsonl"
  path.write_text('{"question": "1+1", "answer": "#### 2"}\n')
  state = types.SimpleNamespace(config=types.SimpleNamespace(data={}))
  with pytest.raises(ValueError, match="record has no field 'prompt'") as e:
    eval_run.accuracy_pairs(state, eval_run.EvalOptions(accuracy_data=str(path)))
  assert "rename them in the file" in str(e.value) and "set data." not in str(e.value)


def test_cloze_longer_than_the_context_is_an_error_or_a_warning(runs, launched, tmp_path, caplog):
  _error(launched, "cloze_too_long", "every one of the", "longer than this run's seq_len=64")
  assert not os.path.exists(runs["root"] / "infill.json")
  lines = open(CLOZE).read().splitlines()
  short = "short-0,I ran.,I sat.,I ate.,I slept.,I woke.,I fell.,1"
  mixed = tmp_path / "mixed.csv"
  mixed.write_text("\n".join([lines[0], short, lines[1]]) + "\n")
  state = workdir_lib.load_inference_state(runs["setdlm"], use_ema=False)
  items, skipped = infill.setting_items(
    state.tokenizer, 64, int(state.objective_config.mask_token_id), "1sent", cloze_path=str(mixed)
  )
  assert (len(items), skipped) == (1, 1)
  assert "1 of 2 stories are longer than seq_len=64" in caplog.text
