"""Inputs the experiments library must refuse, or answer right, rather than record or compute
something silently wrong: measured paths that name no file, a clean-tree check that a results
folder could hide or move to another checkout, images that overwrite another record's, repeated
problem ids, damaged records; a t distribution outside [0, 1] or stuck in a loop, and NaN that
passes for evidence. The statistics are checked against scipy (a test-only dependency)."""

import json
import math
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats as sps

from setdiff_jax.experiments import provenance, record, stats

REPORT = {"command": "python -m benchmarks.x", "markdown": "## T\n"}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(record.__file__))))


def _git(repo, *args):
  return subprocess.run(
    ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
  ).stdout.strip()


def _repo(path, files=None):
  """A git repository on main with `files` ({path: text}) committed and an empty results/."""
  path.mkdir(parents=True)
  _git(path, "init", "-q", "-b", "main")
  _git(path, "config", "user.email", "t@t")
  _git(path, "config", "user.name", "t")
  for name, text in (files or {"code.py": "x = 1\n"}).items():
    (path / name).parent.mkdir(parents=True, exist_ok=True)
    (path / name).write_text(text)
  _git(path, "add", "-A")
  _git(path, "commit", "-q", "-m", "one")
  (path / "results").mkdir()
  return path


@pytest.fixture
def repo(tmp_path):
  return _repo(tmp_path / "repo")


def _within(seconds, fn, *args, **kw):
  """fn(*args, **kw), failing the test (not hanging it) after `seconds`."""

  def stop(*_):
    raise TimeoutError(f"{fn.__name__}{args} ran past {seconds} s")

  old = signal.signal(signal.SIGALRM, stop)
  signal.setitimer(signal.ITIMER_REAL, seconds)
  try:
    return fn(*args, **kw)
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


# --- record.py ---------------------------------------------------------------------------------


def test_measured_paths_that_name_no_file_refuse(repo):
  """An empty list, a string (read one character at a time) or a misspelt pathspec would leave
  the record current forever: publish_report and RunRecord.create refuse all three."""
  results = str(repo / "results")
  bad = {
    "empty": ([], "give the measured paths"),
    "string": ("code.py", "is the string 'code.py'"),
    "typo": (["cod.py"], r"\['cod.py'\] match no file tracked"),
    "one_typo": (["code.py", "src"], r"\['src'\] match no file"),
    "all_excluded": (["code.py", ":(exclude)code.py"], "match no file"),
  }
  for name, (paths, says) in bad.items():
    with pytest.raises(record.RecordError, match=says):
      record.publish_report(dict(REPORT), name, results, paths)
    with pytest.raises(record.RecordError, match=says):
      record.RunRecord.create(name, results, "python x.py", {}, [0], paths, device={})
    with pytest.raises(record.RecordError, match=says):
      record.check_publishable(name, results, measured_paths=paths)
  assert os.listdir(results) == []
  # what the committed records use: paths and exclude pathspecs
  (repo / "pkg").mkdir()
  (repo / "pkg" / "m.py").write_text("y = 1\n")
  (repo / "pkg" / "skip.py").write_text("z = 1\n")
  _git(repo, "add", "pkg")
  _git(repo, "commit", "-q", "-m", "pkg")
  good = ["pkg", ":(exclude)pkg/skip.py", "code.py"]
  path = record.publish_report(dict(REPORT), "good", results, good)
  assert json.loads(open(path).read())["measured_paths"] == good


