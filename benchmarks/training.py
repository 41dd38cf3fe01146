"""Training-step throughput of each objective: steps/s and clean tokens/s, compile time apart.

  python benchmarks/training.py                       # 4 x 256, 4 heads, L=128, V=30522, B=16
  python benchmarks/training.py --objectives=setdlm,ar --batch_size=32 --steps=20
  python benchmarks/training.py --config=configs/tiny_sw.py   # sizes from a config file

Times the jitted `train.make_train_step` exactly as `train_and_evaluate` runs it (state
replicated, batch sharded over data x fsdp of all local devices, state donated) on random tokens,
so no tokenizer or dataset is needed. For each objective: lower + compile once (reported apart),
`--warmup` untimed steps, then `--steps` timed steps ended by `block_until_ready`. A clean token
is one of the B x L tokens of the data batch (SetDLM and BD3LM feed the model 2L slots per row;
the count is of data tokens, so the methods compare on equal footing). Prints a markdown table.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from configs import default  # noqa: E402
from setdiff_jax import methods, sharding, train  # noqa: E402
from setdiff_jax.model import DiT  # noqa: E402

ADALN = {name: methods.get(name).adaln for name in methods.NAMES}
# bert-base-uncased special ids (the LM1B vocabulary of the reference): [PAD] [CLS] [SEP] [MASK].
PAD_ID, BOS_ID, EOS_ID, MASK_ID = 0, 101, 102, 103
FIRST_WORD_ID = MASK_ID + 1  # random tokens are drawn from [FIRST_WORD_ID, vocab_size)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default=None,
                 help="config file with get_config() (default: configs/default.py with the "
                      "benchmark sizes below)")
  p.add_argument("--objectives", default="setdlm,ar,mdlm,bd3lm")
  p.add_argument("--num_layers", type=int, default=None, help="default 4")
  p.add_argument("--hidden_size", type=int, default=None, help="default 256")
  p.add_argument("--num_heads", type=int, default=None, help="default 4")
  p.add_argument("--seq_len", type=int, default=None, help="default 128")
  p.add_argument("--vocab_size", type=int, default=None, help="default 30522")
  p.add_argument("--batch_size", type=int, default=None, help="default 16")
  p.add_argument("--dtype", default=None, help="float32 (default) | bfloat16")
  p.add_argument("--attention", default=None, help="dense (default) | xla | cudnn")
  p.add_argument("--dropout", type=float, default=None, help="default 0.1")
  p.add_argument("--grad_accum_steps", type=int, default=None, help="default 1")
  p.add_argument("--remat", action="store_true", default=None)
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
  sizes = {"model.num_layers": args.num_layers, "model.hidden_size": args.hidden_size,
           "model.num_heads": args.num_heads, "seq_len": args.seq_len,
           "model.vocab_size": args.vocab_size, "batch_size": args.batch_size,
           "model.dtype": args.dtype, "model.attention": args.attention,
           "model.dropout": args.dropout, "grad_accum_steps": args.grad_accum_steps,
           "model.remat": args.remat}
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
    raise SystemExit(f"vocab_size={config.model.vocab_size} must exceed {FIRST_WORD_ID}")
  config.warmup_steps = 0  # a nonzero learning rate from the first step
  return config


def fake_tokenizer(vocab_size: int):
  """What `train.model_and_objective` reads from a tokenizer: the size and the special ids."""
  return types.SimpleNamespace(vocab_size=vocab_size, pad_id=PAD_ID, bos_id=BOS_ID,
                               eos_id=EOS_ID, mask_id=MASK_ID)


def random_batches(config, n: int, seed: int):
  rng = np.random.default_rng(seed)
  shape = (config.batch_size, config.seq_len)
  out = []
  for _ in range(n):
    tokens = rng.integers(FIRST_WORD_ID, config.model.vocab_size, shape).astype(np.int32)
    tokens[:, 0] = BOS_ID
    out.append({"tokens": tokens, "attention_mask": np.ones(shape, np.int32)})
  return out


def benchmark(config, objective: str, args) -> dict:
  config = config.copy_and_resolve_references()
  config.objective = objective
  config.model.adaln = ADALN[objective]
  train.validate_config(config, jax.device_count())
  model_cfg, obj_cfg = train.model_and_objective(config, fake_tokenizer(config.model.vocab_size))
  mesh = sharding.make_mesh(config.mesh)
  config.seed = args.seed
  state, shardings = train.create_sharded_state(config, model_cfg, mesh)
  num_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(state.params))
  step = train.jit_train_step(config, DiT(model_cfg), obj_cfg, mesh, shardings)
  host = random_batches(config, 4, args.seed)
  batches = [sharding.global_batch(b, mesh) for b in host]
  rng = jax.random.key(args.seed + 1)

  t0 = time.perf_counter()
  compiled = step.lower(state, batches[0], rng).compile()
  compile_s = time.perf_counter() - t0

  for i in range(args.warmup):
    state, metrics = compiled(state, batches[i % len(batches)], rng)
  jax.block_until_ready((state, metrics) if args.warmup else state)
  t0 = time.perf_counter()
  for i in range(args.steps):
    state, metrics = compiled(state, batches[i % len(batches)], rng)
  jax.block_until_ready((state, metrics))
  elapsed = time.perf_counter() - t0
  loss = float(metrics["loss"])
  if not np.isfinite(loss):
    raise FloatingPointError(f"{objective}: non-finite loss {loss}")
  clean = float(sum(host[i % len(host)]["attention_mask"].sum() for i in range(args.steps)))
  return {"objective": objective, "params": num_params, "compile_s": compile_s,
          "step_ms": 1e3 * elapsed / args.steps, "steps_per_s": args.steps / elapsed,
          "tokens_per_s": clean / elapsed, "loss": loss}


def markdown(rows, config, args) -> str:
  m = config.model
  head = (f"{m.num_layers} layers x {m.hidden_size}, {m.num_heads} heads, L={config.seq_len}, "
          f"V={m.vocab_size}, batch {config.batch_size} (accum {config.grad_accum_steps}), "
          f"{m.dtype}, attention={m.attention}, dropout {m.dropout}; {jax.device_count()} x "
          f"{jax.devices()[0].device_kind} ({jax.default_backend()}); jax {jax.__version__}; "
          f"{args.warmup} warm-up + {args.steps} timed steps")
  lines = [head, "",
           "| objective | params | compile (s) | ms / step | steps / s | clean tokens / s |",
           "| --- | ---: | ---: | ---: | ---: | ---: |"]
  for r in rows:
    lines.append(f"| {r['objective']} | {r['params'] / 1e6:.2f}M | {r['compile_s']:.1f} | "
                 f"{r['step_ms']:.0f} | {r['steps_per_s']:.2f} | {r['tokens_per_s']:,.0f} |")
  return "\n".join(lines)


def main(argv=None):
  args = parse_args(argv)
  config = load_config(args)
  names = [s.strip() for s in args.objectives.split(",") if s.strip()]
  for name in names:
    if name not in methods.NAMES:
      raise SystemExit(f"--objectives: {name!r} is not one of {methods.NAMES}")
  rows = []
  for name in names:
    row = benchmark(config, name, args)
    print(f"{name}: compile {row['compile_s']:.1f}s, {row['steps_per_s']:.2f} steps/s, "
          f"{row['tokens_per_s']:,.0f} clean tokens/s (loss {row['loss']:.3f})", flush=True)
    rows.append(row)
  print()
  print(markdown(rows, config, args))


if __name__ == "__main__":
  main()
