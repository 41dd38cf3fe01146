"""Compile time and step time of the training step, `model.scan_layers` vs unrolled, by depth;
and the remat policies' peak memory (`compiled.memory_analysis()`) and step time.

  python -m benchmarks.compile_time                           # 4/12/28 layers x 128, L=64, B=8
  python -m benchmarks.compile_time --layers=4,12 --rounds=2 --objective=ar
  python -m benchmarks.compile_time --remat_layers=0          # depth table only

Each configuration is the jitted `train_step.make_train_step` exactly as `benchmarks/training.py`
times it (same state / batch shardings, donated state, random tokens, no tokenizer), lowered and
compiled from scratch in every round (a new jit object, so nothing is reused), then `--warmup`
untimed and `--steps` timed steps. Rounds run every configuration once, in order, so the load of
a shared machine hits all of them alike; the table gives medians over rounds. Peak memory =
arguments + outputs - aliased + temporaries of XLA's buffer assignment (per device; on CPU the
compiler does not schedule for memory, so the remat columns are indicative only: measure on the
target accelerator with the same command).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import types


if __name__ == "__main__" and not __package__:  # a file run cannot import configs/, benchmarks/
  sys.exit("error: run it from the repository root as `python -m benchmarks.compile_time [flags]`")

import jax  # noqa: E402

from benchmarks import inputs  # noqa: E402
from benchmarks import training  # noqa: E402  (benchmarks/training.py: config, state, step and timing helpers)
from setdiff_jax.models import layer_stack  # noqa: E402


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--layers", default="4,12,28", help="depths of the scan-vs-unrolled table")
  p.add_argument("--hidden_size", type=int, default=128)
  p.add_argument("--num_heads", type=int, default=4)
  p.add_argument("--seq_len", type=int, default=64)
  p.add_argument("--batch_size", type=int, default=8)
  p.add_argument("--vocab_size", type=int, default=2048)
  p.add_argument("--dtype", default="float32")
  p.add_argument("--objective", default="setdlm")
  p.add_argument(
    "--remat_layers", type=int, default=12, help="depth of the remat-policy table (0: skip it)"
  )
  p.add_argument("--remat_policies", default=",".join(layer_stack.REMAT_POLICIES))
  p.add_argument("--remat_scan", type=int, default=1, help="remat table with scan_layers (1/0)")
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--warmup", type=int, default=1)
  p.add_argument("--steps", type=int, default=3)
  p.add_argument("--seed", type=int, default=0)
  return p.parse_args(argv)


def base_config(args):
  ns = types.SimpleNamespace(
    config=None,
    num_layers=None,
    hidden_size=args.hidden_size,
    num_heads=args.num_heads,
    seq_len=args.seq_len,
    vocab_size=args.vocab_size,
    batch_size=args.batch_size,
    dtype=args.dtype,
    attention=None,
    dropout=None,
    grad_accum_steps=None,
    remat=None,
    scan_layers=None,
  )
  return training.load_config(ns)


def step_args(args):
  """What `training.benchmark` / `time_steps` read from their argparse namespace."""
  return types.SimpleNamespace(
    fused_head=1,
    head_chunk_rows=0,
    head_recompute=False,
    head_vocab_chunk=None,
    seed=args.seed,
    warmup=args.warmup,
    steps=args.steps,
  )


def measure(config, args) -> dict:
  """One fresh lower + compile + timed steps of the step for `config`."""
  bargs = step_args(args)
  prep = training.benchmark(config, args.objective, bargs)
  mem = prep["compiled"].memory_analysis()
  get = lambda name: int(getattr(mem, name, 0) or 0) if mem is not None else 0
  peak = (
    get("argument_size_in_bytes")
    + get("output_size_in_bytes")
    - get("alias_size_in_bytes")
    + get("temp_size_in_bytes")
  )
  training.time_steps(prep, bargs)
  return {
    "compile_s": prep["compile_s"],
    "compile_cpu_s": prep["compile_cpu_s"],
    "step_s": prep["times"][-1] / args.steps,
    "step_cpu_s": prep["cpu_times"][-1] / args.steps,
    "params": prep["params"],
    "temp": get("temp_size_in_bytes"),
    "peak": peak,
    "loss": prep["loss"],
  }


def with_fields(config, **model):
  c = config.copy_and_resolve_references()
  for k, v in model.items():
    c.model[k] = v
  return c


def median(rows, key):
  return statistics.median(r[key] for r in rows)


def main(argv=None):
  args = parse_args(argv)
  base = base_config(args)
  depths = [int(x) for x in args.layers.split(",") if x.strip()]
  policies = [layer_stack.normalize_remat(x) for x in args.remat_policies.split(",") if x.strip()]
  depth_cfgs = [
    ((n, scan), with_fields(base, num_layers=n, scan_layers=scan))
    for n in depths
    for scan in (False, True)
  ]
  remat_cfgs = []
  if args.remat_layers:
    remat_cfgs = [
      (
        r,
        with_fields(base, num_layers=args.remat_layers, scan_layers=bool(args.remat_scan), remat=r),
      )
      for r in policies
    ]
  results = {key: [] for key, _ in depth_cfgs + [(("remat", r), None) for r, _ in remat_cfgs]}
  for rnd in range(args.rounds):
    for key, cfg in depth_cfgs:
      results[key].append(m := measure(cfg, args))
      print(
        f"round {rnd}: layers={key[0]} scan={key[1]}: compile {m['compile_s']:.1f} s "
        f"(CPU {m['compile_cpu_s']:.1f}), step {1e3 * m['step_s']:.0f} ms (CPU "
        f"{1e3 * m['step_cpu_s']:.0f}), loss {m['loss']:.3f}",
        flush=True,
      )
    for r, cfg in remat_cfgs:
      results[("remat", r)].append(m := measure(cfg, args))
      print(
        f"round {rnd}: remat={r}: compile {m['compile_s']:.1f} s (CPU "
        f"{m['compile_cpu_s']:.1f}), step {1e3 * m['step_s']:.0f} ms (CPU "
        f"{1e3 * m['step_cpu_s']:.0f}), peak {m['peak'] / 2**20:.1f} MiB",
        flush=True,
      )

  m = base.model
  print(
    f"\n{args.objective}, width {m.hidden_size}, {m.num_heads} heads, L={base.seq_len}, "
    f"V={m.vocab_size}, batch {base.batch_size}, {m.dtype}, dropout {m.dropout}; "
    f"{jax.device_count()} x {jax.devices()[0].device_kind} ({jax.default_backend()}); "
    f"jax {jax.__version__}; medians of {args.rounds} interleaved rounds, {args.warmup} "
    f"warm-up + {args.steps} timed steps; load average {os.getloadavg()[0]:.2f}\n"
  )
  print("Process CPU seconds (wall in brackets; on a loaded machine only CPU time is stable).\n")
  print(
    "| layers | params | compile unrolled (s) | compile scan (s) | unrolled / scan | "
    "ms / step unrolled | ms / step scan |"
  )
  print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
  for n in depths:
    u, s = results[(n, False)], results[(n, True)]
    cu, cs = median(u, "compile_cpu_s"), median(s, "compile_cpu_s")
    print(
      f"| {n} | {u[0]['params'] / 1e6:.2f}M | {cu:.1f} ({median(u, 'compile_s'):.1f}) | "
      f"{cs:.1f} ({median(s, 'compile_s'):.1f}) | {cu / cs:.1f}x | "
      f"{1e3 * median(u, 'step_cpu_s'):.0f} ({1e3 * median(u, 'step_s'):.0f}) | "
      f"{1e3 * median(s, 'step_cpu_s'):.0f} ({1e3 * median(s, 'step_s'):.0f}) |"
    )
  if remat_cfgs:
    print(
      f"\nremat policies at {args.remat_layers} layers, scan_layers={bool(args.remat_scan)} "
      "(peak / temporaries per device from compiled.memory_analysis())\n"
    )
    print(
      "| remat | peak (MiB) | temporaries (MiB) | compile CPU s (wall) | ms / step CPU (wall) |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in policies:
      rows = results[("remat", r)]
      print(
        f"| {r} | {rows[0]['peak'] / 2**20:.1f} | {rows[0]['temp'] / 2**20:.1f} | "
        f"{median(rows, 'compile_cpu_s'):.1f} ({median(rows, 'compile_s'):.1f}) | "
        f"{1e3 * median(rows, 'step_cpu_s'):.0f} ({1e3 * median(rows, 'step_s'):.0f}) |"
      )


if __name__ == "__main__":
  inputs.run(main)
