"""experiments.rerun given inputs it must refuse or handle: two reruns at once, a benchmark that
fails after writing its record, --set / --unset of the record's own flags, of switches and of
absent flags, a command without an output folder, relative paths git does not track, values in
capitals that are not placeholders, and a NAME that is a path. Each runs a fake benchmark in a
temporary git repository on main, as tests/test_experiments.py does."""

import json
import os
import subprocess
import sys
import time

import pytest

from setdiff_jax.experiments import rerun

FAKE = """
import argparse, os, sys, time
from setdiff_jax.experiments import record
ap = argparse.ArgumentParser()
for flag in ("--seed", "--out", "--record", "--data", "--sleep", "--crash", "--intrude"):
  ap.add_argument(flag)
ap.add_argument("--images", type=int, default=0)
a = ap.parse_args()
os.makedirs(a.out)  # fails on an older run's folder
if a.sleep:  # a long run: another rerun starts meanwhile
  open(os.path.join(a.out, "started"), "w").write("")
  time.sleep(float(a.sleep))
images = {}
for k in range(a.images):
  images[f"p{k}.png"] = os.path.join(a.out, f"p{k}.png")
  open(images[f"p{k}.png"], "wb").write(b"PNG %d" % k)
report = {
  "command": "python -m benchmarks.fake " + " ".join(sys.argv[1:]),
  "markdown": "## fake\\n\\n" + "".join(f"![p]({n})\\n" for n in images),
  "seed": a.seed,
  "data": open(a.data).read() if a.data else None,
}
if a.intrude:  # a record of that name appears in the checkout while this runs
  open(a.intrude, "w").write('{"name": "intruder"}')
record.publish_report(report, a.record, "benchmarks/results", ["code.py"], images=images)
if a.crash:
  sys.exit("plotting failed after the record was written")
"""


def _git(repo, *args):
  return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True)


@pytest.fixture
def repo(tmp_path):
  """A git repository on main holding code.py, the fake benchmark and a git-ignored runs/."""
  r = tmp_path / "repo"
  (r / "benchmarks" / "results").mkdir(parents=True)
  _git(r, "init", "-q", "-b", "main")
  _git(r, "config", "user.email", "t@t")
  _git(r, "config", "user.name", "t")
  (r / "code.py").write_text("x = 1\n")
  (r / ".gitignore").write_text("runs/\n")
  (r / "benchmarks" / "__init__.py").write_text("")
  (r / "benchmarks" / "fake.py").write_text(FAKE)
  _git(r, "add", "-A")
  _git(r, "commit", "-q", "-m", "fake benchmark")
  return r


def _old(repo, flags, name="fake"):
  """The record `name` of the fake benchmark run with `flags` (as a record holds its command)."""
  command = f"python -m benchmarks.fake {flags} --record={name}"
  path = repo / "benchmarks" / "results" / f"{name}.json"
  path.write_text(json.dumps({"name": name, "command": command, "seed": "1", "data": None}))


def _results(repo):
  return sorted(os.listdir(repo / "benchmarks" / "results"))


def _worktrees(repo):
  return len(_git(repo, "worktree", "list").stdout.strip().splitlines())


def _main(repo, monkeypatch, capsys, *args):
  """(exit status, the one stderr line) of `python -m setdiff_jax.experiments.rerun ARGS`."""
  monkeypatch.chdir(repo)
  status = rerun.main(list(args))
  lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: "), lines
  return status, lines[0]


