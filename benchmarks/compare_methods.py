r"""Side-by-side comparison of AR, MDLM, BD3LM (S=4) and SetDLM (S = 2, 4, 8) on the embedded corpus.

  python -m benchmarks.compare_methods                      # the full run (~30-60 min, 2 CPU cores)
  python -m benchmarks.compare_methods --quick              # a tiny end-to-end check (~1-2 min)
  python -m benchmarks.compare_methods --output_dir=DIR --methods=ar,setdlm4 --steps=200

Every method is trained with the same recipe (configs/compare.py: 2 x 128 backbone, L = 128, the
embedded Jane Austen corpus, batch 16, 700 steps, seed 0; one tokenizer trained once and shared),
then evaluated with `setdiff_jax.evaluation`:
  - validation likelihood: the one-order bound (SPEC §6.1; AR exact, MDLM/BD3LM 1/t NELBO) and the
    K-order estimate (--num_orders; log-mean-exp over orders for SetDLM, K-draw mean otherwise);
  - decoding speed: unconditional, N = L - 1, plain sampling (--top_p), no EOS stop, W = S
    (SetDLM), tau off, 0.9, 0.7, 0.5 (the table shows off and 0.9), batch 1 and 8: tokens/s,
    tokens/step, forward calls;
  - sample quality at each speed setting: generative perplexity of the batch-8 samples under the
    AR model trained here (the judge; AR's own row is therefore self-scored), entropy, distinct-n;
  - infilling: Story Cloze 1- and 3-sentence and held-out corpus paragraphs, oracle length,
    greedy, repetition penalty 1.2 over the visible tokens (the paper's setting), tau off, 0.9 and
    0.7: ROUGE-1/2/L, tokens/s, tokens/step.
Writes to --output_dir: results.json (everything), results.md (tables, command, hardware, timings),
speed_quality.png (tokens/s vs generative PPL, and infill tokens/s vs ROUGE-L), runs/<method>/ (the
training workdirs; re-running resumes / skips finished training) and tokenizer/. A run's
train_fingerprint.json holds the training config it was trained with: a re-run with other settings
(seed, learning rate, batch, sizes, steps, ...) is refused with one `error:` line naming them, and
so is a folder trained before the fingerprint existed; give such a run a new --output_dir.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from typing import Any, Dict, List


if __name__ == "__main__" and not __package__:  # a file run cannot import configs/, benchmarks/
  sys.exit(
    "error: run it from the repository root as `python -m benchmarks.compare_methods [flags]`"
  )

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import arms, inputs  # noqa: E402
from configs import compare  # noqa: E402
from setdiff_jax import cli_storage, train  # noqa: E402
from setdiff_jax.config import run as run_config  # noqa: E402
from setdiff_jax.workdir import load as workdir_lib  # noqa: E402
from setdiff_jax.workdir import lock  # noqa: E402
from setdiff_jax.data import sources, tokenizers  # noqa: E402
from setdiff_jax.evaluation import generation, run  # noqa: E402
from setdiff_jax.evaluation.results import hardware  # noqa: E402
from setdiff_jax.evaluation.tables import markdown_table  # noqa: E402
from setdiff_jax.sampling.config import tau_label  # noqa: E402
from setdiff_jax.experiments import record as record_lib  # noqa: E402

DEFAULT_CLOZE = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
  "..",
  "shared",
  "data",
  "rocstories-cloze-val-2016.csv",
)
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
# The code the numbers depend on (git pathspecs): a record is marked stale once a later commit
# touches one (python -m setdiff_jax.experiments.publish).
MEASURED = (
  "setdiff_jax",
  ":(exclude)setdiff_jax/experiments",
  ":(exclude)setdiff_jax/interop",
  ":(exclude)setdiff_jax/rl",
  "configs/compare.py",
  "benchmarks/compare_methods.py",
)
SPEED_THRESHOLDS = (None, 0.9, 0.7, 0.5)  # the table reports off and 0.9; the plot the sweep
INFILL_THRESHOLDS = (None, 0.9, 0.7)
INFILL_REPETITION_PENALTY = 1.2  # the paper's ROCStories runs (SPEC §4.6), history = visible


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--output_dir", default="/tmp/setdiff_compare")
  p.add_argument(
    "--quick",
    action="store_true",
    help="tiny models, a few steps and examples: checks the pipeline, not the methods",
  )
  p.add_argument(
    "--methods",
    default=",".join(compare.METHODS),
    help="comma-separated: ar, mdlm, bd3lm<S>, setdlm<S> (ar first: it is the judge)",
  )
  p.add_argument("--steps", type=int, default=None, help="training steps (default 700; quick 3)")
  p.add_argument("--batch_size", type=int, default=None, help="training batch (default 16)")
  p.add_argument("--seed", type=int, default=0, help="init / data / sampling seed of every run")
  p.add_argument("--num_orders", type=int, default=None, help="K of the K-order estimate (4)")
  p.add_argument(
    "--max_rows",
    type=int,
    default=None,
    help="validation rows for the likelihood (default: all; quick 16)",
  )
  p.add_argument("--num_infill", type=int, default=None, help="examples per infill set (48)")
  p.add_argument(
    "--num_samples",
    type=int,
    default=None,
    help="samples per setting for generative PPL (16; drawn at batch 8)",
  )
  p.add_argument("--repeats", type=int, default=None, help="timed batch-1 calls per setting (3)")
  p.add_argument(
    "--top_p",
    type=float,
    default=1.0,
    help="nucleus mass for the speed / sample runs (1 = plain sampling; a nucleus "
    "sorts the vocabulary at every masked position, which on CPU dominates "
    "MDLM's steps)",
  )
  p.add_argument("--cloze_path", default=DEFAULT_CLOZE)
  p.add_argument(
    "--lrs",
    default=None,
    help="learning rates per method, METHOD:LR,... (e.g. ar:1e-3,bd3lm4:5e-4; others keep "
    "configs/compare.py's)",
  )
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
  args = p.parse_args(argv)
  # 0 rows gave val NLL 0 / PPL 1, 0 orders a "K=0" column over 1 draw, 0 samples a nan PPL
  counts = ("steps", "batch_size", "num_orders", "max_rows", "num_infill", "num_samples")
  inputs.check_at_least(args, 1, *counts, "repeats")
  if not 0.0 < args.top_p <= 1.0:
    raise ValueError(f"--top_p={args.top_p} must be in (0, 1] (1 = plain sampling)")
  return args


def parse_lrs(text) -> Dict[str, float]:
  """'ar:1e-3,bd3lm4:5e-4' -> {'ar': 0.001, 'bd3lm4': 0.0005}."""
  out = {}
  for item in (text or "").split(","):
    if not item.strip():
      continue
    name, sep, value = item.partition(":")
    try:
      out[name.strip()] = float(value)
    except ValueError:
      sep = ""
    if not sep:
      raise ValueError(f"--lrs: {item!r} is not METHOD:LR (e.g. ar:1e-3,setdlm4:2e-3)")
  return out


@contextlib.contextmanager
def jax_settings(settings: Dict[str, Any]):
  """Temporarily changes jax config values (restored afterwards)."""
  from jax.experimental.compilation_cache import compilation_cache

  previous = {k: jax.config.values[k] for k in settings}
  for k, v in settings.items():
    jax.config.update(k, v)
  compilation_cache.reset_cache()
  try:
    yield
  finally:
    for k, v in previous.items():
      jax.config.update(k, v)
    compilation_cache.reset_cache()


def plan(args) -> Dict[str, Any]:
  """Sizes of this run (full or quick), after the command-line overrides."""
  p = dict(
    steps=700,
    batch_size=16,
    num_orders=4,
    max_rows=None,
    num_infill=48,
    num_samples=16,
    repeats=3,
    speed_batch_sizes=(1, 8),
    infill_batch_size=8,
    max_new_tokens=None,
    infill_sets=("1sent", "3sent", "corpus"),
    infill_thresholds=INFILL_THRESHOLDS,
    speed_thresholds=SPEED_THRESHOLDS,
  )
  if args.quick:  # one compile per decoder and setting: compilation dominates at this size
    p.update(
      steps=3,
      batch_size=8,
      num_orders=2,
      max_rows=16,
      num_infill=3,
      num_samples=2,
      repeats=1,
      speed_batch_sizes=(2,),
      infill_batch_size=3,
      infill_sets=("1sent",),
      max_new_tokens=16,
      speed_thresholds=(None, 0.9),
      infill_thresholds=(None,),
    )
  for k in (
    "steps",
    "batch_size",
    "num_orders",
    "max_rows",
    "num_infill",
    "num_samples",
    "repeats",
  ):
    if getattr(args, k) is not None:
      p[k] = getattr(args, k)
  return p


def method_config(method: str, args, p: Dict[str, Any]):
  c = compare.get_config(method)
  c.seed = args.seed
  c.batch_size = p["batch_size"]
  c.eval_batch_size = p["batch_size"]
  c.num_train_steps = p["steps"]
  c.eval_every_steps = p["steps"]
  c.checkpoint_every_steps = p["steps"]
  c.warmup_steps = min(c.warmup_steps, max(p["steps"] // 4, 1))
  c.num_eval_steps = 1  # one batch in the train loop: evaluate_method evaluates afterwards
  lr = parse_lrs(getattr(args, "lrs", None)).get(method)
  if lr:
    c.learning_rate = lr
  if args.quick:
    c.model.hidden_size = 32
    c.model.num_layers = 1
    c.model.num_heads = 2
    c.model.cond_dim = 16
    c.data.train_split = "validation"  # tokenized in 0.2 s; the 2k BPE is trained on it too
    c.log_every_steps = 1
  return c


def shared_tokenizer(out_dir: str, config) -> str:
  """Trains the run's tokenizer once (on the config's training split) and saves it."""
  tok_dir = os.path.join(out_dir, "tokenizer")
  if not os.path.isfile(os.path.join(tok_dir, "special_tokens.json")):
    texts = sources.tokenizer_training_texts(config.data, max_docs=200_000)
    tokenizers.build_tokenizer(config.tokenizer, texts).save(tok_dir)
  return tok_dir


FINGERPRINT = "train_fingerprint.json"  # beside a run's checkpoints: the settings it trains


def fingerprint(config) -> Dict[str, Any]:
  """What determines a trained model: every field of its training config (method, model sizes,
  seed, learning rate, batch, steps, data, ...), flattened, but the paths
  (`cli_storage.PATH_FIELDS`); the same for every run of the same command."""
  flat = {}

  def walk(tree, prefix):
    for k, v in tree.items():
      if isinstance(v, dict):
        walk(v, f"{prefix}{k}.")
      elif f"{prefix}{k}" not in cli_storage.PATH_FIELDS:
        flat[f"{prefix}{k}"] = v

  walk(json.loads(config.to_json_best_effort(sort_keys=True)), "")
  return dict(sorted(flat.items()))


def write_fingerprint(workdir: str, config) -> None:
  """Records `config`'s fingerprint in `workdir` before training (a resume checks it); atomic: a
  killed write leaves no half file that would refuse every rerun."""
  path = os.path.join(workdir, FINGERPRINT)
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w") as f:
    json.dump(fingerprint(config), f, indent=1)
  os.replace(tmp, path)


def check_reuse(workdir: str, config) -> None:
  """A folder that holds a model (finished or interrupted) is reused only for the settings it
  was trained with (its FINGERPRINT); one trained with other settings, or before the settings
  were recorded, is refused: evaluating it would label the old model with the new settings."""
  finished = os.path.isfile(os.path.join(workdir, "train_info.json"))
  if not finished and not (os.path.isdir(workdir) and lock.saved_steps(workdir)):
    return  # nothing trained there yet
  path = os.path.join(workdir, FINGERPRINT)
  fix = "give a new --output_dir to train these settings"
  if not os.path.isfile(path):
    raise ValueError(
      f"{workdir} holds a model trained before its settings were recorded (no {FINGERPRINT}), "
      f"so they may differ from these: {fix}"
    )
  with open(path) as f:
    old = json.load(f)
  new = fingerprint(config)
  if old != new:
    changed = inputs.differences(old, new)
    raise ValueError(
      f"{workdir} holds a model trained with other settings ({changed}): {fix}, or rerun with "
      "the earlier settings to reuse it"
    )


def train_method(method: str, config, out_dir: str, tok_dir: str, log) -> Dict[str, Any]:
  """Trains (or finds finished, trained with these settings) one run; returns {workdir,
  train_seconds, final train metrics}."""
  workdir = os.path.join(out_dir, "runs", method)
  check_reuse(workdir, config)
  os.makedirs(workdir, exist_ok=True)
  dst = os.path.join(workdir, tokenizers.TOKENIZER_SUBDIR)
  if not os.path.isdir(dst):
    shutil.copytree(tok_dir, dst)
  info_path = os.path.join(workdir, "train_info.json")
  if os.path.isfile(info_path):
    with open(info_path) as f:
      info = json.load(f)
    if info.get("steps") == config.num_train_steps:
      log(f"[{method}] already trained ({info['train_seconds']:.0f}s), skipping")
      return info
  write_fingerprint(workdir, config)
  t0 = time.perf_counter()
  metrics = train.train_and_evaluate(config, workdir)
  info = {
    "workdir": workdir,
    "steps": int(config.num_train_steps),
    "train_seconds": time.perf_counter() - t0,
    "final": {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))},
  }
  with open(info_path, "w") as f:
    json.dump(info, f, indent=2)
  log(
    f"[{method}] trained in {info['train_seconds']:.0f}s: "
    f"{ {k: round(v, 3) for k, v in info['final'].items()} }"
  )
  return info


def evaluate_method(method: str, workdir: str, judge, args, p: Dict[str, Any], log):
  """Likelihood, speed (+ sample quality) and infill of one trained run."""
  state = workdir_lib.load_inference_state(workdir, use_ema=False)
  oc = state.objective_config
  lik_model, gen_model = run.inference_models(state)
  res: Dict[str, Any] = {
    "method": method,
    "objective": oc.name,
    "num_params": int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(state.params))),
  }
  opts = run.EvalOptions(
    num_orders=p["num_orders"],
    max_rows=p["max_rows"],
    cloze_path=args.cloze_path,
    num_infill=p["num_infill"],
    infill_batch_size=p["infill_batch_size"],
    infill_settings=p["infill_sets"],
    infill_thresholds=p["infill_thresholds"],
    repetition_penalty=INFILL_REPETITION_PENALTY,
    penalty_history="visible",
    sampling_seed=args.seed,
  )
  t0 = time.perf_counter()
  res["likelihood"] = run.run_likelihood(state, opts, lik_model)
  log(
    f"[{method}] likelihood: nll {res['likelihood']['nll']:.4f} "
    f"(K={res['likelihood']['num_draws']}: {res['likelihood']['K_nll']:.4f}) "
    f"in {time.perf_counter() - t0:.0f}s"
  )

  t0 = time.perf_counter()
  speed = []
  seq_len = int(state.config.seq_len)
  sizes = p["speed_batch_sizes"]
  for setting in generation.decoding_settings(oc, thresholds=p["speed_thresholds"]):
    for bs in sizes:  # the largest batch also draws the samples that are scored
      big = bs == max(sizes)
      repeats = max(p["repeats"], -(-p["num_samples"] // bs)) if big else p["repeats"]
      row = generation.measure(
        gen_model,
        state.params,
        state.tokenizer,
        oc,
        seq_len,
        setting,
        batch_size=bs,
        repeats=repeats,
        seed=args.seed,
        top_p=args.top_p,
        max_new_tokens=p["max_new_tokens"],
      )
      samples = row.pop("samples")[: p["num_samples"]]
      if big:
        row["quality"] = generation.sample_stats(samples, state.tokenizer, judge=judge, num_shown=2)
      speed.append(row)
  res["speed"] = speed
  log(f"[{method}] speed + samples in {time.perf_counter() - t0:.0f}s")

  t0 = time.perf_counter()
  res["infill"] = run.run_infill(state, opts, gen_model)
  log(f"[{method}] infill in {time.perf_counter() - t0:.0f}s")
  return res


# ----------------------------------------------------------------------------- report
def _get(rows, **match):
  for r in rows:
    if all(r.get(k) == v for k, v in match.items()):
      return r
  return None


def main_table(results: List[Dict[str, Any]], p) -> str:
  b1, b8 = min(p["speed_batch_sizes"]), max(p["speed_batch_sizes"])
  header = [
    "method",
    "params",
    "train min",
    "val NLL",
    "val PPL (1 order)",
    f"PPL (K={p['num_orders']})",
    f"tok/s b={b1} tau off",
    f"tok/s b={b1} tau 0.9",
    "tok/step tau 0.9",
    "gen PPL tau off",
    "gen PPL tau 0.9",
    "R-L cloze-1",
    "R-L cloze-3",
    "R-L corpus",
  ]
  rows = []
  for r in results:
    sp, inf = r["speed"], r["infill"]
    off1 = _get(sp, batch_size=b1, threshold="off")
    hi1 = _get(sp, batch_size=b1, threshold="0.9") or off1
    off8 = _get(sp, batch_size=b8, threshold="off")
    hi8 = _get(sp, batch_size=b8, threshold="0.9") or off8
    rl = lambda d: (_get(inf, dataset=d, threshold="off") or {}).get("rougeL")
    lik = r["likelihood"]
    rows.append(
      [
        r["method"],
        f"{r['num_params'] / 1e6:.2f}M",
        r["train_seconds"] / 60,
        lik["nll"],
        lik["ppl"],
        lik["K_ppl"],
        off1["tokens_per_second"],
        hi1["tokens_per_second"],
        hi1["tokens_per_step"],
        off8["quality"].get("gen_ppl"),
        hi8["quality"].get("gen_ppl"),
        rl("1sent"),
        rl("3sent"),
        rl("corpus"),
      ]
    )
  return markdown_table(header, rows)


def detail_tables(results: List[Dict[str, Any]]) -> str:
  speed_rows, infill_rows = [], []
  for r in results:
    for s in r["speed"]:
      q = s.get("quality", {})
      speed_rows.append(
        [
          r["method"],
          s["setting"],
          s["batch_size"],
          s["tokens_per_second"],
          s["tokens_per_step"],
          s["forward_calls"],
          q.get("gen_ppl"),
          q.get("unigram_entropy"),
          q.get("distinct_2"),
          s["compile_seconds"],
        ]
      )
    for i in r["infill"]:
      infill_rows.append(
        [
          r["method"],
          i["dataset"],
          i.get("threshold"),
          i["num_examples"],
          i["skipped"],
          i.get("rouge1"),
          i.get("rouge2"),
          i.get("rougeL"),
          i.get("tokens_per_second"),
          i.get("tokens_per_step"),
        ]
      )
  speed = markdown_table(
    [
      "method",
      "setting",
      "batch",
      "tok/s",
      "tok/step",
      "fwd calls",
      "gen PPL",
      "entropy",
      "distinct-2",
      "compile s",
    ],
    speed_rows,
  )
  infill = markdown_table(
    ["method", "dataset", "tau", "n", "skipped", "R-1", "R-2", "R-L", "tok/s", "tok/step"],
    infill_rows,
  )
  return (
    "### Decoding speed and sample quality (gen PPL under the AR run; only the larger "
    "batch draws samples)\n\n" + speed + "\n\n### Infilling (ROUGE F x 100)\n\n" + infill
  )


def plot(results: List[Dict[str, Any]], p, path: str):
  """Two panels; one colour per method, filled marker tau off, open marker tau = 0.9."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  b1, b8 = min(p["speed_batch_sizes"]), max(p["speed_batch_sizes"])
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
  markers = "osD^vP*X"

  def draw(ax, pts, i, label):
    if not pts:
      return
    color = f"C{i % 10}"
    mk = markers[i % len(markers)]
    ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], color=color, alpha=0.6)
    for x, y, tau in pts:
      ax.plot(
        [x],
        [y],
        marker=mk,
        color=color,
        markersize=8,
        markerfacecolor=color if tau == "off" else "none",
        label=label if tau == "off" else None,
      )
      if tau != "off":
        ax.annotate(tau, (x, y), fontsize=6, color=color, xytext=(4, 2), textcoords="offset points")

  for i, r in enumerate(results):
    pts = []
    for tau in ["off"] + [tau_label(t) for t in p["speed_thresholds"] if t]:
      s1 = _get(r["speed"], batch_size=b1, threshold=tau)
      s8 = _get(r["speed"], batch_size=b8, threshold=tau)
      if s1 and s8 and s8.get("quality", {}).get("gen_ppl") is not None:
        pts.append((s1["tokens_per_second"], s8["quality"]["gen_ppl"], tau))
    draw(axes[0], pts, i, f"{r['method']} (val PPL {r['likelihood']['ppl']:.0f})")
    pts = []
    for tau in ["off"] + [tau_label(t) for t in p["infill_thresholds"] if t]:
      rows = [x for x in r["infill"] if x.get("threshold") == tau and x.get("num_examples")]
      if rows:
        tps = sum(x["tokens"] for x in rows) / max(sum(x["seconds"] for x in rows), 1e-9)
        pts.append((tps, float(np.mean([x["rougeL"] for x in rows])), tau))
    draw(axes[1], pts, i, r["method"])
  axes[0].set_xscale("log")
  axes[0].set_xlabel(f"unconditional decoding tokens/s (batch {b1}, median of calls; log scale)")
  axes[0].set_ylabel("generative PPL under the AR run (lower is better)")
  axes[0].set_title("speed vs sample quality (filled: tau off; open: tau as labelled)")
  axes[1].set_xscale("log")
  axes[1].set_xlabel(f"infilling tokens/s (batch {p['infill_batch_size']}; log scale)")
  axes[1].set_ylabel("ROUGE-L (mean over infill sets)")
  axes[1].set_title("speed vs infill quality (filled: tau off; open: tau as labelled)")
  for ax in axes:
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_report(out_dir: str, record: Dict[str, Any]):
  results, p = record["results"], record["plan"]
  hw = record["hardware"]
  md = [
    f"## Method comparison ({'quick' if record['quick'] else 'full'} run)",
    "",
    f"Command: `{record['command']}`",
    "",
    f"Hardware: {hw['cpu']} ({hw['cpu_count']} cores visible), jax {hw['jax']} on "
    f"{hw['backend']}; total time {record['total_seconds'] / 60:.1f} min (training "
    f"{record['train_seconds'] / 60:.1f} min, evaluation {record['eval_seconds'] / 60:.1f} "
    f"min).",
    "",
    f"Recipe: configs/compare.py ({record['recipe']}); {p['steps']} steps x batch "
    f"{p['batch_size']}, seed {record['seed']}.",
    "",
    main_table(results, p),
    "",
    "val NLL / PPL: one-order bound (AR exact, MDLM/BD3LM 1/t NELBO) on "
    f"{results[0]['likelihood']['num_sequences']} validation rows; PPL (K): log-mean-exp over "
    "K orders (SetDLM), mean of K NELBO draws (MDLM/BD3LM). tok/s: unconditional decoding, "
    f"N = {p['max_new_tokens'] or 'L - 1'}, W = S, top_p {record['top_p']}. gen PPL: samples at the larger batch scored by the AR run. R-L: infill "
    "ROUGE-L (tau off, greedy, oracle length, repetition penalty "
    f"{INFILL_REPETITION_PENALTY} over the visible tokens).",
    "",
    detail_tables(results),
    "",
    "![speed vs quality](speed_quality.png)",
    "",
  ]
  with open(os.path.join(out_dir, "results.md"), "w") as f:
    f.write("\n".join(md))
  return "\n".join(md)


