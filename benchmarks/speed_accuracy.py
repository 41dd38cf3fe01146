r"""The speed-accuracy trade-off of SPEC §7.1 on the procedural arithmetic task (CPU scale).

  python benchmarks/speed_accuracy.py --output_dir=/tmp/speed_accuracy   # full (~45 min, 2 cores)
  python benchmarks/speed_accuracy.py --quick --output_dir=/tmp/sa_quick  # pipeline check (<2 min)
  python benchmarks/speed_accuracy.py --methods=bd3lm4,mdlm,mdlm+eos --align_to_blocks=both \
      --seeds=0,1,2 --output_dir=/tmp/sa_baselines   # the baselines as the paper ran them

Trains AR, MDLM, BD3LM-4 and SetDLM S=4 (S_max=8) with one recipe (configs/reasoning_common.py:
the same backbone, data, batch, steps, optimizer and seed; one tokenizer trained once and shared),
then decodes every test problem (distinct, disjoint from training) greedily with each method's
sampler: prompt cached, EOS stop per row, batch --decode_batch, and sweeps the confidence
threshold tau in {off, 0.99, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6} (MDLM, BD3LM, SetDLM) and the window
W in --windows (SetDLM). Per point: exact-match accuracy of the '#### n' line, tokens/step
(committed, the reference's parallelism factor) and kept tokens/step (nothing committed after the
first EOS counts), forward calls, mean generated tokens, tokens/s at the decoding batch and at
batch 1 (kept tokens).

A method `X+eos` (e.g. mdlm+eos) trains with data.pad_targets=eos (the answer's tail up to L is
EOS, attended targets). --align_to_blocks on|off|both decodes BD3LM with blocks on the grid (on:
the official harness's align_inputs_to_blocks, the default), from each prompt's end (off), or
both. --seeds=0,1,2 trains and decodes every method once per seed (runs under seed<k>/) and adds
a table of mean +- std over the seeds.

Writes to --output_dir: speed_accuracy.json (everything), speed_accuracy.md (table, command,
machine load), speed_accuracy.png (accuracy vs tokens/s at batch 1, and vs tokens/step; one curve
per method), runs/<method>/ (training workdirs; a re-run skips finished training) and tokenizer/.
--results_dir (default benchmarks/results for a full run) receives copies of the three files.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.compare_methods import _jax_settings, shared_tokenizer, train_method  # noqa: E402
from configs import compare, reasoning_common  # noqa: E402
from setdiff_jax.workdir import load as workdir_lib  # noqa: E402
from setdiff_jax.data import pairs as pairs_lib  # noqa: E402
from setdiff_jax.evaluation import accuracy, run  # noqa: E402
from setdiff_jax.evaluation.generation import threshold_label  # noqa: E402

METHODS = ("ar", "mdlm", "bd3lm4", "setdlm4")
THRESHOLDS = (None, 0.99, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6)
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
NAME = "speed_accuracy"


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--output_dir", default="/tmp/setdiff_speed_accuracy")
  p.add_argument("--results_dir", default=None,
                 help="copy the table/plot/json here (default: benchmarks/results for a full "
                      "run, none for --quick; 'none' disables)")
  p.add_argument("--quick", action="store_true", help="tiny models and few steps / problems")
  p.add_argument("--methods", default=",".join(METHODS),
                 help="comma-separated: ar, mdlm, bd3lm<S>, setdlm<S> (S_max = 2S)")
  p.add_argument("--steps", type=int, default=None, help="training steps (recipe: 1200)")
  p.add_argument("--batch_size", type=int, default=None, help="training batch (recipe: 32)")
  p.add_argument("--hidden_size", type=int, default=None)
  p.add_argument("--num_layers", type=int, default=None)
  p.add_argument("--lr", type=float, default=None)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--seeds", default=None,
                 help="comma-separated seeds (overrides --seed): one training per method and "
                      "seed, plus a mean +- std table")
  p.add_argument("--align_to_blocks", default="on", choices=("on", "off", "both"),
                 help="BD3LM decode blocks on the block grid (on, the official harness), from "
                      "each prompt's end (off), or both")
  p.add_argument("--thresholds", default=",".join(threshold_label(t) for t in THRESHOLDS))
  p.add_argument("--windows", default="4,8", help="SetDLM windows W (the run's S is the default)")
  p.add_argument("--num_test", type=int, default=None, help="test problems (200; quick 8)")
  p.add_argument("--decode_batch", type=int, default=None, help="rows per decoding call (50)")
  p.add_argument("--speed_examples", type=int, default=None,
                 help="prompts timed one per call at batch 1 (16; quick 2)")
  return p.parse_args(argv)


def plan(args) -> Dict[str, Any]:
  p = dict(steps=1200, batch_size=32, hidden_size=None, num_layers=None, lr=None, num_test=200,
           decode_batch=50, speed_examples=16,
           thresholds=[None if t in ("off", "none") else float(t)
                       for t in args.thresholds.split(",") if t.strip()],
           windows=[int(w) for w in args.windows.split(",") if w.strip()])
  if args.quick:
    # decode_batch = 1: the batch-1 timing reuses the decoding compile (one per setting)
    p.update(steps=4, batch_size=8, hidden_size=32, num_layers=1, num_test=8, decode_batch=1,
             speed_examples=2, thresholds=[None, 0.9], windows=[4])
  for k in ("steps", "batch_size", "hidden_size", "num_layers", "lr", "num_test", "decode_batch",
            "speed_examples"):
    if getattr(args, k) is not None:
      p[k] = getattr(args, k)
  return p


def parse_spec(method: str):
  """'mdlm+eos' -> ('mdlm', None, 'eos'); 'bd3lm4' -> ('bd3lm', 4, 'none')."""
  base, plus, tail = method.partition("+")
  if plus and tail != "eos":
    raise ValueError(f"--methods: {method!r}; the only suffix is '+eos' (trains with "
                     "data.pad_targets=eos), e.g. mdlm+eos")
  name, s = compare.parse_method(base)
  return name, s, "eos" if plus else "none"


def method_config(method: str, p: Dict[str, Any], seed: int, quick: bool):
  name, s, pad_targets = parse_spec(method)
  c = reasoning_common.get_config(name)
  c.seed = seed
  c.data.pad_targets = pad_targets
  if name == "setdlm":
    c.loss.desired_set_size, c.loss.max_set_size = s, 2 * s
  if name == "bd3lm":
    c.loss.block_size = s
  for key, field in (("hidden_size", "hidden_size"), ("num_layers", "num_layers")):
    if p[key]:
      c.model[field] = p[key]
  if quick:
    c.model.num_heads = 2
    c.model.cond_dim = 16
    c.data.task_train_examples = 200
    c.log_every_steps = 1
  if p["lr"]:
    c.learning_rate = p["lr"]
  c.batch_size = p["batch_size"]
  c.num_train_steps = p["steps"]
  c.warmup_steps = min(c.warmup_steps, max(p["steps"] // 10, 1))
  c.eval_every_steps = c.checkpoint_every_steps = p["steps"]
  c.num_eval_steps = 1 if quick else 2
  c.data.task_eval_examples = p["num_test"]
  c.eval_batch_size = min(c.eval_batch_size, p["num_test"])
  return c


def settings_for(name: str, s, p) -> List[Dict[str, Any]]:
  if name == "ar":
    return [{"window": None, "threshold": None}]
  if name == "setdlm":
    windows = sorted(set(p["windows"] or [s]))
    return [{"window": w, "threshold": t} for w in windows for t in p["thresholds"]]
  return [{"window": None, "threshold": t} for t in p["thresholds"]]


ALIGN = {"on": [True], "off": [False], "both": [True, False]}


def evaluate_method(method: str, workdir: str, p, seed: int, log,
                    align: str = "on") -> Dict[str, Any]:
  state = workdir_lib.load_inference_state(workdir, use_ema=False)
  name, s, _ = parse_spec(method)
  test = pairs_lib.load_pairs(state.config.data, "eval")
  _, gen_model = run._models(state)  # pylint: disable=protected-access
  t0 = time.perf_counter()
  rows = []
  for aligned in ALIGN[align] if name == "bd3lm" else ALIGN[align][:1]:  # no-op for the others
    rows += accuracy.accuracy_eval(gen_model, state.params, state.tokenizer,
                                   state.objective_config, int(state.config.seq_len), test,
                                   settings=settings_for(name, s, p), batch_size=p["decode_batch"],
                                   speed_examples=p["speed_examples"], extractor="hash",
                                   seed=seed, align_to_blocks=aligned)
  for r in rows:
    r["method"] = method
    if name != "bd3lm":  # the setting has no effect on the others (MDLM: one sub-block of N)
      r["align_to_blocks"] = None
    log(f"[{method}] {r['setting']} align {r['align_to_blocks']}: acc {r['accuracy']:.3f}  "
        f"tok/step {r['tokens_per_step']:.2f} (kept {r['kept_tokens_per_step']:.2f})  tok/s "
        f"b{r['batch_size']} {r['tokens_per_second']:.0f}  b1 "
        f"{r['tokens_per_second_batch1'] or 0:.0f}")
  return {"method": method, "objective": name, "num_test": len(test),
          "num_params": int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(state.params))),
          "eval_seconds": time.perf_counter() - t0, "rows": rows}


# ----------------------------------------------------------------------------- report
def _align_label(x) -> str:
  a = x.get("align_to_blocks")
  return "-" if a is None else ("grid" if a else "prompt end")


def table(results) -> str:
  header = ["method", "W", "tau", "blocks", "accuracy", "tok/step", "kept tok/step", "fwd calls",
            "gen tokens", "tok/s b=1", "tok/s batch", "b1 = batched"]
  body = []
  for r in results:
    for x in r["rows"]:
      body.append([r["method"], x["window"], x["threshold"], _align_label(x), x["accuracy"],
                   x["tokens_per_step"], x.get("kept_tokens_per_step"), x["forward_calls"],
                   x["mean_generated_tokens"], x["tokens_per_second_batch1"],
                   x["tokens_per_second"], x["batch1_matches_batched"]])
  return run.markdown_table(header, body)


MEAN_FIELDS = ("accuracy", "tokens_per_step", "kept_tokens_per_step", "forward_calls",
               "mean_generated_tokens", "tokens_per_second_batch1", "tokens_per_second")


def summarize_seeds(runs) -> List[Dict[str, Any]]:
  """Per (method, W, tau, blocks): the mean and std over the seeds of every MEAN_FIELDS value,
  as `results`-shaped records (rows carry `<field>` = mean and `<field>_std`, `num_seeds`)."""
  out: Dict[str, Dict[str, Any]] = {}
  for seed_run in runs:
    for r in seed_run["results"]:
      rec = out.setdefault(r["method"], {"method": r["method"], "objective": r["objective"],
                                         "num_test": r["num_test"], "groups": {}})
      for x in r["rows"]:
        key = (x["window"], x["threshold"], x.get("align_to_blocks"))
        rec["groups"].setdefault(key, []).append(x)
  summary = []
  for rec in out.values():
    rows = []
    for (w, tau, align), xs in rec.pop("groups").items():
      row = {"window": w, "threshold": tau, "align_to_blocks": align, "num_seeds": len(xs),
             "num_examples": xs[0]["num_examples"], "setting": xs[0]["setting"]}
      for f in MEAN_FIELDS:
        vals = np.array([x.get(f) or 0.0 for x in xs], np.float64)
        row[f], row[f + "_std"] = float(vals.mean()), float(vals.std(ddof=1) if len(vals) > 1
                                                            else 0.0)
      rows.append(row)
    summary.append({**rec, "rows": rows})
  return summary


def summary_table(summary) -> str:
  header = ["method", "W", "tau", "blocks", "seeds", "n test", "accuracy % (mean ± std)",
            "kept tok/step", "tok/step", "fwd calls", "gen tokens", "tok/s b=1"]
  body = []
  for r in summary:
    for x in r["rows"]:
      body.append([r["method"], x["window"], x["threshold"], _align_label(x), x["num_seeds"],
                   x["num_examples"],
                   f"{100 * x['accuracy']:.1f} ± {100 * x['accuracy_std']:.1f}",
                   x["kept_tokens_per_step"], x["tokens_per_step"], x["forward_calls"],
                   x["mean_generated_tokens"], x["tokens_per_second_batch1"]])
  return run.markdown_table(header, body)


def plot(results, path: str):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
  for i, r in enumerate(results):
    groups: Dict[Any, list] = {}
    for x in r["rows"]:
      groups.setdefault((x["window"], str(x.get("align_to_blocks"))), []).append(x)
    for j, ((w, _), rows) in enumerate(sorted(groups.items(),
                                               key=lambda kv: (kv[0][0] or 0, kv[0][1]))):
      label = r["method"] + (f" W={w}" if r["objective"] == "setdlm" else "") + (
          f" ({_align_label(rows[0])})" if rows[0].get("align_to_blocks") is not None else "")
      style = dict(color=f"C{i}", marker="osD^v"[j % 5], linestyle="-" if j == 0 else "--")
      for ax, key in ((axes[0], "tokens_per_second_batch1"), (axes[1], "tokens_per_step")):
        xs = [x[key] or 0.0 for x in rows]
        ys = [100 * x["accuracy"] for x in rows]
        ax.plot(xs, ys, label=label, **style)
        for x, y, row in zip(xs, ys, rows):
          if row["threshold"] != "off":
            ax.annotate(row["threshold"], (x, y), fontsize=6, color=f"C{i}", xytext=(3, 2),
                        textcoords="offset points")
  axes[0].set_xlabel("tokens/s at batch 1 (CPU)")
  axes[1].set_xlabel("tokens per step (parallelism factor)")
  for ax in axes:
    ax.set_ylabel("exact match on the test problems (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  axes[0].set_title("accuracy vs speed (labels: tau)")
  axes[1].set_title("accuracy vs parallelism (labels: tau)")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _commit() -> str:
  """The checkout's commit (with '+dirty' for uncommitted changes), or 'unknown'."""
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          timeout=10, cwd=repo).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=10, cwd=repo).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return "unknown"
  return (head + ("+dirty" if dirty else "")) if head else "unknown"