def test_no_results_folder_hides_an_uncommitted_edit(repo):
  """results_dir was left out of the clean-tree check whole: '.' (or any folder holding code)
  hid every edit. Now only record files are left out, and a folder holding anything else
  refuses."""
  (repo / "code.py").write_text("x = 'uncommitted'\n")
  with pytest.raises(record.RecordError, match="holds code.py, results, which are no record"):
    record.publish_report(dict(REPORT), "t", str(repo), ["code.py"])
  with pytest.raises(record.RecordError, match="no record files"):
    record.RunRecord.create("u", str(repo), "python x.py", {}, [0], ["code.py"], device={})
  assert not (repo / "t.json").exists() and not (repo / "u.json").exists()
  # a folder of code under the results folder's name: its edit shows
  _git(repo, "checkout", "code.py")
  (repo / "sub").mkdir()
  (repo / "sub" / "helper.py").write_text("h = 1\n")
  _git(repo, "add", "sub")
  _git(repo, "commit", "-q", "-m", "helper")
  (repo / "sub" / "helper.py").write_text("h = 2\n")
  with pytest.raises(record.RecordError, match="holds helper.py"):
    record.publish_report(dict(REPORT), "t", str(repo / "sub"), ["code.py"])
  # the records of a folder of records are left out, and only they: a stray file there shows
  _git(repo, "checkout", "sub/helper.py")
  results = repo / "results"
  record.publish_report(dict(REPORT), "first", str(results), ["code.py"])
  record.publish_report(dict(REPORT), "second", str(results), ["code.py"])  # first.json waits
  (results / "notes.txt").write_text("mine\n")
  with pytest.raises(record.RecordError, match="holds notes.txt"):
    record.check_publishable("third", str(results))
  # and the exclusions of clean_commit itself cannot name the whole checkout
  (results / "notes.txt").unlink()
  (repo / "code.py").write_text("x = 3\n")
  for everything in (".", "", "./", "../repo"):
    with pytest.raises(record.RecordError, match="not a path below the checkout's root"):
      provenance.clean_commit(str(repo), exclude=(everything,))


PUBLISH = (
  "import sys; from setdiff_jax.experiments import record; "
  "print(record.publish_report({'markdown': '## T'}, 't', sys.argv[1], ['code.py']))"
)


def test_a_results_folder_of_another_checkout_refuses(tmp_path):
  """The code runs in checkout A, its record goes to B's results folder: B's HEAD was stamped
  (B clean-checked, A's edits unseen). The checkout is the one holding the __main__ script, and
  its results folder must be there; a program with no script (`python -c`) falls back to the
  results folder's checkout, whose own setdiff_jax must then be the one imported."""
  a = _repo(
    tmp_path / "a",
    {"code.py": "x = 1\n", "bench.py": PUBLISH + "\n"},
  )
  (a / "setdiff_jax").symlink_to(os.path.join(ROOT, "setdiff_jax"))  # A's library: this one
  _git(a, "add", "setdiff_jax")
  _git(a, "commit", "-q", "-m", "library")
  b = _repo(tmp_path / "b", {"code.py": "x = 1\n", "setdiff_jax/__init__.py": ""})
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

  def run(argv):  # from A's root, importing A's setdiff_jax
    return subprocess.run(
      [sys.executable, *argv], cwd=a, env=env, capture_output=True, text=True, timeout=120
    )

  for argv, says in (
    (["bench.py"], "is not in the checkout"),
    (["-c", PUBLISH], "imports setdiff_jax from .*, not from the checkout"),
  ):
    out = run([*argv, str(b / "results")])
    assert out.returncode != 0 and re.search(says, out.stderr), out.stderr[-2000:]
    assert os.listdir(b / "results") == []
    out = run([*argv, "results"])  # its own results folder: stamped with its own HEAD
    assert out.returncode == 0, out.stderr[-2000:]
    made = json.loads((a / "results" / "t.json").read_text())
    assert made["commit"] == _git(a, "rev-parse", "HEAD")
    (a / "results" / "t.json").unlink()
  # an uncommitted edit in A is seen
  (a / "code.py").write_text("x = 2\n")
  out = run(["bench.py", "results"])
  assert out.returncode != 0 and "uncommitted changes (code.py)" in out.stderr


def test_a_checkout_whose_own_library_did_not_run_refuses(tmp_path):
  """A checkout of this project stamps its commit only when its own setdiff_jax runs: a worktree
  whose script imports another checkout's library (an editable install, PYTHONPATH) would name
  a commit whose library did not run."""
  other = _repo(tmp_path / "other", {"code.py": "x = 1\n", "setdiff_jax/__init__.py": ""})
  with pytest.raises(
    record.RecordError, match="imports setdiff_jax from .*, not from the checkout"
  ):
    record.publish_report(dict(REPORT), "t", str(other / "results"), ["code.py"])
  assert os.listdir(other / "results") == []


