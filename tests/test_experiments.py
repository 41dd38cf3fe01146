"""The experiments library: records only from clean commits on main and never over another
record; the hierarchical (seeds, then problems) bootstrap against an exact enumeration and
against the flat one; Holm's adjustment against a hand-worked example."""

import itertools
import json
import subprocess

import numpy as np
import pytest

from helpers import git as _git, git_repo
from setdiff_jax.experiments import provenance, record, stats

DEVICE = {"backend": "cpu", "cpu": "test", "cpu_count": 1}


@pytest.fixture
def repo(tmp_path):
  """A git repository on branch main with one commit, and an empty results folder."""
  r = git_repo(tmp_path / "repo")
  (r / "results").mkdir()
  return r


def _create(repo, name="run_a", **kw):
  return record.RunRecord.create(
    name=name,
    results_dir=str(repo / "results"),
    command="python bench.py --x=1",
    config=kw.pop("config", {"lr": 2e-3}),
    seeds=[0, 1],
    measured_paths=["code.py"],
    device=DEVICE,
    **kw,
  )


def test_a_record_holds_commit_command_config_seeds_outcomes(repo):
  rec = _create(repo)
  rec.add_outcomes("a", 0, ["p1", "p2"], [1, 0], seconds=[0.5, 0.25])
  rec.add_outcomes("a", 1, ["p2", "p1"], [1, 1])
  rec.set_timing("train_seconds", 12.0)
  rec.save()
  data = json.loads((repo / "results" / "run_a.json").read_text())
  head = subprocess.run(
    ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True
  ).stdout.strip()
  assert data["commit"] == head and data["command"] == "python bench.py --x=1"
  assert data["config"] == {"lr": 2e-3} and data["seeds"] == [0, 1]
  assert data["device"] == DEVICE and data["measured_paths"] == ["code.py"] and data["date"]
  assert data["outcomes"][0]["seconds"] == [0.5, 0.25]
  # problems are aligned by id across seeds (the paired bootstrap's precondition)
  np.testing.assert_array_equal(rec.matrix("a"), [[1, 0], [1, 1]])
  with pytest.raises(record.RecordError, match="already recorded"):
    rec.add_outcomes("a", 0, ["p1"], [1])


def test_a_dirty_tree_refuses(repo):
  (repo / "code.py").write_text("x = 2\n")
  with pytest.raises(record.RecordError, match="uncommitted changes.*code.py"):
    _create(repo)
  assert not (repo / "results" / "run_a.json").exists()
  _git(repo, "checkout", "code.py")
  (repo / "new_module.py").write_text("y = 1\n")  # untracked code counts too
  with pytest.raises(record.RecordError, match="new_module.py"):
    _create(repo)


def test_a_commit_off_main_refuses(repo):
  _git(repo, "checkout", "-q", "-b", "side")
  (repo / "code.py").write_text("x = 3\n")
  _git(repo, "commit", "-qam", "side")
  with pytest.raises(record.RecordError, match="not on main's history"):
    _create(repo)
  _git(repo, "checkout", "-q", "main")
  _git(repo, "merge", "-q", "side")
  assert _create(repo).data["commit"]  # merged: now reachable


def test_an_existing_name_refuses_unless_resumed(repo):
  rec = _create(repo)
  rec.add_outcomes("a", 0, ["p1"], [1])
  rec.save()
  with pytest.raises(record.RecordError, match="exists"):
    _create(repo)
  again = _create(repo, resume=True)
  assert again.has("a", 0) and not again.has("a", 1)
  with pytest.raises(record.RecordError, match="another config"):
    _create(repo, resume=True, config={"lr": 1e-3})
  (repo / "code.py").write_text("x = 4\n")
  _git(repo, "commit", "-qam", "two")
  with pytest.raises(record.RecordError, match="one commit"):
    _create(repo, resume=True)
  with pytest.raises(record.RecordError, match="record name"):
    _create(repo, name="Bad Name")


