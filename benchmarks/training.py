"""Training-step throughput of each objective: steps/s and clean tokens/s, compile time apart.

  python -m benchmarks.training                       # 4 x 256, 4 heads, L=128, V=30522, B=16
  python -m benchmarks.training --objectives=setdlm,ar --batch_size=32 --steps=20
  python -m benchmarks.training --config=configs/tiny_sw.py   # sizes from a config file
  python -m benchmarks.training --vocab_size=4096 --rounds=2 --steps=5   # interleaved rounds
  python -m benchmarks.training --seq_len=1024 --batch_size=2 --attention=blocksparse

Times the jitted `train_step.make_train_step` exactly as `train_and_evaluate` runs it (state
replicated, batch sharded over data x fsdp of all local devices, state donated) on random tokens,
so no tokenizer or dataset is needed. For each objective: lower + compile once (reported apart),
`--warmup` untimed steps, then `--steps` timed steps ended by `block_until_ready`. A clean token
is one of the B x L tokens of the data batch (SetDLM and BD3LM feed the model 2L slots per row;
the count is of data tokens, so the methods compare on equal footing). With --rounds R the timed
runs of all objectives are interleaved R times and medians reported. GFLOP/s = XLA's
`cost_analysis()` FLOPs of the compiled step / time; MFU = that / the peak (--peak_gflops, or a
2048^3 fp32 matmul probe on this device). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import statistics
import sys
import time
import types


if __name__ == "__main__" and not __package__:  # a file run cannot import configs/, benchmarks/
  sys.exit("error: run it from the repository root as `python -m benchmarks.training [flags]`")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import inputs  # noqa: E402
from configs import default  # noqa: E402
from setdiff_jax import objectives, sharding, train_step  # noqa: E402
from setdiff_jax.config import edge  # noqa: E402
from setdiff_jax.config import run as run_config  # noqa: E402
from setdiff_jax.models.dit import DiT  # noqa: E402

ADALN = {name: objectives.get(name).adaln for name in objectives.NAMES}
# bert-base-uncased special ids (the LM1B vocabulary of the reference): [PAD] [CLS] [SEP] [MASK].
PAD_ID, BOS_ID, EOS_ID, MASK_ID = 0, 101, 102, 103
FIRST_WORD_ID = MASK_ID + 1  # random tokens are drawn from [FIRST_WORD_ID, vocab_size)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument(
    "--config",
    default=None,
    help="config file with get_config() (default: configs/default.py with the "
    "benchmark sizes below)",
  )
  p.add_argument("--objectives", default="setdlm,ar,mdlm,bd3lm")
  p.add_argument("--num_layers", type=int, default=None, help="default 4")
  p.add_argument("--hidden_size", type=int, default=None, help="default 256")
  p.add_argument("--num_heads", type=int, default=None, help="default 4")
  p.add_argument("--seq_len", type=int, default=None, help="default 128")
  p.add_argument("--vocab_size", type=int, default=None, help="default 30522")
  p.add_argument("--batch_size", type=int, default=None, help="default 16")
  p.add_argument("--dtype", default=None, help="float32 (default) | bfloat16")
  p.add_argument(
    "--attention", default=None, help="dense (default) | xla | cudnn | blocksparse | splash"
  )
  p.add_argument(
    "--fused_head",
    type=int,
    default=1,
    help="1 (default): fused head + cross-entropy; 0: the logits path",
  )
  p.add_argument(
    "--head_vocab_chunk",
    type=int,
    default=None,
    help="fused head vocabulary columns per chunk (default 1024, the config's; 0: "
    "all columns at once; --head_chunk_rows / --head_recompute imply 0)",
  )
  p.add_argument("--head_chunk_rows", type=int, default=0, help="fused head rows per chunk")
  p.add_argument("--head_recompute", action="store_true", help="fused head: recompute logits")
  p.add_argument(
    "--peak_gflops",
    type=float,
    default=0.0,
    help="peak FLOP/s (GFLOP/s) for the MFU column; 0: measure with a matmul probe",
  )
  p.add_argument(
    "--rounds",
    type=int,
    default=1,
    help="interleaved rounds over the objectives (medians reported)",
  )
  p.add_argument("--dropout", type=float, default=None, help="default 0.1")
  p.add_argument("--grad_accum_steps", type=int, default=None, help="default 1")
  p.add_argument(
    "--remat",
    nargs="?",
    const="full",
    default=None,
    help="remat policy: none | full (bare --remat) | dots_saveable | "
    "dots_with_no_batch_dims_saveable | save_attention_out",
  )
  p.add_argument(
    "--scan_layers",
    action="store_true",
    default=None,
    help="nn.scan over the blocks (model.scan_layers)",
  )
  p.add_argument("--warmup", type=int, default=3, help="untimed steps after compilation")
  p.add_argument("--steps", type=int, default=10, help="timed steps")
  p.add_argument("--seed", type=int, default=0)
  return p.parse_args(argv)


def load_config(args):
  if args.config:
    spec = importlib.util.spec_from_file_location("bench_config", args.config)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
  else:
    config = default.get_config()
    config.model.num_layers, config.model.hidden_size, config.model.num_heads = 4, 256, 4
    config.seq_len, config.model.vocab_size, config.batch_size = 128, 30522, 16
    config.model.dtype = "float32"
  sizes = {
    "model.num_layers": args.num_layers,
    "model.hidden_size": args.hidden_size,
    "model.num_heads": args.num_heads,
    "seq_len": args.seq_len,
    "model.vocab_size": args.vocab_size,
    "batch_size": args.batch_size,
    "model.dtype": args.dtype,
    "model.attention": args.attention,
    "model.dropout": args.dropout,
    "grad_accum_steps": args.grad_accum_steps,
    "model.remat": args.remat,
    "model.scan_layers": args.scan_layers,
  }
  for key, value in sizes.items():
    if value is not None:
      node, *rest = key.split(".")
      if rest:
        config[node][rest[0]] = value
      else:
        config[node] = value
  if not config.model.vocab_size:  # the config takes it from its tokenizer
    config.model.vocab_size = int(config.tokenizer.get("vocab_size") or 30522)
  if config.model.vocab_size <= FIRST_WORD_ID:
    raise ValueError(
      f"--vocab_size={config.model.vocab_size} must exceed {FIRST_WORD_ID} (the benchmark's "
      "tokens are drawn above the special ids)"
    )
  config.warmup_steps = 0  # a nonzero learning rate from the first step
  return config


def fake_tokenizer(vocab_size: int):
  """What `run_config.model_and_objective` reads from a tokenizer: the size and the special ids."""
  return types.SimpleNamespace(
    vocab_size=vocab_size, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, mask_id=MASK_ID
  )


def random_batches(config, n: int, seed: int):
  rng = np.random.default_rng(seed)
  shape = (config.batch_size, config.seq_len)
  out = []
  for _ in range(n):
    tokens = rng.integers(FIRST_WORD_ID, config.model.vocab_size, shape).astype(np.int32)
    tokens[:, 0] = BOS_ID
    out.append({"tokens": tokens, "attention_mask": np.ones(shape, np.int32)})
  return out


def benchmark(config, objective: str, args, compute_flops: bool = True) -> dict:
  """Builds, compiles and warms up one objective's step. `compute_flops`: also lower the
  unchunked twin of the step for XLA's FLOP count (`model_flops`; prep['flops'], None without)."""
  config = config.copy_and_resolve_references()
  config.objective = objective
  config.model.adaln = ADALN[objective]
  config.seed = args.seed
  cfg = edge.from_config_dict(config, jax.device_count())
  model_cfg, obj_cfg = run_config.model_and_objective(cfg, fake_tokenizer(cfg.model.vocab_size))
  vocab_chunk = args.head_vocab_chunk
  if vocab_chunk is None:
    vocab_chunk = 0 if (args.head_chunk_rows or args.head_recompute) else model_cfg.head_vocab_chunk
  model_cfg = dataclasses.replace(
    model_cfg,
    fused_head=bool(args.fused_head),
    head_chunk_rows=args.head_chunk_rows,
    head_recompute=args.head_recompute,
    head_vocab_chunk=vocab_chunk,
  )
  mesh = sharding.make_mesh(cfg.mesh.sizes())
  state, shardings = train_step.create_sharded_state(cfg, model_cfg, mesh)
  num_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(state.params))
  step = train_step.jit_train_step(cfg.optimization, DiT(model_cfg), obj_cfg, mesh, shardings)
  host = random_batches(config, 4, args.seed)
  batches = [sharding.global_batch(b, mesh) for b in host]
  rng = jax.random.key(args.seed + 1)

  t0, c0 = time.perf_counter(), time.process_time()
  compiled = step.lower(state, batches[0], rng).compile()
  compile_s, compile_cpu_s = time.perf_counter() - t0, time.process_time() - c0
  flops = None
  if compute_flops:
    flops = model_flops(cfg, model_cfg, obj_cfg, mesh, shardings, state, batches[0], rng)

  for i in range(args.warmup):
    state, metrics = compiled(state, batches[i % len(batches)], rng)
  jax.block_until_ready((state, metrics) if args.warmup else state)
  clean = float(sum(host[i % len(host)]["attention_mask"].sum() for i in range(args.steps)))
  return {
    "objective": objective,
    "params": num_params,
    "vocab_chunk": vocab_chunk,
    "compile_s": compile_s,
    "compile_cpu_s": compile_cpu_s,
    "flops": flops,
    "model_config": model_cfg,
    "objective_config": obj_cfg,
    "compiled": compiled,
    "state": state,
    "batches": batches,
    "rng": rng,
    "clean": clean,
    "times": [],
    "cpu_times": [],
  }


