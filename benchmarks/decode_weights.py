"""bf16 decoding weights on the conditional tasks (issue 33, item 4): do the tokens stay those of
fp32 when a trained checkpoint decodes with its weights cast to bf16 and a bf16-compute backbone
(`decoding.decode_weights`)? The answer decides the default: bf16 becomes the default only where
every output is unchanged; otherwise fp32 stays the default and the table documents the change.

It reads the checkpoints a `benchmarks.tuned_baselines` run left in its output folder (each
method at its chosen learning rate, every seed) and decodes that run's test problems twice,
greedy, with the same sampler config: fp32 weights and compute (the tuned record's own path,
so its accuracies must come back exactly: the `fp32 = record` column), then bf16 weights and
compute. Settings: each method at its own window (W = S) and every threshold of the run.

  # after the tuned runs (benchmarks/README.md, "Tuned baselines"), one folder per task
  python -m benchmarks.decode_weights --tuned_dirs=/tmp/i35/arith,/tmp/i35/chain \\
      --output_dir=/tmp/decode_weights

Per (task, method, setting): the problems whose decoded output is unchanged (pooled over seeds),
fp32 and bf16 accuracy (mean ± std over seeds), the paired difference bf16 - fp32 with its
hierarchical bootstrap interval (seeds, then the problems they share; Holm over the rows), and
kept tokens per forward call under each. CPU wall times are not reported: XLA:CPU has no fast
bf16 matmul, so the speed of bf16 decoding is the accelerator check's (`decode_dit` rows).
--record=NAME publishes the report (see speed_accuracy's docstring).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List

if __name__ == "__main__" and not __package__:  # a file run cannot import configs/, benchmarks/
  sys.exit(
    "error: run it from the repository root as `python -m benchmarks.decode_weights [flags]`"
  )

import numpy as np  # noqa: E402

from benchmarks import compare_methods as cm  # noqa: E402
from benchmarks import inputs  # noqa: E402
from benchmarks import speed_accuracy as sa  # noqa: E402
from benchmarks import tuned_baselines as tb  # noqa: E402
from setdiff_jax import decoding  # noqa: E402
from setdiff_jax.evaluation import accuracy  # noqa: E402
from setdiff_jax.evaluation.results import hardware  # noqa: E402
from setdiff_jax.evaluation.tables import markdown_table  # noqa: E402
from setdiff_jax.experiments import stats  # noqa: E402
from setdiff_jax.workdir import load as workdir_lib  # noqa: E402

NAME = "decode_weights"
WEIGHTS = ("float32", "bfloat16")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument(
    "--tuned_dirs",
    required=True,
    help="comma-separated output folders of benchmarks.tuned_baselines runs (arithmetic, chain)",
  )
  p.add_argument("--output_dir", default="/tmp/setdiff_decode_weights")
  p.add_argument("--methods", default=None, help="comma-separated subset (default: the run's)")
  p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples")
  p.add_argument("--record", default=None, help="publish as benchmarks/results/RECORD.json")
  p.add_argument("--record_resume", action="store_true", help="--record: replace a re-report")
  p.add_argument("--results_dir", default=None, help="where --record writes (benchmarks/results)")
  return p.parse_args(argv)


def load_tuned(tuned_dir: str) -> Dict[str, Any]:
  """The tuned run's report (`<tuned_dir>/tuned_baselines.json`): plan, chosen rates, outcomes."""
  path = os.path.join(tuned_dir, f"{tb.NAME}.json")
  if not os.path.isfile(path):
    raise ValueError(
      f"{path} not found: give --tuned_dirs the --output_dir of a finished "
      "`python -m benchmarks.tuned_baselines` run"
    )
  with open(path) as f:
    tuned = json.load(f)
  if tuned["plan"]["task"] == "corpus":
    raise ValueError(f"{tuned_dir} is a corpus run: decoding weights are measured on the tasks")
  return tuned


def run_dir(tuned_dir: str, p, method: str, lr: float, seed: int) -> str:
  """The workdir tuned_baselines trained (`<dir>/<task>/lr<lr>/seed<s>/runs/<method>`)."""
  wd = os.path.join(tuned_dir, p["task"], f"lr{lr:g}", f"seed{seed}", "runs", method)
  if not os.path.isfile(os.path.join(wd, "train_info.json")):
    raise ValueError(f"no finished training run at {wd}: rerun benchmarks.tuned_baselines there")
  return wd


def own_window_settings(method: str, p) -> list:
  """The test settings at the method's own window W = S (every threshold of the run)."""
  s = sa.parse_spec(method)[1]
  return [st for st in tb.settings(method, p, "test") if st.window in (None, s)]


