"""Decoding on a mesh of 1, 2, 4 and 8 devices: tok/s and compiled programs on a GSM8K-like
prompt-length mix (not a test).

  python -m benchmarks.mesh_decoding                 # 8 emulated CPU devices unless XLA_FLAGS say
  python -m benchmarks.mesh_decoding --devices=1,8 --samplers=set --num_prompts=64
  python -m benchmarks.mesh_decoding --quick         # tiny shapes (a smoke run)

A random-init DiT (--num_layers x --hidden_size, random output head so predictions differ) decodes
--num_prompts prompts whose lengths follow a GSM8K-like long-tailed mix (lognormal around
--prompt_median tokens, clipped to [--prompt_min, --prompt_max]) in batches of --batch_size,
--max_new_tokens new tokens each, greedy, with `evaluation.accuracy.decode_all` (prompt lengths
bucketed to powers of two, `SamplerConfig.length_buckets`). For each device count n the
parameters are placed on a data=n mesh of the first n devices and the samplers split every batch
over it (`sampling/placement.py`). Columns: tok/s (compile-free: a batch that compiled is timed
again), tok/s with compile (the cold run's wall clock), compiled programs, and the programs the
same mix would compile without buckets (distinct longest-prompt lengths of its batches).

On one CPU the emulated devices share the same cores: tok/s across device counts measures the
partitioning overhead, not a speed-up; on a TPU slice or a multi-GPU host the same command
measures the scaling.
"""

from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__" and not __package__:  # a file run cannot import benchmarks/
  sys.exit("error: run it from the repository root as `python -m benchmarks.mesh_decoding [flags]`")

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  )

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import arms, inputs  # noqa: E402
from setdiff_jax import sharding  # noqa: E402
from setdiff_jax.evaluation.accuracy import decode_all  # noqa: E402
from setdiff_jax.models import param_shapes  # noqa: E402
from setdiff_jax.models.dit import DiT, DiTConfig  # noqa: E402
from setdiff_jax.sampling import CommitPolicy, SamplerConfig  # noqa: E402
from setdiff_jax.sampling.config import bucket_length  # noqa: E402

IDS = dict(mask_token_id=3, eos_token_id=2, pad_token_id=0, bos_token_id=1)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--devices", default="1,2,4,8")
  p.add_argument("--samplers", default="set,ar")
  p.add_argument("--num_layers", type=int, default=2)
  p.add_argument("--hidden_size", type=int, default=128)
  p.add_argument("--num_heads", type=int, default=4)
  p.add_argument("--vocab_size", type=int, default=4096)
  p.add_argument("--num_prompts", type=int, default=64)
  p.add_argument("--batch_size", type=int, default=16)
  p.add_argument("--prompt_median", type=int, default=90)
  p.add_argument("--prompt_min", type=int, default=20)
  p.add_argument("--prompt_max", type=int, default=220)
  p.add_argument("--max_new_tokens", type=int, default=32)
  p.add_argument("--window", type=int, default=4)
  p.add_argument("--threshold", type=float, default=0.5)
  p.add_argument("--quick", action="store_true", help="tiny shapes")
  args = p.parse_args(argv)
  if args.quick:
    args.num_layers, args.hidden_size, args.vocab_size = 1, 32, 64
    args.num_prompts, args.batch_size, args.max_new_tokens = 16, 8, 4
    args.prompt_median, args.prompt_min, args.prompt_max = 12, 4, 40
  return args


def gsm8k_like_lengths(args, seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  x = rng.lognormal(np.log(args.prompt_median), 0.35, size=args.num_prompts)
  return np.clip(x.astype(int), args.prompt_min, args.prompt_max)


def model_and_params(args):
  cfg = DiTConfig(
    vocab_size=args.vocab_size,
    hidden_size=args.hidden_size,
    num_layers=args.num_layers,
    num_heads=args.num_heads,
    dropout=0.0,
  )
  rng = np.random.default_rng(0)

  def leaf(path, shape):
    if "scale" in jax.tree_util.keystr(path):
      return np.ones(shape.shape, np.float32)
    return (rng.standard_normal(shape.shape) / np.sqrt(shape.shape[0])).astype(np.float32)

  return DiT(cfg), jax.tree_util.tree_map_with_path(leaf, param_shapes(cfg))


def main(argv=None):
  args = parse_args(argv)
  counts = [int(n) for n in args.devices.split(",")]
  if max(counts) > jax.device_count():
    raise SystemExit(f"error: --devices={args.devices}: only {jax.device_count()} devices")
  model, host_params = model_and_params(args)
  lengths = gsm8k_like_lengths(args)
  rng = np.random.default_rng(1)
  prompts = [[1] + list(rng.integers(4, args.vocab_size, int(n) - 1)) for n in lengths]
  longest = [max(lengths[i : i + args.batch_size]) for i in range(0, len(lengths), args.batch_size)]
  unbucketed = len(set(longest))
  buckets = len({bucket_length(n, "pow2") for n in longest})
  max_length = int(args.prompt_max) + args.max_new_tokens
  rows = []
  for name in args.samplers.split(","):
    cfg = SamplerConfig(
      **IDS,
      max_new_tokens=args.max_new_tokens,
      max_length=max_length,
      stop_at_eos=False,
      window=args.window,
      policy=CommitPolicy("threshold", args.threshold),
      length_buckets="pow2",
    )
    reference = None
    for n in counts:
      mesh = sharding.make_mesh({"data": n}, jax.devices()[:n])
      params = jax.device_put(host_params, sharding.state_shardings(host_params, mesh))
      sampler = arms.sampler_decoder(name).generate
      res = decode_all(sampler, model, params, prompts, cfg, batch_size=args.batch_size)
      tokens = sum(len(g) for g in res["generated"])
      if reference is None:
        reference = res["generated"]
      rows.append(
        (
          name,
          n,
          tokens / res["seconds"],
          tokens / res["wall_seconds"],
          res["compiled_programs"],
          res["generated"] == reference,
        )
      )
      print(rows[-1], flush=True)
  print(
    f"\nDiT {args.num_layers} x {args.hidden_size}, {args.num_heads} heads, V="
    f"{args.vocab_size}; {args.num_prompts} prompts of {lengths.min()}..{lengths.max()} "
    f"tokens (median {int(np.median(lengths))}), batch {args.batch_size}, N="
    f"{args.max_new_tokens}, {cfg.setting.name}; "
    f"{jax.devices()[0].device_kind} x {jax.device_count()} ({jax.default_backend()}), "
    f"jax {jax.__version__}, load {os.getloadavg()[0]:.1f}"
  )
  print(
    f"power-of-two buckets of the batches' longest prompts: {buckets}; distinct longest "
    f"lengths (programs without buckets): {unbucketed}\n"
  )
  print(
    "| sampler | devices (data=n) | tok/s | tok/s with compile | compiled programs | "
    "same tokens as 1 device |"
  )
  print("| --- | ---: | ---: | ---: | ---: | --- |")
  for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]:,.0f} | {r[3]:,.0f} | {r[4]} | {'yes' if r[5] else 'NO'} |")
  return rows


if __name__ == "__main__":
  inputs.run(main)