def test_extra_images_never_overwrite_another_records_files(repo, tmp_path):
  """Record `plot`'s second image was `plot_1.png`, the image of record `plot_1`; an .svg was
  saved as .png. Extra images are `<name>+<k>.<ext>` ('+' is in no record name)."""
  results = repo / "results"
  for n in ("a", "b"):
    (tmp_path / f"{n}.png").write_bytes(f"png {n}".encode())
  (tmp_path / "c.svg").write_text("<svg/>")
  record.publish_report(
    {"markdown": "## A\n![a](a.png)\n"},
    "plot_1",
    str(results),
    ["code.py"],
    {"a.png": str(tmp_path / "a.png")},
  )
  path = record.publish_report(
    {"markdown": "## B\n![b](b.png) ![c](c.svg)\n"},
    "plot",
    str(results),
    ["code.py"],
    {"b.png": str(tmp_path / "b.png"), "c.svg": str(tmp_path / "c.svg")},
  )
  assert (results / "plot_1.png").read_bytes() == b"png a"
  assert (results / "plot.png").read_bytes() == b"png b"
  assert (results / "plot+1.svg").read_text() == "<svg/>"
  assert json.loads(open(path).read())["markdown"] == "## B\n![b](plot.png) ![c](plot+1.svg)\n"
  assert sorted(os.listdir(results)) == [
    "plot+1.svg",
    "plot.json",
    "plot.png",
    "plot_1.json",
    "plot_1.png",
  ]
  owned = {n: [f for f in os.listdir(results) if record.owns(n, f)] for n in ("plot", "plot_1")}
  assert sorted(owned["plot"]) == ["plot+1.svg", "plot.json", "plot.png"]
  assert sorted(owned["plot_1"]) == ["plot_1.json", "plot_1.png"]
  (tmp_path / "d.gif").write_bytes(b"GIF8")
  with pytest.raises(record.RecordError, match=r"d.gif is not a .png or .svg file"):
    record.publish_report(
      {"markdown": "## D\n![d](d.gif)\n"},
      "gif",
      str(results),
      ["code.py"],
      {"d.gif": str(tmp_path / "d.gif")},
    )
  assert not (results / "gif.json").exists()


def test_repeated_problem_ids_refuse(repo):
  """matrix aligns seeds by str(id): a repeated id kept one of its values (mean 0.333 for 0.667)
  and 1 and "1" were merged. add_outcomes refuses both; matrix refuses a file that has them."""
  rec = record.RunRecord.create(
    "dup", str(repo / "results"), "python x.py", {}, [0, 1], ["code.py"], device={}
  )
  with pytest.raises(record.RecordError, match=r"problem ids \['p1'\] occur more than once"):
    rec.add_outcomes("a", 0, ["p1", "p1", "p2"], [1, 0, 1])
  with pytest.raises(record.RecordError, match=r"problem ids \['1'\] occur more than once"):
    rec.add_outcomes("b", 0, [1, "1"], [1, 0])
  assert not rec.has("a", 0) and not rec.has("b", 0)
  rec.add_outcomes("a", 0, ["p1", "p2", "p3"], [1, 0, 1])
  rec.add_outcomes("a", 1, ["p3", "p1", "p2"], [1, 1, 1])
  np.testing.assert_array_equal(rec.matrix("a"), [[1, 0, 1], [1, 1, 1]])
  # a record written before the check
  rec.data["outcomes"] += [
    {"arm": "c", "seed": s, "problems": p, "values": v, "seconds": None}
    for s, p, v in ((0, ["p1", "p1", "p2"], [1, 0, 1]), (1, ["p1", "p2", "p1"], [1, 1, 0]))
  ]
  with pytest.raises(record.RecordError, match="occur more than once"):
    rec.matrix("c")


