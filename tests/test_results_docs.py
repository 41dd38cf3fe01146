"""docs/results is generated from benchmarks/results (issue 35): the committed tables equal what
the records give (edited by hand or out of date fails here), staleness comes from git, and every
record either carries a commit on main's history or says what it measured and why it stays."""

import json
import pathlib
import shutil
import subprocess

import pytest

from setdiff_jax.experiments import git, publish

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS, DOCS = REPO / "benchmarks" / "results", REPO / "docs" / "results"


def _full_history():
  try:
    shallow = git._git(str(REPO), "rev-parse", "--is-shallow-repository").stdout.strip()
  except git.GitError:
    return False
  return shallow == "false"


needs_history = pytest.mark.skipif(
  not _full_history(), reason="needs the repository's full git history (not a wheel, not shallow)"
)


@pytest.fixture(scope="module")
def generated():
  return publish.generate(str(RESULTS), str(DOCS), str(REPO))


@needs_history
def test_docs_results_equal_what_the_records_give(generated):
  assert publish.differences(generated, str(DOCS)) == [], (
    "docs/results is out of date or edited by hand: run `python -m setdiff_jax.experiments."
    "publish` and commit docs/results"
  )


@needs_history
def test_a_hand_edit_is_caught(tmp_path, generated):
  docs = tmp_path / "docs"
  shutil.copytree(DOCS, docs)
  target = docs / "rl_chain_5000.md"
  target.write_text(target.read_text().replace("0.3", "0.4", 1))
  (docs / "orphan.md").write_text("# a table with no record\n")
  problems = publish.differences(generated, str(docs))
  assert any("rl_chain_5000.md differs" in p for p in problems)
  assert any("orphan.md has no record" in p for p in problems)
  assert publish.main(["--results_dir", str(RESULTS), "--docs_dir", str(docs), "--check"]) == 1


@needs_history
def test_publish_never_replaces_or_removes_a_file_it_did_not_write(tmp_path):
  """A --docs_dir holding someone's README.md: one error line, nothing written; a stray
  hand-written .md is left (and named), a generated table without a record is removed."""
  docs = tmp_path / "docs"
  docs.mkdir()
  (docs / "README.md").write_text("# my notes\n")
  argv = ["--results_dir", str(RESULTS), "--docs_dir", str(docs)]
  assert publish.main(argv) == 1
  assert sorted(p.name for p in docs.iterdir()) == ["README.md"]
  assert (docs / "README.md").read_text() == "# my notes\n"
  (docs / "README.md").unlink()
  (docs / "notes.md").write_text("# mine\n")
  gone = publish.BANNER.format(source="benchmarks/results/gone.json") + "\n# a removed record\n"
  (docs / "gone.md").write_text(gone)
  assert publish.main(argv) == 0
  assert (docs / "notes.md").read_text() == "# mine\n" and not (docs / "gone.md").exists()
  assert (docs / "README.md").exists() and publish.was_generated(str(docs / "README.md"))


def _git(repo, *args):
  subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def _commit(repo, path, text, msg):
  (repo / path).write_text(text)
  _git(repo, "add", path)
  _git(repo, "commit", "-qm", msg)
  return subprocess.run(
    ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True
  ).stdout.strip()


def _new_repo(repo):
  """A git repository at `repo` on branch main with one commit (code.py); returns its hash."""
  repo.mkdir(exist_ok=True)
  _git(repo, "init", "-q", "-b", "main")
  _git(repo, "config", "user.email", "t@t")
  _git(repo, "config", "user.name", "t")
  return _commit(repo, "code.py", "x = 1\n", "code")


