"""Launchers and workdirs under bad input and faults (issue 14).

One tiny run is trained once through `launch/train.py` (configs/tiny_sw.py shrunk to 1 x 32, two
steps, a checkpoint after each). Bad command lines are run in-process, many per launcher, through
tests/cli_harness.py (one subprocess per launcher: absl flags are global); each must exit non-zero
with exactly one `error: ...` line on stderr.
"""

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import ml_collections
import pytest

from setdiff_jax import errors, train, train_step
from setdiff_jax.workdir import checkpoints as checkpointing
from setdiff_jax.config import run as run_config
from setdiff_jax.workdir import lock as workdir_lock
from setdiff_jax.workdir import load as workdir_lib
from setdiff_jax.data import iterator_state, tokenizers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from configs import tiny_sw

pytestmark = pytest.mark.usefixtures("fast_compile")

TINY = {
  "num_train_steps": 2,
  "checkpoint_every_steps": 1,
  "eval_every_steps": 2,
  "num_eval_steps": 1,
  "num_eval_samples": 0,
  "log_every_steps": 1,
  "batch_size": 8,
  "eval_batch_size": 8,
  "data.train_split": "validation",
  "tokenizer.vocab_size": 384,
  "model.hidden_size": 32,
  "model.num_heads": 2,
  "model.num_layers": 1,
  "warmup_steps": 1,
}


def _tiny_fields(extra):
  """TINY with `extra`; TINY's split is the embedded corpus's, which no other source reads (a
  split set off its default there is refused), so another source gets the default split."""
  fields = {**TINY, **extra}
  if fields.get("data.source", "embedded") != "embedded" and "data.train_split" not in extra:
    fields["data.train_split"] = "train"
  return fields


def tiny_args(workdir, **extra):
  fields = _tiny_fields(extra)
  return ["--config=" + os.path.join(REPO, "configs", "tiny_sw.py"), f"--workdir={workdir}"] + [
    f"--config.{k}={v}" for k, v in fields.items()
  ]


def tiny_config(**extra):
  c = tiny_sw.get_config()
  for key, value in _tiny_fields(extra).items():
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c


def env():
  e = dict(os.environ, PYTHONPATH=REPO)
  e.pop("JAX_PLATFORMS", None)  # what a user gets: jax probes for a TPU (and must not say so)
  e.pop("SETDIFF_VERBOSE", None)
  return e


def launch(script, args, **kw):
  return subprocess.run(
    [sys.executable, os.path.join(REPO, "launch", script)] + list(args),
    capture_output=True,
    text=True,
    cwd=REPO,
    env=env(),
    **kw,
  )


def harness(script, cases):
  r = subprocess.run(
    [sys.executable, os.path.join(REPO, "tests", "cli_harness.py"), os.path.join("launch", script)],
    input=json.dumps(cases),
    capture_output=True,
    text=True,
    cwd=REPO,
    env=env(),
  )
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout)


def assert_one_error_line(result, expected, what):
  lines = [l for l in result["stderr"].splitlines() if l.strip()]
  assert result["rc"] != 0, f"{what}: exit status 0\n{result}"
  assert len(lines) == 1, f"{what}: {len(lines)} stderr lines:\n" + "\n".join(lines[-20:])
  assert lines[-1].startswith("error: "), f"{what}: {lines[-1]}"
  for text in expected:
    assert text in lines[-1], f"{what}: {text!r} not in {lines[-1]!r}"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  """A 2-step run with checkpoints at steps 1 and 2, trained through the launcher."""
  workdir = str(tmp_path_factory.mktemp("run") / "w")
  r = launch("train.py", tiny_args(workdir))
  assert r.returncode == 0, r.stderr[-3000:]
  return workdir, r


def copy_run(run_dir, tmp_path, name="w"):
  dst = str(tmp_path / name)
  shutil.copytree(run_dir[0], dst, ignore=shutil.ignore_patterns(".lock"))
  return dst


# ----------------------------------------------------------------------------- honest output
@pytest.mark.slow
def test_train_and_sample_output(run_dir):
  workdir, r = run_dir
  last = r.stdout.strip().splitlines()[-1]
  assert last.startswith("done: step 2; eval PPL ") and "checkpoints/2" in last, last
  assert f"python launch/sample.py --workdir={workdir}" in last
  for noise in (
    "libtpu",
    "jax.distributed",
    "save_device_host_concurrent_bytes",
    "BasePyTreeCheckpointHandler",
    "GiB",
  ):
    assert noise not in r.stderr, noise
  s = launch(
    "sample.py",
    [
      f"--workdir={workdir}",
      "--num_samples=1",
      "--batch_size=1",
      "--max_new_tokens=8",
      "--seed=-1",
    ],
  )
  assert s.returncode == 0, s.stderr[-3000:]
  first = s.stdout.splitlines()[0]
  for text in (
    f"workdir: {workdir}",
    "step: 2",
    "params: EMA",
    "sampler: setdlm",
    "window=4",
    "tau=off",
    "max_new_tokens=8",
    "seed=",
  ):
    assert text in first, (text, first)
  assert "seed=-1" not in first and "\ufffd" not in s.stdout
  assert "libtpu" not in s.stderr


