"""Attention forward + backward on the static training masks: dense vs blocksparse (vs splash).

  python -m benchmarks.attention                                # L = 128 and 1024, set + block
  python -m benchmarks.attention --lengths=1024 --batch_size=4 --impls=dense,blocksparse,splash

Times `jax.grad` of sum(w * attend(q, k, v, mask)) on the two-stream set-causal (SetDLM) and
block (BD3LM, S = --block_size) masks, 2L slots, --num_heads x --head_dim, fp32, random inputs;
interleaved repeats, median (and min) wall time and the process CPU time (robust on a shared
machine). `splash` runs the Pallas kernel on TPU and falls back to blocksparse elsewhere. Prints
a markdown table with the fraction of needed tiles.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

if __name__ == "__main__" and not __package__:  # a file run cannot import benchmarks/
  sys.exit("error: run it from the repository root as `python -m benchmarks.attention [flags]`")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks import inputs  # noqa: E402
from setdiff_jax.models import attention  # noqa: E402
from setdiff_jax.diffusion import masks


# --masks: the two-stream static masks of training (SetDLM, BD3LM with S = --block_size)
MASKS = {
  "set": lambda length, block_size: masks.set_causal_mask(length),
  "block": lambda length, block_size: masks.block_causal_mask(length, block_size),
}


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--lengths", default="128,1024", help="L values (2L slots)")
  p.add_argument("--masks", default="set,block")
  p.add_argument("--impls", default="dense,blocksparse")
  p.add_argument("--batch_size", type=int, default=0, help="0: 16 at L<=128, else 2")
  p.add_argument("--num_heads", type=int, default=4)
  p.add_argument("--head_dim", type=int, default=64)
  p.add_argument("--block_size", type=int, default=4)
  p.add_argument("--repeats", type=int, default=5)
  args = p.parse_args(argv)
  # an unknown mask name was measured as the block mask under that name; 0 repeats a traceback
  for flag, names, known in (
    ("--masks", args.masks, tuple(MASKS)),
    ("--impls", args.impls, attention.IMPLEMENTATIONS),
  ):
    bad = [x for x in names.split(",") if x not in known]
    if bad:
      raise ValueError(f"{flag}={names}: unknown {bad}; choose from {', '.join(known)}")
  text = args.lengths
  try:
    args.lengths = [int(x) for x in text.split(",")]
  except ValueError:
    args.lengths = [0]
  if min(args.lengths) < 1:
    raise ValueError(f"--lengths={text}: give comma-separated integers >= 1, e.g. 128,1024")
  inputs.check_at_least(args, 0, "batch_size")  # 0: the default per L
  inputs.check_at_least(args, 1, "num_heads", "head_dim", "block_size", "repeats")
  return args


def main(argv=None):
  args = parse_args(argv)
  impls = args.impls.split(",")
  rows = []
  for length in args.lengths:
    b = args.batch_size or (16 if length <= 128 else 2)
    s = 2 * length
    for kind in args.masks.split(","):
      static = MASKS[kind](length, args.block_size)
      ks = jax.random.split(jax.random.key(0), 4)
      q, k, v, w = [jax.random.normal(x, (b, s, args.num_heads, args.head_dim)) for x in ks]
      dense = jnp.asarray(static)[None] & masks.two_stream_padding(jnp.ones((b, length), bool))
      fns = {}
      for impl in impls:
        m = attention.with_tiles(dense, static, impl)
        loss = lambda q, k, v, m, impl=impl: jnp.sum(w * attention.attend(q, k, v, m, impl))
        fn = jax.jit(jax.grad(loss, (0, 1, 2)))
        jax.block_until_ready(fn(q, k, v, m))
        fns[impl] = (fn, m)
      times = {i: ([], []) for i in impls}
      for _ in range(args.repeats):
        for impl, (fn, m) in fns.items():
          c0, t0 = time.process_time(), time.perf_counter()
          jax.block_until_ready(fn(q, k, v, m))
          times[impl][0].append(time.perf_counter() - t0)
          times[impl][1].append(time.process_time() - c0)
      tile = attention.default_tile(s)
      frac = attention.StaticPattern(static).tiles(tile).mean()
      base = statistics.median(times[impls[0]][0])
      for impl in impls:
        wall, cpu = times[impl]
        rows.append(
          (
            length,
            kind,
            b,
            impl,
            tile,
            frac,
            statistics.median(wall),
            min(wall),
            statistics.median(cpu),
            base / statistics.median(wall),
          )
        )
        print(rows[-1], flush=True)
  print(
    f"\n{jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}, "
    f"load {os.getloadavg()[0]:.2f}; {args.num_heads} heads x {args.head_dim}, fp32, fwd+bwd"
  )
  print(
    "| L (2L slots) | mask | batch | impl | tile | tiles needed | median ms | min ms | "
    f"cpu ms | speed vs {impls[0]} |"
  )
  print("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
  for r in rows:
    print(
      f"| {r[0]} ({2 * r[0]}) | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]:.1%} | "
      f"{1e3 * r[6]:.1f} | {1e3 * r[7]:.1f} | {1e3 * r[8]:.1f} | {r[9]:.2f}x |"
    )


if __name__ == "__main__":
  inputs.run(main)