def test_staleness_follows_the_measured_paths(tmp_path):
  repo = tmp_path / "repo"
  c0 = _new_repo(repo)
  rec = {"commit": c0[:7], "measured_paths": ["code.py"], "markdown": "## T\n\nbody\n"}
  assert publish.status(rec, str(repo))["label"] == "current"
  _commit(repo, "other.py", "y = 1\n", "unrelated")
  assert publish.status(rec, str(repo))["label"] == "current"
  _commit(repo, "code.py", "x = 2\n", "measured code changes")
  st = publish.status(rec, str(repo))
  assert st["label"] == "stale" and f"git log {c0[:7]}..HEAD -- code.py" in st["text"]
  _commit(repo, "code.py", "x = 3\n", "again")  # once stale, the text no longer moves
  assert publish.status(rec, str(repo)) == st
  # a commit that is not on the history: kept, judged from its provenance's base when named
  gone = {"commit": "deadbee", "measured_paths": ["code.py"], "markdown": "## T\n"}
  assert publish.status(gone, str(repo))["label"] == "kept"
  assert "cannot be judged" in publish.status(gone, str(repo))["text"]
  gone["provenance"] = {"base": c0[:7], "why_kept": "w"}
  assert "**stale**" in publish.status(gone, str(repo))["text"]
  dirty = dict(rec, commit=c0[:7] + "+dirty")
  assert publish.status(dirty, str(repo))["label"] == "kept"
  doc = publish.render("t", dict(gone, command="python b.py"), str(repo), "results/t.json", [])
  assert "| provenance: why kept | w |" in doc and "| command | `python b.py` |" in doc
  with pytest.raises(ValueError, match="no 'markdown'"):
    publish.render("t", {"commit": c0}, str(repo), "results/t.json", [])


def test_the_merged_issue22_table_is_what_its_sources_give():
  """speed_accuracy_i22 has no run of its own: its table must equal the three-seed summary of
  its nine source records (so a source cannot change without this table changing)."""
  from benchmarks import speed_accuracy as sa

  merged = json.loads((RESULTS / "speed_accuracy_i22.json").read_text())
  src = {n: json.loads((RESULTS / f"{n}.json").read_text()) for n in merged["sources"]}
  runs = []
  for k in range(3):
    results = []
    for rec in src.values():
      results += [r for run in rec["runs"] if run["seed"] == k for r in run["results"]]
    runs.append({"seed": k, "results": results})
  order = ["ar", "mdlm", "mdlm+eos", "bd3lm4", "setdlm4"]
  for run in runs:
    run["results"].sort(key=lambda r: order.index(r["method"]))
  assert sa.summary_table(sa.summarize_seeds(runs)) in merged["markdown"]


@needs_history
def test_every_record_has_a_reachable_commit_or_says_why_it_stays():
  for name, rec in publish.load_records(str(RESULTS)).items():
    _, on_history, _ = publish.commit_status(rec, str(REPO))
    prov = rec.get("provenance") or {}
    assert on_history or (prov.get("measured") and prov.get("why_kept")), name
    assert rec.get("measured_paths") and rec.get("markdown") and rec.get("date"), name


def test_the_page_title_is_the_records_leading_heading():
  from setdiff_jax.experiments.publish import _title_and_body

  assert _title_and_body("## Tuned\n\nbody", "n") == ("Tuned", "body")
  assert _title_and_body("# Speed\n\n| a |", "n") == ("Speed", "| a |")
  assert _title_and_body("| a |\n", "name") == ("name", "| a |")


def _run_record(name, command, outcomes, seconds, out_dir, cpu="Intel Xeon"):
  """A record as a benchmark writes one: outcomes per problem, timings, where it wrote."""
  return {
    "name": name,
    "commit": "abc1234",
    "command": command,
    "date": "2026-12-06 10:00 UTC",
    "hardware": {"cpu": cpu, "backend": "cpu"},
    "measured_paths": ["code.py"],
    "markdown": f"## {name}\n",
    "args": {"out": out_dir, "record": name, "seed": 0},
    "outcomes": {"ar": {"0": [{"values": list(outcomes), "score": sum(outcomes) / 4}]}},
    "summary": {  # a value after a timing in one dict is still a value
      "total_seconds": seconds,
      "kept_per_call": 2.5,
      "rows": [{"tok/s b=1": 100 / seconds, "median_s": 1.0}],
    },
  }