def test_decode_never_returns_replacement_characters(tmp_path):
  tok = tokenizers.get_tokenizer(tiny_config().tokenizer, train_texts=["café naïve"] * 50)
  ids = tok.encode("café")
  assert tok.decode(ids) == "café"
  lead_byte = tok.hf.token_to_id("Ã")  # the byte-level symbol of 0xC3, first byte of "é"
  assert lead_byte is not None
  assert tok.hf.decode([lead_byte]) == "\ufffd"  # what the raw decoder gives
  assert tok.decode([lead_byte]) == "" and tok.decode_batch([[lead_byte] + ids]) == ["café"]


HOLD = """
import sys, time
from setdiff_jax.workdir.lock import WorkdirLock
WorkdirLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(120)
"""


# ----------------------------------------------------------------------------- bad input
def test_bad_train_inputs(run_dir, tmp_path):
  workdir = copy_run(run_dir, tmp_path)
  latin1 = tmp_path / "latin1.txt"
  latin1.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
  broken = tmp_path / "broken.jsonl"
  broken.write_text('{"text": "fine"}\n{"text": \n')
  fresh = str(tmp_path / "fresh")
  cases = [
    (tiny_args(workdir) + ["--config.foo=1"], ["--config.foo is not a config field"]),
    (tiny_args(workdir) + ["--config.model.hiden=1"], ["closest: --config.model.hidden_size"]),
    (tiny_args(workdir) + ["stray"], ["unexpected argument", "stray"]),
    (tiny_args(workdir) + ["--config.model.hidden_size=x"], ["hidden_size=x"]),
    ([f"--workdir={workdir}"], ["--config is required"]),
    (["--config=configs/nope.py", f"--workdir={workdir}"], ["nope.py"]),
    (
      tiny_args(workdir, **{"model.hidden_size": 64}),
      ["refusing to resume", "model.hidden_size: 32 -> 64", "--config.init_from=", "--workdir"],
    ),
    (
      tiny_args(fresh, **{"data.source": "text", "data.paths": str(latin1)}),
      [str(latin1), "not UTF-8"],
    ),
    (
      tiny_args(fresh, **{"data.source": "jsonl", "data.paths": str(broken)}),
      [f"{broken}:2", "not valid JSON"],
    ),
    (
      tiny_args(fresh, **{"data.source": "text", "data.paths": "missing.txt"}),
      ["missing.txt", "data.paths"],
    ),
    (
      tiny_args(fresh, **{"loss.block_size": 5, "objective": "bd3lm", "model.adaln": True}),
      ["block_size"],
    ),
  ]
  locked = copy_run(run_dir, tmp_path, "locked")
  holder = subprocess.Popen(
    [sys.executable, "-c", HOLD, locked],
    stdout=subprocess.PIPE,
    text=True,
    env=dict(os.environ, PYTHONPATH=REPO),
  )
  try:
    assert holder.stdout.readline().strip() == "locked"
    cases.append((tiny_args(locked), [f"workdir {locked} in use by pid {holder.pid} on "]))
    before = open(os.path.join(workdir, "config.json"), "rb").read()
    for (args, expected), result in zip(cases, harness("train.py", [a for a, _ in cases])):
      assert_one_error_line(result, expected, " ".join(args[2:]))
  finally:
    holder.kill()
    holder.wait()
  assert open(os.path.join(workdir, "config.json"), "rb").read() == before