def _uptime() -> str:
  try:
    return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return "unknown"


def write_report(out_dir: str, record) -> str:
  hw, p = record["hardware"], record["plan"]
  md = [f"## Speed-accuracy trade-off on the arithmetic task ({'quick' if record['quick'] else 'full'} run)",
        "", f"Command: `{record['command']}` at commit {record.get('commit', 'unknown')}", "",
        f"Hardware: {hw['cpu']} ({hw['cpu_count']} cores visible), jax {hw['jax']} on "
        f"{hw['backend']}. Machine load (`uptime`) at start: {record['load_start']}; at end: "
        f"{record['load_end']}. Total {record['total_seconds'] / 60:.1f} min (training "
        f"{record['train_seconds'] / 60:.1f}, evaluation {record['eval_seconds'] / 60:.1f}).", "",
        f"Recipe: {record['recipe']}; {p['steps']} steps x batch {p['batch_size']}, seed(s) "
        f"{', '.join(str(r['seed']) for r in record['runs'])}; "
        f"{record['results'][0]['num_test']} distinct test problems, greedy, "
        f"decoding batch {p['decode_batch']}, batch-1 speed over the first {p['speed_examples']}.",
        "BD3LM blocks: grid = on the block grid (--align_to_blocks on, the official harness's "
        "align_inputs_to_blocks, as the paper ran it); prompt end = from each prompt's end. "
        "`+eos`: trained with data.pad_targets=eos. kept tok/step: tokens that come back "
        "(nothing committed after the first EOS) per decoding step; tok/s counts kept tokens.", ""]
  if len(record["runs"]) > 1:
    md += [f"Mean ± std over seeds {', '.join(str(r['seed']) for r in record['runs'])} "
           "(accuracy in %, the other columns are means):", "",
           summary_table(record["summary"]), ""]
  for seed_run in record["runs"]:
    md += [f"Seed {seed_run['seed']}. Trained: " + ", ".join(
        f"{r['method']} {r['num_params'] / 1e6:.2f}M params {r['train_seconds'] / 60:.1f} min"
        for r in seed_run["results"]), "", table(seed_run["results"]), ""]
  md += [f"![accuracy vs speed]({NAME}.png)", ""]
  text = "\n".join(md)
  with open(os.path.join(out_dir, f"{NAME}.md"), "w") as f:
    f.write(text)
  return text