def test_a_rerun_is_compared_value_by_value_timings_and_paths_apart():
  """reproduce.compare by hand: the same outcomes with other timings, output folder and record
  name reproduce; one flipped problem, a value only in one record, or another device is named."""
  from setdiff_jax.experiments import reproduce

  old = _run_record(
    "t", "python benchmarks/t.py --seed=0 --out=/tmp/a --record=t", [1, 0, 1, 1], 10, "/tmp/a"
  )
  new = _run_record(
    "t_r2", "python -m benchmarks.t --record=t_r2 --out=OUT --seed=0", [1, 0, 1, 1], 20, "/x/b"
  )
  same = reproduce.compare(old, new)
  # values: 4 outcomes + score + seed + kept_per_call (timings, names, paths, commit, date, command apart)
  assert same.identical and same.measured == 7 and not same.other_device
  # durations 10 -> 20 s and 1 -> 1 s: median 1.5; the rate (tok/s 10 -> 5) is left out of it
  assert same.timing_ratio == pytest.approx(1.5) and same.timings == 2
  assert "every one of the 7 values (timings apart) equals `t`'s" in same.summary("`t`")
  assert reproduce.command_key(old["command"]) == reproduce.command_key(new["command"])
  assert reproduce.command_key("python -m benchmarks.t --seed=1") != reproduce.command_key(
    new["command"]
  )

  flipped = _run_record("t_r2", new["command"], [1, 1, 1, 1], 10, "/x/b", cpu="AMD EPYC")
  diff = reproduce.compare(old, flipped)
  assert not diff.identical and diff.other_device
  assert [p for p, _, _ in diff.differ] == [
    'outcomes.ar["0"][0].score',
    'outcomes.ar["0"][0].values[1]',
  ]
  assert "2 of the 7 values (timings apart) differ" in diff.summary("`t`")
  assert "(on another device)" in diff.summary("`t`")
  # an aggregate's rerun reads the rerun records: their names are not values
  agg_old = dict(old, refs=["t_s0", "t_s1"], command="python -m benchmarks.agg --runs=t_s0,t_s1")
  agg_new = dict(new, refs=["t_s0_r2", "t_s1_r2"], command="python -m benchmarks.agg --runs=a,b")
  assert reproduce.compare(agg_old, agg_new).identical
  assert reproduce.command_key(agg_old["command"]) == reproduce.command_key(agg_new["command"])
  extra = dict(new, extra={"k": 1})
  assert reproduce.compare(old, extra).only_new == ["extra.k"]
  assert reproduce.compare(extra, old).only_old == ["extra.k"]
  assert reproduce.series("t_r12") == ("t", 12) and reproduce.series("t_run") == ("t_run", 1)


def test_publish_says_which_stale_record_a_rerun_reproduced():
  """A series t, t_r2, t_r3 (same command): each page names the run before and after it; the
  index marks a stale record whose rerun gave every value again, and only that one."""
  command = "python -m benchmarks.t --seed=0"
  records = {
    "t": _run_record("t", command, [1, 0, 1, 1], 10, "/a"),
    "t_r2": _run_record("t_r2", command, [1, 1, 1, 1], 10, "/b"),
    "t_r3": _run_record("t_r3", command, [1, 1, 1, 1], 12, "/c"),
    "u_r2": _run_record("u_r2", command, [1, 1, 1, 1], 12, "/c"),  # no t-series neighbour
    "t_r4": _run_record("t_r4", command + " --steps=9", [1, 1, 1, 1], 12, "/c"),  # other command
  }
  label = {"t": "stale", "t_r2": "stale", "t_r3": "current", "u_r2": "current", "t_r4": "current"}
  statuses = {n: {"label": label[n], "text": label[n]} for n in records}
  rows, shown = publish.rerun_rows(records, statuses)
  assert shown == {"t_r2": "stale; its 7 values (timings apart) again in [t_r3](t_r3.md) (current)"}
  assert [r[0] for r in rows["t_r2"]] == ["rerun of", "rerun as"]
  assert "2 of the 7 values (timings apart) differ from `t`'s" in rows["t_r2"][0][1]
  assert "equals this record's" in rows["t_r2"][1][1]
  assert "t_r4" not in rows and "u_r2" not in rows and [r[0] for r in rows["t_r3"]] == ["rerun of"]


