r"""The measured RL result of issue 28: GRPO (exact trajectory likelihoods) against continued SFT
with the same compute, on the chain task (configs/reasoning_chain.py: 5 operands in 1..9, L=32).

  python -m benchmarks.rl_result --sft_workdirs=D0,D1,D2 --output_dir=/tmp/rl_result  # full
  python -m benchmarks.rl_result --quick --output_dir=/tmp/rl_quick      # pipeline check (~1 min)
  # seeds as parallel processes on one output dir (seed 0 chooses the learning rates), then the
  # report of all three from the caches:
  python -m benchmarks.rl_result --sft_workdirs=D0 --seeds=0 --output_dir=OUT &
  python -m benchmarks.rl_result --sft_workdirs=D1 --seeds=1 --lr_seed=0 --wait_minutes=60 \
      --output_dir=OUT &
  wait; python -m benchmarks.rl_result --sft_workdirs=D0,D1 --seeds=0,1 --output_dir=OUT

Per seed s of --seeds (default 0,1,2):
  1. SFT: SetDLM S=4 (S_max 8) on the chain task; --sft_workdirs reuses one finished workdir per
     seed (e.g. benchmarks/speed_accuracy.py --policies --tasks=chain --steps=2000's
     runs/setdlm4), else the benchmark's recipe is trained for --sft_steps. Plateau evidence
     (eval NLL and train loss windows from its metrics.jsonl) goes into the table header.
  2. From that checkpoint, same seed: 'rl' = GRPO with lambda = 0 (exact_match reward, the pmax
     commit policy with tau off, temperature 1); 'rl_cost' = GRPO with a step cost lambda
     (--step_cost) and a commit policy that can trade steps (--cost_policy, default pmax with
     tau 0.7: every position whose max-probability passes 0.7 commits, so a sharper model
     finishes in fewer steps; under greedy decoding pmax ranks exactly like the threshold rule, so
     the rollouts train the rule that is evaluated); 'control' = continued SFT from the same
     parameters (launch/train.py's loop with `init_from`) with the same optimiser chain, the same
     number of updates (RL steps x rl.inner_updates) and the same rows per update (P prompts x
     G completions of RL = P x G ground-truth rows of the train split). Wall-clock per arm.
     Learning rates: a grid per arm family (--rl_lrs, --control_lrs) run on --lr_seed (default
     the first of --seeds), chosen by greedy tau-off accuracy on its VALIDATION split (never
     test), then used for every seed ('rl_cost' uses the 'rl' choice; <output_dir>/lr_choice.json).
  3. Every checkpoint (sft, control, rl, rl_cost) is decoded greedily (as launch/evaluate.py
     --eval=accuracy) on --num_val validation problems over --eval_grid (the choice: the most kept
     tokens per forward call within 1 point of tau off, `speed_accuracy.choose`) and on --num_test
     test problems at tau off and at that choice. The RL prompts come from the task's train split
     (checked disjoint from both at run time). Paired hierarchical bootstrap CIs (seeds, then
     the problems they share: `speed_accuracy.paired_ci`): accuracy difference and kept-tokens-per-call
     ratio of rl - control, rl - sft, control - sft (and rl_cost likewise), at tau off and at each
     arm's own validation choice, against the issue's targets.
Writes rl_chain.{md,json,png} to --output_dir (no machine paths inside); --record=NAME publishes
them as the record benchmarks/results/NAME.json (+ .png; see speed_accuracy's docstring). Each (seed, arm) is cached in
<output_dir>/seed<s>/arm_<arm>.json (atomic; RL / control workdirs resume), so a killed run resumes.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional


if __name__ == "__main__" and not __package__:  # a file run cannot import configs/, benchmarks/
  sys.exit("error: run it from the repository root as `python -m benchmarks.rl_result [flags]`")

import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import inputs  # noqa: E402
from benchmarks import speed_accuracy as sa  # noqa: E402
from benchmarks.compare_methods import (
  check_record,
  check_reuse,
  jax_settings,
  publish,
  shared_tokenizer,
  train_method,
  write_fingerprint,
)  # noqa: E402
from setdiff_jax.data import pairs as pairs_lib  # noqa: E402
from setdiff_jax.data import tokenizers  # noqa: E402
from setdiff_jax.evaluation import accuracy, run  # noqa: E402
from setdiff_jax.evaluation.results import hardware  # noqa: E402
from setdiff_jax.evaluation.tables import markdown_table  # noqa: E402
from setdiff_jax.rl import config as rl_config  # noqa: E402
from setdiff_jax.workdir import checkpoints as checkpointing  # noqa: E402
from setdiff_jax.sampling.config import CommitPolicy, DecodeSetting  # noqa: E402
from setdiff_jax.workdir import load as workdir_lib  # noqa: E402

NAME = "rl_chain"
MEASURED = sa.MEASURED[:3] + sa.MEASURED[4:] + ("benchmarks/rl_result.py",)  # + setdiff_jax/rl
ARMS = ("sft", "control", "rl", "rl_cost")
LABELS = {
  "sft": "SFT checkpoint",
  "control": "continued SFT (control)",
  "rl": "RL, lambda = 0",
  "rl_cost": "RL, lambda > 0",
}
EVAL_GRID = "threshold:off/0.9/0.7/0.5,entropy_bound:0.1/0.3/1"
# Optimiser fields the control copies from the RL config (the same chain; only loss and rows differ)
OPTIMISER = (
  "lr_schedule",
  "cosine_alpha",
  "weight_decay",
  "adam_b1",
  "adam_b2",
  "adam_eps",
  "grad_clip_norm",
)
PLATEAU_STEPS = (600, 1200, 1800, 2000)
COMPARISONS = (
  ("rl", "control"),
  ("rl", "sft"),
  ("control", "sft"),
  ("rl_cost", "control"),
  ("rl_cost", "sft"),
)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--output_dir", default="/tmp/setdiff_rl_result")
  p.add_argument(
    "--record",
    default=None,
    help="publish the report as the record RESULTS_DIR/RECORD.json (+ .png): only from a clean "
    "commit on main's history, never over another record",
  )
  p.add_argument(
    "--record_resume", action="store_true", help="--record: replace a re-report of the same commit"
  )
  p.add_argument("--results_dir", default=None, help="where --record writes (benchmarks/results)")
  p.add_argument("--quick", action="store_true", help="tiny model, few steps and problems")
  p.add_argument("--seeds", default=None, help="comma-separated (default 0,1,2; quick 0)")
  p.add_argument(
    "--sft_workdirs",
    default=None,
    help="one finished SetDLM chain SFT workdir per seed (comma-separated, in --seeds order; "
    "'-' = train that seed's here); default: train --sft_steps here (recipe: speed_accuracy's "
    "setdlm4 on chain, eval NLL every 600 steps)",
  )
  p.add_argument("--sft_steps", type=int, default=None, help="SFT steps when training (2000)")
  p.add_argument("--rl_steps", type=int, default=None, help="RL steps per run (250; quick 2)")
  p.add_argument("--prompts_per_step", type=int, default=None, help="P (8; quick 4)")
  p.add_argument("--group_size", type=int, default=None, help="G (8; quick 2)")
  p.add_argument("--inner_updates", type=int, default=1, help="mu, updates per RL step")
  p.add_argument("--rl_lrs", default=None, help="RL learning-rate grid (1e-5,3e-5,1e-4)")
  p.add_argument("--control_lrs", default=None, help="control learning-rate grid (2e-5,2e-4)")
  p.add_argument("--step_cost", type=float, default=0.02, help="lambda of the rl_cost arm")
  p.add_argument(
    "--cost_policy", default="pmax:0.7", help="the rl_cost arm's RL commit policy NAME[:ARG]"
  )
  p.add_argument(
    "--cost_adv_eps",
    type=float,
    default=1.0,
    help="rl.adv_eps of the rl_cost arm: advantages "
    "(r - mean) / (std + eps); with the default 1e-6 a group whose rows are all right or all "
    "wrong is ranked by step count alone at full strength, whatever lambda (its scale cancels)",
  )
  p.add_argument("--num_val", type=int, default=None, help="validation problems (200; quick 4)")
  p.add_argument("--num_test", type=int, default=None, help="test problems (1000; quick 8)")
  p.add_argument("--decode_batch", type=int, default=None, help="rows per decode (100; quick 8)")
  p.add_argument("--eval_grid", default=None, help=f"greedy policy grid ({EVAL_GRID})")
  p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples")
  p.add_argument(
    "--lr_seed",
    type=int,
    default=None,
    help="the seed whose validation split chooses the "
    "learning rates (default: the first of --seeds); a run without it reads that choice from "
    "<output_dir>/lr_choice.json (e.g. seeds run as parallel processes on one --output_dir)",
  )
  p.add_argument(
    "--wait_minutes",
    type=float,
    default=0.0,
    help="wait up to this long for each SFT "
    "workdir's last checkpoint and for lr_choice.json (another process writing them)",
  )
  args = p.parse_args(argv)
  check_counts(args)
  return args


def check_counts(args) -> None:
  """Counts below their minimum and negative costs are refused before anything runs."""
  inputs.check_at_least(args, 1, "sft_steps", "rl_steps", "prompts_per_step", "inner_updates")
  inputs.check_at_least(args, 1, "num_val", "num_test", "decode_batch", "bootstrap")
  inputs.check_at_least(args, 2, "group_size")  # GRPO's advantages compare rows of a group
  inputs.check_at_least(args, 0, "lr_seed", "step_cost", "wait_minutes")
  if not args.cost_adv_eps > 0:
    raise ValueError(f"--cost_adv_eps={args.cost_adv_eps} must be > 0")


def _floats(text: str) -> List[float]:
  return [float(x) for x in text.split(",") if x.strip()]


def plan(args) -> Dict[str, Any]:
  q = bool(args.quick)
  p = dict(
    quick=q,
    seeds=[int(x) for x in (args.seeds or ("0" if q else "0,1,2")).split(",") if x.strip()],
    sft_steps=args.sft_steps or (4 if q else 2000),
    rl_steps=args.rl_steps or (2 if q else 250),
    prompts_per_step=args.prompts_per_step or (4 if q else 8),
    group_size=args.group_size or (2 if q else 8),
    inner_updates=int(args.inner_updates),
    rl_lrs=_floats(args.rl_lrs or ("1e-4" if q else "1e-5,3e-5,1e-4")),
    control_lrs=_floats(args.control_lrs or ("2e-4" if q else "2e-5,2e-4")),
    step_cost=float(args.step_cost),
    cost_adv_eps=float(args.cost_adv_eps),
    num_val=args.num_val or (4 if q else 200),
    num_test=args.num_test or (8 if q else 1000),
    decode_batch=args.decode_batch or (8 if q else 100),
    bootstrap=int(args.bootstrap),
  )
  name, _, arg = args.cost_policy.partition(":")
  p["cost_policy"] = [name.strip(), float(arg) if arg.strip() else None]
  grid = sa.parse_grid(args.eval_grid or ("threshold:off/0.7" if q else EVAL_GRID))
  grid.setdefault("threshold", (None,))
  if None not in grid["threshold"]:  # tau off: the reference of the choice
    grid["threshold"] = (None,) + tuple(grid["threshold"])
  p["eval_grid"] = {k: list(v) for k, v in grid.items()}
  sft = [x.strip() for x in (args.sft_workdirs or "").split(",") if x.strip()]
  if sft and len(sft) != len(p["seeds"]):
    raise ValueError(
      f"--sft_workdirs has {len(sft)} workdirs for {len(p['seeds'])} seeds {p['seeds']}: give "
      "one per seed, in --seeds order"
    )
  p["sft_workdirs"] = sft
  p["lr_seed"] = p["seeds"][0] if args.lr_seed is None else int(args.lr_seed)
  p["wait_minutes"] = float(args.wait_minutes)
  return p


# ----------------------------------------------------------------------------- pure helpers
def rl_run_config(sft_dir: str, seed: int, lr: float, p, cost: bool) -> ml_collections.ConfigDict:
  """The launch/rl.py config of one RL arm (lambda = 0: pmax tau off; lambda > 0: the step cost
  and --cost_policy)."""
  c = rl_config.default_config()
  c.seed = int(seed)
  c.num_train_steps = int(p["rl_steps"])
  c.learning_rate = float(lr)
  c.checkpoint_every_steps = max(int(p["rl_steps"]) // 4, 1)
  c.keep_checkpoints = 1
  c.log_every_steps = 1
  r = c.rl
  r.init_from = sft_dir
  r.prompts_per_step = int(p["prompts_per_step"])
  r.group_size = int(p["group_size"])
  r.inner_updates = int(p["inner_updates"])
  r.reward = "exact_match"
  r.temperature = 1.0
  r.policy, r.policy_arg = "pmax", None
  if cost:
    r.step_cost = float(p["step_cost"])
    r.adv_eps = float(p["cost_adv_eps"])
    r.policy, r.policy_arg = p["cost_policy"][0], p["cost_policy"][1]
  return c


def control_config(
  sft: ml_collections.ConfigDict, rl: ml_collections.ConfigDict, lr: float
) -> ml_collections.ConfigDict:
  """Continued SFT with the compute of the RL run `rl`: from the SFT parameters
  (init_from = rl.rl.init_from), the same optimiser chain, rl.num_train_steps x rl.inner_updates
  updates of rl.prompts_per_step x rl.group_size ground-truth rows each, seed rl.seed."""
  c = ml_collections.ConfigDict(copy.deepcopy(sft.to_dict()))
  r = rl.rl
  updates = int(rl.num_train_steps) * int(r.inner_updates)
  c.init_from = str(r.init_from)
  c.init_from_hf = ""
  c.seed = int(rl.seed)
  c.batch_size = int(r.prompts_per_step) * int(r.group_size)
  c.grad_accum_steps = 1
  c.num_train_steps = updates
  c.learning_rate = float(lr)
  c.warmup_steps = int(rl.warmup_steps) * int(r.inner_updates)
  for k in OPTIMISER:
    c[k] = copy.deepcopy(rl[k])
  c.eval_every_steps = updates
  c.checkpoint_every_steps = max(updates // 4, 1)
  c.keep_checkpoints = 1
  c.log_every_steps = max(1, min(10, updates))
  return c


def choose_lr(val_acc: Dict[float, float]) -> float:
  """The learning rate with the best validation accuracy (ties: the smaller one)."""
  if not val_acc:
    raise ValueError("no learning rate was evaluated")
  return min(val_acc, key=lambda lr: (-val_acc[lr], lr))


def plateau(lines: List[Dict[str, Any]], steps=PLATEAU_STEPS, window: int = 200):
  """SFT plateau evidence from metrics.jsonl records: per step in `steps` (those reached), the
  eval NLL logged at that step (None if none) and the mean train loss over (step - window, step]."""
  out = []
  for s in steps:
    evals = [x["eval/nll"] for x in lines if "eval/nll" in x and int(x["step"]) == s]
    losses = [
      x["train/loss"] for x in lines if "train/loss" in x and s - window < int(x["step"]) <= s
    ]
    if evals or losses:
      out.append(
        {
          "step": s,
          "eval_nll": float(evals[-1]) if evals else None,
          "train_loss": float(np.mean(losses)) if losses else None,
        }
      )
  return out


def pooled(records: List[Dict[str, Any]], arm: str, which: str, seeds) -> Dict[str, list]:
  """The per-example results of `arm` at `which` ('off' | 'chosen', test) pooled over `seeds` in
  that order: {'correct', 'kept', 'calls'} lists, the (seed, problem) pairs of the CIs."""
  by_seed = {r["seed"]: r for r in records if r["arm"] == arm}
  missing = [s for s in seeds if s not in by_seed]
  if missing:
    raise ValueError(f"arm {arm!r} has no record for seeds {missing}")
  per = [by_seed[s][f"test_{which}"]["per_example"] for s in seeds]
  return {k: sum((x[k] for x in per), []) for k in ("correct", "kept", "calls")}


def compare(records, a: str, b: str, which: str, seeds, n_boot: int) -> Dict[str, Any]:
  """Arm a vs arm b on the same (seed, problem) pairs: accuracy difference and kept/call ratio
  with 95 % paired hierarchical bootstrap intervals (seeds, then problems:
  `speed_accuracy.paired_ci`)."""
  x, y = pooled(records, a, which, seeds), pooled(records, b, which, seeds)
  if len(x["correct"]) != len(y["correct"]):
    raise ValueError(f"{a} and {b} were not evaluated on the same problems")
  ci = sa.paired_ci(x, y, n_boot, 0, len(seeds))
  return {"a": a, "b": b, "which": which, "n": len(x["correct"]), **ci}


def targets(comps: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
  """The issue's two targets from the paired comparisons: (1) rl - control >= +10 points with the
  CI above 0 (tau off or at the choices); (2) rl_cost at >= 1.3x the control's kept tokens per
  call at most 1 point less accurate (point estimate), at its choice vs the control's."""
  get = {(c["a"], c["b"], c["which"]): c for c in comps}
  out = []
  for which in ("off", "chosen"):
    c = get.get(("rl", "control", which))
    if c:
      out.append(
        {
          "target": f"rl - control >= +10 points, CI excludes 0 ({which})",
          "measured": c,
          "met": bool(c["acc_diff"] >= 0.10 and c["acc_diff_ci"][0] > 0),
        }
      )
  for which in ("chosen", "off"):
    c = get.get(("rl_cost", "control", which))
    if c:
      out.append(
        {
          "target": f"rl_cost >= 1.3x control's kept/call at <= 1 point lower accuracy ({which})",
          "measured": c,
          "met": bool(c["speedup"] >= 1.3 and c["acc_diff"] >= -0.01),
        }
      )
  return out


