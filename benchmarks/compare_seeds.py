r"""The embedded-corpus method comparison over seeds: one table from several runs of
`benchmarks.compare_methods` that differ only in --seed (its records, or its results.json files).

  python -m benchmarks.compare_seeds \
      --runs=compare_tuned_s0,compare_tuned_s1,compare_tuned_s2 --output_dir=/tmp/compare_seeds

Each run (a seed) trains every method with its own init, data order and sampling draws, and
keeps one number per metric and method (a perplexity over the validation rows, a ROUGE-L over
the infill examples). The seeds are therefore the sample: every cell is the mean ± std over the
seeds with its Student-t 95 % interval, and `--against` (default setdlm4) minus each other
method is paired by seed (the same seed's data order, validation rows, prompts and draws), with
the paired t interval and Holm over the whole family (`experiments.stats`).

--runs: record names in --results_dir (default benchmarks/results) or paths of results.json
files. They must agree on everything but the seed (the commit, methods, learning rates, plan,
recipe, sampling, hardware); else one `error:` line names the difference. At least 3 seeds.
--record=NAME publishes the table as a record (clean commit on main; `experiments.record`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Any, Dict, List, Optional

if __name__ == "__main__" and not __package__:  # a file run cannot import benchmarks/
  sys.exit("error: run it from the repository root as `python -m benchmarks.compare_seeds [flags]`")

from benchmarks import compare_methods  # noqa: E402
from setdiff_jax.evaluation.tables import markdown_table  # noqa: E402
from setdiff_jax.experiments import record as record_lib  # noqa: E402
from setdiff_jax.experiments import stats  # noqa: E402

NAME = "compare_seeds"
MIN_SEEDS = 3
# Fields every run must share; the command may differ only in these flags.
SHARED_FIELDS = ("commit", "methods", "lrs", "plan", "recipe", "top_p", "quick", "hardware")
PER_SEED_FLAGS = ("--seed", "--output_dir", "--record", "--record_resume", "--results_dir")
TAU_HI = "0.9"  # the threshold of the tau columns (compare_methods' table shows off and 0.9)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument(
    "--runs", required=True, help="record names or results.json paths, comma-separated"
  )
  p.add_argument("--against", default="setdlm4", help="the method paired against every other")
  p.add_argument("--output_dir", default="/tmp/setdiff_compare_seeds")
  p.add_argument("--record", default=None, help="publish the table as the record RECORD")
  p.add_argument("--record_resume", action="store_true", help="--record: replace a re-report")
  p.add_argument("--results_dir", default=None, help="where runs are read and --record writes")
  return p.parse_args(argv)


def load_run(ref: str, results_dir: str) -> Dict[str, Any]:
  """A compare_methods report: `ref` as a path to a .json file, else a record name."""
  path = ref if ref.endswith(".json") else os.path.join(results_dir, f"{ref}.json")
  if not os.path.isfile(path):
    raise ValueError(f"run {ref!r}: no file {path}; give a record name or a results.json path")
  with open(path) as f:
    run = json.load(f)
  if "results" not in run or "seed" not in run:
    raise ValueError(f"run {ref!r} ({path}) is not a benchmarks.compare_methods report")
  return run


def _flags_but_seed(command: str) -> List[str]:
  return [w for w in shlex.split(command) if not any(w.split("=")[0] == f for f in PER_SEED_FLAGS)]


def check_runs(runs: List[Dict[str, Any]]) -> None:
  """Refuses runs that differ in more than the seed, repeat a seed, or are too few."""
  if len(runs) < MIN_SEEDS:
    raise ValueError(f"{len(runs)} run(s): an interval that counts seeds needs >= {MIN_SEEDS}")
  seeds = [r["seed"] for r in runs]
  if len(set(seeds)) != len(seeds):
    raise ValueError(f"seeds {seeds} repeat: each run must be another --seed")
  first = runs[0]
  for r in runs[1:]:
    for field in SHARED_FIELDS:
      if r.get(field) != first.get(field):
        raise ValueError(
          f"seed {r['seed']} differs from seed {first['seed']} in {field!r} "
          f"({r.get(field)!r} vs {first.get(field)!r}): combine runs of one command and commit"
        )
    if _flags_but_seed(r["command"]) != _flags_but_seed(first["command"]):
      raise ValueError(
        f"seed {r['seed']}'s command differs in more than {', '.join(PER_SEED_FLAGS)}: "
        f"{r['command']!r} vs {first['command']!r}"
      )


def _row(rows, **match) -> Optional[Dict[str, Any]]:
  return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), None)


def metrics_of(result: Dict[str, Any], plan: Dict[str, Any]) -> Dict[str, Optional[float]]:
  """One method's numbers in one run: {column: value} (None where the run has no such row)."""
  b1, b8 = min(plan["speed_batch_sizes"]), max(plan["speed_batch_sizes"])
  sp, inf, lik = result["speed"], result["infill"], result["likelihood"]
  off1, off8 = _row(sp, batch_size=b1, threshold="off"), _row(sp, batch_size=b8, threshold="off")
  hi1 = _row(sp, batch_size=b1, threshold=TAU_HI) or off1  # AR has no threshold rows
  hi8 = _row(sp, batch_size=b8, threshold=TAU_HI) or off8
  rouge = lambda d: (_row(inf, dataset=d, threshold="off") or {}).get("rougeL")  # noqa: E731
  return {
    "val NLL (1 order)": lik["nll"],
    f"val NLL (K={plan['num_orders']})": lik["K_nll"],
    f"tok/step b={b1} tau 0.9": hi1["tokens_per_step"],
    f"tok/s b={b1} tau off": off1["tokens_per_second"],
    "gen PPL tau off": off8["quality"].get("gen_ppl"),
    "gen PPL tau 0.9": hi8["quality"].get("gen_ppl"),
    "entropy tau off": off8["quality"].get("unigram_entropy"),
    "R-L cloze-1": rouge("1sent"),
    "R-L cloze-3": rouge("3sent"),
    "R-L corpus": rouge("corpus"),
  }