def test_two_reruns_at_once_take_two_names(repo, tmp_path):
  """Finding 4: the second rerun of a record started while the first runs took the same `_r2`
  name, and the one that finished last replaced the other's record."""
  _old(repo, "--seed=1 --out=OUT")
  first = subprocess.Popen(
    [sys.executable, "-m", "setdiff_jax.experiments.rerun", "fake", "--set", "sleep=4"]
    + [f"--scratch={tmp_path / 'a'}"],
    cwd=repo,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  try:
    started = tmp_path / "a" / "fake_r2" / "out" / "started"
    deadline = time.time() + 60
    while not started.exists() and time.time() < deadline and first.poll() is None:
      time.sleep(0.1)
    assert started.exists(), first.communicate(timeout=30)[0]
    second = rerun.rerun("fake", str(repo), {"seed": "2"}, scratch=str(tmp_path / "b"))
    assert second == "fake_r3"
    out = first.communicate(timeout=120)[0]
  finally:
    if first.poll() is None:
      first.kill()
      first.wait()
  assert first.returncode == 0, out
  results = repo / "benchmarks" / "results"
  assert json.loads((results / "fake_r2.json").read_text())["seed"] == "1"
  assert json.loads((results / "fake_r3.json").read_text())["seed"] == "2"
  assert _results(repo) == ["fake.json", "fake_r2.json", "fake_r3.json"]  # no claim left


def test_the_copy_never_replaces_a_record(repo, tmp_path, monkeypatch, capsys):
  """Finding 4: a record of the new name that appears while the rerun runs is kept; the rerun's
  record stays in its scratch folder, and the error says where."""
  _old(repo, "--seed=1 --out=OUT")
  intruder = repo / "benchmarks" / "results" / "fake_r2.json"
  status, line = _main(
    repo, monkeypatch, capsys, "fake", "--set", f"intrude={intruder}", f"--scratch={tmp_path}/s"
  )
  assert status == 2 and "appeared in" in line and f"{tmp_path}/s/fake_r2/record" in line
  assert json.loads(intruder.read_text()) == {"name": "intruder"}
  kept = json.loads((tmp_path / "s" / "fake_r2" / "record" / "fake_r2.json").read_text())
  assert kept["name"] == "fake_r2" and _worktrees(repo) == 1


def test_a_record_written_before_a_failing_exit_is_kept(repo, tmp_path, monkeypatch, capsys):
  """Finding 5: a benchmark that wrote its record (and its images) and then exited non-zero lost
  them with the worktree, while the error said it wrote its record."""
  _old(repo, "--seed=1 --out=OUT --crash=1 --images=2")
  status, line = _main(repo, monkeypatch, capsys, "fake", f"--scratch={tmp_path}/s")
  kept = tmp_path / "s" / "fake_r2" / "record"
  assert status == 2 and "status 1 after writing its record: kept in" in line and str(kept) in line
  new = json.loads((kept / "fake_r2.json").read_text())
  images = sorted(fn for fn in os.listdir(kept) if fn.endswith(".png"))
  assert new["name"] == "fake_r2" and len(images) == 2, os.listdir(kept)
  assert all(f"]({fn})" in new["markdown"] for fn in images)  # the images the record links
  assert sorted((kept / fn).read_bytes() for fn in images) == [b"PNG 0", b"PNG 1"]
  assert _results(repo) == ["fake.json"] and _worktrees(repo) == 1
  assert not (tmp_path / "s" / "fake_r2" / "tree").exists()


@pytest.mark.parametrize(
  "args",
  [
    ("--set", "record=fake_seed1"),
    ("--unset", "record"),
    ("--set", "results_dir=ELSEWHERE"),
    ("--unset", "results_dir"),
  ],
)
def test_the_record_name_and_folder_are_not_set(repo, tmp_path, monkeypatch, capsys, args):
  """Finding 6: `--set record=` (or results_dir) made the benchmark write its record elsewhere,
  and the rerun removed it with the worktree; refused before anything runs, pointing to --as."""
  _old(repo, "--seed=1 --out=OUT")
  args = [a.replace("ELSEWHERE", str(tmp_path / "elsewhere")) for a in args]
  status, line = _main(repo, monkeypatch, capsys, "fake", *args, f"--scratch={tmp_path}/s")
  assert status == 2 and "--as NEW" in line, line
  assert not (tmp_path / "s").exists() and _results(repo) == ["fake.json"]


def test_a_commands_results_dir_is_left_out():
  """Finding 6: the record is taken from the worktree's benchmarks/results: a --results_dir of
  the record's command (`RESULTS`, `/tmp/x/results`, `none`) is not passed on."""
  for value in ("RESULTS", "/tmp/nowhere/results", "none"):
    argv = rerun.plan_command(
      f"python -m benchmarks.x --out=OUT --results_dir={value} --record=x", "x_r2", "/s/o", {}
    )
    assert argv[1:] == ["-m", "benchmarks.x", "--out=/s/o", "--record=x_r2"]


def test_a_command_without_an_output_folder_is_refused(repo, tmp_path, monkeypatch, capsys):
  """Finding 7: a record made with the benchmark's default output folder reran into that default
  (an older run's caches, or a folder in the worktree that was removed with it)."""
  _old(repo, "--seed=2")
  status, line = _main(repo, monkeypatch, capsys, "fake", f"--scratch={tmp_path}/s")
  assert status == 2 and f"--set output_dir={tmp_path}/s/fake_r2/out" in line, line
  assert not (tmp_path / "s").exists()
  with pytest.raises(rerun.RerunError, match="no output folder"):  # unset: the same
    rerun.plan_command("python -m benchmarks.x --out=OUT", "x_r2", "/s/o", {}, ["out"])
  argv = rerun.plan_command("python -m benchmarks.x --seed=2", "x_r2", "/s/o", {"out": "/s/o"})
  assert argv[1:] == ["-m", "benchmarks.x", "--seed=2", "--out=/s/o", "--record=x_r2"]
  # with the flag given, the rerun runs and keeps its output folder
  status = rerun.main(["fake", "--set", f"out={tmp_path}/o2", f"--scratch={tmp_path}/s"])
  assert status == 0 and (tmp_path / "o2").is_dir() and "fake_r2.json" in _results(repo)


def test_set_gives_a_switch_its_value_and_unset_names_a_flag_of_the_command():
  """Finding 9: `--set quick=2` was dropped for a flag written bare (`--quick`), and `--unset`
  of a flag the command does not have (a typo) was accepted without a word."""
  command = "python -m benchmarks.x --quick --seed=1 --out=OUT"
  argv = rerun.plan_command(command, "x_r2", "/s/o", {"quick": "2", "lr": "3e-4"})
  assert argv[1:] == [
    "-m",
    "benchmarks.x",
    "--quick=2",
    "--seed=1",
    "--out=/s/o",
    "--lr=3e-4",  # a flag the command lacks is added: how a default changes
    "--record=x_r2",
  ]
  for off in ("false", "0", "off", ""):
    with pytest.raises(rerun.RerunError, match="switch.*leave it out with --unset quick"):
      rerun.plan_command(command, "x_r2", "/s/o", {"quick": off})
  with pytest.raises(rerun.RerunError, match="no --report-only.*--quick, --seed, --out"):
    rerun.plan_command(command, "x_r2", "/s/o", {}, ["report-only"])
  with pytest.raises(rerun.RerunError, match="give one of them"):
    rerun.plan_command(command, "x_r2", "/s/o", {"seed": "2"}, ["seed"])
  argv = rerun.plan_command(command, "x_r2", "/s/o", {}, ["quick"])
  assert "--quick" not in argv


def test_a_relative_input_git_does_not_track_is_asked_for(repo, tmp_path, monkeypatch, capsys):
  """Finding 16: `--data=runs/data.txt` (a git-ignored file of the checkout, made relative by
  `provenance.public_command`) was not asked for; the run started in the worktree, which lacks it,
  and failed there."""
  (repo / "runs").mkdir()
  (repo / "runs" / "data.txt").write_text("ignored data")
  _old(repo, "--seed=1 --out=OUT --data=runs/data.txt")
  status, line = _main(repo, monkeypatch, capsys, "fake", f"--scratch={tmp_path}/s")
  assert status == 2 and "--data=runs/data.txt (not tracked by git" in line, line
  assert "--set data=PATH" in line and not (tmp_path / "s").exists()
  data = repo / "runs" / "data.txt"
  assert rerun.main(["fake", "--set", f"data={data}", f"--scratch={tmp_path}/s"]) == 0
  new = json.loads((repo / "benchmarks" / "results" / "fake_r2.json").read_text())
  assert new["data"] == "ignored data"
  # missing from the checkout too, inside a folder it holds: asked for as well
  _old(repo, "--seed=1 --out=OUT --data=runs/gone.txt", name="gone")
  with pytest.raises(rerun.RerunError, match="--set data=PATH"):
    rerun.rerun("gone", str(repo), dry_run=True)
  # tracked files, and values that only look like paths, run as they are
  _old(repo, "--seed=1 --out=OUT --data=code.py --grid=threshold:off/0.9/0.5", name="tracked")
  assert rerun.rerun("tracked", str(repo), dry_run=True) is None
  said = capsys.readouterr().out
  assert "--data=code.py --grid=threshold:off/0.9/0.5" in said


def test_only_the_placeholder_forms_records_write_are_asked_for():
  """Finding 18: any value in capitals (`--dtype=BF16`) was taken for a path placeholder.
  Placeholders are the flag's name in capitals (`provenance.public_command`), or capitals for a
  flag named as a path (older records' `--sft_workdirs=SFT0,SFT1`)."""
  command = "python -m benchmarks.x --dtype=BF16 --task=GSM8K --methods=AR,MDLM --out=OUT"
  argv = rerun.plan_command(command, "x_r2", "/s/o", {})
  assert "--dtype=BF16" in argv and "--task=GSM8K" in argv and "--methods=AR,MDLM" in argv
  for flags, asks in (
    ("--official_dir=OFFICIAL_DIR", "official_dir"),
    ("--tuned_dirs=TUNED_DIRS,data/a", "tuned_dirs"),
    ("--data.paths=DATA_PATHS", "data.paths"),
    ("--sft_workdirs=SFT0,SFT1,-", "sft_workdirs"),
  ):
    with pytest.raises(rerun.RerunError, match=f"--set {asks}=PATH"):
      rerun.plan_command(f"python -m benchmarks.x {flags} --out=OUT", "x_r2", "/s/o", {})


@pytest.mark.parametrize("name", ["../../../a", "../fake", "../results/fake", "/etc/passwd"])
def test_the_record_to_rerun_is_a_plain_name(repo, tmp_path, monkeypatch, capsys, name):
  """Finding 18: the NAME argument was joined to benchmarks/results as it came (`../../x`
  read a JSON outside it)."""
  _old(repo, "--seed=1 --out=OUT")
  (tmp_path / "a.json").write_text(json.dumps({"command": "python -m benchmarks.fake --out=O"}))
  (repo / "benchmarks" / "fake.json").write_text((tmp_path / "a.json").read_text())
  status, line = _main(repo, monkeypatch, capsys, name, "--as", "zz", "--dry_run")
  assert status == 2 and f"record name {name!r}" in line, line


def test_a_set_flag_the_benchmark_lacks_is_refused_before_anything_runs(
  repo, tmp_path, monkeypatch, capsys
):
  """Probe F4: `--set sede=2` (misspelt) made a worktree and ran the benchmark, whose error said
  only "see log.txt"; now refused at once, naming the benchmark's own flags (learnt from its
  parser: --images is one though the command lacks it). A run that fails quotes its log's last
  line."""
  _old(repo, "--seed=1 --out=OUT")
  status, line = _main(
    repo, monkeypatch, capsys, "fake", "--set", "sede=2", f"--scratch={tmp_path}/s"
  )
  assert status == 2 and "--set sede=2" in line and "did you mean --seed?" in line, line
  assert "--images" in line and "--crash" in line
  assert not (tmp_path / "s").exists() and _results(repo) == ["fake.json"] and _worktrees(repo) == 1
  assert (
    rerun.rerun("fake", str(repo), {"images": "1"}, scratch=str(tmp_path / "d"), dry_run=True)
    is None
  )
  status, line = _main(
    repo, monkeypatch, capsys, "fake", "--set", "images=x", f"--scratch={tmp_path}/s"
  )
  log = tmp_path / "s" / "fake_r2" / "log.txt"
  assert status == 2 and "argument --images: invalid int value: 'x'" in line and str(log) in line