def test_bad_sample_evaluate_export_inputs(run_dir, tmp_path):
  workdir = run_dir[0]
  w = f"--workdir={workdir}"
  damaged = copy_run(run_dir, tmp_path, "damaged")
  with open(os.path.join(damaged, "config.json"), "r+") as f:
    f.truncate(40)
  sample = [
    ([w, "--window=0"], ["--window=0 must be in [1, seq_len=64]"]),
    ([w, "--window=1000"], ["--window=1000"]),
    ([w, "--max_new_tokens=0"], ["--max_new_tokens=0"]),
    ([w, "--prompt=" + "word " * 100], ["the prompt is", "seq_len=64"]),
    ([w, "--step=999"], ["--step=999", "[1, 2]"]),
    ([w, "extra"], ["unexpected argument"]),
    ([w, "--infill=no gap here"], ["[GAP:n]"]),
    ([w, "--infill=a [GAP:3] b", "--max_new_tokens=40"], ["--max_new_tokens would be unused"]),
    ([w, "--policy=nope"], ["--policy='nope'", "valid: threshold, entropy_bound, factor"]),
    ([w, "--policy=entropy_bound", "--policy_arg=-1"], ["--policy_arg=-1", "gamma must be >= 0"]),
    ([w, "--policy=margin", "--threshold=0.9"], ["--threshold", "--policy_arg"]),
    ([f"--workdir={tmp_path / 'nothing'}"], ["config.json not found"]),
    ([f"--workdir={damaged}"], [os.path.join(damaged, "config.json"), "damaged"]),
    ([w, "--mesh=rows=2"], ["--mesh='rows=2'", "data=2,tensor=4"]),
    ([w, "--mesh=data=3"], ["--mesh {'data': 3, 'fsdp': 1, 'tensor': 1} needs 3 devices"]),
  ]
  for (args, expected), result in zip(sample, harness("sample.py", [a for a, _ in sample])):
    assert_one_error_line(result, expected, "sample " + " ".join(args))
  evaluate = [
    ([w, "--eval=speed", "--window=0"], ["--window=0"]),
    ([w, "--eval=speed", "--max_new_tokens=0"], ["--max_new_tokens=0"]),
    ([w, "--eval=bogus"], ["unknown eval"]),
    ([w, "--step=999"], ["[1, 2]"]),
    ([w, "--num_orders=0"], ["--num_orders=0"]),
    ([w, "--eval=speed", "--policy=topk", "--policy_args=0"], ["--policy_args=0", "k must be"]),
    ([w, "again"], ["unexpected argument"]),
    ([w, "--mesh=data=x"], ["--mesh='data=x'"]),
  ]
  for (args, expected), result in zip(evaluate, harness("evaluate.py", [a for a, _ in evaluate])):
    assert_one_error_line(result, expected, "evaluate " + " ".join(args))
  full = tmp_path / "full"
  full.mkdir()
  (full / "notes.txt").write_text("mine")
  other = tmp_path / "other_run"  # another run: its config.json beside its tokenizer/
  (other / "tokenizer").mkdir(parents=True)
  (other / "config.json").write_text("{}")
  (other / "tokenizer" / "tokenizer.json").write_text("theirs")
  export = [
    ([w, f"--out={other / 'tokenizer'}"], ["is inside the training run", str(other)]),
    ([w, f"--out={other / 'checkpoints' / '99'}"], ["is inside the training run"]),
    ([w, f"--out={full / 'notes.txt' / 'sub'}"], ["which is a file"]),
    ([w, f"--out={workdir}"], ["is a training workdir"]),
    ([w, f"--out={os.path.join(workdir, 'tokenizer')}"], ["is inside the training workdir"]),
    # new folders inside the run: retention would delete the first, loads misread the second
    ([w, f"--out={os.path.join(workdir, 'checkpoints', '20', 'hf')}"], ["outside the run"]),
    ([w, f"--out={os.path.join(workdir, 'checkpoints', '30')}"], ["outside the run"]),
    ([w, f"--out={full}", "--overwrite"], []),  # allowed: checked below
    ([w, f"--out={full}"], ["not empty", "--overwrite"]),
    ([w, f"--out={tmp_path / 'e'}", "--step=999"], ["[1, 2]"]),
    ([w, f"--out={tmp_path / 'e'}", "--format=onnx"], ["onnx"]),
    ([w, f"--out={tmp_path / 'e'}", "x"], ["unexpected argument"]),
  ]
  results = harness("export.py", [a for a, _ in export])
  for (args, expected), result in zip(export, results):
    if "--overwrite" in args:
      assert result["rc"] == 0, result["stderr"][-2000:]
      continue
    assert_one_error_line(result, expected, "export " + " ".join(args))
  assert checkpointing.load_config(workdir).objective == "setdlm"  # the run's config is intact
  assert not os.path.exists(tmp_path / "e")
  assert {"20", "30"}.isdisjoint(os.listdir(os.path.join(workdir, "checkpoints")))
  assert (other / "tokenizer" / "tokenizer.json").read_text() == "theirs"
  assert not (other / "checkpoints").exists()