# The metrics paired against --against (the likelihood and the infill quality: the paper's claims).
PAIRED = ("val NLL (1 order)", "R-L cloze-1", "R-L cloze-3", "R-L corpus")


def per_seed(runs: List[Dict[str, Any]]) -> Dict[str, Dict[str, List[float]]]:
  """{method: {column: [value per seed, in the runs' order]}}."""
  out: Dict[str, Dict[str, List[float]]] = {}
  for run in runs:
    for result in run["results"]:
      for col, v in metrics_of(result, run["plan"]).items():
        out.setdefault(result["method"], {}).setdefault(col, []).append(v)
  return out


def summarize(runs: List[Dict[str, Any]], against: str) -> Dict[str, Any]:
  """Per method and column the seed summary; `against` minus each other method, paired, Holm."""
  check_runs(runs)
  values = per_seed(runs)
  if against not in values:
    raise ValueError(f"--against={against}: the runs hold {sorted(values)}")
  summary = {
    m: {c: (stats.seed_summary(v) if None not in v else None) for c, v in cols.items()}
    for m, cols in values.items()
  }
  pairs = []
  for m in (m for m in values if m != against):
    for col in PAIRED:
      a, b = values[against][col], values[m][col]
      if None in a or None in b:
        continue
      pairs.append({"method": m, "metric": col, **stats.paired_seed_difference(a, b)})
  for row, p in zip(pairs, stats.holm([r["p"] for r in pairs]) if pairs else []):
    row["p_holm"] = float(p)
  return {"seeds": [r["seed"] for r in runs], "values": values, "summary": summary, "pairs": pairs}


def _cell(s: Optional[Dict[str, float]], digits: int) -> str:
  if s is None:
    return "-"
  return (
    f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f} [{s['lo']:.{digits}f}, {s['hi']:.{digits}f}]"
  )