def check_record(args) -> None:
  """--record=NAME: refuses at the start what `publish` would refuse after the run (a dirty tree,
  a commit off main, an existing record), so no run is spent on a record it cannot write."""
  if not getattr(args, "record", None):
    return
  if args.results_dir == "none":
    raise ValueError("--record writes into --results_dir: give a folder (not 'none')")
  record_lib.check_publishable(args.record, args.results_dir or RESULTS_DIR, args.record_resume)


def publish(out_dir: str, name: str, args, measured, images=None, compact: bool = False) -> None:
  """--record=NAME: publishes `<out_dir>/<name>.json` (and its plot) as the record NAME
  (`experiments.record.publish_report`; `measured`: the code the numbers depend on, git
  pathspecs); without --record nothing leaves out_dir. Every benchmark publishes through here."""
  if not getattr(args, "record", None):
    return
  if args.results_dir == "none":
    raise ValueError("--record writes into --results_dir: give a folder (not 'none')")
  with open(os.path.join(out_dir, f"{name}.json")) as f:
    report = json.load(f)
  path = record_lib.publish_report(
    report,
    args.record,
    args.results_dir or RESULTS_DIR,
    measured,
    images={f"{name}.png": os.path.join(out_dir, f"{name}.png")} if images is None else images,
    resume=args.record_resume,
    compact=compact,
  )
  print(f"recorded {path}; now run `python -m setdiff_jax.experiments.publish`")