# ----------------------------------------------------------------------------- workdir integrity
def test_mismatched_resume_writes_nothing(tmp_path, monkeypatch):
  """A workdir whose checkpoints came from another config: refused before anything is built."""
  workdir = tmp_path / "w"
  (workdir / "checkpoints" / "5").mkdir(parents=True)
  checkpointing.save_config(tiny_config(), str(workdir))
  before = {p: (workdir / p).read_bytes() for p in ["config.json"]}
  monkeypatch.setattr(jax, "jit", lambda *a, **k: pytest.fail("compiled something"))
  monkeypatch.setattr(train, "build_tokenizer", lambda *a, **k: pytest.fail("built a tokenizer"))
  changed = tiny_config(
    **{
      "model.num_layers": 2,
      "loss.desired_set_size": 2,
      "seq_len": 32,
      "num_train_steps": 9,
      "learning_rate": 0.1,
      "seed": 1,  # the data order the iterator state indexes into (probe round 10)
    }
  )
  with pytest.raises(errors.ConfigMismatchError) as e:
    train.train_and_evaluate(changed, str(workdir))
  msg = str(e.value)
  for text in (
    "loss.desired_set_size: 4 -> 2",
    "model.num_layers: 1 -> 2",
    "seq_len: 64 -> 32",
    "seed: 0 -> 1",
    "--workdir",
    f"--config.init_from={workdir}",
  ):
    assert text in msg, text
  assert "num_train_steps" not in msg and "learning_rate" not in msg  # those may change
  assert {p: (workdir / p).read_bytes() for p in before} == before
  assert sorted(os.listdir(workdir)) == [".lock", "checkpoints", "config.json"]


def test_rl_resume_from_another_sft_run_is_structural(tmp_path, monkeypatch):
  """An RL run resumed with another rl.init_from would take its KL reference and prompts from a
  different SFT run without a word; the same run given relative or absolute is no change."""
  monkeypatch.chdir(tmp_path)
  old = {"rl": {"init_from": str(tmp_path / "sft"), "learning_rate": 1e-5}}
  assert workdir_lock.structural_changes(old, {"rl": {"init_from": "sft"}}) == []
  assert workdir_lock.structural_changes(old, {"rl": {"init_from": "sft", "kl_beta": 0.1}}) == []
  for name, a, b in (
    ("task_seed", 0, 5),
    ("task_train_examples", 20000, 50),
    ("prompt_style", "plain", "gsm8k"),
  ):
    data = {"source": "arithmetic"}
    changed = workdir_lock.structural_changes(
      {"data": {**data, name: a}}, {"data": {**data, name: b}}
    )
    assert changed == [(f"data.{name}", a, b)], name  # the prompts a resume would train on
  moved = workdir_lock.structural_changes(old, {"rl": {"init_from": "sft_seed1"}})
  assert moved == [("rl.init_from", str(tmp_path / "sft"), "sft_seed1")]
  saved = workdir_lock.absolute_paths(ml_collections.ConfigDict({"rl": {"init_from": "sft"}}))
  assert saved.rl.init_from == str(tmp_path / "sft")


def test_an_rl_resume_from_another_sft_run_is_not_called_a_changed_one(tmp_path, monkeypatch):
  """Probe 18b: resumed with another rl.init_from whose config differs, the refusal said the SFT
  run "was changed since; restore its config.json from a backup" (advice that could overwrite
  the other run's config); the SFT-config check leaves it to the resume check, which names
  rl.init_from old -> new. The same SFT run, given relative, is still compared."""
  from setdiff_jax.rl import sft_start

  monkeypatch.chdir(tmp_path)
  (tmp_path / "rl").mkdir()
  recorded = {"objective": "setdlm", "rl": {"init_from": str(tmp_path / "sft")}}
  (tmp_path / "rl" / "config.json").write_text(json.dumps(recorded))
  other = ml_collections.ConfigDict({"objective": "ar", "rl": {"init_from": "sft_ar"}})
  sft_start.check_same_sft_config(other, str(tmp_path / "rl"))  # not this check's case
  changed = ml_collections.ConfigDict({"objective": "ar", "rl": {"init_from": "sft"}})
  with pytest.raises(
    errors.ConfigMismatchError, match='objective: "setdlm" -> "ar". The SFT run was'
  ):
    sft_start.check_same_sft_config(changed, str(tmp_path / "rl"))