def test_reproduce_compares_every_measured_value_and_sets_aside_only_timings_and_places():
  """Probe round 8: per-seed accuracies, tokens per step and decoded outputs are values (the
  timing words are matched whole, `output` is a place only as a flag); True is not 1, integers
  are exact, a dotted key cannot stand for a nested one; RunRecord's `timings` are timings."""
  from setdiff_jax.experiments import reproduce

  def rec(**values):
    base = {"name": "t", "command": "python -m benchmarks.t", "args": {"output": "/tmp/a"}}
    return dict(base, **values)

  measured = {
    "per_seed": [0.5, 0.6],
    "acc_fp32_per_seed": [0.5],
    "tokens_per_step": 2.5,
    "kept_tokens_per_step": 3.0,
    "examples": [{"prompt": "1+1", "output": "2"}],
    "flag": True,
    "count": 10**9,
    "a.b": 1,
    "a": {"b": 2},
  }
  old = rec(**measured)
  assert reproduce.compare(old, json.loads(json.dumps(old))).identical
  changed = {
    "per_seed": [0.5, 0.7],
    "acc_fp32_per_seed": [0.4],
    "tokens_per_step": 5.0,
    "kept_tokens_per_step": 1.0,
    "examples": [{"prompt": "1+1", "output": "garbage"}],
    "flag": 1,
    "count": 10**9 + 1,
    "a.b": 7,
  }
  for key, value in changed.items():
    result = reproduce.compare(old, rec(**dict(measured, **{key: value})))
    assert not result.identical and len(result.differ) == 1, key
  # the flag `--output` (top level or args) is where the run wrote: set aside
  assert reproduce.compare(old, rec(**measured, output="/x")).only_new == []
  moved = dict(rec(**measured), args={"output": "/elsewhere"})
  assert reproduce.compare(old, moved).identical
  # timings: RunRecord's section, rates and durations never count as values
  timed = rec(**measured, timings={"train": 12.0}, load_avg=1.0, rows_per_s=3.0, wall=4.0)
  slower = rec(**measured, timings={"train": 14.5}, load_avg=2.0, rows_per_s=1.0, wall=8.0)
  result = reproduce.compare(timed, slower)
  assert result.identical and result.timings == 2
  assert result.timing_ratio == pytest.approx((14.5 / 12 + 8 / 4) / 2)
  assert reproduce.path_text(("a.b",)) == '["a.b"]' and reproduce.path_text(("a", "b")) == "a.b"


def test_a_rerun_is_compared_with_the_latest_earlier_run_of_its_command():
  """t_r3 ran t's command after t_r2 ran another one: t_r3 reruns t (probe round 8)."""
  from setdiff_jax.experiments import reproduce

  command = "python -m benchmarks.t --seed=0"
  records = {
    "t": _run_record("t", command, [1, 0, 1, 1], 10, "/a"),
    "t_r2": _run_record("t_r2", command + " --seed=2", [1, 1, 1, 1], 10, "/b"),
    "t_r3": _run_record("t_r3", command, [1, 0, 1, 1], 12, "/c"),
    "t_r4": _run_record("t_r4", command, [1, 0, 1, 1], 12, "/d"),
  }
  assert reproduce.predecessors(records) == {"t_r3": "t", "t_r4": "t_r3"}
  statuses = {n: {"label": "stale", "text": "stale"} for n in records}
  _, shown = publish.rerun_rows(records, statuses)
  assert shown["t"].startswith("stale; its 7 values (timings apart) again in [t_r3]")