def main(argv=None, log=print) -> Dict[str, Any]:
  args = parse_args(argv)
  check_record(args)
  p = plan(args)
  inputs.check_output_dir(args.output_dir)
  out_dir = os.path.abspath(args.output_dir)
  methods = [m.strip() for m in args.methods.split(",") if m.strip()]
  for m in methods:
    compare.parse_method(m)
  # The run with the exact likelihood (AR) is the judge: train it first.
  methods = sorted(methods, key=lambda m: not arms.objective(m).exact_likelihood)
  judge_arm = next((m for m in methods if arms.objective(m).exact_likelihood), None)
  settings = {"jax_disable_most_optimizations": True} if args.quick else {}
  t_start = time.perf_counter()
  with jax_settings(settings):
    configs = {m: method_config(m, args, p) for m in methods}
    for m in methods:  # before anything is trained: a bad config, or a run of other settings
      run_config.from_config_dict(configs[m])
      check_reuse(os.path.join(out_dir, "runs", m), configs[m])
    os.makedirs(out_dir, exist_ok=True)
    tok_dir = shared_tokenizer(out_dir, configs[methods[0]])
    t0 = time.perf_counter()
    infos = {m: train_method(m, configs[m], out_dir, tok_dir, log) for m in methods}
    train_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    judge = (
      workdir_lib.load_inference_state(infos[judge_arm]["workdir"], use_ema=False)
      if judge_arm
      else None
    )
    results = []
    for m in methods:
      res = evaluate_method(m, infos[m]["workdir"], judge, args, p, log)
      res["train_seconds"] = infos[m]["train_seconds"]
      results.append(res)
    eval_seconds = time.perf_counter() - t0
  cfg0 = configs[methods[0]]
  record = {
    "command": "python -m benchmarks.compare_methods "
    + " ".join(argv if argv is not None else sys.argv[1:]),
    "lrs": {m: float(configs[m].learning_rate) for m in methods},
    "quick": bool(args.quick),
    "seed": args.seed,
    "methods": methods,
    "top_p": args.top_p,
    "plan": {k: list(v) if isinstance(v, tuple) else v for k, v in p.items()},
    "recipe": (
      f"{cfg0.model.num_layers} x {cfg0.model.hidden_size}, {cfg0.model.num_heads} "
      f"heads, L={cfg0.seq_len}, vocab {cfg0.tokenizer.vocab_size}, lr "
      f"{cfg0.learning_rate} {cfg0.lr_schedule}"
    ),
    "hardware": hardware(),
    "train_seconds": train_seconds,
    "eval_seconds": eval_seconds,
    "total_seconds": time.perf_counter() - t_start,
    "results": results,
  }
  plot(results, p, os.path.join(out_dir, "speed_quality.png"))
  text = record["markdown"] = write_report(out_dir, record)
  with open(os.path.join(out_dir, "results.json"), "w") as f:
    json.dump(record, f, indent=2, default=float)
  images = {"speed_quality.png": os.path.join(out_dir, "speed_quality.png")}
  publish(out_dir, "results", args, MEASURED, images)
  log(text)
  log(
    f"\nwrote {out_dir}/results.md, results.json, speed_quality.png "
    f"({record['total_seconds'] / 60:.1f} min)"
  )
  return record


if __name__ == "__main__":
  inputs.run(main)