def model_flops(cfg, model_cfg, obj_cfg, mesh, shardings, state, batch, rng) -> float:
  """FLOPs of one step by XLA's cost analysis of the same step without head chunking.

  A chunked head is a loop whose body XLA counts once, and the vocabulary-chunked backward
  recomputes the logits (hardware, not model, FLOPs); the unchunked twin counts the model's
  FLOPs. It is only lowered (HLO cost analysis), never compiled."""
  twin = dataclasses.replace(model_cfg, head_vocab_chunk=0, head_chunk_rows=0, head_recompute=False)
  step = train_step.jit_train_step(cfg.optimization, DiT(twin), obj_cfg, mesh, shardings)
  cost = step.lower(state, batch, rng).cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float((cost or {}).get("flops", 0.0))


def time_steps(prep: dict, args):
  """One timed run of `--steps` steps; appends the elapsed seconds to prep['times']."""
  state, compiled, batches, rng = prep["state"], prep["compiled"], prep["batches"], prep["rng"]
  t0, c0 = time.perf_counter(), time.process_time()
  for i in range(args.steps):
    state, metrics = compiled(state, batches[i % len(batches)], rng)
  jax.block_until_ready((state, metrics))
  prep["times"].append(time.perf_counter() - t0)
  prep.setdefault("cpu_times", []).append(time.process_time() - c0)
  prep["state"] = state
  loss = float(metrics["loss"])
  if not np.isfinite(loss):
    raise FloatingPointError(f"{prep['objective']}: non-finite loss {loss}")
  prep["loss"] = loss