def decode_both(workdir: str, p, method: str, seed: int) -> List[Dict[str, Any]]:
  """One row per setting: per-problem outputs, correctness and counters, fp32 and bf16."""
  state = workdir_lib.load_inference_state(workdir, use_ema=False)
  pairs = tb.problems(state, p, "test")
  settings = own_window_settings(method, p)
  per_weights = {}
  for weights in WEIGHTS:
    per_weights[weights] = accuracy.accuracy_eval(
      workdir_lib.inference_model(state.model_config, weights),
      decoding.decode_weights(state.params, weights),
      state.tokenizer,
      state.objective_config,
      int(state.config.seq_len),
      pairs,
      settings=settings,
      batch_size=p["decode_batch"],
      speed_examples=0,
      extractor="hash",
      seed=seed,
      per_example=True,
      num_shown=len(pairs),
    )
  rows = []
  for r32, r16 in zip(*(per_weights[w] for w in WEIGHTS)):
    rows.append(
      {
        "setting": r32["setting"],
        "same_output": [
          a["output"] == b["output"] for a, b in zip(r32["examples"], r16["examples"])
        ],
        **{
          f"{key}_{tag}": r["per_example"][key]
          for tag, r in (("fp32", r32), ("bf16", r16))
          for key in ("correct", "kept", "calls")
        },
      }
    )
  return rows


def reproduces(rows, tuned_outcomes) -> Dict[str, bool]:
  """Per setting: do the fp32 outcomes equal the tuned record's per-problem outcomes?"""
  saved = {r["setting"]: [bool(v) for v in r["values"]] for r in tuned_outcomes}
  return {r["setting"]: saved.get(r["setting"]) == list(r["correct_fp32"]) for r in rows}


def summarize(outcomes: Dict[str, Dict[str, Dict[int, List[Dict[str, Any]]]]], n_boot: int):
  """Per (task, method, setting) over seeds: unchanged outputs, accuracy under each weight type,
  the paired bf16 - fp32 difference with its hierarchical interval, kept tokens per call; Holm
  over all rows. `outcomes[task][method][seed]`: `decode_both`'s rows (+ 'fp32_equals_record')."""
  rows = []
  for task, methods in outcomes.items():
    for method, per_seed in methods.items():
      seeds = sorted(per_seed)
      for setting in [r["setting"] for r in per_seed[seeds[0]]]:
        got = [next(r for r in per_seed[s] if r["setting"] == setting) for s in seeds]
        a32 = np.asarray([g["correct_fp32"] for g in got], float)
        a16 = np.asarray([g["correct_bf16"] for g in got], float)
        iv = stats.interval([a16, a32], stats.mean_difference, n_boot)
        same = sum(sum(g["same_output"]) for g in got)
        rows.append(
          {
            "task": task,
            "method": method,
            "setting": setting,
            "seeds": seeds,
            "problems_per_seed": int(a32.shape[1]),
            "unchanged": int(same),
            "decoded": int(a32.size),
            "acc_fp32_per_seed": a32.mean(axis=1).tolist(),
            "acc_bf16_per_seed": a16.mean(axis=1).tolist(),
            "kept_tokens_per_call_fp32": _per_call(got, "fp32"),
            "kept_tokens_per_call_bf16": _per_call(got, "bf16"),
            "fp32_equals_record": all(g.get("fp32_equals_record") for g in got),
            "difference": iv,
          }
        )
  for row, adj in zip(rows, stats.holm([r["difference"]["p"] for r in rows])):
    row["difference"]["p_holm"] = float(adj)
  unchanged = all(r["unchanged"] == r["decoded"] for r in rows)
  return {"rows": rows, "all_outputs_unchanged": unchanged}


def _per_call(got, tag: str) -> float:
  """Kept tokens per forward call, mean over seeds (each seed: its tokens / its calls)."""
  return float(np.mean([sum(g[f"kept_{tag}"]) / max(sum(g[f"calls_{tag}"]), 1) for g in got]))


def _pm(per_seed) -> str:
  per = 100 * np.asarray(per_seed)
  std = float(np.std(per, ddof=1)) if len(per) > 1 else 0.0
  return f"{per.mean():.1f} ± {std:.1f}"


