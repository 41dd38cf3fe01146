r"""The speed-accuracy trade-off of SPEC §7.1 on the procedural arithmetic task (CPU scale).

  python -m benchmarks.speed_accuracy --output_dir=/tmp/speed_accuracy   # full (~45 min, 2 cores)
  python -m benchmarks.speed_accuracy --quick --output_dir=/tmp/sa_quick  # pipeline check (<2 min)
  python -m benchmarks.speed_accuracy --methods=bd3lm4,mdlm,mdlm+eos --align_to_blocks=both \
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
per method), runs/<method>/ (training workdirs; a re-run with the same training settings skips
finished training, one with other settings is refused: compare_methods' train_fingerprint.json)
and tokenizer/.
--record=NAME publishes the report as the record benchmarks/results/NAME.json (+ .png; only
from a clean commit on main's history, never over another record); then
`python -m setdiff_jax.experiments.publish` regenerates its table in docs/results/NAME.md.

Commit policies (issue 27; `setdiff_jax/sampling/policies.py`):

  python -m benchmarks.speed_accuracy \
      --policies=threshold,entropy_bound,factor,margin,topk,dilated,stable \
      --tasks=arithmetic,chain --seeds=0,1,2 --output_dir=/tmp/sa_policies
  python -m benchmarks.speed_accuracy --quick --policies=threshold,entropy_bound \
      --output_dir=/tmp/sa_policies_quick        # pipeline check: chain task, BD3LM + SetDLM

With --policies the benchmark trains --methods (default ar, bd3lm4, setdlm4) once per task
(arithmetic: the recipe's 3 x 1..9 chains; chain: --chain_operands numbers in
1..--chain_max_operand, default configs/reasoning_chain.py's calibrated 5 x 1..9, running values
only, see data/tasks.py) and seed, then for SetDLM (W = S and W = 2S) and BD3LM sweeps each
policy's parameter (POLICY_GRID, or --policy_grid=NAME:V1/V2,...) on the task's VALIDATION split,
picks per policy the parameter with the most kept tokens per forward call whose validation
accuracy is at most 1 point below the threshold rule with tau off (else the most accurate one),
and measures that choice once on the TEST split; the threshold rule is measured on test at every
grid tau (its curve). Speed = kept tokens per forward call (generated tokens that come back,
nothing after the answer's EOS; the prompt-encoding call counts), forward calls per example
beside it. Paired comparisons (same checkpoints and problems; 95 % intervals of the paired
hierarchical bootstrap: seeds, then the problems they share; accuracy difference and kept-tokens-per-call ratio) of each
policy against (1) tau off, (2) the threshold rule's own validation choice, (3) the threshold rule
at matched speed: the tau whose validation kept tokens per call is nearest to the policy's (per
seed). Also: mean +- std over seeds, tau-off accuracy per seed (seed agreement), copy fraction per
task (`accuracy.copy_stats`). Writes speed_accuracy_policies.{json,md,png} (the plot: accuracy
vs kept tokens per call on test, the threshold curve and each policy's choice, per method and W)
after every seed; per (task, seed, method) the evaluation is cached in
<output_dir>/<task>/seed<k>/policy_records_<method>.json, so a re-run (e.g. --seeds=0,1,2 after
three one-seed runs in parallel on the same --output_dir) skips finished training and
evaluation and reports them together. --report_only writes nothing when no cache matches its
flags (one `error:` line naming the caches it expected), nor over a folder that does not exist.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List


if __name__ == "__main__" and not __package__:  # a file run cannot import configs/, benchmarks/
  sys.exit(
    "error: run it from the repository root as `python -m benchmarks.speed_accuracy [flags]`"
  )

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import arms, inputs  # noqa: E402
from benchmarks.compare_methods import (
  check_record,
  jax_settings,
  publish,
  shared_tokenizer,
  train_method,
)  # noqa: E402
from configs import compare, reasoning_chain, reasoning_common  # noqa: E402
from setdiff_jax import decoders  # noqa: E402
from setdiff_jax.workdir import load as workdir_lib  # noqa: E402
from setdiff_jax.data import pairs as pairs_lib  # noqa: E402
from setdiff_jax.data import tasks as tasks_lib  # noqa: E402
from setdiff_jax.sampling import policies as policies_lib  # noqa: E402
from setdiff_jax.evaluation import accuracy, run  # noqa: E402
from setdiff_jax.evaluation.results import hardware  # noqa: E402
from setdiff_jax.evaluation.tables import markdown_table  # noqa: E402
from setdiff_jax.sampling.config import CommitPolicy, DecodeSetting, tau_label  # noqa: E402
from setdiff_jax.experiments import stats  # noqa: E402

METHODS = ("ar", "mdlm", "bd3lm4", "setdlm4")
POLICY_METHODS = ("ar", "bd3lm4", "setdlm4")
QUICK_POLICY_METHODS = ("bd3lm4", "setdlm4")
TASKS = ("arithmetic", "chain")
# Parameters swept per policy on the validation split (None = the policy's 'off' / default).
POLICY_GRID = {
  "threshold": (None, 0.9, 0.8, 0.7, 0.5),
  "entropy_bound": (0.01, 0.1, 0.3, 1.0),
  "factor": (0.5, 1.0, 2.0, 4.0),
  "margin": (None, 0.9, 0.7, 0.5),
  "topk": (2, 3, 4),
  "dilated": (2, 4),
  "stable": (2, 3),
  "pmax": (None, 0.9, 0.7, 0.5),
}
CHAIN = {
  "task_operands": reasoning_chain.OPERANDS,  # the calibrated difficulty
  "task_max_operand": reasoning_chain.MAX_OPERAND,
}
ARITH_HELD_OUT, ARITH_MIN_VAL = 207, 57  # arithmetic: held-out problems in all; kept for val
THRESHOLDS = (None, 0.99, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6)
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
NAME = "speed_accuracy"
# The code the numbers depend on (git pathspecs): a record is marked stale once a later commit
# touches one (python -m setdiff_jax.experiments.publish).
MEASURED = (
  "setdiff_jax",
  ":(exclude)setdiff_jax/experiments",
  ":(exclude)setdiff_jax/interop",
  ":(exclude)setdiff_jax/rl",
  "configs/reasoning_common.py",
  "configs/reasoning_chain.py",
  "configs/compare.py",
  "benchmarks/speed_accuracy.py",
  "benchmarks/compare_methods.py",
)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--output_dir", default="/tmp/setdiff_speed_accuracy")
  p.add_argument(
    "--record",
    default=None,
    help="publish this run's report as the record RESULTS_DIR/RECORD.json (+ .png): only from "
    "a clean commit on main's history, never over another record (setdiff_jax/experiments); "
    "without it nothing leaves --output_dir",
  )
  p.add_argument(
    "--record_resume", action="store_true", help="--record: replace a re-report of the same commit"
  )
  p.add_argument("--results_dir", default=None, help="where --record writes (benchmarks/results)")
  p.add_argument("--quick", action="store_true", help="tiny models and few steps / problems")
  p.add_argument(
    "--methods",
    default=",".join(METHODS),
    help="comma-separated: ar, mdlm, bd3lm<S>, setdlm<S> (S_max = 2S)",
  )
  p.add_argument("--steps", type=int, default=None, help="training steps (recipe: 1200)")
  p.add_argument("--batch_size", type=int, default=None, help="training batch (recipe: 32)")
  p.add_argument("--hidden_size", type=int, default=None)
  p.add_argument("--num_layers", type=int, default=None)
  p.add_argument("--lr", type=float, default=None)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument(
    "--seeds",
    default=None,
    help="comma-separated seeds (overrides --seed): one training per method and "
    "seed, plus a mean +- std table (policy mode: the training seeds)",
  )
  p.add_argument(
    "--align_to_blocks",
    default="on",
    choices=("on", "off", "both"),
    help="BD3LM decode blocks on the block grid (on, the official harness), from "
    "each prompt's end (off), or both",
  )
  p.add_argument("--thresholds", default=",".join(tau_label(t) for t in THRESHOLDS))
  p.add_argument("--windows", default="4,8", help="SetDLM windows W (the run's S is the default)")
  p.add_argument("--num_test", type=int, default=None, help="test problems (200; quick 8)")
  p.add_argument("--decode_batch", type=int, default=None, help="rows per decoding call (50)")
  p.add_argument(
    "--speed_examples",
    type=int,
    default=None,
    help="prompts timed one per call at batch 1 (16; quick 2)",
  )
  p.add_argument(
    "--policies",
    default=None,
    help="commit policies to compare (sampling/policies.py); turns on the policy "
    "mode (see the module docstring)",
  )
  p.add_argument(
    "--tasks", default=None, help="policy mode: arithmetic, chain (default both; quick: chain)"
  )
  p.add_argument(
    "--num_val", type=int, default=None, help="policy mode: validation problems (100; quick 6)"
  )
  p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples for the CIs")
  p.add_argument(
    "--policy_grid",
    default=None,
    help="policy mode: replace policies' grids, NAME:V1/V2,... e.g. "
    "'entropy_bound:0.1/1,topk:2/4' ('off' = no parameter; tau off is always "
    "in the threshold grid)",
  )
  p.add_argument(
    "--report_only",
    action="store_true",
    help="policy mode: no training or decoding; report what the --output_dir's "
    "caches hold (finished and partly finished evaluations, labelled)",
  )
  p.add_argument(
    "--chain_operands",
    type=int,
    default=CHAIN["task_operands"],
    help="policy mode, chain task: operands per problem (data.task_operands)",
  )
  p.add_argument(
    "--chain_max_operand",
    type=int,
    default=CHAIN["task_max_operand"],
    help="policy mode, chain task: operands in 1..this (data.task_max_operand)",
  )
  args = p.parse_args(argv)
  check_counts(args)
  return args


def check_counts(args) -> None:
  """Counts and sizes below their minimum are refused before anything runs (0 test problems
  reported an accuracy over none, 0 bootstrap resamples a nan interval)."""
  inputs.check_at_least(
    args, 1, "steps", "batch_size", "hidden_size", "num_layers", "num_test", "decode_batch"
  )
  inputs.check_at_least(args, 1, "num_val", "bootstrap")  # (chain sizes: policy_plan)
  inputs.check_at_least(args, 0, "speed_examples", "seed")
  if args.lr is not None and not args.lr > 0:
    raise ValueError(f"--lr={args.lr} must be > 0")


def plan(args) -> Dict[str, Any]:
  p = dict(
    steps=1200,
    batch_size=32,
    hidden_size=None,
    num_layers=None,
    lr=None,
    num_test=200,
    decode_batch=50,
    speed_examples=16,
    thresholds=[
      None if t in ("off", "none") else float(t) for t in args.thresholds.split(",") if t.strip()
    ],
    windows=[int(w) for w in args.windows.split(",") if w.strip()],
  )
  if args.quick:
    # decode_batch = 1: the batch-1 timing reuses the decoding compile (one per setting)
    p.update(
      steps=4,
      batch_size=8,
      hidden_size=32,
      num_layers=1,
      num_test=8,
      decode_batch=1,
      speed_examples=2,
      thresholds=[None, 0.9],
      windows=[4],
    )
  for k in (
    "steps",
    "batch_size",
    "hidden_size",
    "num_layers",
    "lr",
    "num_test",
    "decode_batch",
    "speed_examples",
  ):
    if getattr(args, k) is not None:
      p[k] = getattr(args, k)
  return p


def parse_spec(method: str):
  """'mdlm+eos' -> ('mdlm', None, 'eos'); 'bd3lm4' -> ('bd3lm', 4, 'none')."""
  base, plus, tail = method.partition("+")
  if plus and tail != "eos":
    raise ValueError(
      f"--methods: {method!r}; the only suffix is '+eos' (trains with "
      "data.pad_targets=eos), e.g. mdlm+eos"
    )
  name, s = compare.parse_method(base)
  return name, s, "eos" if plus else "none"


def method_config(method: str, p: Dict[str, Any], seed: int, quick: bool):
  name, s, pad_targets = parse_spec(method)
  c = reasoning_common.get_config(name)
  c.seed = seed
  c.data.pad_targets = pad_targets
  arms.set_size(c.loss, name, s)
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


def settings_for(name: str, s, p) -> List[DecodeSetting]:
  decoder = decoders.get(name)
  if not decoder.uses_threshold:
    return [DecodeSetting(None, None)]
  tau = lambda t: CommitPolicy(policies_lib.DEFAULT, t)  # noqa: E731
  windows = sorted(set(p["windows"] or [s])) if decoder.uses_window else [None]
  return [DecodeSetting(w, tau(t)) for w in windows for t in p["thresholds"]]


ALIGN = {"on": [True], "off": [False], "both": [True, False]}


def evaluate_method(
  method: str, workdir: str, p, seed: int, log, align: str = "on"
) -> Dict[str, Any]:
  state = workdir_lib.load_inference_state(workdir, use_ema=False)
  name, s, _ = parse_spec(method)
  test = pairs_lib.load_pairs(state.config.data, "eval")
  _, gen_model = run.inference_models(state)
  # The block grid exists for a sampler with the trained block size (BD3LM; MDLM: one
  # sub-block of N): for the others the setting has no effect.
  blocks = "block_size" in decoders.get(name).sampler_fields(state.objective_config)
  t0 = time.perf_counter()
  rows = []
  for aligned in ALIGN[align] if blocks else ALIGN[align][:1]:
    rows += accuracy.accuracy_eval(
      gen_model,
      state.params,
      state.tokenizer,
      state.objective_config,
      int(state.config.seq_len),
      test,
      settings=settings_for(name, s, p),
      batch_size=p["decode_batch"],
      speed_examples=p["speed_examples"],
      extractor="hash",
      seed=seed,
      align_to_blocks=aligned,
    )
  for r in rows:
    r["method"] = method
    if not blocks:
      r["align_to_blocks"] = None
    log(
      f"[{method}] {r['setting']} align {r['align_to_blocks']}: acc {r['accuracy']:.3f}  "
      f"tok/step {r['tokens_per_step']:.2f} (kept {r['kept_tokens_per_step']:.2f})  tok/s "
      f"b{r['batch_size']} {r['tokens_per_second']:.0f}  b1 "
      f"{r['tokens_per_second_batch1'] or 0:.0f}"
    )
  return {
    "method": method,
    "objective": name,
    "num_test": len(test),
    "num_params": int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(state.params))),
    "eval_seconds": time.perf_counter() - t0,
    "rows": rows,
  }


# ----------------------------------------------------------------------------- report
def _align_label(x) -> str:
  a = x.get("align_to_blocks")
  return "-" if a is None else ("grid" if a else "prompt end")


def table(results) -> str:
  header = [
    "method",
    "W",
    "tau",
    "blocks",
    "accuracy",
    "tok/step",
    "kept tok/step",
    "fwd calls",
    "gen tokens",
    "tok/s b=1",
    "tok/s batch",
    "b1 = batched",
  ]
  body = []
  for r in results:
    for x in r["rows"]:
      body.append(
        [
          r["method"],
          x["window"],
          x["threshold"],
          _align_label(x),
          x["accuracy"],
          x["tokens_per_step"],
          x.get("kept_tokens_per_step"),
          x["forward_calls"],
          x["mean_generated_tokens"],
          x["tokens_per_second_batch1"],
          x["tokens_per_second"],
          x["batch1_matches_batched"],
        ]
      )
  return markdown_table(header, body)


MEAN_FIELDS = (
  "accuracy",
  "tokens_per_step",
  "kept_tokens_per_step",
  "forward_calls",
  "mean_generated_tokens",
  "tokens_per_second_batch1",
  "tokens_per_second",
)


def summarize_seeds(runs) -> List[Dict[str, Any]]:
  """Per (method, W, tau, blocks): the mean and std over the seeds of every MEAN_FIELDS value,
  as `results`-shaped records (rows carry `<field>` = mean and `<field>_std`, `num_seeds`)."""
  out: Dict[str, Dict[str, Any]] = {}
  for seed_run in runs:
    for r in seed_run["results"]:
      rec = out.setdefault(
        r["method"],
        {
          "method": r["method"],
          "objective": r["objective"],
          "num_test": r["num_test"],
          "groups": {},
        },
      )
      for x in r["rows"]:
        key = (x["window"], x["threshold"], x.get("align_to_blocks"))
        rec["groups"].setdefault(key, []).append(x)
  summary = []
  for rec in out.values():
    rows = []
    for (w, tau, align), xs in rec.pop("groups").items():
      row = {
        "window": w,
        "threshold": tau,
        "align_to_blocks": align,
        "num_seeds": len(xs),
        "num_examples": xs[0]["num_examples"],
        "setting": xs[0]["setting"],
      }
      for f in MEAN_FIELDS:
        vals = np.array([x.get(f) or 0.0 for x in xs], np.float64)
        row[f], row[f + "_std"] = (
          float(vals.mean()),
          float(vals.std(ddof=1) if len(vals) > 1 else 0.0),
        )
      rows.append(row)
    summary.append({**rec, "rows": rows})
  return summary


def summary_table(summary) -> str:
  header = [
    "method",
    "W",
    "tau",
    "blocks",
    "seeds",
    "n test",
    "accuracy % (mean ± std)",
    "kept tok/step",
    "tok/step",
    "fwd calls",
    "gen tokens",
    "tok/s b=1",
  ]
  body = []
  for r in summary:
    for x in r["rows"]:
      body.append(
        [
          r["method"],
          x["window"],
          x["threshold"],
          _align_label(x),
          x["num_seeds"],
          x["num_examples"],
          f"{100 * x['accuracy']:.1f} ± {100 * x['accuracy_std']:.1f}",
          x["kept_tokens_per_step"],
          x["tokens_per_step"],
          x["forward_calls"],
          x["mean_generated_tokens"],
          x["tokens_per_second_batch1"],
        ]
      )
  return markdown_table(header, body)


def plot(results, path: str):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
  for i, r in enumerate(results):
    groups: Dict[Any, list] = {}
    for x in r["rows"]:
      groups.setdefault((x["window"], str(x.get("align_to_blocks"))), []).append(x)
    for j, ((w, _), rows) in enumerate(
      sorted(groups.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1]))
    ):
      label = (
        r["method"]
        + (f" W={w}" if decoders.get(r["objective"]).uses_window else "")
        + (f" ({_align_label(rows[0])})" if rows[0].get("align_to_blocks") is not None else "")
      )
      style = dict(color=f"C{i}", marker="osD^v"[j % 5], linestyle="-" if j == 0 else "--")
      for ax, key in ((axes[0], "tokens_per_second_batch1"), (axes[1], "tokens_per_step")):
        xs = [x[key] or 0.0 for x in rows]
        ys = [100 * x["accuracy"] for x in rows]
        ax.plot(xs, ys, label=label, **style)
        for x, y, row in zip(xs, ys, rows):
          if row["threshold"] != "off":
            ax.annotate(
              row["threshold"],
              (x, y),
              fontsize=6,
              color=f"C{i}",
              xytext=(3, 2),
              textcoords="offset points",
            )
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


def commit_label() -> str:
  """The checkout's commit (with '+dirty' for uncommitted changes), or 'unknown'."""
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    head = subprocess.run(
      ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10, cwd=repo
    ).stdout.strip()
    dirty = subprocess.run(
      ["git", "status", "--porcelain", "--untracked-files=no"],
      capture_output=True,
      text=True,
      timeout=10,
      cwd=repo,
    ).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return "unknown"
  return (head + ("+dirty" if dirty else "")) if head else "unknown"