def test_a_resume_names_the_settings_it_changes(tmp_path, caplog):
  """Probe 18b: a resume with another rl.reward (or lr, kl_beta, ...) was accepted without a word
  and config.json then recorded only the new value. One warning names every changed setting;
  the same config again names none."""
  import logging

  (tmp_path / "checkpoints" / "3").mkdir(parents=True)
  old = tiny_config(**{"data.paths": str(tmp_path / "a.txt")})
  old.rl = ml_collections.ConfigDict({"reward": "exact_match", "kl_beta": 0.1})
  (tmp_path / "config.json").write_text(old.to_json())
  new = tiny_config(learning_rate=5e-4, **{"data.paths": str(tmp_path / "a.txt")})
  new.rl = ml_collections.ConfigDict({"reward": "format", "kl_beta": 0.1})
  with caplog.at_level(logging.WARNING):
    workdir_lock.check_resume(new, str(tmp_path))
    lines = [r.getMessage() for r in caplog.records if "changed settings" in r.getMessage()]
    assert lines == [
      f"resuming {tmp_path} from step 3 with changed settings: learning_rate: "
      f'{old.learning_rate} -> 0.0005; rl.reward: "exact_match" -> "format"'
    ]
    caplog.clear()
    workdir_lock.check_resume(old, str(tmp_path))
    assert not [r for r in caplog.records if "changed settings" in r.getMessage()]


def test_a_run_of_the_other_launcher_is_named_as_such(tmp_path):
  """Probe 18a: train.py on an RL run's workdir was refused as "saved by an older version ... or
  the files were deleted", rl.py on another training run's workdir with "use the config it was
  trained with"; each names the kind of run the workdir holds and the launcher it takes."""
  (tmp_path / "checkpoints" / "3").mkdir(parents=True)
  rl_run = tiny_config()
  rl_run.rl = ml_collections.ConfigDict({"init_from": str(tmp_path / "sft")})
  (tmp_path / "config.json").write_text(rl_run.to_json())
  with pytest.raises(errors.ConfigMismatchError) as e:
    workdir_lock.check_resume(tiny_config(), str(tmp_path))
  assert str(e.value) == (
    f"{tmp_path} (checkpoint steps [3]) is an RL run (its config.json has an rl section): resume "
    "it with launch/rl.py, or train into another --workdir"
  )
  workdir_lock.check_resume(rl_run, str(tmp_path))  # its own kind: resumes
  (tmp_path / "config.json").write_text(tiny_config().to_json())
  with pytest.raises(
    errors.ConfigMismatchError, match=r"is a training run \(launch/train.py\), not"
  ):
    workdir_lock.check_resume(rl_run, str(tmp_path))


def test_structural_fields_and_absolute_paths(tmp_path, monkeypatch):
  old = tiny_config()
  assert workdir_lock.structural_changes(old, tiny_config(**{"model.dropout": 0.3})) == []
  assert workdir_lock.structural_changes(old, tiny_config(grad_clip_norm=0.5)) == []
  assert [c[0] for c in workdir_lock.structural_changes(old, tiny_config(grad_clip_norm=0.0))] == [
    "grad_clip_norm"
  ]  # removes an optimizer-chain element
  # Probe 18b: another RoPE base was applied on resume without a word (and config.json rewritten,
  # so the earlier steps were then decoded with it): not a shape, but what the parameters compute.
  for name, value in (("model.rope_base", 500.0), ("model.rms_norm_eps", 1e-5)):
    changed = workdir_lock.structural_changes(old, tiny_config(**{name: value}))
    assert [c[0] for c in changed] == [name], name
  monkeypatch.chdir(tmp_path)
  c = workdir_lock.absolute_paths(
    tiny_config(**{"data.paths": "a.txt, sub/b.txt", "data.eval_paths": "gs://bucket/v.txt"})
  )
  assert c.data.paths == f"{tmp_path}/a.txt,{tmp_path}/sub/b.txt"
  assert c.data.eval_paths == "gs://bucket/v.txt"
  # The stored absolute path equals the relative one given from the same directory.
  assert workdir_lock.structural_changes(c, tiny_config(**{"data.paths": "a.txt,sub/b.txt"})) == []


# ----------------------------------------------------------------------------- one trainer