def test_bootstrap_matches_an_exact_enumeration():
  """2 seeds x 3 shared problems: all 2^2 seed draws x 3^3 problem draws are equally likely;
  the bootstrap's mean and variance of the grand mean match the enumeration's."""
  x = np.array([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
  exact = []
  for s in itertools.product(range(2), repeat=2):
    for p in itertools.product(range(3), repeat=3):
      exact.append(x[np.ix_(s, p)].mean())
  exact = np.array(exact)
  draws = stats.hierarchical_bootstrap([x], np.mean, n_boot=20000, seed=1)
  assert abs(draws.mean() - exact.mean()) < 0.01
  assert abs(draws.var() - exact.var()) < 0.1 * exact.var()
  # per-seed problems (nested): 2^2 seed draws x (3^3)^2 problem draws, enumerated by seed row
  per_row = [
    np.array([x[r, list(p)].mean() for p in itertools.product(range(3), repeat=3)])
    for r in range(2)
  ]
  nested = np.array(
    [
      (per_row[a][:, None] + per_row[b][None, :]).ravel() / 2
      for a, b in itertools.product(range(2), repeat=2)
    ]
  ).ravel()
  draws = stats.hierarchical_bootstrap([x], np.mean, n_boot=20000, seed=2, problems="per_seed")
  assert abs(draws.var() - nested.var()) < 0.1 * nested.var()


def test_the_interval_widens_with_seed_variance_where_the_flat_one_does_not():
  rng = np.random.default_rng(0)
  n_p = 400
  # three training runs of very different quality, the same 400 problems
  seedy = np.stack([rng.random(n_p) < q for q in (0.3, 0.6, 0.9)]).astype(float)
  # the same cells with the seed structure removed (shuffled across seeds)
  mixed = rng.permutation(seedy.ravel()).reshape(seedy.shape)
  width = lambda d: np.subtract(*np.percentile(d, [97.5, 2.5]))
  flat_seedy = width(stats.flat_bootstrap([seedy], np.mean, 2000))
  flat_mixed = width(stats.flat_bootstrap([mixed], np.mean, 2000))
  hier_seedy = width(stats.hierarchical_bootstrap([seedy], np.mean, 2000))
  hier_mixed = width(stats.hierarchical_bootstrap([mixed], np.mean, 2000))
  assert abs(flat_seedy - flat_mixed) < 0.15 * flat_mixed  # the flat one cannot see seeds
  assert hier_seedy > 4 * flat_seedy  # three runs spread 0.3..0.9: the mean is barely known
  assert hier_mixed < 1.6 * flat_mixed  # no seed effect: about the flat width (two-way: <= 2x)


def test_paired_difference_uses_the_same_indices():
  rng = np.random.default_rng(1)
  a = (rng.random((3, 200)) < 0.7).astype(float)
  shift = stats.paired_difference(a + 0.1, a, n_boot=500)
  assert shift["point"] == pytest.approx(0.1)
  assert shift["lo"] == pytest.approx(0.1) and shift["hi"] == pytest.approx(0.1)
  assert shift["p"] == 0.0
  same = stats.paired_difference(a, a, n_boot=200)
  assert same["lo"] == same["hi"] == 0.0 and same["p"] == 1.0
  with pytest.raises(ValueError, match="same seeds x problems"):
    stats.paired_difference(a, a[:, :10])


def test_holm_against_a_hand_worked_example():
  # sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04 -> max(0.06, 0.04)
  adj = stats.holm([0.01, 0.04, 0.03, 0.005])
  np.testing.assert_allclose(adj, [0.03, 0.06, 0.06, 0.02])
  assert list(adj <= 0.05) == [True, False, False, True]
  np.testing.assert_allclose(stats.holm([0.5, 0.6]), [1.0, 1.0])
  with pytest.raises(ValueError):
    stats.holm([1.5])


def test_p_value_is_two_sided():
  assert stats.p_value(np.array([1.0, 2.0, 3.0, -1.0])) == pytest.approx(0.5)
  assert stats.p_value(np.array([1.0, 2.0])) == 0.0


def test_publish_report_stamps_the_commit_and_never_overwrites(repo, tmp_path):
  png = tmp_path / "plot.png"
  png.write_bytes(b"\x89PNG")
  report = {"command": "python -m benchmarks.x", "markdown": "## T\n\n![p](x.png)\n", "v": 1}
  path = record.publish_report(
    report, "t_one", str(repo / "results"), ["code.py"], {"x.png": str(png)}
  )
  data = json.loads(open(path).read())
  assert len(data["commit"]) == 40 and data["measured_paths"] == ["code.py"] and data["date"]
  assert (
    data["markdown"] == "## T\n\n![p](t_one.png)\n" and (repo / "results" / "t_one.png").exists()
  )
  with pytest.raises(record.RecordError, match="exists"):
    record.publish_report(report, "t_one", str(repo / "results"), ["code.py"])
  record.publish_report(dict(report, v=2), "t_one", str(repo / "results"), ["code.py"], resume=True)
  assert json.loads(open(path).read())["v"] == 2
  with pytest.raises(record.RecordError, match="no 'markdown'"):
    record.publish_report({"v": 1}, "t_two", str(repo / "results"), ["code.py"])
  (repo / "code.py").write_text("x = 5\n")
  with pytest.raises(record.RecordError, match="uncommitted"):
    record.publish_report(report, "t_three", str(repo / "results"), ["code.py"])


def test_a_record_never_holds_this_machines_paths(repo, tmp_path):
  """tuned_baselines wrote its --output_dir (a scratch folder of the machine that ran it) into
  the record and its tables. Flag paths outside the checkout become the flag's name, paths
  inside it relative ones, item by item in a comma list; other words are left as they are."""
  inside = repo / "data" / "a.txt"
  raw = (
    f"python -m benchmarks.x --output_dir={tmp_path}/scratch/run1 --tuned_dirs={tmp_path}/a,"
    f"{inside} --data.paths={inside} --seeds=0,1 --name=/not/a/flag/value --official_dir=OFFICIAL"
  )
  public = (
    "python -m benchmarks.x --output_dir=OUTPUT_DIR --tuned_dirs=TUNED_DIRS,data/a.txt "
    "--data.paths=data/a.txt --seeds=0,1 --name=NAME --official_dir=OFFICIAL"
  )
  assert provenance.public_command(raw, str(repo)) == public
  report = {"command": raw, "markdown": f"## T\n\nCommand: `{raw}`\n"}
  data = json.loads(
    open(record.publish_report(report, "t_p", str(repo / "results"), ["code.py"])).read()
  )
  assert data["command"] == public and data["markdown"] == f"## T\n\nCommand: `{public}`\n"
  rec = record.RunRecord.create(
    name="t_q",
    results_dir=str(repo / "results"),
    command=raw,
    config={},
    seeds=[0],
    measured_paths=["code.py"],
    device=DEVICE,
  )
  assert rec.data["command"] == public and str(tmp_path) not in open(rec.path).read()


def test_a_record_that_cannot_be_written_is_refused_before_the_run(repo, monkeypatch):
  """`check_publishable` refuses what `publish_report` would (an existing name, a dirty tree), and
  a benchmark given such a --record stops before it measures anything (a 1319-row run once ended
  in that refusal after its tables were done)."""
  from benchmarks import continuous_batching

  results = str(repo / "results")
  report = {"command": "python -m benchmarks.x", "markdown": "## T\n"}
  record.check_publishable("t_new", results)  # nothing in the way
  record.publish_report(report, "t_one", results, ["code.py"])
  with pytest.raises(record.RecordError, match="exists"):
    record.check_publishable("t_one", results)
  record.check_publishable("t_one", results, resume=True)  # a re-report of the same commit
  with pytest.raises(record.RecordError, match="record name"):
    record.check_publishable("Bad Name", results)
  (repo / "code.py").write_text("x = 5\n")
  with pytest.raises(record.RecordError, match="uncommitted"):
    record.check_publishable("t_two", results)

  def measured(*a, **k):
    raise AssertionError("the benchmark ran before its record was checked")

  monkeypatch.setattr(continuous_batching, "run", measured)
  with pytest.raises(record.RecordError, match="uncommitted"):
    continuous_batching.main(
      ["--quick", "--record=t_three", f"--results_dir={results}", f"--out={repo.parent / 'out'}"]
    )


def test_t_distribution_against_printed_tables():
  # two-sided 95 % critical values from a printed t table (Fisher & Yates), and the normal limit
  for df, crit in ((1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (10, 2.228), (30, 2.042)):
    assert stats.t_quantile(0.975, df) == pytest.approx(crit, abs=6e-4)
  assert stats.t_quantile(0.975, 5000) == pytest.approx(1.960, abs=1e-3)
  assert stats.t_cdf(1.0, 1) == pytest.approx(0.75)  # Cauchy: 1/2 + atan(1)/pi
  assert stats.t_cdf(0.0, 7) == 0.5 and stats.t_cdf(-2.0, 3) == pytest.approx(1 - stats.t_cdf(2, 3))
  # df = 2 has a closed form: F(x) = 1/2 + x / (2 sqrt(2 + x^2))
  for x in (-3.0, 0.4, 9.0):
    assert stats.t_cdf(x, 2) == pytest.approx(0.5 + x / (2 * (2 + x * x) ** 0.5), abs=1e-12)
  with pytest.raises(ValueError):
    stats.t_quantile(1.0, 3)


def test_seed_intervals_by_hand():
  # mean 5.2, sample std 0.2, half width 4.303 * 0.2 / sqrt(3) = 0.4968
  s = stats.seed_summary([5.0, 5.2, 5.4])
  assert s["mean"] == pytest.approx(5.2) and s["std"] == pytest.approx(0.2) and s["n"] == 3
  assert (s["lo"], s["hi"]) == pytest.approx((5.2 - 0.49683, 5.2 + 0.49683), abs=1e-4)
  # differences 1, 0.9, 0.9: mean 0.9333, std 0.0577, t = 28.0 on 2 df -> p = 0.00127
  d = stats.paired_seed_difference([5.0, 5.2, 5.4], [4.0, 4.3, 4.5])
  assert d["point"] == pytest.approx(0.93333, abs=1e-5)
  assert d["p"] == pytest.approx(2 * (1 - (0.5 + 28.0 / (2 * (2 + 28.0**2) ** 0.5))), rel=1e-3)
  assert stats.paired_seed_difference([1, 2, 3], [0, 1, 2])["p"] == 0.0  # a constant shift
  assert stats.paired_seed_difference([1, 2, 3], [1, 2, 3])["p"] == 1.0
  with pytest.raises(ValueError, match=">= 2"):
    stats.seed_summary([1.0])


FAKE_BENCHMARK = """
import argparse, os, sys, time
from setdiff_jax.experiments import record
ap = argparse.ArgumentParser()
for flag in ("--seed", "--out", "--record", "--data", "--sleep"):
  ap.add_argument(flag)
a = ap.parse_args()
os.makedirs(a.out)  # fails on an older run's folder
open(os.path.join(a.out, "shared.txt"), "w").write(open("../shared/data.txt").read())
if a.sleep:  # a long run, to be stopped
  open(os.path.join(a.out, "pid"), "w").write(str(os.getpid()))
  time.sleep(float(a.sleep))
open(os.path.join(a.out, "cwd.txt"), "w").write(os.getcwd())
code = open("code.py").read()
report = {
  "command": "python -m benchmarks.fake " + " ".join(sys.argv[1:]),
  "markdown": "## fake\\n",
  "outcomes": [(int(a.seed) * 7 + i) % 3 for i in range(5)],
  "code": code,
  "total_seconds": float(len(os.environ.get("PYTHONPATH", ""))),
}
record.publish_report(report, a.record, "benchmarks/results", ["code.py"])
"""


def test_rerun_regenerates_a_record_at_head_and_compares_it(repo, tmp_path, capsys):
  """experiments.rerun end to end on a fake benchmark: the rerun runs HEAD's files from a clean
  worktree (not this checkout's), in a fresh output folder, as the next name of the series,
  and says whether every value came out again; a dirty checkout, a name taken and a
  placeholder path without --set are refused before anything runs; the worktree is removed."""
  from setdiff_jax.experiments import rerun

  (repo / "benchmarks" / "results").mkdir(parents=True)
  (repo / "benchmarks" / "fake.py").write_text(FAKE_BENCHMARK)
  (repo.parent / "shared").mkdir()  # data beside the checkout, read as ../shared
  (repo.parent / "shared" / "data.txt").write_text("beside")
  _git(repo, "add", "benchmarks/fake.py")
  _git(repo, "commit", "-q", "-m", "fake benchmark")
  first = ["-m", "benchmarks.fake", "--seed=1", f"--out={tmp_path}/o1", "--record=fake"]
  subprocess.run([rerun.sys.executable, *first], cwd=repo, check=True)
  old = json.loads((repo / "benchmarks" / "results" / "fake.json").read_text())
  assert old["command"] == "python -m benchmarks.fake --seed=1 --out=OUT --record=fake"

  scratch = tmp_path / "scratch"
  assert rerun.rerun("fake", str(repo), scratch=str(scratch)) == "fake_r2"
  new = json.loads((repo / "benchmarks" / "results" / "fake_r2.json").read_text())
  assert new["outcomes"] == old["outcomes"] and new["commit"] == old["commit"]
  # the record written in the worktree and copied in keeps its seal (publish takes it)
  record.check_seal(str(repo / "benchmarks" / "results" / "fake_r2.json"), new)
  assert "every one of the 6 values (timings apart) equals `fake`'s" in capsys.readouterr().out
  assert (scratch / "fake_r2" / "out" / "cwd.txt").read_text() == str(scratch / "fake_r2" / "tree")
  assert (scratch / "fake_r2" / "out" / "shared.txt").read_text() == "beside"
  assert (scratch / "fake_r2" / "log.txt").exists() and not (scratch / "fake_r2" / "tree").exists()
  worktrees = subprocess.run(
    ["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True
  ).stdout
  assert len(worktrees.strip().splitlines()) == 1, worktrees

  # A committed change runs; an uncommitted one is refused (it would not run).
  (repo / "code.py").write_text("x = 2\n")
  with pytest.raises(record.RecordError, match="uncommitted"):
    rerun.rerun("fake_r2", str(repo), scratch=str(scratch))
  _git(repo, "commit", "-q", "-am", "code changes")
  assert rerun.rerun("fake_r2", str(repo), scratch=str(scratch)) == "fake_r3"
  said = capsys.readouterr().out
  assert "1 of the 6 values (timings apart) differ from `fake_r2`'s (first: `code`" in said
  with pytest.raises(rerun.RerunError, match="exists"):
    rerun.rerun("fake", str(repo), new_name="fake_r2", scratch=str(scratch))

  with pytest.raises(rerun.RerunError, match="--set data=PATH"):
    rerun.plan_command("python benchmarks/fake.py --seed=0 --data=DATA", "f_r2", "/s/o", {})
  argv = rerun.plan_command(
    "python benchmarks/fake.py --seed=0 --out=DIR/agg --data=DATA --record=f --report_only",
    "f_r2",
    "/s/o",
    {"data": "/d", "seed": "3"},
    unset=["report_only"],
  )
  assert argv[1:] == [
    "-m",
    "benchmarks.fake",
    "--seed=3",
    "--out=/s/o/agg",
    "--data=/d",
    "--record=f_r2",
  ]
  assert rerun.next_name("x_r2", ["x_r3"]) == "x_r4" and rerun.next_name("x_s0", []) == "x_s0_r2"


def test_a_stopped_rerun_stops_its_benchmark_and_removes_its_worktree(repo, tmp_path):
  """`kill` (SIGTERM) of a rerun: the benchmark it runs is stopped and its worktree removed, not
  left registered in the repository."""
  import os
  import signal
  import sys
  import time

  (repo / "benchmarks" / "results").mkdir(parents=True)
  (repo / "benchmarks" / "fake.py").write_text(FAKE_BENCHMARK)
  (repo.parent / "shared").mkdir()
  (repo.parent / "shared" / "data.txt").write_text("beside")
  (repo / "benchmarks" / "results" / "slow.json").write_text(
    json.dumps(
      {"name": "slow", "command": "python -m benchmarks.fake --seed=0 --out=OUT --sleep=60"}
    )
  )
  _git(repo, "add", "benchmarks")
  _git(repo, "commit", "-q", "-m", "a slow fake benchmark")
  scratch = tmp_path / "scratch"
  proc = subprocess.Popen(
    [sys.executable, "-m", "setdiff_jax.experiments.rerun", "slow", f"--scratch={scratch}"],
    cwd=repo,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  pid_file = scratch / "slow_r2" / "out" / "pid"
  deadline = time.time() + 60
  while not pid_file.exists() and time.time() < deadline and proc.poll() is None:
    time.sleep(0.2)
  assert pid_file.exists(), proc.communicate(timeout=30)[0]
  time.sleep(0.3)  # the pid is written: the benchmark runs
  proc.send_signal(signal.SIGTERM)
  out = proc.communicate(timeout=30)[0]
  assert proc.returncode == 143, out
  child = int(pid_file.read_text())
  deadline = time.time() + 10
  while time.time() < deadline:
    try:
      os.kill(child, 0)
    except ProcessLookupError:
      break
    time.sleep(0.1)
  else:
    raise AssertionError(f"the benchmark {child} outlived its rerun")
  listing = subprocess.run(
    ["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True
  ).stdout
  assert len(listing.strip().splitlines()) == 1, listing
  assert not (scratch / "slow_r2" / "tree").exists()