def test_a_record_whose_measured_paths_name_nothing_is_unjudged_never_current(tmp_path):
  repo = tmp_path / "repo"
  c0 = _new_repo(repo)
  for paths in ([], ["cod.py"]):
    rec = {"commit": c0, "measured_paths": paths, "markdown": "## T\n"}
    _commit(repo, "code.py", f"x = {len(paths) + 2}\n", "the measured code changes")
    st = publish.status(rec, str(repo))
    assert st["label"] == "unjudged" and "cannot be judged" in st["text"], paths
  assert publish.status(dict(rec, measured_paths=["code.py"]), str(repo))["label"] == "stale"


def test_publish_refuses_what_is_no_record_with_one_line_naming_the_file(tmp_path, capsys):
  """Damaged JSON, a JSON list, fields of the wrong type, a record named like the index: one
  `error:` line naming the file; a non-UTF-8 or folder `.md` in the docs is someone's, left; a
  --docs_dir that is a file is named."""
  from setdiff_jax.experiments import record

  results, docs = tmp_path / "results", tmp_path / "docs"
  results.mkdir()
  c0 = _new_repo(tmp_path)
  good = {"name": "ok", "command": "python -m benchmarks.t", "markdown": "## T\n", "v": 1}
  good["commit"] = c0
  (results / "ok.json").write_text(json.dumps(record.sealed(good, "ok")))
  argv = ["--results_dir", str(results), "--docs_dir", str(docs)]
  cases = {
    "bad.json": '{"name": "bad", "v": 1',
    "listed.json": "[1, 2]",
    "typed.json": json.dumps(dict(good, device="cpu")),
    "cmd.json": json.dumps(dict(good, command=["python", "x"])),
    "README.json": json.dumps(good),
    "readme.json": json.dumps(good),
  }
  for fn, text in cases.items():
    (results / fn).write_text(text)
    assert publish.main(argv) == 1, fn
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and fn in err[0], (fn, err)
    (results / fn).unlink()
  with pytest.raises(ValueError, match="listed.json holds a JSON list"):
    (results / "listed.json").write_text("[1]")
    record.read_record(str(results / "listed.json"))
  (results / "listed.json").unlink()
  docs.mkdir()
  (docs / "notes.md").write_bytes(b"\xff\xfe not utf-8\n")
  (docs / "folder.md").mkdir()
  assert publish.main(argv) == 0 and (docs / "notes.md").read_bytes().startswith(b"\xff")
  (docs / "ok.md").unlink()
  (docs / "ok.md").mkdir()
  assert publish.main(argv) == 1 and "ok.md is a folder" in capsys.readouterr().err
  (docs / "ok.md").rmdir()
  assert publish.main(["--results_dir", str(results), "--docs_dir", str(docs / "notes.md")]) == 1
  assert "is a file" in capsys.readouterr().err


