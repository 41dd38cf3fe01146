"""Every record is sealed by the benchmark that writes it (probe F1): `publish` and `publish
--check` refuse a record whose raw outcomes, summary numbers or rendered tables were changed
afterwards (the published table would drift from its data), one without a seal, and one whose
`name` is not its file's (F7); a provenance note added by hand is no change."""

import json
import pathlib
import shutil

import pytest

from helpers import git_repo
from setdiff_jax.experiments import publish, record

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


@pytest.fixture
def written(tmp_path):
  """(a checkout on main holding one record `t` its writer sealed, that record's path)."""
  repo = git_repo(tmp_path / "repo")
  report = {
    "command": "python -m benchmarks.t --seed=0",
    "outcomes": {"a": [1.0, 0.0, 1.0, 1.0]},
    "summary": {"a": 0.75},
    "markdown": "## T\n\n| arm | accuracy |\n| --- | --- |\n| a | 75.0 ± 3.0 |\n",
  }
  path = record.publish_report(report, "t", str(repo / "results"), ["code.py"])
  return repo, pathlib.Path(path)


def _argv(repo, *more):
  return ["--results_dir", str(repo / "results"), "--docs_dir", str(repo / "docs"), *more]


def _edit(path, change):
  data = json.loads(path.read_text())
  change(data)
  path.write_text(json.dumps(data, indent=1) + "\n")


def _one_error(capsys):
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: "), err
  return err[0]


def test_the_writer_seals_its_record_and_publish_takes_it(written, capsys):
  repo, path = written
  data = json.loads(path.read_text())
  assert list(data)[0] == "seal" and data["seal"] == record.seal_of(data, "t")
  record.check_seal(str(path), data)
  # RunRecord (the incremental writer) seals each save
  rec = record.RunRecord.create(
    "u", str(repo / "results"), "python -m benchmarks.u", {"lr": 1}, [0], ["code.py"], {}
  )
  rec.add_outcomes("a", 0, [1, 2], [1.0, 0.0])
  rec.set_markdown("## U\n")
  rec.save()
  record.check_seal(rec.path, record.read_record(rec.path))
  assert publish.main(_argv(repo)) == 0 and publish.main(_argv(repo, "--check")) == 0


@pytest.mark.parametrize(
  "change",
  [
    lambda d: d["outcomes"]["a"].__setitem__(1, 1.0),  # a raw per-problem outcome
    lambda d: d["summary"].__setitem__("a", 1.0),  # a summary number
    lambda d: d.__setitem__("markdown", d["markdown"].replace("75.0 ± 3.0", "99.9 ± 0.1")),
    lambda d: d.__setitem__("commit", "0" * 40),
    lambda d: d.pop("seal"),  # a record no benchmark wrote
  ],
  ids=["outcome", "summary", "markdown", "commit", "no seal"],
)
def test_a_record_changed_after_its_benchmark_wrote_it_is_refused(written, capsys, change):
  repo, path = written
  assert publish.main(_argv(repo)) == 0
  before = (repo / "docs" / "t.md").read_text()
  _edit(path, change)
  for more in (["--check"], []):  # publish refuses too: it never publishes the changed table
    assert publish.main(_argv(repo, *more)) == 1
    err = _one_error(capsys)
    assert str(path) in err and f"git checkout -- {path}" in err and "rerun" in err, err
  assert (repo / "docs" / "t.md").read_text() == before


def test_provenance_and_notes_added_by_hand_keep_the_seal(written, capsys):
  repo, path = written
  why = {"why_kept": "made on a branch before its rebase", "measured": "the tuned checkpoints"}
  _edit(path, lambda d: d.update(provenance=why, records_note="rerun as t_r2"))
  assert publish.main(_argv(repo)) == 0
  assert "| provenance: why kept | made on a branch" in (repo / "docs" / "t.md").read_text()


def test_a_record_named_unlike_its_file_is_refused(written, capsys):
  repo, path = written
  shutil.copy(path, path.with_name("t_r2.json"))  # a copy posing as a rerun
  assert publish.main(_argv(repo)) == 1
  err = _one_error(capsys)
  assert "t_r2.json names itself 't'" in err and "rename" in err, err


def test_the_probes_edits_of_committed_records_are_refused(tmp_path):
  """The probe's edits of real records: 40 per-problem outcomes of tuned_chain flipped, a
  summary number changed, an invented row in tuned_arithmetic's table."""
  edits = {
    "tuned_chain": lambda d: [
      row["values"].__setitem__(i, 1.0 - row["values"][i])
      for row in d["outcomes"]["bd3lm4"]["0"][:1]
      for i in range(40)
    ],
    "tuned_chain_summary": lambda d: d["summary"]["rows"][0].__setitem__("point", 0.9),
    "tuned_arithmetic": lambda d: d.__setitem__(
      "markdown", d["markdown"].replace("95.6 ± 3.0", "99.9 ± 0.1")
    ),
  }
  for key, change in edits.items():
    name = key.replace("_summary", "")
    results = tmp_path / key
    results.mkdir()
    data = json.loads((RESULTS / f"{name}.json").read_text())
    before = json.dumps(data)
    change(data)
    assert json.dumps(data) != before, key
    (results / f"{name}.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"{name}.json changed since its benchmark wrote it"):
      publish.load_records(str(results))


def test_every_committed_record_is_sealed():
  for name, rec in publish.load_records(str(RESULTS)).items():  # raises on a bad seal
    assert rec["seal"] == record.seal_of(rec, name), name