def _digits(col: str) -> int:
  return 3 if "NLL" in col else 2 if ("tok/step" in col or "entropy" in col) else 1


def report_markdown(report: Dict[str, Any]) -> str:
  s, runs0 = report["summary"], report["runs"][0]
  lrs, methods = runs0["lrs"], list(s)
  cols = list(next(iter(s.values())))
  header = ["column"] + [f"{m} (lr {lrs[m]:g})" for m in methods]
  body = [[c] + [_cell(s[m][c], _digits(c)) for m in methods] for c in cols]
  table = markdown_table(header, body)
  pair_rows = [
    [
      f"{report['against']} - {r['method']}",
      r["metric"],
      f"{r['point']:+.{_digits(r['metric'])}f}",
      f"[{r['lo']:+.{_digits(r['metric'])}f}, {r['hi']:+.{_digits(r['metric'])}f}]",
      f"{r['p']:.3f}",
      f"{r['p_holm']:.3f}",
    ]
    for r in report["pairs"]
  ]
  pairs = markdown_table(
    ["difference", "metric", "mean", "95% t interval", "p", "p (Holm)"], pair_rows
  )
  plan = runs0["plan"]
  return "\n".join(
    [
      f"## Method comparison over {len(report['seeds'])} seeds (benchmarks.compare_seeds)",
      "",
      f"Runs: {', '.join(report['refs'])} (seeds {report['seeds']}, commit "
      f"`{str(runs0.get('commit'))[:10]}`); one run's command: `{runs0['command']}`.",
      "",
      f"Recipe: configs/compare.py, {plan['steps']} steps x batch {plan['batch_size']}, each "
      "method at the learning rate in its column. Each cell: mean ± std over the seeds "
      "[95 % Student-t interval of the mean].",
      "",
      table,
      "",
      f"Paired by seed: {report['against']} minus each method (negative NLL and positive ROUGE-L "
      "favour it); paired t over the seeds, Holm over all rows.",
      "",
      pairs,
      "",
      "val NLL: nats/token on the validation rows (1 order: AR exact, MDLM / BD3LM the 1/t NELBO, "
      "SetDLM one order; K: log-mean-exp over K orders for SetDLM, the mean of K draws "
      "otherwise). tok/step: kept tokens per forward call at batch 1 (exact); tok/s: the CPU "
      "rate of the compare run (noisy, load not controlled across seeds). gen PPL and entropy: "
      "the batch-8 samples scored by the same seed's AR run. R-L: infill ROUGE-L (tau off, "
      "greedy, oracle length), Story Cloze 1 / 3 sentences and corpus paragraphs.",
    ]
  )


def main(argv=None, log=print) -> Dict[str, Any]:
  args = parse_args(argv)
  results_dir = args.results_dir or compare_methods.RESULTS_DIR
  if args.record:
    compare_methods.check_record(args)
  refs = [r.strip() for r in args.runs.split(",") if r.strip()]
  runs = [load_run(r, results_dir) for r in refs]
  report = {"refs": refs, "against": args.against, **summarize(runs, args.against)}
  report["runs"] = [{k: r.get(k) for k in SHARED_FIELDS + ("seed", "command")} for r in runs]
  report["hardware"] = runs[0].get("hardware")  # the same for every run (check_runs)
  report["command"] = "python -m benchmarks.compare_seeds " + " ".join(
    argv if argv is not None else sys.argv[1:]
  )
  report["markdown"] = report_markdown(report)
  out_dir = os.path.abspath(args.output_dir)
  os.makedirs(out_dir, exist_ok=True)
  record_lib.write_json(os.path.join(out_dir, f"{NAME}.json"), report)
  measured = compare_methods.MEASURED + ("benchmarks/compare_seeds.py",)
  compare_methods.publish(out_dir, NAME, args, measured, images={})
  log(report["markdown"])
  return report


if __name__ == "__main__":
  try:
    main()
  except (ValueError, record_lib.RecordError) as e:
    sys.exit(f"error: {e}")
