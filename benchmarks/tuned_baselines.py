"""Tuned baselines (issue 35): each method's learning rate chosen on seed 0's validation split
from a small grid, then every seed trained at its method's chosen value and measured once on the
held-out problems (rows); seed-aware intervals and Holm-adjusted comparisons.

  # the speed-accuracy table: four methods on the arithmetic task (100 validation + 107 test
  # problems per seed: the task's 207 held-out problems in all)
  python -m benchmarks.tuned_baselines --task=arithmetic --output_dir=/tmp/tuned_arith
  # the chain task: BD3LM and SetDLM (the 5000-step recipe of configs/reasoning_chain.py)
  python -m benchmarks.tuned_baselines --task=chain --methods=bd3lm4,setdlm4 --output_dir=...
  # the likelihood table: the four methods of benchmarks/compare_methods.py on the corpus
  python -m benchmarks.tuned_baselines --task=corpus --output_dir=/tmp/tuned_corpus

What is chosen on what: the validation score is greedy accuracy at tau off on the validation
problems (arithmetic, chain) or the one-order NLL bound on the even-numbered validation rows
(corpus: the embedded corpus has no third split, so the odd-numbered rows are kept for the
table); ties go to the smaller learning rate. The test problems (odd rows) are decoded (scored)
once per seed at the chosen value, never during the choice.

Intervals: per method and setting, the hierarchical bootstrap of `setdiff_jax.experiments.stats`
(training seeds resampled, then the problems they share); for each comparison of SetDLM with
another method at the same decoding setting, the paired hierarchical interval and a two-sided
bootstrap p-value, Holm-adjusted over all comparisons in the table.

Every training run is cached under --output_dir (a rerun skips finished training and finished
evaluations: <output_dir>/<task>/lr<lr>/seed<s>/runs/<method>, eval_*.json beside it; a training
folder of other settings, or from before compare_methods' train_fingerprint.json, is refused).
--record=NAME publishes the report as benchmarks/results/NAME.json (see speed_accuracy's
docstring). `--quick` checks the pipeline on tiny models in a minute or two.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional

if __name__ == "__main__" and not __package__:  # a file run cannot import configs/, benchmarks/
  sys.exit(
    "error: run it from the repository root as `python -m benchmarks.tuned_baselines [flags]`"
  )

import numpy as np  # noqa: E402

from benchmarks import compare_methods as cm  # noqa: E402
from benchmarks import inputs  # noqa: E402
from benchmarks import speed_accuracy as sa  # noqa: E402
from configs import reasoning_chain  # noqa: E402
from setdiff_jax import decoders  # noqa: E402
from setdiff_jax.data import pairs as pairs_lib  # noqa: E402
from setdiff_jax.data import tasks as tasks_lib  # noqa: E402
from setdiff_jax.evaluation import accuracy, generation, likelihood, run  # noqa: E402
from setdiff_jax.evaluation.results import hardware  # noqa: E402
from setdiff_jax.evaluation.tables import markdown_table  # noqa: E402
from setdiff_jax.experiments import stats  # noqa: E402
from setdiff_jax.sampling import policies  # noqa: E402
from setdiff_jax.sampling.config import CommitPolicy, DecodeSetting  # noqa: E402
from setdiff_jax.workdir import load as workdir_lib  # noqa: E402

TASKS = ("arithmetic", "chain", "corpus")
METHODS = {
  "arithmetic": "ar,mdlm,bd3lm4,setdlm4",
  "chain": "bd3lm4,setdlm4",
  "corpus": "ar,mdlm,bd3lm4,setdlm4",
}
LR_GRID = "1e-3,2e-3,4e-3"  # around the shared 2e-3 of the reasoning recipe
NAME = "tuned_baselines"
REFERENCE = "setdlm4"  # every comparison is SetDLM S=4 against another method


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--task", required=True, choices=TASKS)
  p.add_argument("--output_dir", default="/tmp/setdiff_tuned_baselines")
  p.add_argument("--methods", default=None, help="comma-separated (default per task, see above)")
  p.add_argument("--lr_grid", default=LR_GRID, help="learning rates tried on the lr seed")
  p.add_argument(
    "--widen",
    type=int,
    default=1,
    help="times a method's grid is widened by one step while its validation optimum sits "
    "strictly best on an edge (0 = the grid as given)",
  )
  p.add_argument("--lr_seed", type=int, default=0, help="the seed whose validation split chooses")
  p.add_argument("--seeds", default="0,1,2", help="seeds trained at the chosen learning rates")
  p.add_argument("--steps", type=int, default=None, help="training steps (the task's recipe)")
  p.add_argument("--num_val", type=int, default=None, help="validation problems (100; quick 4)")
  p.add_argument("--num_test", type=int, default=None, help="test problems (arith 107, chain 1000)")
  p.add_argument("--decode_batch", type=int, default=None, help="rows per decoding call (100)")
  p.add_argument("--thresholds", default="off,0.9", help="decoding settings measured on test")
  p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples")
  p.add_argument("--quick", action="store_true", help="tiny models, few steps and problems")
  p.add_argument("--record", default=None, help="publish as benchmarks/results/RECORD.json")
  p.add_argument("--record_resume", action="store_true", help="--record: replace a re-report")
  p.add_argument("--results_dir", default=None, help="where --record writes (benchmarks/results)")
  args = p.parse_args(argv)
  inputs.check_at_least(args, 1, "steps", "num_val", "num_test", "decode_batch", "bootstrap")
  inputs.check_at_least(args, 0, "widen", "lr_seed")
  return args


def _floats(text: str) -> List[float]:
  return [float(x) for x in text.split(",") if x.strip()]


def plan(args) -> Dict[str, Any]:
  q, task = bool(args.quick), args.task
  steps = {"arithmetic": 1200, "chain": reasoning_chain.get_config("setdlm").num_train_steps}
  p = dict(
    task=task,
    quick=q,
    methods=[m.strip() for m in (args.methods or METHODS[task]).split(",") if m.strip()],
    lr_grid=_floats(args.lr_grid),
    widen=int(args.widen),
    lr_seed=int(args.lr_seed),
    seeds=[int(s) for s in args.seeds.split(",") if s.strip()],
    steps=args.steps or (4 if q else steps.get(task, 700)),
    num_val=args.num_val or (4 if q else 100),
    num_test=args.num_test or (8 if q else {"arithmetic": 107, "chain": 1000}.get(task, 0)),
    decode_batch=args.decode_batch or (8 if q else 100),
    thresholds=[None if t in ("off", "none") else float(t) for t in args.thresholds.split(",")],
    bootstrap=int(args.bootstrap),
  )
  if len(set(p["seeds"])) < 2:  # the intervals resample seeds (experiments.stats refuses one)
    raise ValueError(
      f"--seeds={args.seeds}: the summary's intervals resample seeds, so give at least two "
      "different ones (e.g. --seeds=0,1)"
    )
  if task == "arithmetic" and p["num_val"] + p["num_test"] > sa.ARITH_HELD_OUT:
    raise ValueError(
      f"--num_val {p['num_val']} + --num_test {p['num_test']} exceed the arithmetic task's "
      f"{sa.ARITH_HELD_OUT} held-out problems: lower one of them"
    )
  if p["lr_seed"] not in p["seeds"]:
    raise ValueError(f"--lr_seed {p['lr_seed']} must be one of --seeds {p['seeds']}")
  if not p["lr_grid"]:
    raise ValueError("--lr_grid: give at least one learning rate, e.g. 1e-3,2e-3,4e-3")
  return p


def run_config(method: str, p, seed: int, lr: float):
  """The recipe of `method` on the task, at `seed` and learning rate `lr`."""
  if p["task"] == "corpus":
    args = cm.parse_args(["--quick"] if p["quick"] else [])
    args.seed = seed
    cp = cm.plan(args)
    cp["steps"] = p["steps"]
    c = cm.method_config(method, args, cp)
  else:
    sp = dict(
      hidden_size=None,
      num_layers=None,
      lr=None,
      batch_size=8 if p["quick"] else 32,
      steps=p["steps"],
      num_test=p["num_test"],
    )
    if p["quick"]:
      sp.update(hidden_size=32, num_layers=1)
    c = sa.task_config(sa.method_config(method, sp, seed, p["quick"]), p["task"])
  c.learning_rate = float(lr)
  return c


def train(method: str, p, seed: int, lr: float, out_dir: str, log) -> str:
  """Trains (or finds trained) one run; returns its workdir."""
  sub = os.path.join(out_dir, p["task"], f"lr{lr:g}", f"seed{seed}")
  c = run_config(method, p, seed, lr)
  tok_dir = cm.shared_tokenizer(sub, c)
  return cm.train_method(method, c, sub, tok_dir, log)["workdir"]


def problems(state, p, split: str):
  """The task's validation or test problems (pairs) for a run's data config."""
  data = state.config.data
  if split == "test":
    return pairs_lib.load_pairs(data, "eval")
  if p["task"] == "chain":
    cfg = data.copy_and_resolve_references()
    cfg.task_eval_examples = p["num_val"]
    return pairs_lib.load_pairs(cfg, "validation")
  return tasks_lib.arithmetic_pairs(
    "validation",
    p["num_val"],
    int(data.get("task_seed", 0)),
    num_operands=int(data.task_operands),
    max_operand=int(data.task_max_operand),
    num_test=p["num_test"],
  )


def settings(method: str, p, split: str) -> List[DecodeSetting]:
  """Validation: tau off at the run's own W; test: every --thresholds value (SetDLM at W = S
  and 2S; BD3LM on the block grid, the official harness)."""
  name, s, _ = sa.parse_spec(method)
  decoder = decoders.get(name)
  taus = [None] if split == "val" else p["thresholds"]
  if not decoder.uses_threshold:
    return [DecodeSetting(None, None)]
  windows = ([s] if split == "val" else [s, 2 * s]) if decoder.uses_window else [None]
  return [DecodeSetting(w, _tau(t)) for w in windows for t in taus]


def _tau(tau) -> CommitPolicy:
  return CommitPolicy(policies.DEFAULT, tau)


def score(method: str, workdir: str, p, seed: int, split: str) -> List[Dict[str, Any]]:
  """One row per setting with per-problem outcomes: accuracy (reasoning tasks) or the per-row
  one-order NLL and token count (corpus; `split` val = even rows, test = odd rows)."""
  state = workdir_lib.load_inference_state(workdir, use_ema=False)
  lik_model, gen_model = run.inference_models(state)
  if p["task"] == "corpus":
    tokens, att, ctx = likelihood.eval_rows(state.config, state.tokenizer)
    part = slice(0, None, 2) if split == "val" else slice(1, None, 2)
    nll, count = likelihood.sequence_nlls(
      lik_model,
      state.params,
      state.objective_config,
      tokens[part],
      att[part],
      context_mask=ctx[part],
      seed=seed,
    )
    nll, count = np.asarray(nll)[0], np.asarray(count)
    return [
      {
        "setting": "bound",
        "score": float(nll.sum() / count.sum()),
        "values": nll.tolist(),
        "counts": count.tolist(),
      }
    ]
  rows = accuracy.accuracy_eval(
    gen_model,
    state.params,
    state.tokenizer,
    state.objective_config,
    int(state.config.seq_len),
    problems(state, p, split),
    settings=settings(method, p, split),
    batch_size=p["decode_batch"],
    speed_examples=0,
    extractor="hash",
    seed=seed,
    per_example=True,
  )
  return [
    {
      "setting": r["setting"],
      "score": float(r["accuracy"]),
      "values": [float(x) for x in r["per_example"]["correct"]],
      "kept_tokens_per_call": r.get("kept_tokens_per_call"),
    }
    for r in rows
  ]


def cached_score(method, lr, seed, p, out_dir, split, log) -> List[Dict[str, Any]]:
  path = os.path.join(out_dir, p["task"], f"lr{lr:g}", f"seed{seed}", f"eval_{split}_{method}.json")
  key = {k: p[k] for k in ("steps", "num_val", "num_test", "thresholds", "quick")}
  if os.path.isfile(path):
    with open(path) as f:
      saved = json.load(f)
    if saved.get("key") == json.loads(json.dumps(key)):
      return saved["rows"]
  workdir = train(method, p, seed, lr, out_dir, log)
  rows = score(method, workdir, p, seed, split)
  log(
    f"[{method} lr {lr:g} seed {seed}] {split}: "
    + ", ".join(f"{r['setting']} {r['score']:.4f}" for r in rows)
  )
  sa.dump_json(path, {"key": key, "rows": rows})
  return rows


def choose_lr(val: Dict[float, float], lower_is_better: bool) -> float:
  """The best validation score; ties go to the smaller learning rate."""
  sign = 1.0 if lower_is_better else -1.0
  return min(sorted(val), key=lambda lr: (sign * val[lr], lr))


def widened(val: Dict[float, float], lower_is_better: bool) -> Optional[float]:
  """The learning rate to try next when the validation optimum sits on an edge of the tried
  grid and is strictly better than its neighbour (the optimum may lie outside): one grid step
  (the ratio of the two outermost rates on that side, x2 for a single rate) further out; None
  when the optimum is inside, or ties its neighbour (a flat curve says nothing about outside)."""
  grid = sorted(val)
  if len(grid) < 2:
    return None
  best, sign = choose_lr(val, lower_is_better), 1.0 if lower_is_better else -1.0
  if best == grid[0] and sign * val[grid[0]] < sign * val[grid[1]]:
    return grid[0] * grid[0] / grid[1]
  if best == grid[-1] and sign * val[grid[-1]] < sign * val[grid[-2]]:
    return grid[-1] * grid[-1] / grid[-2]
  return None


def choose_with_widening(method: str, p, score, lower_is_better: bool, log) -> Dict[str, Any]:
  """Scores the grid on the lr seed's validation split (`score(lr) -> float`), widens it at
  most `p["widen"]` times while the optimum sits on an edge (`widened`), and chooses."""
  val = {lr: score(lr) for lr in p["lr_grid"]}
  for _ in range(p["widen"]):
    extra = widened(val, lower_is_better)
    if extra is None:
      break
    extra = float(f"{extra:.3g}")
    log(f"[{method}] validation optimum on the grid's edge: also trying lr {extra:g}")
    val[extra] = score(extra)
  chosen = choose_lr(val, lower_is_better)
  return {"val": {f"{lr:g}": val[lr] for lr in sorted(val)}, "chosen": chosen}


def summarize(per_seed: Dict[str, Dict[int, List[Dict[str, Any]]]], p) -> Dict[str, Any]:
  """Per (method, setting): mean over seeds with its hierarchical interval; SetDLM vs every other
  method at the same setting label: paired hierarchical interval, p, Holm-adjusted p."""
  corpus = p["task"] == "corpus"
  seeds = p["seeds"]

  def matrix(method, setting, key="values"):
    rows = [[r for r in per_seed[method][s] if r["setting"] == setting][0] for s in seeds]
    return np.asarray([r[key] for r in rows], float)

  def stat_of(arrays):
    if corpus:
      return float(arrays[0].sum() / arrays[1].sum())
    return float(arrays[0].mean())

  rows, comps = [], []
  for m in p["methods"]:
    for setting in [r["setting"] for r in per_seed[m][seeds[0]]]:
      arrays = [matrix(m, setting)] + ([matrix(m, setting, "counts")] if corpus else [])
      iv = stats.interval(arrays, lambda *a: stat_of(a), p["bootstrap"])
      per = [stat_of([a[i : i + 1] for a in arrays]) for i in range(len(seeds))]
      kept = [
        [r for r in per_seed[m][s] if r["setting"] == setting][0].get("kept_tokens_per_call")
        for s in seeds
      ]
      rows.append(
        {
          "method": m,
          "setting": setting,
          "per_seed": per,
          "std": float(np.std(per, ddof=1)) if len(per) > 1 else 0.0,
          # the speed axis (exact, not timed): tokens kept per forward call, mean over seeds
          "kept_tokens_per_call": None if None in kept else float(np.mean(kept)),
          **iv,
        }
      )
  if REFERENCE in p["methods"]:
    for m in p["methods"]:
      if m == REFERENCE:
        continue
      ref_settings = {r["setting"] for r in per_seed[REFERENCE][seeds[0]]}
      window = sa.parse_spec(REFERENCE)[1]
      for setting in [r["setting"] for r in per_seed[m][seeds[0]]]:
        # the same decoding setting at SetDLM's W = S (AR, which has no tau: tau off)
        tau = next((x[4:] for x in setting.split() if x.startswith("tau=")), "off")
        same = DecodeSetting(window, _tau(generation.parse_thresholds([tau])[0])).name
        ref = setting if setting in ref_settings else same
        a = [matrix(REFERENCE, ref)] + ([matrix(REFERENCE, ref, "counts")] if corpus else [])
        b = [matrix(m, setting)] + ([matrix(m, setting, "counts")] if corpus else [])
        iv = stats.interval(
          a + b, lambda *x: stat_of(x[: len(a)]) - stat_of(x[len(a) :]), p["bootstrap"]
        )
        comps.append({"a": REFERENCE, "a_setting": ref, "b": m, "b_setting": setting, **iv})
    if comps:
      for c, adj in zip(comps, stats.holm([c["p"] for c in comps])):
        c["p_holm"] = float(adj)
  return {"rows": rows, "comparisons": comps}


def _val(x, fmt) -> str:
  return "-" if x is None else fmt(x)


def _kept(x) -> str:
  return "-" if x is None else f"{x:.2f}"


def report_markdown(record: Dict[str, Any]) -> str:
  p, corpus = record["plan"], record["plan"]["task"] == "corpus"
  unit, scale = ("NLL (nats/token)", 1.0) if corpus else ("accuracy %", 100.0)
  fmt = (lambda x: f"{x * scale:.3f}") if corpus else (lambda x: f"{x * scale:.1f}")
  tried = sorted({float(lr) for m in p["methods"] for lr in record["lr_choice"][m]["val"]})
  lr_rows = [
    [
      m,
      *[_val(record["lr_choice"][m]["val"].get(f"{lr:g}"), fmt) for lr in tried],
      f"{record['lr_choice'][m]['chosen']:g}",
    ]
    for m in p["methods"]
  ]
  speed = not corpus and any(r.get("kept_tokens_per_call") for r in record["summary"]["rows"])
  main = [
    [
      r["method"],
      r["setting"],
      f"{fmt(r['point'])} ± {fmt(r['std'])}",
      f"[{fmt(r['lo'])}, {fmt(r['hi'])}]",
      " / ".join(fmt(x) for x in r["per_seed"]),
      *([_kept(r.get("kept_tokens_per_call"))] if speed else []),
    ]
    for r in record["summary"]["rows"]
  ]
  d = (lambda x: f"{x:+.3f}") if corpus else (lambda x: f"{x * scale:+.1f}")  # noqa: E731
  comp = [
    [
      f"{c['a']} {c['a_setting']} - {c['b']} {c['b_setting']}",
      d(c["point"]),
      f"[{d(c['lo'])}, {d(c['hi'])}]",
      f"{c['p']:.3f}",
      f"{c['p_holm']:.3f}",
    ]
    for c in record["summary"]["comparisons"]
  ]
  md = [
    f"## Tuned baselines on the {p['task']} task ({'quick' if p['quick'] else 'full'} run)",
    "",
    f"Command: `{record['command']}`",
    "",
    f"Each method's learning rate chosen from {', '.join(f'{x:g}' for x in p['lr_grid'])}"
    + (
      f" (widened by one step, at most {p['widen']} time(s), where the optimum sat strictly best "
      "on an edge; '-': not tried)"
      if p.get("widen")
      else ""
    )
    + " on "
    f"seed {p['lr_seed']}'s validation split ({'even validation rows, one-order bound' if corpus else str(p['num_val']) + ' problems, greedy, tau off'}; "
    "ties to the smaller), then seeds "
    f"{', '.join(map(str, p['seeds']))} at the chosen value; {p['steps']} steps. "
    f"Test: {'odd validation rows' if corpus else str(p['num_test']) + ' problems per seed'}.",
    "",
    markdown_table(["method", *[f"val {unit} at lr {lr:g}" for lr in tried], "chosen lr"], lr_rows),
    "",
    f"Test {unit}: mean ± std over seeds, 95 % hierarchical bootstrap interval (seeds, then "
    f"shared problems; {p['bootstrap']} resamples), per seed"
    + (
      "; the speed axis: tokens kept per forward call (prompt prefill included), mean over seeds:"
      if not corpus
      else ":"
    ),
    "",
    markdown_table(
      ["method", "setting", f"{unit} (mean ± std)", "95% CI", "per seed"]
      + (["kept tokens / call"] if speed else []),
      main,
    ),
    "",
  ]
  if comp:
    md += [
      f"{REFERENCE} against each method (AR: against {REFERENCE}'s tau-off row), paired "
      f"hierarchical bootstrap; p two-sided, Holm-adjusted over the {len(comp)} comparisons "
      f"({'NLL' if corpus else 'points'}; {'negative = SetDLM lower' if corpus else 'positive = SetDLM more accurate'}):",
      "",
      markdown_table(["comparison", "difference", "95% CI", "p", "p (Holm)"], comp),
      "",
    ]
  return "\n".join(md)


def main(argv=None, log=print) -> Dict[str, Any]:
  args = parse_args(argv)
  cm.check_record(args)
  p = plan(args)
  inputs.check_output_dir(args.output_dir)
  out_dir = os.path.abspath(args.output_dir)
  os.makedirs(out_dir, exist_ok=True)
  command = "python -m benchmarks.tuned_baselines " + " ".join(
    argv if argv is not None else sys.argv[1:]
  )
  load_start, t0 = sa.uptime(), time.perf_counter()
  lower = p["task"] == "corpus"
  choice, per_seed = {}, {}
  with cm.jax_settings({"jax_disable_most_optimizations": True} if p["quick"] else {}):
    for m in p["methods"]:
      val_score = lambda lr: cached_score(m, lr, p["lr_seed"], p, out_dir, "val", log)[0]["score"]  # noqa: E731
      choice[m] = choose_with_widening(m, p, val_score, lower, log)
      chosen = choice[m]["chosen"]
      log(f"[{m}] learning rate {chosen:g} (validation: {choice[m]['val']})")
      per_seed[m] = {s: cached_score(m, chosen, s, p, out_dir, "test", log) for s in p["seeds"]}
  record = {
    "command": command,
    "commit": sa.commit_label(),
    "plan": p,
    "hardware": hardware(),
    "load_start": load_start,
    "load_end": sa.uptime(),
    "total_seconds": time.perf_counter() - t0,
    "lr_choice": choice,
    "outcomes": per_seed,
  }
  record["summary"] = summarize(per_seed, p)
  record["markdown"] = report_markdown(record)
  sa.dump_json(os.path.join(out_dir, f"{NAME}.json"), record)
  with open(os.path.join(out_dir, f"{NAME}.md"), "w") as f:
    f.write(record["markdown"])
  measured = sa.MEASURED + ("benchmarks/tuned_baselines.py",)
  cm.publish(out_dir, NAME, args, measured, compact=True)
  log(record["markdown"])
  return record


if __name__ == "__main__":
  inputs.run(main)
