"""Static vs continuous batching on a GSM8K-like answer-length mix (issue 38).

  python -m benchmarks.continuous_batching --out=OUT        # 1319 rows (GSM8K test), 32 slots, set + AR
  python -m benchmarks.continuous_batching --quick --out=OUT  # 48 rows, 8 slots (the slow-tier test)
  python -m benchmarks.continuous_batching --out=OUT --record=NAME   # + the record (clean main commit)

The same rows are decoded two ways with the same sampler (greedy):
  static      batches of S rows in input order, each run until its slowest row ends (the last
              batch padded with copies of row 0, as `accuracy.decode_all`): the samplers' own
              jitted loops (`set_sampler.set_core`, `ar_sampler.ar_core`);
  continuous  S slots refilled as rows end (`sampling.continuous`, refill K = S / 8 rows per
              prompt-encoding call).

Length mix: a tiny random-parameter model does not end its answers by itself, so each row gets a
token budget (its answer length; the row also stops at an EOS the model happens to write):
budgets from a log-normal with median 64 and sigma 0.6, clipped to [4, 200] (5-95 % about
24-170 tokens, a ~7x spread as GSM8K's answers; --max_answer=A scales the median to 64 A / 200); prompts log-normal, median 24, clipped to
[6, 56] tokens. Per-row budgets are the sampler's own per-row targets (set: prompt ++ M * N_r;
AR: the per-row stop n_r), identical in both modes.

Counters (exact, from the loops' per-row counters): forward calls to finish the set (static: one
prompt call + the batch's longest row's steps per batch; continuous: decode steps + prefill
calls), slot utilisation = live slot-steps / (S x decode steps) (every row's steps summed), kept
tokens per forward call (the generated tokens that come back / forward calls). rows/s: the
median of --repeats interleaved timed runs after one compiling run each; the machine's load
average is printed. The benchmark checks that every row's tokens and commit steps are identical
in both modes (log-probs: the largest difference, fp32 rounding of differently shaped batches).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

if __name__ == "__main__" and not __package__:  # a file run cannot import benchmarks/
  sys.exit("error: run it from the repository root as `python -m benchmarks.continuous_batching`")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import arms, compare_methods, inputs  # noqa: E402
from setdiff_jax.evaluation.results import hardware  # noqa: E402
from setdiff_jax.models.dit import DiT, DiTConfig
from setdiff_jax.models import param_shapes
from setdiff_jax.sampling import ar_sampler, compiles, continuous, loop, set_sampler
from setdiff_jax.sampling.baselines import loop_cfg
from setdiff_jax.sampling.cache import as_forward
from setdiff_jax.sampling.config import SamplerConfig

PAD, BOS, EOS, MASK = 0, 1, 2, 3
TITLE = "## Static vs continuous batching on a GSM8K-like answer-length mix (issue 38)"


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--rows", type=int, default=1319, help="default: the GSM8K test set's size")
  p.add_argument("--slots", type=int, default=32)
  p.add_argument("--refill", type=int, default=None, help="rows per refill call (default S/8)")
  p.add_argument("--samplers", default="set,ar")
  p.add_argument("--window", type=int, default=4)
  p.add_argument("--max_answer", type=int, default=200)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--vocab_size", type=int, default=1024)
  p.add_argument("--hidden_size", type=int, default=64)
  p.add_argument("--num_layers", type=int, default=2)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument(
    "--quick",
    action="store_true",
    help="48 rows, 8 slots, answers <= 48, 1 repeat (flags given explicitly still win)",
  )
  p.add_argument(
    "--rollout_stats",
    action="store_true",
    help="decode with per-token log-probs (RL's mode) and compare them too; default: the plain "
    "decoding path that evaluation runs",
  )
  p.add_argument("--out", default=None, help="write the report (JSON) and table (.md) here")
  p.add_argument(
    "--record",
    default=None,
    help="publish the report as the record RESULTS_DIR/RECORD.json: only from a clean commit on "
    "main's history, never over another record (needs --out)",
  )
  p.add_argument(
    "--record_resume", action="store_true", help="--record: replace a re-report of the same commit"
  )
  p.add_argument("--results_dir", default=None, help="where --record writes (benchmarks/results)")
  if p.parse_known_args(argv)[0].quick:  # its sizes are defaults: an explicit flag wins
    p.set_defaults(rows=48, slots=8, max_answer=48, repeats=1)
  args = p.parse_args(argv)
  for name in ("rows", "slots", "window", "max_answer", "repeats", "refill", "num_layers"):
    value = getattr(args, name)
    if value is not None and value < 1:
      p.error(f"--{name}={value} must be >= 1")
  if args.vocab_size <= MASK + 1:  # was `low >= high` from numpy after the model was built
    p.error(f"--vocab_size={args.vocab_size} must exceed {MASK + 1} (prompts draw [{MASK + 1}, V))")
  for kind in args.samplers.split(","):  # static_generate runs 'set', else the causal loop
    try:
      loop_kind = arms.sampler_decoder(kind).continuous_kind
    except ValueError:
      loop_kind = None
    if loop_kind != ("set" if kind == "set" else "causal"):
      p.error(
        f"--samplers={args.samplers}: {kind!r} is neither the set sampler 'set' nor a method "
        "decoded by the causal loop (e.g. --samplers=set,ar)"
      )
  if args.record and not args.out:
    p.error("--record needs --out (the report it publishes is written there first)")
  return args


def length_mix(n: int, max_answer: int, vocab: int, seed: int):
  """(prompts, budgets): the synthetic GSM8K-like mix of the module doc."""
  rng = np.random.default_rng(seed)
  median = 64 * max_answer / 200  # --quick scales the mix down
  budgets = np.clip(np.round(rng.lognormal(np.log(median), 0.6, n)), 4, max_answer).astype(int)
  plens = np.clip(np.round(rng.lognormal(np.log(24), 0.5, n)), 6, 56).astype(int)
  prompts = [[BOS] + rng.integers(4, vocab, p - 1).tolist() for p in plens]
  return prompts, budgets.tolist()


def tiny_model(args):
  cfg = DiTConfig(
    vocab_size=args.vocab_size,
    hidden_size=args.hidden_size,
    num_layers=args.num_layers,
    num_heads=2,
    dropout=0.0,
  )
  rng = np.random.default_rng(args.seed)

  def leaf(path, shape):
    name = jax.tree_util.keystr(path)
    if "scale" in name:
      return 1.0 + 0.1 * rng.standard_normal(shape.shape)
    if "head" in name:
      return 0.5 * rng.standard_normal(shape.shape)
    return rng.standard_normal(shape.shape) / np.sqrt(shape.shape[0])

  params = jax.tree_util.tree_map_with_path(leaf, param_shapes(cfg))
  return DiT(cfg), jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), params)


# ----------------------------------------------------------------------------- static batches
def static_generate(kind, model, params, prompts, budgets, cfg, slots, width):
  """Static batches of `slots` rows with per-row budgets through the samplers' own loops.
  Returns (per-row SampleOutputs, counters)."""
  fwd = as_forward(model, params)
  static = loop_cfg(cfg)
  key = jax.random.PRNGKey(0)
  outs, decode_steps, batches, live = [], 0, 0, 0
  for i in range(0, len(prompts), slots):
    k = min(slots, len(prompts) - i)
    rows = list(prompts[i : i + k]) + [prompts[0]] * (slots - k)
    budget = list(budgets[i : i + k]) + [budgets[0]] * (slots - k)
    if kind == "set":
      inp = continuous.set_rows(rows, cfg, budget, width=width)
      history = "generated" if cfg.penalty_history == "auto" else cfg.penalty_history
      out = set_sampler.run_inputs(
        set_sampler.set_core, model, params, inp, cfg, key, cfg.stops_at_eos, history
      )
      steps = out.num_steps
    else:
      (prompt, plen, canvas, n), target = continuous.ar_rows(rows, cfg, budget, width=width)
      res = ar_sampler.ar_core(
        fwd.apply, fwd.params, prompt, plen, canvas, n, key, cfg=static, stop_eos=cfg.stops_at_eos
      )
      out = loop.ar_output(jax.device_get(res), target, cfg)
      steps = out.num_steps - 1  # the first token comes from the prompt call
    decode_steps += int(np.max(steps))  # the loop runs until the batch's slowest row ends
    live += int(np.sum(steps[:k]))  # padding rows are idle work
    batches += 1
    outs += [(out, b) for b in range(k)]
  counters = dict(
    decode_steps=decode_steps,
    prefill_calls=batches,
    live_slot_steps=live,
    forward_calls=decode_steps + batches,
    utilisation=live / (slots * decode_steps),
  )
  return outs, counters


def _row(out, b):
  """(generated tokens, commit steps of the target positions, log-probs there or None) of row b."""
  t = out.target[b]
  lp = None if out.token_logprob is None else out.token_logprob[b][t]
  return out.generated[b], out.commit_step[b][t], lp


def compare(static_rows, cont):
  """Identical tokens and commit steps per row (raises otherwise); the largest log-prob gap (None
  without --rollout_stats: the plain decoding path, as evaluation runs it)."""
  gap = None
  for r, (out, b) in enumerate(static_rows):
    g, s, lp = _row(out, b)
    g2, s2, lp2 = _row(cont, r)
    n = min(len(s), len(s2))
    if g != g2 or not np.array_equal(s[:n], s2[:n]):
      raise AssertionError(f"row {r}: static and continuous outputs differ")
    if lp is not None:
      gap = max(gap or 0.0, float(np.max(np.abs(lp[:n] - lp2[:n]), initial=0.0)))
  return gap


# ----------------------------------------------------------------------------- the benchmark
def run(args):
  model, params = tiny_model(args)
  prompts, budgets = length_mix(args.rows, args.max_answer, args.vocab_size, args.seed)
  cfg = SamplerConfig(
    mask_token_id=MASK,
    eos_token_id=EOS,
    pad_token_id=PAD,
    bos_token_id=BOS,
    window=args.window,
    max_new_tokens=max(budgets),
    stop_at_eos=True,
    greedy=True,
    max_length=64 + args.max_answer,
    length_buckets="pow2",
    rollout_stats=args.rollout_stats,
  )
  table = []
  for kind in args.samplers.split(","):
    # One canvas width for every static batch: the continuous run's (one program per mode).
    if kind == "set":
      width = continuous.set_rows(prompts, cfg, budgets).canvas.shape[1]
    else:
      width = continuous.ar_rows(prompts, cfg, budgets)[0][2].shape[1]
    key = jax.random.PRNGKey(0)
    before = compiles.compiled_programs()
    static_rows, s_count = static_generate(
      kind, model, params, prompts, budgets, cfg, args.slots, width
    )
    static_programs = compiles.compiled_programs() - before
    before = compiles.compiled_programs()
    flow = lambda: continuous.continuous_generate(
      arms.sampler_decoder(kind).continuous_kind,
      model,
      params,
      prompts,
      cfg,
      key,
      slots=args.slots,
      refill=args.refill,
      budgets=budgets,
    )
    out = flow()
    cont_programs = compiles.compiled_programs() - before
    gap = compare(static_rows, out.result)
    kept = sum(len(g) for g in out.result.generated)
    times = {"static": [], "continuous": []}
    load = [os.getloadavg()[0]]
    for _ in range(args.repeats):  # interleaved, warm
      t0 = time.perf_counter()
      static_generate(kind, model, params, prompts, budgets, cfg, args.slots, width)
      times["static"].append(time.perf_counter() - t0)
      t0 = time.perf_counter()
      flow()
      times["continuous"].append(time.perf_counter() - t0)
    load.append(os.getloadavg()[0])
    c_count = out.counters
    for mode, count, programs in (
      ("static", s_count, static_programs),
      ("continuous", c_count, cont_programs),
    ):
      sec = float(np.median(times[mode]))
      table.append(
        dict(
          sampler=kind,
          mode=mode,
          slots=args.slots,
          rows=args.rows,
          utilisation=count["utilisation"],
          decode_steps=count["decode_steps"],
          prefill_calls=count["prefill_calls"],
          forward_calls=count["forward_calls"],
          kept_tokens_per_call=kept / count["forward_calls"],
          rows_per_s=args.rows / sec,
          median_s=sec,
          compiled_programs=programs,
          load_avg=load,
          max_logprob_gap=gap,
          identical_rows=True,
        )
      )
  return table, prompts, budgets


def markdown(table, args) -> str:
  lines = [
    f"rows {args.rows}, slots {args.slots}, refill {args.refill or max(1, args.slots // 8)}, "
    f"window {args.window} (tau off), greedy; DiT d={args.hidden_size} L={args.num_layers} "
    f"V={args.vocab_size}, random params; {jax.device_count()} {jax.default_backend()} device(s)",
    "",
    "| sampler | mode | slot utilisation | forward calls (steps + prompt calls) | kept tokens / call "
    "| rows/s (median) | compiled programs | identical rows |",
    "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
  ]
  for r in table:
    lines.append(
      f"| {r['sampler']} | {r['mode']} | {r['utilisation']:.1%} | {r['forward_calls']} "
      f"({r['decode_steps']} + {r['prefill_calls']}) | {r['kept_tokens_per_call']:.2f} "
      f"| {r['rows_per_s']:.1f} | {r['compiled_programs']} | yes |"
    )
  for kind in dict.fromkeys(r["sampler"] for r in table):
    s, c = [r for r in table if r["sampler"] == kind]
    lines.append(
      f"\n{kind}: {s['forward_calls'] / c['forward_calls']:.2f}x fewer forward calls, "
      f"{c['rows_per_s'] / s['rows_per_s']:.2f}x rows/s; largest log-prob gap "
      f"{'n/a (no --rollout_stats)' if c['max_logprob_gap'] is None else format(c['max_logprob_gap'], '.1e')}; load average {c['load_avg'][0]:.1f} -> {c['load_avg'][1]:.1f}"
    )
  return "\n".join(lines)


def main(argv=None):
  args = parse_args(argv)
  compare_methods.check_record(args)
  inputs.check_output_dir(args.out, "--out")  # before the measurement: the report is written last
  table, _, budgets = run(args)
  text = markdown(table, args)
  print(text)
  print(
    f"\nanswer budgets: median {np.median(budgets):.0f}, min {min(budgets)}, max {max(budgets)}"
  )
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    command = "python -m benchmarks.continuous_batching " + " ".join(argv or sys.argv[1:])
    record = dict(
      args=vars(args),
      command=command,
      hardware=hardware(),
      table=table,
      budgets=budgets,
      markdown=TITLE + "\n\n" + text + "\n",
    )
    for name, body in (
      ("continuous_batching.json", json.dumps(record, indent=1)),
      ("continuous_batching.md", text + "\n"),
    ):
      tmp = os.path.join(args.out, f".{name}.{os.getpid()}")
      with open(tmp, "w") as f:
        f.write(body)
      os.replace(tmp, os.path.join(args.out, name))
    measured = ["setdiff_jax/sampling", "setdiff_jax/models", "benchmarks/continuous_batching.py"]
    compare_methods.publish(args.out, "continuous_batching", args, measured, images={})
  elif args.record:
    raise SystemExit("error: --record needs --out=DIR (the report is published from there)")
  return table


if __name__ == "__main__":
  sys.exit(0 if inputs.run(main) else 1)