def uptime() -> str:
  try:
    return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return "unknown"


def write_report(out_dir: str, record) -> str:
  hw, p = record["hardware"], record["plan"]
  md = [
    f"## Speed-accuracy trade-off on the arithmetic task ({'quick' if record['quick'] else 'full'} run)",
    "",
    f"Command: `{record['command']}` at commit {record.get('commit', 'unknown')}",
    "",
  ]
  done, wanted = record.get("seeds_done"), record.get("seeds")
  if done is not None and wanted is not None and list(done) != list(wanted):
    md += [
      f"**Partial**: seeds {', '.join(map(str, done))} of {', '.join(map(str, wanted))} "
      "done when this was written.",
      "",
    ]
  md += [
    f"Hardware: {hw['cpu']} ({hw['cpu_count']} cores visible), jax {hw['jax']} on "
    f"{hw['backend']}. Machine load (`uptime`) at start: {record['load_start']}; at end: "
    f"{record['load_end']}. Total {record['total_seconds'] / 60:.1f} min (training "
    f"{record['train_seconds'] / 60:.1f}, evaluation {record['eval_seconds'] / 60:.1f}).",
    "",
    f"Recipe: {record['recipe']}; {p['steps']} steps x batch {p['batch_size']}, seed(s) "
    f"{', '.join(str(r['seed']) for r in record['runs'])}; "
    f"{record['results'][0]['num_test']} distinct test problems, greedy, "
    f"decoding batch {p['decode_batch']}, batch-1 speed over the first {p['speed_examples']}.",
    "BD3LM blocks: grid = on the block grid (--align_to_blocks on, the official harness's "
    "align_inputs_to_blocks, as the paper ran it); prompt end = from each prompt's end. "
    "`+eos`: trained with data.pad_targets=eos. kept tok/step: tokens that come back "
    "(nothing committed after the first EOS) per decoding step; tok/s counts kept tokens.",
    "",
  ]
  if len(record["runs"]) > 1:
    md += [
      f"Mean ± std over seeds {', '.join(str(r['seed']) for r in record['runs'])} "
      "(accuracy in %, the other columns are means):",
      "",
      summary_table(record["summary"]),
      "",
    ]
  for seed_run in record["runs"]:
    md += [
      f"Seed {seed_run['seed']}. Trained: "
      + ", ".join(
        f"{r['method']} {r['num_params'] / 1e6:.2f}M params {r['train_seconds'] / 60:.1f} min"
        for r in seed_run["results"]
      ),
      "",
      table(seed_run["results"]),
      "",
    ]
  md += [f"![accuracy vs speed]({NAME}.png)", ""]
  text = "\n".join(md)
  with open(os.path.join(out_dir, f"{NAME}.md"), "w") as f:
    f.write(text)
  return text