def test_a_record_git_tracks_is_restored_not_its_table_removed_and_links_resolve(tmp_path, capsys):
  """Probe F2: a record deleted by hand (git still tracks it) is named with `git checkout --`,
  and publish leaves its table; once retired with git rm, --check names each link of README.md
  and benchmarks/README.md into docs/results or benchmarks/results that no longer resolves."""
  from setdiff_jax.experiments import record

  repo = tmp_path / "repo"
  _new_repo(repo)
  (repo / "benchmarks").mkdir()
  _commit(repo, "README.md", "See [T](docs/results/t.md) and [all](docs/results/README.md).\n", "r")
  _commit(
    repo, "benchmarks/README.md", "[T's plot](results/t.png), [U](../docs/results/u.md)\n", "b"
  )
  results, docs = repo / "benchmarks" / "results", repo / "docs" / "results"
  for name in ("t", "u"):
    report = {"command": f"python -m benchmarks.{name}", "markdown": f"## {name}\n"}
    record.publish_report(report, name, str(results), ["code.py"])
  (results / "t.png").write_bytes(b"png")
  argv = ["--results_dir", str(results), "--docs_dir", str(docs)]
  assert publish.main(argv) == 0 and publish.main(argv + ["--check"]) == 0
  _git(repo, "add", "-A")
  _git(repo, "commit", "-qm", "records and tables")

  (results / "t.json").unlink()
  for more in (["--check"], []):
    assert publish.main(argv + more) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "git checkout -- benchmarks/results/t.json" in err[0], err
    assert "remove it" not in err[0]
  assert (docs / "t.md").exists()

  _git(repo, "rm", "-q", "benchmarks/results/t.json")
  assert publish.main(argv) == 0  # retired: its table goes
  assert publish.main(argv + ["--check"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1] == (
    "error: README.md links docs/results/t.md, which no record gives: fix or remove the link"
  )
  (repo / "README.md").write_text("[all](docs/results/README.md)\n")
  (results / "t.png").unlink()
  assert publish.main(argv + ["--check"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1] == (
    "error: benchmarks/README.md links results/t.png, which does not exist: fix or remove the link"
  )
  (repo / "benchmarks" / "README.md").write_text("[U](../docs/results/u.md)\n")
  assert publish.main(argv + ["--check"]) == 0


def test_a_record_kept_without_a_reason_is_refused(tmp_path, capsys):
  """Probe F3: a (sealed) record whose commit is in no commit of the repository, is missing, or
  is off the history, and whose provenance does not say what it measured and why it stays,
  would read *kept (see provenance)* with none: one error line; with the provenance it is kept."""
  from setdiff_jax.experiments import record

  repo = tmp_path / "repo"
  c0 = _new_repo(repo)
  _git(repo, "checkout", "-qb", "side")
  side = _commit(repo, "side.py", "y = 1\n", "a branch")
  _git(repo, "checkout", "-q", "main")
  results, docs = repo / "results", repo / "docs"
  results.mkdir()
  argv = ["--results_dir", str(results), "--docs_dir", str(docs)]
  base = {"name": "t", "markdown": "## T\n", "measured_paths": ["code.py"], "date": "d"}
  cases = {
    "no commit of this repository": dict(base, commit="0" * 40),
    "names no commit": base,
    "not on this checkout's history": dict(base, commit=side),
  }
  for said, rec in cases.items():
    (results / "t.json").write_text(json.dumps(record.sealed(rec, "t")))
    for more in (["--check"], []):
      assert publish.main(argv + more) == 1, said
      err = capsys.readouterr().err.strip().splitlines()
      assert len(err) == 1 and "t.json" in err[0] and said in err[0], (said, err)
      assert "provenance.why_kept" in err[0]
    why = {"measured": "code.py at c0", "why_kept": "a branch's run", "base": c0}
    (results / "t.json").write_text(json.dumps(dict(record.sealed(rec, "t"), provenance=why)))
    assert publish.main(argv) == 0
    assert "| provenance: why kept | a branch's run |" in (docs / "t.md").read_text()


def test_reproduce_names_a_misspelt_record_and_restores_only_a_tracked_one(
  tmp_path, monkeypatch, capsys
):
  """Probe F5: a misspelt name was answered "restore it (git checkout -- ...)" for a file that
  never existed; the restore advice is for a record git tracks that is gone."""
  from setdiff_jax.experiments import reproduce

  repo = tmp_path / "repo"
  _new_repo(repo)
  (repo / "benchmarks" / "results").mkdir(parents=True)
  _commit(repo, "benchmarks/results/t.json", json.dumps({"name": "t", "v": 1}), "t")
  _commit(repo, "benchmarks/results/t_r2.json", json.dumps({"name": "t_r2", "v": 1}), "t_r2")
  monkeypatch.chdir(repo)
  cases = {
    ("tt", "t_r2"): "error: no record 'tt' in benchmarks/results: give a name `ls "
    "benchmarks/results` lists",
    (
      "t",
      "x/t_r3.json",
    ): "error: no file x/t_r3.json: give a record's name or the path of its JSON",
  }
  for args, said in cases.items():
    assert reproduce.main(list(args)) == 2
    assert capsys.readouterr().err.strip() == said
  assert reproduce.main(["t", "t_r2"]) == 0
  (repo / "benchmarks" / "results" / "t.json").unlink()
  assert reproduce.main(["t", "t_r2"]) == 2
  assert "restore it (git checkout -- benchmarks/results/t.json)" in capsys.readouterr().err