def main(argv=None, log=print) -> Dict[str, Any]:
  args = parse_args(argv)
  p = plan(args)
  out_dir = os.path.abspath(args.output_dir)
  os.makedirs(out_dir, exist_ok=True)
  methods = [m.strip() for m in args.methods.split(",") if m.strip()]
  for m in methods:
    parse_spec(m)
  seeds = ([int(x) for x in args.seeds.split(",") if x.strip()] if args.seeds else [args.seed])
  load_start = _uptime()
  t_start = time.perf_counter()
  train_seconds = eval_seconds = 0.0
  runs = []
  with _jax_settings({"jax_disable_most_optimizations": True} if args.quick else {}):
    for seed in seeds:
      seed_dir = out_dir if len(seeds) == 1 else os.path.join(out_dir, f"seed{seed}")
      configs = {m: method_config(m, p, seed, args.quick) for m in methods}
      tok_dir = shared_tokenizer(out_dir, configs[methods[0]])  # seed-independent (task data)
      t0 = time.perf_counter()
      infos = {m: train_method(m, configs[m], seed_dir, tok_dir, log) for m in methods}
      train_seconds += time.perf_counter() - t0
      t0 = time.perf_counter()
      results = []
      for m in methods:
        res = evaluate_method(m, infos[m]["workdir"], p, seed, log, args.align_to_blocks)
        res["train_seconds"] = infos[m]["train_seconds"]
        results.append(res)
      eval_seconds += time.perf_counter() - t0
      runs.append({"seed": seed, "results": results})
  c0 = configs[methods[0]]
  summary = summarize_seeds(runs) if len(runs) > 1 else None
  record = {
      "command": "python benchmarks/speed_accuracy.py " + " ".join(
          argv if argv is not None else sys.argv[1:]),
      "commit": _commit(), "quick": bool(args.quick), "seed": seeds[0], "seeds": seeds, "methods": methods,
      "plan": p, "align_to_blocks": args.align_to_blocks,
      "recipe": (f"configs/reasoning_common.py: {c0.model.num_layers} x {c0.model.hidden_size} "
                 f"DiT, L={c0.seq_len}, vocab {c0.tokenizer.vocab_size}, lr {c0.learning_rate} "
                 f"{c0.lr_schedule}"),
      "hardware": run.hardware(), "load_start": load_start, "load_end": _uptime(),
      "train_seconds": train_seconds, "eval_seconds": eval_seconds,
      "total_seconds": time.perf_counter() - t_start,
      "results": runs[0]["results"],  # the first seed's (as a single-seed run)
      "runs": runs, "summary": summary}
  with open(os.path.join(out_dir, f"{NAME}.json"), "w") as f:
    json.dump(record, f, indent=2, default=float)
  plot(summary or runs[0]["results"], os.path.join(out_dir, f"{NAME}.png"))
  text = write_report(out_dir, record)
  results_dir = args.results_dir or (None if args.quick else RESULTS_DIR)
  if results_dir and results_dir != "none":
    os.makedirs(results_dir, exist_ok=True)
    for ext in ("md", "json", "png"):
      shutil.copy(os.path.join(out_dir, f"{NAME}.{ext}"), results_dir)
  log(text)
  log(f"\nwrote {out_dir}/{NAME}.md, .json, .png ({record['total_seconds'] / 60:.1f} min)")
  return record


if __name__ == "__main__":
  main()