def test_second_trainer_fails_at_once_with_the_pid(tmp_path, monkeypatch):
  workdir = str(tmp_path / "w")
  holder = subprocess.Popen(
    [sys.executable, "-c", HOLD, workdir],
    stdout=subprocess.PIPE,
    text=True,
    env=dict(os.environ, PYTHONPATH=REPO),
  )
  try:
    assert holder.stdout.readline().strip() == "locked"
    monkeypatch.setattr(jax, "jit", lambda *a, **k: pytest.fail("compiled something"))
    t0 = time.monotonic()
    with pytest.raises(errors.WorkdirInUseError, match=f"in use by pid {holder.pid} on "):
      train.train_and_evaluate(tiny_config(), workdir)
    print(f"second trainer refused after {time.monotonic() - t0:.3f}s")
    os.kill(holder.pid, signal.SIGKILL)  # kill -9: the kernel releases the lock
    holder.wait()
    with workdir_lock.WorkdirLock(workdir) as lock:  # free again, although the file remains
      assert lock._fd is not None
    with workdir_lock.WorkdirLock(workdir, process_index=1):  # per-process files
      with workdir_lock.WorkdirLock(workdir, process_index=0):
        pass
  finally:
    holder.kill()
    holder.wait()


def test_lock_is_released_after_an_error(tmp_path):
  workdir = str(tmp_path / "w")
  with pytest.raises(ValueError):
    with workdir_lock.WorkdirLock(workdir):
      raise ValueError("boom")
  fd = os.open(os.path.join(workdir, ".lock", "process_0.lock"), os.O_RDWR)
  fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # would raise if still held
  os.close(fd)


# ----------------------------------------------------------------------------- damaged checkpoints
def _truncate(path, size=16):
  with open(path, "r+b") as f:
    f.truncate(size)


def _truncate_data_files(ck):
  """Every OCDBT data file of the step (under state/**/d/) cut to 16 bytes."""
  files = [
    os.path.join(r, f)
    for r, _, fs in os.walk(os.path.join(ck, "state"))
    for f in fs
    if os.path.basename(r) == "d"
  ]
  assert files
  for f in files:
    _truncate(f)