def sft_steps(records: List[Dict[str, Any]]):
  """The step of the SFT checkpoints RL started from, as the record's plan states it (one number
  when the seeds agree): --sft_steps only applies when this benchmark trains the SFT itself."""
  steps = sorted({int(r["step"]) for r in records if r["arm"] == "sft"})
  return steps[0] if len(steps) == 1 else steps


def scrub(text: str, names: Dict[str, str]) -> str:
  """Replaces machine paths (longest first) by their names: no /tmp or /work in results files."""
  for path in sorted(names, key=len, reverse=True):
    text = text.replace(path, names[path])
  return text


# ----------------------------------------------------------------------------- runs
def _load(path: str, key) -> Optional[Dict[str, Any]]:
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    saved = json.load(f)
  return saved if saved.get("key") == key else None


def _metrics(workdir: str) -> List[Dict[str, Any]]:
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.isfile(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _has_checkpoint(workdir: str) -> bool:
  d = checkpointing.checkpoint_dir(workdir)
  return os.path.isdir(d) and any(s.isdigit() for s in os.listdir(d))


def sft_workdir(seed: int, p, out_dir: str, log) -> str:
  given = p["sft_workdirs"][p["seeds"].index(seed)] if p["sft_workdirs"] else "-"
  if given != "-":
    d = os.path.abspath(given)
    if not _wait(lambda: sft_finished(d), p["wait_minutes"], log, f"the SFT run {d}"):
      raise FileNotFoundError(
        f"--sft_workdirs: {d} has no config.json or no checkpoint of its last step (waited "
        f"{p['wait_minutes']:g} min; --wait_minutes waits longer)"
      )
    return d
  sp = dict(
    steps=p["sft_steps"],
    batch_size=8 if p["quick"] else 32,
    hidden_size=32 if p["quick"] else None,
    num_layers=1 if p["quick"] else None,
    lr=None,
    num_test=p["num_test"],
  )
  c = sa.task_config(sa.method_config("setdlm4", sp, seed, p["quick"]), "chain")
  c.eval_every_steps = min(600, int(c.num_train_steps))  # plateau evidence (eval NLL)
  sub = os.path.join(out_dir, f"seed{seed}")
  info = train_method("sft", c, sub, shared_tokenizer(out_dir, c), log)
  return info["workdir"]


def sft_finished(workdir: str) -> bool:
  """config.json and the checkpoint of its num_train_steps are there (training finished)."""
  try:
    steps = int(checkpointing.load_config(workdir).num_train_steps)
  except (OSError, ValueError):
    return False
  return os.path.isdir(os.path.join(checkpointing.checkpoint_dir(workdir), str(steps)))


def _wait(ready, minutes: float, log, what: str, every: float = 30.0) -> bool:
  """Polls `ready()` until it holds or `minutes` have passed (a bounded wait)."""
  deadline = time.time() + 60.0 * minutes
  said = False
  while not ready():
    if time.time() >= deadline:
      return False
    if not said:
      log(f"waiting up to {minutes:g} min for {what}")
      said = True
    time.sleep(min(every, max(deadline - time.time(), 0.1)))
  return True


def train_rl_arm(workdir: str, c, log) -> Dict[str, Any]:
  """Runs (or resumes, or finds finished) one RL run; wall-clock of this call."""
  from setdiff_jax.rl import grpo

  check_reuse(workdir, c)  # a run of other settings (seed, lr, kl, ...) is never reported as this
  info_path = os.path.join(workdir, "train_info.json")
  if os.path.isfile(info_path):
    with open(info_path) as f:
      info = json.load(f)
    if info.get("steps") == int(c.num_train_steps):
      return info
  resumed = _has_checkpoint(workdir)
  os.makedirs(workdir, exist_ok=True)
  write_fingerprint(workdir, c)
  t0 = time.perf_counter()
  grpo.train_rl(c, workdir)
  info = {
    "steps": int(c.num_train_steps),
    "train_seconds": time.perf_counter() - t0,
    "resumed": resumed,
    "step_seconds_sum": float(
      sum(x.get("rl/step_seconds", 0.0) for x in _metrics(workdir) if "rl/step_seconds" in x)
    ),
  }
  sa.dump_json(info_path, info)
  log(f"  RL {os.path.basename(workdir)}: {info['train_seconds']:.0f}s")
  return info


def train_control_arm(runs_dir: str, name: str, c, sft_dir: str, log) -> Dict[str, Any]:
  workdir = os.path.join(runs_dir, "runs", name)
  finished = os.path.isfile(os.path.join(workdir, "train_info.json"))
  resumed = _has_checkpoint(workdir) and not finished  # an interrupted run goes on
  info = train_method(name, c, runs_dir, os.path.join(sft_dir, tokenizers.TOKENIZER_SUBDIR), log)
  info.setdefault("resumed", resumed)
  return info


def splits(data_cfg, p):
  """(validation, test) problems of the task, and the check that the train split (RL prompts,
  control rows) shares no prompt with either."""
  val_cfg, test_cfg = data_cfg.copy_and_resolve_references(), data_cfg.copy_and_resolve_references()
  val_cfg.task_eval_examples, test_cfg.task_eval_examples = p["num_val"], p["num_test"]
  val = pairs_lib.load_pairs(val_cfg, "validation")
  test = pairs_lib.load_pairs(test_cfg, "eval")
  train = {x.prompt for x in pairs_lib.load_pairs(data_cfg, "train")}
  overlap = len(train & {x.prompt for x in val}) + len(train & {x.prompt for x in test})
  if overlap or {x.prompt for x in val} & {x.prompt for x in test}:
    raise ValueError(f"the train / validation / test problems overlap ({overlap} shared)")
  info = {"train_distinct": len(train), "val": len(val), "test": len(test), "overlap": 0}
  return val, test, info


def _slim(r: Dict[str, Any]) -> Dict[str, Any]:
  keys = ("setting", "policy", "policy_arg", "accuracy", "num_examples", "kept_tokens_per_call")
  keys += ("forward_calls", "mean_generated_tokens", "tokens_per_step")
  return {k: r.get(k) for k in keys}


def evaluate(workdir: str, p, seed: int, full: bool, log, label: str) -> Dict[str, Any]:
  """Greedy decoding of one checkpoint: validation over the grid (full) or at tau off only (a
  learning-rate candidate); test at tau off and at the validation choice (full)."""
  state = workdir_lib.load_inference_state(workdir, use_ema=False)
  val, test, split_info = splits(state.config.data, p)
  _, model = run.inference_models(state)
  w = int(state.config.loss.desired_set_size)

  def ev(problems, settings):
    return accuracy.accuracy_eval(
      model,
      state.params,
      state.tokenizer,
      state.objective_config,
      int(state.config.seq_len),
      problems,
      settings=settings,
      batch_size=p["decode_batch"],
      speed_examples=0,
      extractor="hash",
      seed=seed,
      per_example=True,
    )

  def setting(policy, arg):
    return DecodeSetting(w, CommitPolicy(policy, arg))

  t0 = time.perf_counter()
  off = setting("threshold", None)
  if not full:
    r = ev(val, [off])[0]
    log(f"  [{label}] val acc (tau off) {r['accuracy']:.3f}")
    return {"val_off": _slim(r), "step": int(state.step), "splits": split_info}
  grid = [setting(k, a) for k, args in p["eval_grid"].items() for a in args]
  val_rows = ev(val, grid)
  ref = [r for r in val_rows if r["policy"] == "threshold" and r["policy_arg"] is None][0]
  pick = sa.choose(val_rows, ref["accuracy"])
  chosen = setting(pick["policy"], pick["policy_arg"])
  tests = ev(test, [off] if chosen == off else [off, chosen])
  rec = {
    "step": int(state.step),
    "splits": split_info,
    "val": [_slim(r) for r in val_rows],
    "val_off": _slim(ref),
    "chosen": {"policy": pick["policy"], "policy_arg": pick["policy_arg"]},
    "test_off": {**_slim(tests[0]), "per_example": tests[0]["per_example"]},
    "test_chosen": {**_slim(tests[-1]), "per_example": tests[-1]["per_example"]},
    "eval_seconds": time.perf_counter() - t0,
  }
  log(
    f"  [{label}] test tau off: acc {tests[0]['accuracy']:.3f} kept/call "
    f"{tests[0]['kept_tokens_per_call']:.2f}; choice {pick['policy']} {pick['policy_arg']}: acc "
    f"{tests[-1]['accuracy']:.3f} kept/call {tests[-1]['kept_tokens_per_call']:.2f}"
  )
  return rec


def _lr_tag(lr: float) -> str:
  return f"lr{lr:g}"


def _key(p, arm: str, lr=None, sft_dir: str = ""):
  keys = ("rl_steps", "prompts_per_step", "group_size", "inner_updates", "num_val", "num_test")
  keys += ("eval_grid", "decode_batch", "sft_steps")
  if arm == "rl_cost":
    keys += ("step_cost", "cost_policy", "cost_adv_eps")
  return json.loads(json.dumps({"arm": arm, "lr": lr, "sft": sft_dir, **{k: p[k] for k in keys}}))


def run_arm(arm: str, lr, seed: int, sft_dir: str, p, out_dir: str, full: bool, log):
  """Trains (or finds) one arm's run and evaluates it, cached in seed<s>/<arm>_<lr>.json (full
  evaluations also as arm_<arm>.json)."""
  sub = os.path.join(out_dir, f"seed{seed}")
  name = arm if arm == "sft" else f"{arm}_{_lr_tag(lr)}"
  cache = os.path.join(sub, f"{'arm' if full else 'cand'}_{name}.json")
  key = _key(p, arm, lr, sft_dir)
  saved = _load(cache, key)
  if saved:
    return saved["record"]
  label = f"seed {seed} {name}"
  log(f"[{label}] {'train + evaluate' if full else 'learning-rate candidate'}")
  info: Dict[str, Any] = {"train_seconds": 0.0, "resumed": False}
  workdir = sft_dir
  if arm in ("rl", "rl_cost"):
    workdir = os.path.join(sub, "runs", name)
    info = train_rl_arm(workdir, rl_run_config(sft_dir, seed, lr, p, arm == "rl_cost"), log)
  elif arm == "control":
    rl = rl_run_config(sft_dir, seed, lr, p, False)
    sft_cfg = checkpointing.load_config(sft_dir)
    info = train_control_arm(sub, name, control_config(sft_cfg, rl, lr), sft_dir, log)
    workdir = info["workdir"]
  rec = {
    "arm": arm,
    "seed": seed,
    "lr": lr,
    "workdir": os.path.relpath(workdir, out_dir) if workdir != sft_dir else f"SFT{seed}",
    "commit": sa.commit_label(),
    "train_seconds": float(info.get("train_seconds", 0.0)),
    "resumed": bool(info.get("resumed", False)),
    "updates": 0 if arm == "sft" else int(p["rl_steps"]) * int(p["inner_updates"]),
    "rows_per_update": 0 if arm == "sft" else int(p["prompts_per_step"]) * int(p["group_size"]),
    **evaluate(workdir, p, seed, full, log, label),
  }
  sa.dump_json(cache, {"key": key, "record": rec})
  return rec


def _lr_key(p):
  return {k: p[k] for k in ("rl_lrs", "control_lrs")} | {"seed": p["lr_seed"], **_key(p, "lr")}


def read_lrs(p, out_dir: str, log) -> Dict[str, Any]:
  """The choice another run (on --lr_seed) wrote to <output_dir>/lr_choice.json (bounded wait)."""
  path = os.path.join(out_dir, "lr_choice.json")
  if not _wait(lambda: _load(path, _lr_key(p)) is not None, p["wait_minutes"], log, path):
    raise FileNotFoundError(
      f"--lr_seed={p['lr_seed']} is not among --seeds={p['seeds']} and {path} holds no choice "
      "for this plan: run that seed first (or with these seeds), or wait longer (--wait_minutes)"
    )
  return _load(path, _lr_key(p))["record"]


def choose_lrs(seed: int, sft_dir: str, p, out_dir: str, log) -> Dict[str, Any]:
  """The learning rates of every seed, chosen on `seed`'s validation split (cached)."""
  path = os.path.join(out_dir, "lr_choice.json")
  key = _lr_key(p)
  saved = _load(path, key)
  if saved:
    return saved["record"]
  out: Dict[str, Any] = {"seed": seed}
  for arm, lrs in (("rl", p["rl_lrs"]), ("control", p["control_lrs"])):
    val = {}
    for lr in lrs:
      rec = run_arm(arm, lr, seed, sft_dir, p, out_dir, False, log)
      val[lr] = rec["val_off"]["accuracy"]
    out[arm] = {"grid": [[lr, a] for lr, a in val.items()], "chosen": choose_lr(val)}
  out["rl_cost"] = {"grid": [], "chosen": out["rl"]["chosen"], "from": "rl"}
  sa.dump_json(path, {"key": key, "record": out})
  return out


# ----------------------------------------------------------------------------- report
def _ms(xs, scale=1.0, fmt="{:.1f}") -> str:
  xs = np.asarray(xs, float) * scale
  sd = xs.std(ddof=1) if len(xs) > 1 else 0.0
  return f"{fmt.format(xs.mean())} ± {fmt.format(sd)}"


def _choice(r) -> str:
  arg = r["chosen"]["policy_arg"]
  return f"{r['chosen']['policy']} {'off' if arg is None else format(arg, 'g')}"


def arm_table(records, seeds) -> str:
  header = [
    "arm",
    "lr",
    "updates x rows",
    "wall-clock min (mean)",
    "val acc % tau off",
    "test acc % tau off",
    "kept/call tau off",
    "choice (per seed)",
    "test acc % at choice",
    "kept/call at choice",
    "n test",
  ]
  body = []
  for arm in ARMS:
    rs = [r for s in seeds for r in records if r["arm"] == arm and r["seed"] == s]
    if len(rs) != len(seeds):
      continue
    body.append(
      [
        LABELS[arm],
        "-" if arm == "sft" else f"{rs[0]['lr']:g}",
        "-" if arm == "sft" else f"{rs[0]['updates']} x {rs[0]['rows_per_update']}",
        "-" if arm == "sft" else f"{np.mean([r['train_seconds'] for r in rs]) / 60:.1f}",
        _ms([r["val_off"]["accuracy"] for r in rs], 100),
        _ms([r["test_off"]["accuracy"] for r in rs], 100),
        _ms([r["test_off"]["kept_tokens_per_call"] for r in rs], 1, "{:.2f}"),
        " / ".join(_choice(r) for r in rs),
        _ms([r["test_chosen"]["accuracy"] for r in rs], 100),
        _ms([r["test_chosen"]["kept_tokens_per_call"] for r in rs], 1, "{:.2f}"),
        f"{sum(r['test_off']['num_examples'] for r in rs)} ({len(rs)} x "
        f"{rs[0]['test_off']['num_examples']})",
      ]
    )
  return markdown_table(header, body)


def seed_table(records, seeds) -> str:
  header = ["arm"] + [f"seed {s}: acc % off / choice (kept/call off / choice)" for s in seeds]
  body = []
  for arm in ARMS:
    row = [LABELS[arm]]
    for s in seeds:
      r = [x for x in records if x["arm"] == arm and x["seed"] == s]
      row.append(
        "-"
        if not r
        else f"{100 * r[0]['test_off']['accuracy']:.1f} / {100 * r[0]['test_chosen']['accuracy']:.1f}"
        f" ({r[0]['test_off']['kept_tokens_per_call']:.2f} / "
        f"{r[0]['test_chosen']['kept_tokens_per_call']:.2f})"
      )
    body.append(row)
  return markdown_table(header, body)


def comparison_table(comps) -> str:
  header = ["comparison", "decoding", "d accuracy, points [95% CI]", "x kept/call [95% CI]", "n"]
  body = [
    [
      f"{c['a']} - {c['b']}",
      "tau off" if c["which"] == "off" else "each arm's validation choice",
      sa.ci_cell(c, "acc_diff"),
      sa.ci_cell(c, "speedup", 1.0, "{:.2f}"),
      c["n"],
    ]
    for c in comps
  ]
  return markdown_table(header, body)


def target_table(rows) -> str:
  body = [
    [
      t["target"],
      sa.ci_cell(t["measured"], "acc_diff"),
      sa.ci_cell(t["measured"], "speedup", 1.0, "{:.2f}"),
      "met" if t["met"] else "not met",
    ]
    for t in rows
  ]
  return markdown_table(["target", "d accuracy, points", "x kept/call", "verdict"], body)


def plot(curves: Dict[str, List[Dict[str, Any]]], path: str, smooth: int = 10):
  """Training curves per RL step: reward, sampled accuracy, kept tokens per call (moving average
  over `smooth` steps), one line per (arm, seed); the control's train loss per update."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  keys = (
    ("rl/reward_mean", "reward (mean over rows)"),
    ("rl/accuracy", "sampled accuracy (T = 1)"),
    ("rl/kept_tokens_per_call", "kept tokens per call (sampling)"),
    ("train/loss", "control: SFT train loss"),
  )
  fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
  seeds = sorted({name.split(" s")[-1] for name in curves})
  for name, lines in sorted(curves.items()):
    arm, seed = name.split(" s")
    ls = ("-", "--", ":", "-.")[seeds.index(seed) % 4]
    style = dict(color=f"C{ARMS.index(arm)}", ls=ls, lw=1.0, label=name)
    for ax, (k, title) in zip(axes, keys):
      xs = [x["step"] for x in lines if k in x]
      ys = np.asarray([x[k] for x in lines if k in x], float)
      if len(ys) == 0:
        continue
      n = min(smooth, len(ys)) if k.startswith("rl/") else 1
      ys = np.convolve(ys, np.ones(n) / n, mode="valid")
      ax.plot(xs[n - 1 :], ys, **style)
      ax.set_title(title)
  for ax in axes:
    ax.set_xlabel("RL step (control: update)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  plt.close(fig)


def write_report(out_dir: str, record: Dict[str, Any], names: Dict[str, str]) -> str:
  p, seeds = record["plan"], record["seeds_done"]
  hw = record["hardware"]
  lr = record.get("lr_choice") or {}
  plat = "; ".join(
    f"seed {s}: "
    + ", ".join(
      f"{x['step']}: "
      + (f"eval NLL {x['eval_nll']:.4f}" if x["eval_nll"] is not None else "eval NLL -")
      + (f", train loss {x['train_loss']:.4f}" if x["train_loss"] is not None else "")
      for x in pl
    )
    for s, pl in record["plateau"].items()
  )
  grid = lambda a: ", ".join(
    f"{x:g}: {100 * y:.1f} %" for x, y in (lr.get(a) or {}).get("grid", [])
  )
  md = [
    f"## RL vs continued SFT on the chain task ({'quick' if p['quick'] else 'full'} run)",
    "",
    f"Command: `{record['command']}` at commit {record['commit']} (the arms were trained and "
    f"evaluated at {', '.join(sorted({str(r.get('commit')) for r in record['records']}))}; each "
    "(seed, arm) is cached).",
    "",
    f"Seeds done: {seeds} of {p['seeds']}. Hardware: {hw['cpu']} ({hw['cpu_count']} cores "
    f"visible), jax {hw['jax']} on {hw['backend']}. Load (`uptime`) at start: "
    f"{record['load_start']}; at the end: {record['load_end']}. Total "
    f"{record['total_seconds'] / 60:.1f} min.",
    "",
    f"SFT: SetDLM S=4 (S_max 8), {record['sft_recipe']}. Plateau evidence (metrics.jsonl: eval "
    f"NLL where logged, train loss = mean of the logged values over the 200 steps up to the "
    f"step): {plat}.",
    "",
    f"RL: GRPO, {p['prompts_per_step']} prompts x {p['group_size']} completions per step from "
    f"the train split, {p['rl_steps']} steps x {p['inner_updates']} update(s), temperature 1, "
    "exact_match reward; lambda = 0: policy pmax (tau off); lambda > 0: reward - "
    f"{p['step_cost']:g} x decoding steps, policy {p['cost_policy'][0]} "
    f"{p['cost_policy'][1]}, advantages (r - mean) / (std + {p['cost_adv_eps']:g}) (so lambda "
    "stays a price in groups of equal correctness). Control: continued SFT from the same parameters, the same "
    f"optimiser chain and number of updates, {p['prompts_per_step'] * p['group_size']} "
    "ground-truth train rows per update. Learning rates chosen on seed "
    f"{lr.get('seed', '-')}'s validation split (greedy, tau off): RL {{{grid('rl')}}} -> "
    f"{(lr.get('rl') or {}).get('chosen', '-')}; control {{{grid('control')}}} -> "
    f"{(lr.get('control') or {}).get('chosen', '-')}; RL lambda > 0 uses RL's.",
    "",
    f"Evaluation: greedy decoding, W = 4, {p['num_val']} validation problems over the grid "
    f"{p['eval_grid']} (choice: most kept tokens per forward call within 1 point of tau off), "
    f"{p['num_test']} test problems per seed (the same for every arm and seed; disjoint from the "
    "train split of the RL prompts and control rows, checked) at tau off and at the choice. "
    f"CIs: paired hierarchical bootstrap ({p['bootstrap']} resamples: seeds, then the problems they share).",
    "",
    "Per arm (mean ± std over seeds; wall-clock of the training call on the shared machine, "
    "seeds run as parallel processes, so it is not a clean compute measure):",
    "",
    arm_table(record["records"], seeds),
    "",
    "Paired comparisons (a - b; x = a's kept tokens per call / b's):",
    "",
    comparison_table(record["comparisons"]),
    "",
    "Against the issue's targets:",
    "",
    target_table(record["targets"]),
    "",
    "Per seed (test accuracy % at tau off / at the choice; kept tokens per call):",
    "",
    seed_table(record["records"], seeds),
    "",
    f"![RL training curves]({NAME}.png)",
    "",
  ]
  text = scrub("\n".join(md), names)
  with open(os.path.join(out_dir, f"{NAME}.md"), "w") as f:
    f.write(text)
  return text


def main(argv=None, log=print) -> Dict[str, Any]:
  args = parse_args(argv)
  check_record(args)
  p = plan(args)
  inputs.check_output_dir(args.output_dir)
  out_dir = os.path.abspath(args.output_dir)
  os.makedirs(out_dir, exist_ok=True)
  names = {out_dir: "OUT"}
  for s, d in zip(p["seeds"], p["sft_workdirs"]):
    if d != "-":
      names[os.path.abspath(d)] = f"SFT{s}"
      names[d] = f"SFT{s}"
  command = scrub(
    "python -m benchmarks.rl_result " + " ".join(argv if argv is not None else sys.argv[1:]),
    {**names, args.output_dir: "OUT"},
  )
  load_start, t_start = sa.uptime(), time.perf_counter()
  records: List[Dict[str, Any]] = []
  curves: Dict[str, List[Dict[str, Any]]] = {}
  plat: Dict[int, Any] = {}
  lrs, done, recipe = None, [], ""
  # the learning-rate seed first (its validation split chooses for all)
  order = sorted(p["seeds"], key=lambda s: s != p["lr_seed"])
  with jax_settings({"jax_disable_most_optimizations": True} if p["quick"] else {}):
    for seed in order:
      sft_dir = sft_workdir(seed, p, out_dir, log)
      names.setdefault(sft_dir, f"SFT{seed}")
      sft_cfg = checkpointing.load_config(sft_dir)
      recipe = (
        f"{sft_cfg.model.num_layers} x {sft_cfg.model.hidden_size} DiT, L={sft_cfg.seq_len}, "
        f"batch {sft_cfg.batch_size}, {sft_cfg.num_train_steps} steps, lr "
        f"{sft_cfg.learning_rate:g} {sft_cfg.lr_schedule}, chain {sft_cfg.data.task_operands} x "
        f"1..{sft_cfg.data.task_max_operand}"
      )
      lines = _metrics(sft_dir)  # the evidence at the SFT run's own eval steps and last step
      own_steps = {int(x["step"]) for x in lines if "eval/nll" in x} | {
        int(sft_cfg.num_train_steps)
      }
      plat[seed] = plateau(lines, steps=sorted({*PLATEAU_STEPS, *own_steps}))
      records.append(run_arm("sft", None, seed, sft_dir, p, out_dir, True, log))
      if lrs is None:  # another run's choice is read after this seed's SFT evaluation
        own = seed == p["lr_seed"]
        lrs = choose_lrs(seed, sft_dir, p, out_dir, log) if own else read_lrs(p, out_dir, log)
      for arm in ("control", "rl", "rl_cost"):
        rec = run_arm(arm, lrs[arm]["chosen"], seed, sft_dir, p, out_dir, True, log)
        records.append(rec)
        curves[f"{arm} s{seed}"] = _metrics(os.path.join(out_dir, rec["workdir"]))
      done.append(seed)
      done = [s for s in p["seeds"] if s in done]  # the order of --seeds
      comps = [
        compare(records, a, b, which, done, p["bootstrap"])
        for which in ("off", "chosen")
        for a, b in COMPARISONS
      ]
      record = {
        "command": command,
        "commit": sa.commit_label(),
        "plan": {
          **{k: v for k, v in p.items() if k != "sft_workdirs"},
          "sft_steps": sft_steps(records),
        },
        "sft_workdirs": [f"SFT{s}" for s in p["seeds"]] if p["sft_workdirs"] else None,
        "sft_recipe": recipe,
        "seeds_done": done,
        "hardware": hardware(),
        "load_start": load_start,
        "load_end": sa.uptime(),
        "total_seconds": time.perf_counter() - t_start,
        "lr_choice": lrs,
        "plateau": {str(k): v for k, v in plat.items()},
        "records": records,
        "comparisons": comps,
        "targets": targets(comps),
      }
      plot(curves, os.path.join(out_dir, f"{NAME}.png"))
      text = write_report(out_dir, record, names)
      record["markdown"] = text
      tmp = os.path.join(out_dir, f"{NAME}.json.{os.getpid()}.tmp")
      with open(tmp, "w") as f:
        f.write(scrub(json.dumps(record, separators=(",", ":"), default=float), names))
      os.replace(tmp, os.path.join(out_dir, f"{NAME}.json"))
  publish(out_dir, NAME, args, MEASURED, compact=True)
  log(text)
  log(f"\nwrote {out_dir}/{NAME}.md, .json, .png ({record['total_seconds'] / 60:.1f} min)")
  return record


if __name__ == "__main__":
  inputs.run(main)