def test_a_damaged_record_gives_one_record_error(repo):
  """A truncated or non-object record file gave a raw JSONDecodeError / AttributeError (and the
  'exists' refusal came after json.load): now the name is refused first, a resume names the
  file and the fix."""
  results = repo / "results"
  (results / "bad.json").write_text('{"name": "bad", "commit": "ab')
  (results / "lst.json").write_text("[1, 2]")
  with pytest.raises(record.RecordError, match="a record named 'bad' exists"):
    record.check_publishable("bad", str(results))
  with pytest.raises(record.RecordError, match="bad.json cannot be read .*restore it"):
    record.check_publishable("bad", str(results), resume=True)
  with pytest.raises(record.RecordError, match="bad.json cannot be read"):
    record.publish_report(dict(REPORT), "bad", str(results), ["code.py"], resume=True)
  with pytest.raises(record.RecordError, match="bad.json cannot be read"):
    record.RunRecord.create(
      "bad", str(results), "python x.py", {}, [0], ["code.py"], device={}, resume=True
    )
  with pytest.raises(record.RecordError, match="lst.json holds a JSON list, not a record"):
    record.check_publishable("lst", str(results), resume=True)


# --- stats.py ----------------------------------------------------------------------------------


def test_t_distribution_against_scipy():
  """t_cdf rose above 1 by rounding (1 + 1e-15 at df=2), which made p-values negative; the
  quantile's bracket doubled to inf and looped forever for a prob near 0 or 1."""
  xs = np.concatenate([np.linspace(-12, 12, 97), np.logspace(1, 12, 23), -np.logspace(1, 12, 23)])
  for df in (1, 2, 3, 4, 7, 10, 30, 100, 1000):
    for x in xs:
      c = stats.t_cdf(float(x), df)
      assert 0.0 <= c <= 1.0
      assert c == pytest.approx(sps.t.cdf(x, df), abs=1e-13), (x, df)
      # the far tail keeps its relative precision (p-values of large t)
      tail = c if x < 0 else 1 - c
      if df <= 30 and abs(x) < 8:
        assert tail == pytest.approx(sps.t.sf(abs(x), df), rel=1e-12), (x, df)
  assert stats.t_cdf(1e9, 2) <= 1.0 and stats.t_cdf(math.inf, 3) == 1.0
  assert stats.t_cdf(-math.inf, 3) == 0.0 and stats.t_cdf(0.0, 5) == 0.5
  for df in (1, 2, 3, 30, 1000):
    for p in (1e-300, 1e-20, 1e-9, 0.01, 0.3, 0.5, 0.8, 0.975, 1 - 1e-12):
      q = _within(10, stats.t_quantile, p, df)
      # scipy's ppf gives inf for some far tails (1e-300 at df=3); its cdf is the check there
      assert sps.t.cdf(q, df) == pytest.approx(p, rel=1e-9, abs=1e-15), (p, df)
      if math.isfinite(sps.t.ppf(p, df)):
        assert q == pytest.approx(sps.t.ppf(p, df), rel=1e-9, abs=1e-12), (p, df)
  assert _within(10, stats.t_quantile, 1e-20, 30) == pytest.approx(sps.t.ppf(1e-20, 30), rel=1e-9)
  with pytest.raises(ValueError, match="beyond float range"):
    _within(10, stats.t_quantile, 1e-310, 1)  # -1/(pi p): past the largest float
  for bad in (0.0, 1.0, math.nan):
    with pytest.raises(ValueError, match="need 0 < prob < 1"):
      stats.t_quantile(bad, 3)
  with pytest.raises(ValueError, match="x is nan"):
    stats.t_cdf(math.nan, 3)
  with pytest.raises(ValueError, match="df=nan"):
    stats.t_cdf(1.0, math.nan)


def test_seed_intervals_and_paired_p_values_against_scipy():
  rng = np.random.default_rng(3)
  for n in (2, 3, 5, 12):
    a = rng.normal(0.6, 0.05, n)
    b = a - rng.normal(0.02, 0.03, n)
    s = stats.seed_summary(a, 0.9)
    lo, hi = sps.t.interval(0.9, n - 1, loc=a.mean(), scale=sps.sem(a))
    assert (s["lo"], s["hi"]) == pytest.approx((lo, hi), rel=1e-10)
    d = stats.paired_seed_difference(a, b)
    assert d["p"] == pytest.approx(sps.ttest_rel(a, b).pvalue, rel=1e-9)
  # an extreme level ended in an endless loop
  wide = _within(10, stats.seed_summary, list(range(31)), level=1 - 1e-15)
  half = sps.t.ppf(0.5 + (1 - 1e-15) / 2, 30) * sps.sem(np.arange(31))
  assert wide["hi"] - wide["mean"] == pytest.approx(half, rel=1e-6)
  for level in (0.0, 1.0, 1.5, math.nan):
    with pytest.raises(ValueError, match="need 0 < level < 1"):
      stats.seed_summary([1.0, 2.0], level)