# ----------------------------------------------------------------------------- policy mode
def parse_grid(text) -> Dict[str, tuple]:
  """'--policy_grid=entropy_bound:0.1/0.3,topk:2/3' -> {name: (args...)}; 'off' = None."""
  out: Dict[str, tuple] = {}
  for part in (text or "").split(","):
    if not part.strip():
      continue
    name, _, vals = part.partition(":")
    name = name.strip()
    if name not in POLICY_GRID or not vals.strip():
      raise ValueError(
        f"--policy_grid={text!r}: {part!r} must be NAME:V1/V2/... with NAME one of "
        f"{sorted(POLICY_GRID)}"
      )
    args = []
    for v in vals.split("/"):
      v = v.strip()
      a = None if v in ("off", "none") else float(v)
      policies_lib.check_arg(name, a)  # the policy's own range (one error naming the flag)
      args.append(a)
    out[name] = tuple(args)
  return out


def policy_plan(args) -> Dict[str, Any]:
  p = plan(args)
  names = [x.strip() for x in args.policies.split(",") if x.strip()]
  for name in names:
    policies_lib.get(name)
  if policies_lib.DEFAULT not in names:
    names.insert(0, policies_lib.DEFAULT)  # the reference every comparison is paired with
  tasks = [
    t.strip()
    for t in (args.tasks or ("chain" if args.quick else ",".join(TASKS))).split(",")
    if t.strip()
  ]
  for t in tasks:
    if t not in TASKS:
      raise ValueError(f"--tasks={args.tasks!r}: {t!r} is not one of {TASKS}")
  seeds = [int(x) for x in (args.seeds or str(args.seed)).split(",") if x.strip()]
  grid = {
    n: (POLICY_GRID[n] if not args.quick else (policies_lib.get(n).param.default,)) for n in names
  }
  if args.quick:
    grid[policies_lib.DEFAULT] = (None,)
    if args.decode_batch is None:
      p["decode_batch"] = 8  # one compiled program per split (no batch-1 timing here)
  grid.update({k: v for k, v in parse_grid(args.policy_grid).items() if k in grid})
  if None not in grid[policies_lib.DEFAULT]:  # tau off: the reference of every comparison
    grid[policies_lib.DEFAULT] = (None,) + tuple(grid[policies_lib.DEFAULT])
  if args.chain_operands < 2 or args.chain_max_operand < 1:
    raise ValueError(
      f"--chain_operands={args.chain_operands} must be >= 2 and "
      f"--chain_max_operand={args.chain_max_operand} >= 1"
    )
  p.update(
    policies=names,
    tasks=tasks,
    seeds=seeds,
    grid=grid,
    chain={"task_operands": args.chain_operands, "task_max_operand": args.chain_max_operand},
    num_val=args.num_val or (4 if args.quick else 100),
    num_test=args.num_test or (8 if args.quick else 1000),
  )
  return p