def summarise(prep: dict, args, peak: float) -> dict:
  elapsed = statistics.median(prep["times"])
  achieved = prep["flops"] * args.steps / elapsed
  return {
    "objective": prep["objective"],
    "params": prep["params"],
    "vocab_chunk": prep["vocab_chunk"],
    "compile_s": prep["compile_s"],
    "step_ms": 1e3 * elapsed / args.steps,
    "steps_per_s": args.steps / elapsed,
    "tokens_per_s": prep["clean"] / elapsed,
    "loss": prep["loss"],
    "gflops": achieved / 1e9,
    "mfu": achieved / peak if peak else 0.0,
  }


def matmul_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
  """Best fp32 GFLOP/s of an n x n x n jitted matmul on the default device (a peak estimate)."""
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda x, y: x @ y)
  f(a, a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    f(a, a).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  return 2 * n**3 / best / 1e9


def markdown(rows, config, args) -> str:
  m = config.model
  head = (
    f"{m.num_layers} layers x {m.hidden_size}, {m.num_heads} heads, L={config.seq_len}, "
    f"V={m.vocab_size}, batch {config.batch_size} (accum {config.grad_accum_steps}), "
    f"{m.dtype}, attention={m.attention}, dropout {m.dropout}, remat={m.remat}, "
    f"scan_layers={m.get('scan_layers', False)}; {jax.device_count()} x "
    f"{jax.devices()[0].device_kind} ({jax.default_backend()}); jax {jax.__version__}; "
    f"{args.warmup} warm-up + {args.steps} timed steps"
  )
  lines = [
    head,
    "",
    "| objective | params | compile (s) | ms / step | steps / s | clean tokens / s | "
    "GFLOP/s | MFU |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
  ]
  for r in rows:
    lines.append(
      f"| {r['objective']} | {r['params'] / 1e6:.2f}M | {r['compile_s']:.1f} | "
      f"{r['step_ms']:.0f} | {r['steps_per_s']:.2f} | {r['tokens_per_s']:,.0f} | "
      f"{r['gflops']:.1f} | {r['mfu']:.0%} |"
    )
  return "\n".join(lines)


def main(argv=None):
  args = parse_args(argv)
  config = load_config(args)
  names = [s.strip() for s in args.objectives.split(",") if s.strip()]
  for name in names:
    if name not in objectives.NAMES:
      raise ValueError(f"--objectives: {name!r} is not one of {objectives.NAMES}")
  preps = [benchmark(config, name, args) for name in names]
  peak = args.peak_gflops * 1e9 or matmul_peak_gflops() * 1e9
  for r in range(args.rounds):
    for prep in preps:
      time_steps(prep, args)
      print(
        f"round {r}: {prep['objective']}: {args.steps / prep['times'][-1]:.2f} steps/s "
        f"(loss {prep['loss']:.3f})",
        flush=True,
      )
  rows = [summarise(p, args, peak) for p in preps]
  print()
  print(markdown(rows, config, args))
  print(
    f"\nMFU = cost_analysis() FLOPs per step x steps/s / peak {peak / 1e9:.1f} GFLOP/s "
    f"({'--peak_gflops' if args.peak_gflops else '2048^3 fp32 matmul probe'}); "
    f"median of {args.rounds} interleaved round(s); load average {os.getloadavg()[0]:.2f}; "
    f"fused_head={args.fused_head}, head_vocab_chunk={rows[0]['vocab_chunk'] if rows else '-'}; "
    "FLOPs = XLA's cost analysis of the step without head chunks (model FLOPs)."
  )


if __name__ == "__main__":
  inputs.run(main)