def test_a_constant_difference_has_p_zero_and_none_has_p_one():
  """[0.5, 0.6, 0.7] - [0.3, 0.4, 0.5] is 0.2 on every seed up to rounding: its p-value came out
  as -1.8e-15, which holm refused. A difference that is the same on every seed (t = +-inf) has
  p = 0; no difference at all, up to rounding, p = 1."""
  d = stats.paired_seed_difference([0.5, 0.6, 0.7], [0.3, 0.4, 0.5])
  assert d["p"] == 0.0 and d["point"] == pytest.approx(0.2)
  np.testing.assert_allclose(stats.holm([d["p"], 0.2]), [0.0, 0.2])
  none = stats.paired_seed_difference([0.1 + 0.2, 0.3, 0.6], [0.3, 0.3, 0.6])
  assert none["p"] == 1.0
  # a t beyond what 1 - cdf can resolve: p small and positive, as scipy's
  a, b = np.array([5.0, 5.2, 5.4]), np.array([4.0, 4.2 + 1e-9, 4.4])
  assert (
    0.0
    < stats.paired_seed_difference(a, b)["p"]
    == pytest.approx(sps.ttest_rel(a, b).pvalue, rel=1e-6)
  )


def test_non_finite_inputs_refuse():
  """NaN compares false with everything: NaN cells gave p = 0.007, all-NaN draws p = 0, a NaN
  seed a silent nan interval, holm accepted a NaN p-value."""
  nan = math.nan
  with pytest.raises(ValueError, match=r"seed values: 1 of 3 entries are not finite .*index 1"):
    stats.seed_summary([0.8, nan, 0.9])
  with pytest.raises(ValueError, match="paired seeds: b: 1 of 3"):
    stats.paired_seed_difference([0.8, 0.7, 0.9], [0.5, math.inf, 0.6])
  a, b = np.ones((3, 20)), np.ones((3, 20))
  a[:, :5] = nan
  with pytest.raises(ValueError, match=r"arm 0: 15 of 60 entries are not finite"):
    stats.paired_difference(a, b, n_boot=50)
  with pytest.raises(ValueError, match="bootstrap draws: 100 of 100"):
    stats.p_value(np.full(100, nan))
  with pytest.raises(ValueError, match="no bootstrap draws"):
    stats.p_value(np.array([]))
  with pytest.raises(ValueError, match=r"got \[nan\]"):
    stats.holm([0.01, nan])
  with pytest.raises(ValueError, match=r"got \[-1e-15\]"):
    stats.holm([-1e-15])


def test_bootstrap_intervals_refuse_one_seed_a_percent_level_and_empty_arms():
  """Probe F6: `interval` / `paired_difference` took a single seed (a bootstrap over problems
  only) where `seed_summary` refuses n = 1; level=95 gave numpy's "Percentiles must be in the
  range [0, 100]"; 0 problems per seed gave a nan interval or numpy's error."""
  a = np.ones((3, 20))
  with pytest.raises(ValueError, match=r"needs >= 2 seeds .*got 1: one seed's bootstrap"):
    stats.paired_difference(a[:1], a[:1], n_boot=50)
  with pytest.raises(ValueError, match=r"needs >= 2 seeds"):
    stats.interval([a[:1]], np.mean, n_boot=50)
  with pytest.raises(ValueError, match="an interval over seeds needs >= 2 values"):
    stats.seed_summary([0.5])  # the same rule
  for level in (95, 0.0, 1.0, math.nan):
    with pytest.raises(ValueError, match=r"level=.*need 0 < level < 1 \(e\.g\. 0\.95\)"):
      stats.interval([a, a], stats.mean_difference, n_boot=50, level=level)
  for shape in ((3, 0), (0, 20)):
    with pytest.raises(ValueError, match="empty arrays"):
      stats.paired_difference(np.ones(shape), np.ones(shape), n_boot=50)
  assert stats.interval([a, a], stats.mean_difference, n_boot=50, level=0.9)["p"] == 1.0