def chain_seq_len(num_operands: int, max_operand: int) -> int:
  """A context that holds every chain row, rounded up to 8 (S_max of the recipe): one token
  per character at most (a byte-level BPE only merges) plus BOS and EOS."""
  d, big = len(str(max_operand)), len(str(num_operands * max_operand))
  prompt = num_operands * d + (num_operands - 1) + 1  # operands, signs, newline
  answer = (num_operands - 1) * (big + 1) + len(tasks_lib.ANSWER_PREFIX) + big
  return -(-(prompt + answer + 2) // 8) * 8


def task_config(c, task: str, chain=None):
  """The method's recipe on `task` (chain: `chain` = data.task_operands / task_max_operand,
  default CHAIN; L from `chain_seq_len`)."""
  c.data.source = task
  if task == "chain":
    chain = chain or CHAIN
    for k, v in chain.items():
      c.data[k] = v
    c.seq_len = chain_seq_len(chain["task_operands"], chain["task_max_operand"])
  return c


def policy_settings(name: str, s: int, p, policy: str, args) -> List[DecodeSetting]:
  """The (window, policy, arg) points of one policy for one method (AR: its one setting)."""
  decoder = decoders.get(name)
  if not decoder.uses_threshold:
    return [DecodeSetting(None, None)]
  windows = ([s] if p["quick"] else [s, 2 * s]) if decoder.uses_window else [None]
  return [DecodeSetting(w, CommitPolicy(policy, a)) for w in windows for a in args]


def choose(rows: List[Dict[str, Any]], base_acc: float) -> Dict[str, Any]:
  """The validation choice: the most kept tokens per call within 1 point of tau off (ties: the
  more accurate), else the most accurate point."""
  ok = [r for r in rows if r["accuracy"] >= base_acc - 0.01 - 1e-12]
  if ok:
    return max(ok, key=lambda r: (r["kept_tokens_per_call"], r["accuracy"]))
  return max(rows, key=lambda r: (r["accuracy"], r["kept_tokens_per_call"]))


def matched(rows: List[Dict[str, Any]], kept_per_call: float) -> Dict[str, Any]:
  """The threshold rule's validation point whose kept tokens per call is nearest (ties: the
  faster one): the tau a policy is compared with at matched speed."""
  return min(
    rows, key=lambda r: (abs(r["kept_tokens_per_call"] - kept_per_call), -r["kept_tokens_per_call"])
  )


def paired_ci(a: Dict[str, list], b: Dict[str, list], n_boot: int, seed: int = 0, n_seeds: int = 1):
  """Policy a vs reference b on the same problems: (accuracy difference, kept-tokens-per-call
  ratio), each with a 95 % interval of the paired hierarchical bootstrap
  (`experiments.stats`: the `n_seeds` training runs resampled, then the problems they share).
  a, b: {'correct', 'kept', 'calls'} lists pooled seed after seed, the same problems per seed."""
  arrays = [np.asarray(x[k], float) for k in ("correct", "kept", "calls") for x in (a, b)]
  if len(arrays[0]) % n_seeds or any(len(x) != len(arrays[0]) for x in arrays):
    raise ValueError(
      f"paired CI: {len(arrays[0])} and {len(arrays[1])} results are not {n_seeds} seeds x "
      "the same problems"
    )
  arrays = [x.reshape(n_seeds, -1) for x in arrays]
  stat = lambda ca, cb, ka, kb, fa, fb: (  # noqa: E731
    ca.mean() - cb.mean(),
    (ka.sum() / fa.sum()) / (kb.sum() / fb.sum()),
  )
  boots = stats.hierarchical_bootstrap(arrays, stat, n_boot, seed)
  point = stat(*arrays)
  lo, hi = np.percentile(boots, [2.5, 97.5], axis=0)
  return {
    "acc_diff": float(point[0]),
    "acc_diff_ci": [float(lo[0]), float(hi[0])],
    "speedup": float(point[1]),
    "speedup_ci": [float(lo[1]), float(hi[1])],
  }


def _merge(per: List[Dict[str, list]]) -> Dict[str, list]:
  return {k: sum((x[k] for x in per), []) for k in per[0]}


def policy_eval(
  method: str, workdir: str, task: str, p, seed: int, log, prior=(), save=None
) -> List[Dict[str, Any]]:
  """Validation sweep + test measurement per policy for one trained run. The threshold rule is
  measured on test at every grid tau (its curve; matched-speed comparisons pick tau on
  validation), every other policy at its validation choice only. `prior`: records of policies
  already evaluated (skipped); `save(records)` is called after every policy."""
  state = workdir_lib.load_inference_state(workdir, use_ema=False)
  name, s = compare.parse_method(method)
  data = state.config.data
  if task == "chain":
    val_cfg = data.copy_and_resolve_references()
    val_cfg.task_eval_examples = p["num_val"]
    val = pairs_lib.load_pairs(val_cfg, "validation")
  else:  # the held-out problems after the test ones (data/tasks.py)
    val = tasks_lib.arithmetic_pairs(
      "validation",
      p["num_val"],
      int(data.get("task_seed", 0)),
      num_operands=int(data.task_operands),
      max_operand=int(data.task_max_operand),
      num_test=p["num_test"],
    )
  test = pairs_lib.load_pairs(state.config.data, "eval")
  _, model = run.inference_models(state)
  seq_len = int(state.config.seq_len)
  ev = lambda pairs, settings: accuracy.accuracy_eval(
    model,
    state.params,
    state.tokenizer,
    state.objective_config,
    seq_len,
    pairs,
    settings=settings,
    batch_size=p["decode_batch"],
    speed_examples=0,
    extractor="hash",
    seed=seed,
    per_example=True,
  )
  out = list(prior)
  if not decoders.get(name).uses_threshold:  # AR, the reference: one greedy decode of the test
    row = ev(test, [DecodeSetting(None, None)])[0]
    log(f"[{task} {method} seed {seed}] test acc {row['accuracy']:.3f}")
    return [
      {
        "task": task,
        "method": method,
        "seed": seed,
        "window": None,
        "policy": policies_lib.DEFAULT,
        "chosen_arg": None,
        "val": [],
        "test": _slim(row),
        "per_example": row["per_example"],
        "val_ref": None,
        "ref_test": _slim(row),
        "ref_per_example": row["per_example"],
        "grid_test": [],
      }
    ]
  for policy in p["policies"]:
    if any(r["policy"] == policy for r in out):
      continue
    val_rows = ev(val, policy_settings(name, s, p, policy, p["grid"][policy]))
    by_window: Dict[Any, list] = {}
    for r in val_rows:
      by_window.setdefault(r["window"], []).append(r)
    for w, rows in by_window.items():
      thr = policy == policies_lib.DEFAULT
      ref_val = [r for r in rows if r["policy_arg"] is None][0] if thr else out_ref(out, w, "val")
      pick = choose(rows, ref_val["accuracy"])
      args = [r["policy_arg"] for r in rows] if thr else [pick["policy_arg"]]
      settings = [DecodeSetting(w, CommitPolicy(policy, a)) for a in args]
      tests = {a: t for a, t in zip(args, ev(test, settings))}
      test_row = tests[pick["policy_arg"]]
      rec = {
        "task": task,
        "method": method,
        "seed": seed,
        "window": w,
        "policy": policy,
        "chosen_arg": pick["policy_arg"],
        "val": [_slim(r) for r in rows],
        "val_pick": _slim(pick),
        "test": _slim(test_row),
        "per_example": test_row["per_example"],
        "grid_test": [],
      }
      if thr:
        rec.update(
          val_ref=_slim(ref_val),
          ref_test=_slim(tests[None]),
          ref_per_example=tests[None]["per_example"],
          grid_test=[
            {"arg": a, "test": _slim(t), "per_example": t["per_example"]} for a, t in tests.items()
          ],
        )
      out.append(rec)
      log(
        f"[{task} {method} seed {seed}] W={w} {policy}: val pick {pick['policy_arg']} -> test "
        f"acc {test_row['accuracy']:.3f} kept/call {test_row['kept_tokens_per_call']:.2f}"
      )
    if save:
      save(out)
  return out


def out_ref(out, window, split: str):
  for r in out:
    if r["policy"] == policies_lib.DEFAULT and r["window"] == window:
      return r["val_ref"] if split == "val" else r["ref_test"]
  raise ValueError("the threshold policy is evaluated first")


def _slim(r: Dict[str, Any]) -> Dict[str, Any]:
  keys = (
    "setting",
    "policy",
    "policy_arg",
    "accuracy",
    "num_examples",
    "kept_tokens_per_call",
    "forward_calls",
    "mean_generated_tokens",
    "tokens_per_step",
    "tokens_per_second",
    "copy_fraction",
    "parallel_fraction",
    "parallel_copy_fraction",
  )
  return {k: r.get(k) for k in keys}


def _ms(xs) -> List[float]:
  xs = np.asarray(xs, float)
  return [float(xs.mean()), float(xs.std(ddof=1)) if len(xs) > 1 else 0.0]


def summarize(records: List[Dict[str, Any]], n_boot: int) -> List[Dict[str, Any]]:
  """One row per (task, method, window, policy): test numbers over seeds (pooled, and mean ± std
  of the per-seed values) + paired CIs against tau off, against the threshold rule's own
  validation choice ('thr') and against the threshold rule at the tau whose validation kept
  tokens per call is nearest ('match', tau per seed)."""
  groups: Dict[Any, list] = {}
  for r in records:
    groups.setdefault((r["task"], r["method"], r["window"], r["policy"]), []).append(r)
  rows = []
  for (task, method, w, policy), recs in groups.items():
    thr = {
      x["seed"]: x
      for x in records
      if x["task"] == task
      and x["method"] == method
      and x["window"] == w
      and x["policy"] == policies_lib.DEFAULT
    }
    recs = [x for x in recs if x["seed"] in thr]
    if not recs:
      continue
    a = _merge([x["per_example"] for x in recs])
    t = [x["test"] for x in recs]
    row = {
      "task": task,
      "method": method,
      "window": w,
      "policy": policy,
      "chosen_args": [x["chosen_arg"] for x in recs],
      "seeds": [x["seed"] for x in recs],
      "accuracy": float(np.mean(a["correct"])),
      "seed_accuracies": [x["accuracy"] for x in t],
      "accuracy_ms": _ms([x["accuracy"] for x in t]),
      "kept_tokens_per_call": float(np.sum(a["kept"]) / np.sum(a["calls"])),
      "kept_tokens_per_call_ms": _ms([x["kept_tokens_per_call"] for x in t]),
      "forward_calls": float(np.mean(a["calls"])),
      "tokens_per_second": float(np.mean([x["tokens_per_second"] for x in t])),
      "copy_fraction": float(np.mean([x["copy_fraction"] for x in t])),
      "num_test": len(a["correct"]),
      "num_test_per_seed": len(recs[0]["per_example"]["correct"]),
    }
    k = len(recs)  # seeds
    row.update(
      paired_ci(a, _merge([thr[x["seed"]]["ref_per_example"] for x in recs]), n_boot, 0, k)
    )
    if not arms.decoder(method).uses_threshold or policy == policies_lib.DEFAULT:
      row["ref_seed_accuracies"] = [x["ref_test"]["accuracy"] for x in recs]  # seed agreement
      rows.append(row)
      continue
    chosen = _merge([thr[x["seed"]]["per_example"] for x in recs])
    row["vs_thr"] = paired_ci(a, chosen, n_boot, 0, k)
    row["thr_args"] = [thr[x["seed"]]["chosen_arg"] for x in recs]
    taus, per = [], []
    for x in recs:
      m = matched(thr[x["seed"]]["val"], x["val_pick"]["kept_tokens_per_call"])
      taus.append(m["policy_arg"])
      per.append(
        [g for g in thr[x["seed"]]["grid_test"] if g["arg"] == m["policy_arg"]][0]["per_example"]
      )
    row["match_args"] = taus
    row["vs_match"] = paired_ci(a, _merge(per), n_boot, 0, k)
    rows.append(row)
  return rows


def threshold_curve(records) -> List[Dict[str, Any]]:
  """The threshold rule on test at every grid tau: accuracy and kept tokens per call (pooled
  over seeds) per (task, method, window, tau): the curve the policies are plotted against."""
  groups: Dict[Any, list] = {}
  for r in records:
    for g in r.get("grid_test", []):
      groups.setdefault((r["task"], r["method"], r["window"], g["arg"]), []).append(g)
  return [
    {
      "task": k[0],
      "method": k[1],
      "window": k[2],
      "tau": k[3],
      "accuracy": float(np.mean(sum((g["per_example"]["correct"] for g in gs), []))),
      "accuracy_ms": _ms([g["test"]["accuracy"] for g in gs]),
      "kept_tokens_per_call": float(
        sum(sum(g["per_example"]["kept"]) for g in gs)
        / sum(sum(g["per_example"]["calls"]) for g in gs)
      ),
      "num_seeds": len(gs),
    }
    for k, gs in groups.items()
  ]


def ci_cell(c, key, scale=100.0, fmt="{:+.1f}") -> str:
  lo, hi = c[key + "_ci"]
  return f"{fmt.format(scale * c[key])} [{fmt.format(scale * lo)}, {fmt.format(scale * hi)}]"


def _args(xs) -> str:
  return "/".join("off" if a is None else f"{a:g}" for a in xs)


def policy_table(rows) -> str:
  header = [
    "task",
    "method",
    "W",
    "policy",
    "chosen (per seed)",
    "accuracy % (mean ± std)",
    "kept/call (mean ± std)",
    "fwd calls",
    "d acc vs tau off [95% CI]",
    "x vs tau off [95% CI]",
    "d acc vs threshold's choice",
    "x vs threshold's choice",
    "copies",
    "n",
  ]
  body = []
  for r in rows:
    v = r.get("vs_thr")
    body.append(
      [
        r["task"],
        r["method"],
        r["window"] or "-",
        r["policy"],
        _args(r["chosen_args"]),
        f"{100 * r['accuracy_ms'][0]:.1f} ± {100 * r['accuracy_ms'][1]:.1f}",
        f"{r['kept_tokens_per_call_ms'][0]:.2f} ± {r['kept_tokens_per_call_ms'][1]:.2f}",
        r["forward_calls"],
        ci_cell(r, "acc_diff"),
        ci_cell(r, "speedup", 1.0, "{:.2f}"),
        ci_cell(v, "acc_diff") if v else "-",
        ci_cell(v, "speedup", 1.0, "{:.2f}") if v else "-",
        r["copy_fraction"],
        f"{r['num_test']} ({len(r['seeds'])} x {r['num_test_per_seed']})",
      ]
    )
  return markdown_table(header, body)


def matched_table(rows) -> str:
  header = [
    "task",
    "method",
    "W",
    "policy",
    "chosen",
    "matched tau (per seed)",
    "d acc vs threshold at matched speed [95% CI]",
    "x kept/call [95% CI]",
    "n",
  ]
  body = [
    [
      r["task"],
      r["method"],
      r["window"] or "-",
      r["policy"],
      _args(r["chosen_args"]),
      _args(r["match_args"]),
      ci_cell(r["vs_match"], "acc_diff"),
      ci_cell(r["vs_match"], "speedup", 1.0, "{:.2f}"),
      r["num_test"],
    ]
    for r in rows
    if "vs_match" in r
  ]
  return markdown_table(header, body)


def seed_table(rows) -> str:
  """Seed agreement: tau-off (threshold rule, no tau) test accuracy per seed and its spread."""
  header = ["task", "method", "W", "seeds", "tau-off accuracy per seed (%)", "spread (points)"]
  body = []
  for r in rows:
    if r["policy"] == policies_lib.DEFAULT:
      accs = [100 * a for a in r["ref_seed_accuracies"]]
      body.append(
        [
          r["task"],
          r["method"],
          r["window"] or "-",
          "/".join(map(str, r["seeds"])),
          " / ".join(f"{a:.1f}" for a in accs),
          f"{max(accs) - min(accs):.1f}",
        ]
      )
  return markdown_table(header, body)


def plot_policies(rows, curve, path: str):
  """Accuracy vs kept tokens per forward call on test, one panel per (task, method, W): the
  threshold rule's curve over tau and each policy's validation choice."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  panels = sorted(
    {
      (r["task"], r["method"], r["window"] or 0)
      for r in rows
      if arms.decoder(r["method"]).uses_threshold
    }
  )
  if not panels:
    return
  fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.4), squeeze=False)
  for ax, (task, method, w) in zip(axes[0], panels):
    pts = sorted(
      (c for c in curve if (c["task"], c["method"], c["window"] or 0) == (task, method, w)),
      key=lambda c: c["kept_tokens_per_call"],
    )
    ax.plot(
      [c["kept_tokens_per_call"] for c in pts],
      [100 * c["accuracy"] for c in pts],
      "k-o",
      ms=3,
      label="threshold (tau curve)",
    )
    for c in pts:
      ax.annotate(
        _args([c["tau"]]),
        (c["kept_tokens_per_call"], 100 * c["accuracy"]),
        fontsize=6,
        xytext=(3, 2),
        textcoords="offset points",
      )
    for i, r in enumerate(
      x
      for x in rows
      if (x["task"], x["method"], x["window"] or 0) == (task, method, w)
      and x["policy"] != policies_lib.DEFAULT
    ):
      ax.plot(
        [r["kept_tokens_per_call"]],
        [100 * r["accuracy"]],
        "osD^v*P"[i % 7],
        color=f"C{i}",
        label=f"{r['policy']} ({_args(r['chosen_args'])})",
      )
    ar = [x for x in rows if x["task"] == task and not arms.decoder(x["method"]).uses_threshold]
    if ar:
      ax.axhline(100 * ar[0]["accuracy"], color="grey", ls=":", label="AR")
    ax.set_title(f"{task}: {method}" + (f" W={w}" if w else ""))
    ax.set_xlabel("kept tokens per forward call (test)")
    ax.set_ylabel("exact match (%), pooled over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def dump_json(path: str, obj) -> None:
  """Writes json atomically (a killed run leaves the previous file, never half of one)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = f"{path}.{os.getpid()}.tmp"  # per process: parallel runs may share an output dir
  with open(tmp, "w") as f:
    json.dump(obj, f, default=float)
  os.replace(tmp, path)


def _plan_key(p, task: str, method: str) -> Dict[str, Any]:
  keys = (
    "policies",
    "grid",
    "num_val",
    "num_test",
    "decode_batch",
    "chain",
    "steps",
    "batch_size",
    "hidden_size",
    "num_layers",
    "lr",
  )
  return json.loads(
    json.dumps({"task": task, "method": method, **{k: p.get(k) for k in keys}}, default=str)
  )


def _unmatched(cache: str, raw: Dict[str, Any], key: Dict[str, Any], out_dir: str) -> str:
  """Why --report_only finds nothing in `cache`: missing, empty, or made with other flags (its
  plan key)."""
  name = os.path.relpath(cache, out_dir)
  if not raw:
    return f"{name} missing"
  if raw.get("key") == key:
    return f"{name} holds no finished policy"
  diff = inputs.differences(key, raw.get("key") or {}, shown=4)
  return f"{name} made with other flags (these -> its: {diff})"


def _nothing_to_report(out_dir: str, unmatched: List[str]) -> ValueError:
  unmatched = sorted(unmatched, key=lambda x: x.endswith(" missing"))  # the telling ones first
  more = f"; and {len(unmatched) - 3} more" if len(unmatched) > 3 else ""
  return ValueError(
    f"--report_only: no evaluation cache in {out_dir} matches these flags ("
    + "; ".join(unmatched[:3])
    + f"{more}): give the flags of the run that made them (e.g. --quick, --policies, --tasks, "
    "--seeds); nothing was written"
  )


def policy_main(args, argv, log) -> Dict[str, Any]:
  p = policy_plan(args)
  p["quick"] = bool(args.quick)
  inputs.check_output_dir(args.output_dir)
  out_dir = os.path.abspath(args.output_dir)
  if args.report_only and not os.path.isdir(out_dir):
    raise ValueError(
      f"--report_only: {out_dir} does not exist: give the --output_dir of a --policies run"
    )
  os.makedirs(out_dir, exist_ok=True)
  unmatched = []  # --report_only: the caches these flags expect that hold nothing for them
  methods = [m.strip() for m in args.methods.split(",") if m.strip()]
  if args.methods == ",".join(METHODS):  # not given: AR as the reference, BD3LM, SetDLM
    methods = list(QUICK_POLICY_METHODS if args.quick else POLICY_METHODS)
  for m in methods:
    compare.parse_method(m)
  command = "python -m benchmarks.speed_accuracy " + " ".join(
    argv if argv is not None else sys.argv[1:]
  )
  load_start = uptime()
  t_start = time.perf_counter()
  records, train_seconds, done = [], 0.0, []
  with jax_settings({"jax_disable_most_optimizations": True} if args.quick else {}):
    for task in p["tasks"]:
      pt = p
      if task == "arithmetic":  # its 3 x 1..9 family holds 207 held-out problems in all
        pt = dict(p, num_test=min(p["num_test"], ARITH_HELD_OUT - ARITH_MIN_VAL))
        pt["num_val"] = min(p["num_val"], ARITH_HELD_OUT - pt["num_test"])
      p.setdefault("per_task", {})[task] = {"num_val": pt["num_val"], "num_test": pt["num_test"]}
      for seed in p["seeds"]:
        sub = os.path.join(out_dir, task, f"seed{seed}")
        configs = {
          m: task_config(method_config(m, pt, seed, args.quick), task, p["chain"]) for m in methods
        }
        tok_dir = None if args.report_only else shared_tokenizer(sub, configs[methods[0]])
        for m in methods:
          cache = os.path.join(sub, f"policy_records_{m}.json")  # a re-run skips finished evals
          key = _plan_key(pt, task, m)
          raw = {}
          if os.path.isfile(cache):
            with open(cache) as f:
              raw = json.load(f)
          saved = raw if raw.get("key") == key else {}
          prior = saved.get("records", [])
          label = f"{task} {m} seed {seed}"
          if args.report_only and not prior:
            unmatched.append(_unmatched(cache, raw, key, out_dir))
          if args.report_only or saved.get("complete"):
            if prior:
              log(f"[{label}] evaluated before: {cache}")
              records += prior
              done.append(
                label
                if saved.get("complete")
                else label
                + " (policies "
                + "/".join(dict.fromkeys(r["policy"] for r in prior))
                + " only)"
              )
            continue
          t0 = time.perf_counter()
          info = train_method(m, configs[m], sub, tok_dir, log)
          train_seconds += time.perf_counter() - t0
          dump = lambda recs, complete, info=info, key=key, cache=cache: dump_json(
            cache,
            {
              "key": key,
              "train_seconds": info["train_seconds"],
              "records": recs,
              "complete": complete,
            },
          )
          recs = policy_eval(
            m,
            info["workdir"],
            task,
            pt,
            seed,
            log,
            prior,
            save=lambda recs, dump=dump: dump(recs, False),
          )
          dump(recs, True)
          records += recs
          done.append(label)
        # a report after every seed: an interrupted run leaves what finished, labelled
        if not args.report_only:
          record = write_policy_report(
            out_dir,
            args,
            p,
            command,
            methods,
            load_start,
            t_start,
            train_seconds,
            records,
            done,
            log,
          )
  if args.report_only:  # written once, and never empty over a finished report
    if not records:
      raise _nothing_to_report(out_dir, unmatched)
    record = write_policy_report(
      out_dir, args, p, command, methods, load_start, t_start, train_seconds, records, done, log
    )
  name = f"{NAME}_policies"
  publish(out_dir, name, args, MEASURED)
  log(record["markdown"])
  log(f"\nwrote {out_dir}/{name}.md, .json, .png ({record['total_seconds'] / 60:.1f} min)")
  return record


def planned_rows(p, methods) -> set:
  """(task, method, seed, policy) of every row a policy run with plan `p` reports (AR, which
  uses no threshold, only under the default policy)."""
  rows = set()
  for task in p["tasks"]:
    for seed in p["seeds"]:
      for m in methods:
        uses = decoders.get(compare.parse_method(m)[0]).uses_threshold
        for policy in p["policies"] if uses else [policies_lib.DEFAULT]:
          rows.add((task, m, int(seed), policy))
  return rows


def keep_uncovered_report(out_dir: str, p, methods, log) -> None:
  """A policy report in `out_dir` with rows these flags will not report (other methods, seeds,
  tasks or policies) is moved aside, not replaced: `<name>.replaced_<UTC time>.json` (.md,
  .png), named in the log. The evaluation caches stay where they are."""
  name = f"{NAME}_policies"
  path = os.path.join(out_dir, f"{name}.json")
  if not os.path.isfile(path):
    return
  try:
    with open(path) as f:
      old = json.load(f).get("records") or []
    held = {(r["task"], r["method"], int(r["seed"]), r["policy"]) for r in old}
  except (ValueError, KeyError, TypeError, AttributeError):
    held = {("unreadable",)}  # a damaged report is kept too
  extra = held - planned_rows(p, methods)
  if not extra:
    return
  stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
  for ext in (".json", ".md", ".png"):
    src = os.path.join(out_dir, name + ext)
    if os.path.exists(src):
      os.replace(src, os.path.join(out_dir, f"{name}.replaced_{stamp}{ext}"))
  shown = ", ".join(" ".join(map(str, r)) for r in sorted(extra, key=str)[:3])
  log(
    f"kept the earlier report as {name}.replaced_{stamp}.json: it holds {len(extra)} row(s) "
    f"these flags do not report ({shown}{', ...' if len(extra) > 3 else ''})"
  )


def write_policy_report(
  out_dir, args, p, command, methods, load_start, t_start, train_seconds, records, done, log
) -> Dict[str, Any]:
  keep_uncovered_report(out_dir, p, methods, log)
  rows = summarize(records, args.bootstrap)
  curve = threshold_curve(records)
  name = f"{NAME}_policies"
  record = {
    "command": command,
    "commit": commit_label(),
    "quick": bool(args.quick),
    "methods": methods,
    "plan": p,
    "hardware": hardware(),
    "load_start": load_start,
    "load_end": uptime(),
    "train_seconds": train_seconds,
    "total_seconds": time.perf_counter() - t_start,
    "finished": done,
    "summary": rows,
    "threshold_curve": curve,
    "records": records,
  }
  plot_policies(rows, curve, os.path.join(out_dir, f"{name}.png"))
  chain = p["chain"]
  md = "\n".join(
    [
      f"## Commit policies: speed (kept tokens per forward call) vs accuracy "
      f"({'quick' if args.quick else 'full'} run)",
      "",
      f"Command: `{command}` at commit {record['commit']}",
      "",
      f"Finished (task, method, seed): {', '.join(done)}.",
      "",
      f"Machine load (`uptime`) at start: {load_start}; now: {record['load_end']}. Total "
      f"{record['total_seconds'] / 60:.1f} min (training {train_seconds / 60:.1f}).",
      "",
      f"Chain task: {chain['task_operands']} operands in 1..{chain['task_max_operand']}. "
      f"Seeds {p['seeds']}; validation / test problems per task and seed: "
      + ", ".join(f"{t} {v['num_val']} / {v['num_test']}" for t, v in p["per_task"].items())
      + f". The validation split chooses each policy's parameter (grid {p['grid']}; the most "
      "kept tokens per call within 1 point of tau off, else the most accurate); the test split "
      "measures the choice once (and the threshold rule at every grid tau, for its curve). "
      f"CIs: paired hierarchical bootstrap ({args.bootstrap} resamples: seeds, then the problems "
      "they share), same checkpoints and problems; accuracy differences in points, speed as the ratio "
      "of kept tokens per forward call. tok/s is not reported here (a shared, loaded machine).",
      "",
      policy_table(rows),
      "",
      "At matched speed: each policy against the threshold rule at the tau whose VALIDATION "
      "kept tokens per call is nearest to the policy's (per seed):",
      "",
      matched_table(rows),
      "",
      "Seed agreement (tau off, test):",
      "",
      seed_table(rows),
      "",
      f"![accuracy vs kept tokens per call]({name}.png)",
      "",
    ]
  )
  record["markdown"] = md
  with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
    json.dump(record, f, indent=2, default=float)
  with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
    f.write(md)
  return record


def _recipe(c0) -> str:
  return (
    f"configs/reasoning_common.py: {c0.model.num_layers} x {c0.model.hidden_size} DiT, "
    f"L={c0.seq_len}, vocab {c0.tokenizer.vocab_size}, lr {c0.learning_rate} "
    f"{c0.lr_schedule}"
  )


def _save(out_dir: str, record) -> str:
  """Writes speed_accuracy.{json,png,md} for the seeds done so far (the json with its rendered
  markdown); returns the markdown."""
  plot(record["summary"] or record["runs"][0]["results"], os.path.join(out_dir, f"{NAME}.png"))
  record["markdown"] = write_report(out_dir, record)
  with open(os.path.join(out_dir, f"{NAME}.json"), "w") as f:
    json.dump(record, f, indent=2, default=float)
  return record["markdown"]


def main(argv=None, log=print) -> Dict[str, Any]:
  args = parse_args(argv)
  check_record(args)
  if args.policies is not None:
    return policy_main(args, argv, log)
  p = plan(args)
  inputs.check_output_dir(args.output_dir)
  out_dir = os.path.abspath(args.output_dir)
  methods = [m.strip() for m in args.methods.split(",") if m.strip()]
  for m in methods:
    parse_spec(m)
  os.makedirs(out_dir, exist_ok=True)
  seeds = [int(x) for x in args.seeds.split(",") if x.strip()] if args.seeds else [args.seed]
  load_start, commit = uptime(), commit_label()
  t_start = time.perf_counter()
  train_seconds = eval_seconds = 0.0
  runs = []
  with jax_settings({"jax_disable_most_optimizations": True} if args.quick else {}):
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
      # every finished seed is on disk (a run cut short keeps its complete seeds)
      record = {
        "command": "python -m benchmarks.speed_accuracy "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": commit,
        "quick": bool(args.quick),
        "seed": seeds[0],
        "seeds": seeds,
        "seeds_done": [r["seed"] for r in runs],
        "methods": methods,
        "plan": p,
        "align_to_blocks": args.align_to_blocks,
        "recipe": _recipe(configs[methods[0]]),
        "hardware": hardware(),
        "load_start": load_start,
        "load_end": uptime(),
        "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
        "total_seconds": time.perf_counter() - t_start,
        "results": runs[0]["results"],  # the first seed's (as a single-seed run)
        "runs": runs,
        "summary": summarize_seeds(runs) if len(runs) > 1 else None,
      }
      text = _save(out_dir, record)
  publish(out_dir, NAME, args, MEASURED)
  log(text)
  log(f"\nwrote {out_dir}/{NAME}.md, .json, .png ({record['total_seconds'] / 60:.1f} min)")
  return record


if __name__ == "__main__":
  inputs.run(main)