def _garbage_inside_data_file(ck):
  """64 KiB of garbage (or half the file, if smaller) written inside the largest data file."""
  files = [
    os.path.join(r, f)
    for r, _, fs in os.walk(os.path.join(ck, "state"))
    for f in fs
    if os.path.basename(r) == "d"
  ]
  big = max(files, key=os.path.getsize)
  size = os.path.getsize(big)
  n = min(64 * 1024, size // 2)
  with open(big, "r+b") as f:
    f.seek(size // 4)
    f.write(os.urandom(n))
  assert os.path.getsize(big) == size


DAMAGE = {
  "garbage inside a data file": _garbage_inside_data_file,
  "truncated data files": _truncate_data_files,
  "deleted manifest": lambda ck: os.remove(os.path.join(ck, "state", "manifest.ocdbt")),
  "truncated _METADATA": lambda ck: _truncate(os.path.join(ck, "state", "_METADATA")),
  "deleted state/": lambda ck: shutil.rmtree(os.path.join(ck, "state")),
}


def damaged_copy(run_dir, tmp_path, kind, step=2):
  workdir = copy_run(run_dir, tmp_path, kind.replace(" ", "_").replace("/", ""))
  DAMAGE[kind](os.path.join(workdir, "checkpoints", str(step)))
  return workdir


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_inference_falls_back_past_a_damaged_latest_step(run_dir, tmp_path, kind, caplog):
  """sample, evaluate and export load through `load_inference_state`."""
  workdir = damaged_copy(run_dir, tmp_path, kind)
  state = workdir_lib.load_inference_state(workdir)
  assert state.step == 1
  warned = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
  assert warned and "step 2" in warned[0] and "falling back to step 1" in warned[0], warned
  if kind == "garbage inside a data file":  # named by the checksums, whatever orbax makes of it
    assert "differs from what was saved (checksum mismatch)" in warned[0], warned
    assert os.path.join(workdir, "checkpoints", "2", "state") in warned[0], warned
  with pytest.raises(errors.DamagedCheckpointError, match="step 2.*other steps there: \\[1\\]"):
    workdir_lib.load_inference_state(workdir, step=2)  # an explicit step never falls back


def test_inference_state_on_a_mesh(run_dir):
  """load_inference_state places the parameters with the training rules on the mesh it is given
  (the samplers then decode on that mesh: tests/test_decode_mesh.py)."""
  from setdiff_jax import sharding
  from setdiff_jax.sampling import placement

  plain = workdir_lib.load_inference_state(run_dir[0])
  state = workdir_lib.load_inference_state(run_dir[0], mesh_config=sharding.parse_mesh("fsdp=-1"))
  mesh = placement.mesh_of(state.params)
  assert dict(mesh.shape) == {"data": 1, "fsdp": 8, "tensor": 1}
  want = sharding.state_shardings(plain.params, mesh, sharding.rules_from_config(state.config))
  specs = []
  for x, y, s in zip(*(jax.tree_util.tree_leaves(t) for t in (state.params, plain.params, want))):
    assert x.sharding.is_equivalent_to(s, x.ndim)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    specs.append(x.sharding.spec)
  assert any("fsdp" in spec for spec in specs)  # the matrices are split, not replicated


@pytest.mark.slow
def test_train_and_sample_fall_back_past_a_truncated_latest_step(run_dir, tmp_path):
  from setdiff_jax import decoding

  workdir = damaged_copy(run_dir, tmp_path, "truncated data files")
  lines = []
  decoding.sample_from_workdir(
    workdir, num_samples=1, batch_size=1, max_new_tokens=2, warmup=False, write=lines.append
  )
  assert lines[0].startswith(f"workdir: {workdir}  step: 1  params: EMA"), lines[0]
  config = checkpointing.load_config(workdir)
  result = train.train_and_evaluate(config, workdir)  # resumes from 1, trains step 2 again
  assert result["step"] == 2
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["1", "2", "2.damaged"]
  assert workdir_lib.load_inference_state(workdir).step == 2


def _abstract(workdir, **model):
  config = checkpointing.load_config(workdir)
  config.model.update(model)
  tok = tokenizers.Tokenizer.load(os.path.join(workdir, tokenizers.TOKENIZER_SUBDIR))
  cfg = run_config.from_config_dict(config)
  model_cfg, _ = run_config.model_and_objective(cfg, tok)
  return jax.eval_shape(
    lambda: train_step.create_train_state(cfg.optimization, model_cfg, jax.random.key(0))
  )


def test_structure_mismatch_is_not_called_damage(run_dir):
  workdir = run_dir[0]
  manager = checkpointing.make_manager(workdir, with_data=False)
  try:
    with pytest.raises(errors.CheckpointStructureError) as e:
      checkpointing.restore(manager, _abstract(workdir, hidden_size=64))
  finally:
    checkpointing.close(manager)
  msg = str(e.value)
  assert "checkpoints/2 holds a different model/optimizer structure" in msg
  assert "params.blocks_0.attn_out.kernel: checkpoint (32, 32), config (64, 64)" in msg
  assert "files are intact" in msg
  assert not isinstance(e.value, errors.DamagedCheckpointError)


def test_missing_iterator_state_says_so(run_dir, tmp_path):
  workdir = copy_run(run_dir, tmp_path)
  manager = checkpointing.make_manager(workdir)
  abstract = _abstract(workdir)
  try:
    os.remove(os.path.join(workdir, "checkpoints", "2", "data", iterator_state.ITERATOR_FILE))
    iterator = _train_iterator(workdir)
    assert int(checkpointing.restore(manager, abstract, data_iterator=iterator).step) == 1
    os.remove(os.path.join(workdir, "checkpoints", "1", "data", iterator_state.ITERATOR_FILE))
    with pytest.raises(errors.MissingIteratorStateError) as e:
      checkpointing.restore(manager, abstract, data_iterator=iterator)
  finally:
    checkpointing.close(manager)
  assert "data-iterator state" in str(e.value) and f"--config.init_from={workdir}" in str(e.value)


def _train_iterator(workdir):
  from setdiff_jax.data import pipeline

  config = checkpointing.load_config(workdir)
  tok = tokenizers.Tokenizer.load(os.path.join(workdir, tokenizers.TOKENIZER_SUBDIR))
  return iter(
    pipeline.make_dataset(
      config.data,
      tok,
      split="train",
      seq_len=config.seq_len,
      global_batch_size=config.batch_size,
      seed=config.seed,
      shuffle=True,
      num_epochs=None,
      drop_remainder=True,
    )
  )


# ----------------------------------------------------------------------------- disk full
@pytest.mark.slow
def test_disk_full_during_save_keeps_the_previous_checkpoint(run_dir, tmp_path, monkeypatch):
  import errno
  import io

  from etils import epath

  from setdiff_jax import cli

  workdir = copy_run(run_dir, tmp_path)
  real = epath.Path.write_text

  def full(self, *args, **kwargs):  # every orbax metadata write of a checkpoint fails
    if f"{os.sep}checkpoints{os.sep}" in str(self):
      raise OSError(errno.ENOSPC, "No space left on device", str(self))
    return real(self, *args, **kwargs)

  monkeypatch.setattr(epath.Path, "write_text", full)
  config = checkpointing.load_config(workdir)
  config.num_train_steps = 3
  with pytest.raises(errors.DiskFullError) as e:
    train.train_and_evaluate(config, workdir)
  monkeypatch.setattr(epath.Path, "write_text", real)
  stream = io.StringIO()
  assert cli.report(e.value, stream) == 1
  lines = stream.getvalue().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: disk full while saving checkpoint 3")
  assert "the previous checkpoint (step 2) is intact" in lines[0]
  assert workdir_lib.load_inference_state(workdir).step == 2
  assert workdir_lock.saved_steps(workdir) == [1, 2]


# ----------------------------------------------------------------------------- small pieces
def test_import_names_a_hidden_size_mismatch(run_dir, tmp_path):
  from setdiff_jax.interop import export_workdir, import_checkpoint

  out = str(tmp_path / "hf")
  export_workdir(run_dir[0], out)
  path = os.path.join(out, "config.json")
  cfg = json.load(open(path))
  cfg["backbone_config"]["hidden_size"] = 64
  json.dump(cfg, open(path, "w"))
  with pytest.raises(
    ValueError,
    match=r"hidden size mismatch: .*hidden_size=64 but the weights "
    r"have hidden size 32",
  ):
    import_checkpoint(out)


def test_eta_counts_the_evals_and_saves_ahead():
  config = run_config.from_config_dict(tiny_config(eval_every_steps=10, checkpoint_every_steps=5))
  pauses = {"eval": [30.0, 2.0], "save": [1.0]}  # the first eval compiled: the latest counts
  # after step 12 of 30: evals at 20, 30 and saves at 15, 20, 25, 30
  assert train._pauses_ahead(config, 12, 30, pauses) == 2 * 2.0 + 4 * 1.0
  assert train._pauses_ahead(config, 12, 31, pauses) == 3 * 2.0 + 5 * 1.0  # + the final step
  assert train._pauses_ahead(config, 20, 30, pauses) == 2 * 2.0 + 3 * 1.0  # 20's still to come
  assert train._pauses_ahead(config, 30, 30, pauses) == 2.0 + 1.0


def test_a_step_deleted_while_it_is_read_is_read_again_or_named(run_dir, tmp_path, monkeypatch):
  """Probe 17b: load_inference_state on a run still training (keep_checkpoints=1) sometimes failed
  with a bare `FileNotFoundError: .../checkpoints/37`: retention deleted the newest step while
  orbax listed or read it. Simulated: while a step is read the run saves the next one and deletes
  it (a rename), and the read fails as orbax's does."""
  import errno

  from setdiff_jax.workdir import load

  real = load._restore_params_once
  calls, rotate_next = [], [True]

  def rotated_away(directory, abstract, step, use_ema, always=False):
    calls.append(step)
    steps = sorted(int(s) for s in os.listdir(directory))
    read = os.path.join(str(directory), str(steps[-1] if step is None else step))
    if always or rotate_next.pop():
      rotate_next.append(False)
      os.rename(read, os.path.join(str(directory), str(steps[-1] + 1)))
      raise FileNotFoundError(errno.ENOENT, "No such file or directory", read)
    return real(directory, abstract, step, use_ema)

  monkeypatch.setattr(load, "_restore_params_once", rotated_away)
  workdir = copy_run(run_dir, tmp_path, "rotating")
  assert workdir_lib.load_inference_state(workdir).step == 3  # 2 went, 3 came: the newest again
  assert calls == [None, None]
  step_1 = os.path.join(workdir, "checkpoints", "1")
  rotate_next[:] = [True]
  with pytest.raises(errors.CheckpointError) as e:  # an explicit step is not swapped for another
    workdir_lib.load_inference_state(workdir, step=1)
  assert str(e.value).startswith(f"checkpoint {step_1} was deleted while it was read: the run")
  assert str(e.value).endswith("pass a --step it still keeps, or leave --step out for its newest")
  # a run rotating faster than it can be read: bounded, then named
  calls.clear()
  monkeypatch.setattr(load, "_restore_params_once", lambda *a: rotated_away(*a, always=True))
  with pytest.raises(errors.CheckpointError, match="happened 3 times in a row: read it once"):
    workdir_lib.load_inference_state(copy_run(run_dir, tmp_path, "rotating_fast"))
  assert len(calls) == load.RESTORE_ATTEMPTS
  # a missing file elsewhere is not taken for retention
  elsewhere = FileNotFoundError(errno.ENOENT, "No such file or directory", str(tmp_path / "x"))
  monkeypatch.setattr(load, "_restore_params_once", lambda *a: (_ for _ in ()).throw(elsewhere))
  with pytest.raises(FileNotFoundError):
    workdir_lib.load_inference_state(copy_run(run_dir, tmp_path, "other"))