def report_markdown(record: Dict[str, Any]) -> str:
  summary = record["summary"]
  table = [
    [
      r["task"],
      r["method"],
      r["setting"],
      f"{r['unchanged']}/{r['decoded']} ({100 * r['unchanged'] / r['decoded']:.1f} %)",
      _pm(r["acc_fp32_per_seed"]),
      _pm(r["acc_bf16_per_seed"]),
      f"{100 * r['difference']['point']:+.1f} [{100 * r['difference']['lo']:+.1f}, "
      f"{100 * r['difference']['hi']:+.1f}]",
      f"{r['difference']['p_holm']:.2f}",
      f"{r['kept_tokens_per_call_fp32']:.2f} / {r['kept_tokens_per_call_bf16']:.2f}",
      "yes" if r["fp32_equals_record"] else "no",
    ]
    for r in summary["rows"]
  ]
  verdict = (
    "Every decoded output is unchanged: bf16 decoding weights can be the default."
    if summary["all_outputs_unchanged"]
    else "Some outputs change under bf16 weights, so fp32 stays the default decoding weights; "
    "bf16 (`decoding.decode_weights(params, 'bfloat16')` with a bf16-compute backbone) is an "
    "option whose effect is this table."
  )
  sources = ", ".join(f"`{t['task']}` (commit {t['commit']})" for t in record["tuned"])
  return "\n".join(
    [
      "## bf16 decoding weights on the conditional tasks (issue 33)",
      "",
      f"Checkpoints: the tuned baselines' runs ({sources}), each method at its chosen learning "
      "rate, every seed; greedy decoding of the test problems, fp32 weights and compute against "
      "bf16 weights and compute, the same sampler config.",
      "",
      markdown_table(
        [
          "task",
          "method",
          "setting",
          "outputs unchanged",
          "accuracy % fp32",
          "accuracy % bf16",
          "bf16 - fp32 (points, 95% CI)",
          "p (Holm)",
          "kept tok / call fp32 / bf16",
          "fp32 = record",
        ],
        table,
      ),
      "",
      f"**{verdict}**",
      "",
      "outputs unchanged: problems whose decoded text is the same under both, pooled over seeds. "
      "The interval is the paired hierarchical bootstrap (seeds, then the problems they share); "
      "Holm over the rows. fp32 = record: the fp32 outcomes equal the tuned record's, problem by "
      "problem (the same path, so they must).",
      "",
    ]
  )


def main(argv=None, log=print) -> Dict[str, Any]:
  args = parse_args(argv)
  cm.check_record(args)
  inputs.check_output_dir(args.output_dir)
  dirs = [os.path.abspath(d) for d in args.tuned_dirs.split(",") if d.strip()]
  tuned = [load_tuned(d) for d in dirs]
  wanted = [m.strip() for m in args.methods.split(",")] if args.methods else None
  out_dir = os.path.abspath(args.output_dir)
  os.makedirs(out_dir, exist_ok=True)
  command = "python -m benchmarks.decode_weights " + " ".join(
    argv if argv is not None else sys.argv[1:]
  )
  load_start, t0 = sa.uptime(), time.perf_counter()
  outcomes: Dict[str, Dict[str, Dict[int, List[Dict[str, Any]]]]] = {}
  for d, t in zip(dirs, tuned):
    p = t["plan"]
    with cm.jax_settings({"jax_disable_most_optimizations": True} if p["quick"] else {}):
      for m in p["methods"]:
        if wanted and m not in wanted:
          continue
        lr = t["lr_choice"][m]["chosen"]
        for s in p["seeds"]:
          rows = decode_both(run_dir(d, p, m, lr, s), p, m, s)
          same = reproduces(rows, t["outcomes"][m][str(s)])
          for r in rows:
            r["fp32_equals_record"] = same[r["setting"]]
          outcomes.setdefault(p["task"], {}).setdefault(m, {})[s] = rows
          log(
            f"[{p['task']} {m} lr {lr:g} seed {s}] "
            + ", ".join(
              f"{r['setting']}: {sum(r['same_output'])}/{len(r['same_output'])} unchanged"
              for r in rows
            )
          )
  record = {
    "command": command,
    "commit": sa.commit_label(),
    "hardware": hardware(),
    "load_start": load_start,
    "load_end": sa.uptime(),
    "total_seconds": time.perf_counter() - t0,
    "tuned": [
      {"task": t["plan"]["task"], "commit": t.get("commit"), "dir": d} for d, t in zip(dirs, tuned)
    ],
    "outcomes": outcomes,
  }
  record["summary"] = summarize(outcomes, args.bootstrap)
  record["markdown"] = report_markdown(record)
  sa.dump_json(os.path.join(out_dir, f"{NAME}.json"), record)
  with open(os.path.join(out_dir, f"{NAME}.md"), "w") as f:
    f.write(record["markdown"])
  measured = sa.MEASURED + ("benchmarks/tuned_baselines.py", "benchmarks/decode_weights.py")
  cm.publish(out_dir, NAME, args, measured, compact=True)
  log(record["markdown"])
  return record


if __name__ == "__main__":
  inputs.run(main)
