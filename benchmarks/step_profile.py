"""Where a training step's time goes on XLA:CPU, and what its matmuls alone cost.

  python -m benchmarks.step_profile                               # 4 objectives, V = 30,522
  python -m benchmarks.step_profile --objectives=ar,setdlm --vocab_size=4096
  python -m benchmarks.step_profile --decode_rows=1,5,9,40 --objectives=   # decoding floor only

Training: builds and compiles the step exactly as `benchmarks/training.py` does (same flags),
runs it under `jax.profiler.trace`, and sums the duration of every executed XLA thunk by what
its HLO computes (read from the compiled program):

  dense matmul      dots without batch dimensions (the layers, the head)
  batched matmul    dots with batch dimensions (attention scores and values)
  rotary / RNG      fusions with sine or cosine / with the threefry bit mixing
  layout copies     fusions of only transposes, copies, slices, pads, concatenations, broadcasts
  other             the remaining elementwise and reduction fusions, scatters, sorts, ...

Loop and branch thunks (`while`, `conditional`) contain other thunks and are not counted, so the
sum is below the step time by their own overhead. "matmul-only" is the two matmul rows: a step
made of nothing but the matmuls XLA:CPU runs today would take that long, a floor for any change
outside the matmul kernels.

Decoding (`--decode_rows`): the per-step floor of a cached decoding step of M rows, i.e. the
weight matmuls of the layers (qkv, out, MLP in, MLP out) and of a head over M rows, chained
through the layers in a `fori_loop` as the samplers run them, with no attention, sampling or
cache work. The set sampler at window W runs M = W + 1 rows per sequence through the blocks
(the pending slot and W masks) and W through the head; batch B multiplies both.

Prints markdown tables. Use `--peak_gflops` or the printed 2048^3 probe to read GFLOP/s.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time


if __name__ == "__main__" and not __package__:  # a file run cannot import configs/, benchmarks/
  sys.exit("error: run it from the repository root as `python -m benchmarks.step_profile [flags]`")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import inputs  # noqa: E402
from benchmarks import training  # noqa: E402  (the training benchmark's config, step and timing)

CATEGORIES = ("dense matmul", "batched matmul", "rotary", "RNG", "layout copies", "other")
_LAYOUT_OPS = {
  "parameter",
  "bitcast",
  "transpose",
  "copy",
  "slice",
  "dynamic-slice",
  "concatenate",
  "pad",
  "broadcast",
  "reshape",
  "constant",
  "tuple",
  "get-tuple-element",
  "dynamic-update-slice",
}
_CONTAINERS = ("while", "conditional", "cond", "call")


def hlo_ops(compiled_text: str) -> dict:
  """{instruction name: [opcodes it computes, with its fused computation's ops]} of an HLO text,
  and for dots whether they have batch dimensions ('dot' or 'batched-dot')."""
  computations = {
    m.group(1): m.group(2)
    for m in re.finditer(r"\n%([\w.\-]+) [^\n]*\{\n(.*?)\n\}\n", compiled_text, re.S)
  }
  ops = {}
  for name, line in re.findall(r"\n  (?:ROOT )?%([\w.\-]+) = ([^\n]*)", compiled_text):
    called = re.search(r"calls=%([\w.\-]+)", line)
    body = computations.get(called.group(1), "") if called else ""
    found = []
    for text in (line,) + ((body,) if body else ()):
      for op, rest in re.findall(r"= \S+ ([\w\-]+)\((.*)", text):
        if op == "dot":
          op = "batched-dot" if re.search(r"lhs_batch_dims=\{\d", rest) else "dot"
        found.append(op)
    ops[name] = found  # found[0]: the instruction's own opcode (the first match, on its line)
  return ops


def category(ops: list) -> str:
  body = set(ops[1:]) if len(ops) > 1 else set(ops)
  every = set(ops)
  if "batched-dot" in every:
    return "batched matmul"
  if "dot" in every:
    return "dense matmul"
  if "sine" in body or "cosine" in body:
    return "rotary"
  if "xor" in body or "shift-right-logical" in body:
    return "RNG"
  if body and body <= _LAYOUT_OPS:
    return "layout copies"
  return "other"


def thunk_times(run) -> dict:
  """{thunk name: total microseconds in one call of run()} from a jax.profiler trace."""
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d):
      run()
    path = glob.glob(os.path.join(d, "**", "*.trace.json.gz"), recursive=True)[0]
    events = json.load(gzip.open(path))["traceEvents"]
  totals = collections.Counter()
  for e in events:
    name = e.get("name", "")
    if e.get("ph") != "X" or name.startswith("$") or "::" in name or "(" in name:
      continue
    totals[name] += e.get("dur", 0.0)
  return totals


def profile_training(objective: str, args) -> dict:
  config = training.load_config(args)
  prep = training.benchmark(config, objective, args)
  t0 = time.perf_counter()
  training.time_steps(prep, args)
  step_ms = 1e3 * (time.perf_counter() - t0) / args.steps
  ops = hlo_ops(prep["compiled"].as_text())
  times = thunk_times(lambda: training.time_steps(prep, args))
  by_cat = collections.Counter()
  for name, us in times.items():
    base = name.split(":")[0].strip()
    if base.split(".")[0] in _CONTAINERS or base not in ops:
      continue
    by_cat[category(ops[base])] += us / 1e3 / args.steps
  return {"objective": objective, "step_ms": step_ms, "flops": prep["flops"], **by_cat}


def decode_floor_ms(
  rows: int,
  hidden: int,
  layers: int,
  vocab: int,
  head_rows: int,
  iters: int = 100,
  repeats: int = 5,
) -> float:
  """ms per step of the weight matmuls of a `rows`-row cached step (head over `head_rows`)."""
  key = jax.random.PRNGKey(0)
  shapes = [(hidden, 3 * hidden), (hidden, hidden), (hidden, 4 * hidden), (4 * hidden, hidden)]
  weights = [
    [jax.random.normal(jax.random.fold_in(key, 4 * i + j), s) * 0.02 for j, s in enumerate(shapes)]
    for i in range(layers)
  ]
  head = jax.random.normal(key, (hidden, vocab)) * 0.02

  def step(i, carry, weights, head):
    x, acc = carry
    for qkv, out, mlp_in, mlp_out in weights:
      q, k, v = jnp.split(x @ qkv, 3, axis=-1)  # every qkv column used (no slice pushed into it)
      x = x + (q + k * v) @ out
      x = x + jnp.tanh(x @ mlp_in) @ mlp_out
      x = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)
    logits = x[:head_rows] @ head
    return x, acc + jnp.max(logits)

  loop = jax.jit(
    lambda x, w, h: jax.lax.fori_loop(0, iters, lambda i, c: step(i, c, w, h), (x, 0.0))
  )
  x = jnp.ones((rows, hidden), jnp.float32)
  jax.block_until_ready(loop(x, weights, head))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(loop(x, weights, head))
    times.append(time.perf_counter() - t0)
  return 1e3 * float(np.median(times)) / iters


def main(argv=None):
  p = training.argparse.ArgumentParser(
    description=__doc__, formatter_class=training.argparse.RawTextHelpFormatter
  )
  p.add_argument(
    "--decode_rows",
    default="",
    help="comma list of M for the decoding floor (e.g. 1,5,9,40); '' = none",
  )
  p.add_argument(
    "--decode_head_rows",
    default="",
    help="head rows per M (default M - 1, at least 1; e.g. 1,4,8,32)",
  )
  own, rest = p.parse_known_args(argv)
  args = training.parse_args(["--steps=2", "--warmup=1"] + rest)  # later flags win
  config = training.load_config(args)
  m = config.model
  print(
    f"{m.num_layers} x {m.hidden_size}, {m.num_heads} heads, L={config.seq_len}, "
    f"V={m.vocab_size}, batch {config.batch_size}; jax {jax.__version__}; "
    f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; load {os.getloadavg()[0]:.2f}\n"
  )
  objectives = [o for o in args.objectives.split(",") if o]
  if objectives:
    print(
      "| objective | step ms | " + " | ".join(CATEGORIES) + " | matmul-only ms | matmul GFLOP/s |"
    )
    print("| --- | ---: | " + " | ".join("---:" for _ in CATEGORIES) + " | ---: | ---: |")
    for obj in objectives:
      r = profile_training(obj, args)
      mm = r.get("dense matmul", 0.0) + r.get("batched matmul", 0.0)
      cells = " | ".join(f"{r.get(c, 0.0):.0f}" for c in CATEGORIES)
      print(
        f"| {obj} | {r['step_ms']:.0f} | {cells} | {mm:.0f} | "
        f"{r['flops'] / (mm / 1e3) / 1e9 if mm else 0:.0f} |",
        flush=True,
      )
    print(
      "\nms per step by what each executed thunk computes (profiled step; loop thunks not "
      "counted). matmul GFLOP/s = the step's model FLOPs / matmul-only time (an upper bound: "
      "the FLOPs include the few outside matmuls).\n"
    )
  rows = [int(x) for x in own.decode_rows.split(",") if x]
  if rows:
    heads = (
      [int(x) for x in own.decode_head_rows.split(",")]
      if own.decode_head_rows
      else [max(1, r - 1) for r in rows]
    )
    print("| rows M (head rows) | matmul-only ms / step | weight MB read | GB/s |")
    print("| --- | ---: | ---: | ---: |")
    mb = 4 * (12 * m.hidden_size**2 * m.num_layers + m.hidden_size * m.vocab_size) / 2**20
    for r, hr in zip(rows, heads):
      ms = decode_floor_ms(r, m.hidden_size, m.num_layers, m.vocab_size, hr)
      print(f"| {r} ({hr}) | {ms:.2f} | {mb:.1f} | {mb / 1024 / (ms / 1e3):.1f} |", flush=True)
    print(
      "\nThe weight matmuls of one cached decoding step alone (fori_loop of 100 steps, "
      "median of 5)."
    )


if __name__ == "__main__":
  inputs.run(main)
