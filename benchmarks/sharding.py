"""Per-device memory of the training step under several mesh layouts (data / fsdp / tensor).

  python -m benchmarks.sharding                                   # lm1b_sw sizes, compile only
  python -m benchmarks.sharding --config=configs/lm1b_sw.py --batch_size=256
  python -m benchmarks.sharding --layouts="fsdp=8;fsdp=4,tensor=2" --num_layers=24
  python -m benchmarks.sharding --time_steps=5                    # + step time, tiny_sw sizes
  python -m benchmarks.sharding --config=configs/gsm8k_sw_qwen3.py --preset=qwen3-1.7b \
      --layouts="fsdp=8;fsdp=4,tensor=2" --batch_size=8           # Qwen3-1.7B fine-tuning

For each layout the train step is jitted exactly as `train.train_and_evaluate` jits it (state in
`sharding.state_shardings`, batch over data x fsdp, state donated), lowered on abstract inputs and
compiled; nothing is allocated or run. It reports per device:

  params / EMA / optimizer   exact bytes of one device's shards of each part of the TrainState,
                             from the shardings (the Adam moments are sharded like the params);
  arguments / outputs / temp from `compiled.memory_analysis()`: what XLA's buffer assignment of the
                             per-device SPMD program needs: arguments (state + batch shard),
                             outputs (new state + metrics), temporaries (activations, gradients,
                             all-gathered weights, collectives' buffers);
  peak (est.)                arguments + outputs - aliased (the donated state) + temp.

By default the devices are 8 emulated CPU devices (XLA_FLAGS below, set before jax is imported),
which is what the sizing table of the README was made with. The params / EMA / optimizer columns
are exact on any backend. The temp column is XLA:CPU's buffer assignment: it shows how the
activations split (or fail to split) over a layout and how they scale with the batch, but as an
absolute number it is pessimistic: the CPU compiler fuses less and does not schedule for memory as
the TPU / GPU compilers do (`--remat` barely changes it on CPU). Run with `--backend=tpu` (or gpu)
on the real slice for absolute numbers.

`--time_steps=N` also times N steps per layout on a smaller config (`--time_config`, default
configs/tiny_sw.py; lm1b sizes take minutes per step on CPU). On emulated CPU devices, which share
the host's cores, the step time shows the collectives' overhead, not real-hardware speed-up.
"""

from __future__ import annotations

import os

# Before jax is imported anywhere: 8 emulated host devices (harmless on GPU/TPU hosts).
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  ).strip()

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402


if __name__ == "__main__" and not __package__:  # a file run cannot import configs/, benchmarks/
  sys.exit("error: run it from the repository root as `python -m benchmarks.sharding [flags]`")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import inputs  # noqa: E402
from setdiff_jax import models, objectives, sharding, train_step  # noqa: E402
from setdiff_jax.config import edge  # noqa: E402
from setdiff_jax.config import run as run_config  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_LAYOUTS = "data=8;fsdp=8;fsdp=4,tensor=2;data=2,fsdp=2,tensor=2"
# Architectures for --preset (the public config.json values).
PRESETS = {
  "qwen3-1.7b": dict(
    backbone="qwen3",
    vocab_size=151936,
    hidden_size=2048,
    num_layers=28,
    num_heads=16,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=6144,
    rope_base=1e6,
    tie_embeddings=True,
  ),
  "qwen3-0.6b": dict(
    backbone="qwen3",
    vocab_size=151936,
    hidden_size=1024,
    num_layers=28,
    num_heads=16,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=3072,
    rope_base=1e6,
    tie_embeddings=True,
  ),
}
# bert-base-uncased special ids (the LM1B vocabulary): [PAD] [CLS] [SEP] [MASK].
PAD_ID, BOS_ID, EOS_ID, MASK_ID = 0, 101, 102, 103


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument(
    "--config",
    default=os.path.join(REPO, "configs", "lm1b_sw.py"),
    help="config file with get_config() (default: configs/lm1b_sw.py)",
  )
  p.add_argument(
    "--layouts",
    default=DEFAULT_LAYOUTS,
    help="';'-separated meshes, each 'axis=size,...' (missing axes = 1; one may be "
    f"-1). Default: {DEFAULT_LAYOUTS!r}",
  )
  p.add_argument("--backend", default="cpu", help="cpu (default: 8 emulated devices) | gpu | tpu")
  p.add_argument("--objective", default=None, help="override config.objective")
  p.add_argument("--batch_size", type=int, default=None, help="global batch (default: config's)")
  p.add_argument("--seq_len", type=int, default=None)
  p.add_argument("--num_layers", type=int, default=None)
  p.add_argument("--hidden_size", type=int, default=None)
  p.add_argument("--num_heads", type=int, default=None)
  p.add_argument(
    "--vocab_size",
    type=int,
    default=None,
    help="default: config.model.vocab_size, else 30522 (bert-base-uncased) for "
    "wordpiece configs, else config.tokenizer.vocab_size",
  )
  p.add_argument("--dtype", default=None, help="compute dtype: float32 | bfloat16")
  p.add_argument("--grad_accum_steps", type=int, default=None)
  p.add_argument(
    "--remat",
    nargs="?",
    const="full",
    default=None,
    help="model.remat policy: none | full (bare --remat) | dots_saveable | "
    "dots_with_no_batch_dims_saveable | save_attention_out",
  )
  p.add_argument(
    "--time_steps",
    type=int,
    default=0,
    help="also time this many steps per layout on --time_config (0: compile only)",
  )
  p.add_argument("--time_config", default=os.path.join(REPO, "configs", "tiny_sw.py"))
  p.add_argument("--time_batch_size", type=int, default=None)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument(
    "--preset",
    default=None,
    choices=sorted(PRESETS),
    help="fill config.model with a known architecture (e.g. a Qwen3 config whose "
    "fields come from init_from_hf at training time)",
  )
  p.add_argument(
    "--state_only",
    action="store_true",
    help="report the exact params / EMA / optimizer shards only (no compile)",
  )
  return p.parse_args(argv)


def parse_layouts(text: str):
  layouts = []
  for item in text.split(";"):
    item = item.strip()
    if not item:
      continue
    mesh = {a: 1 for a in sharding.MESH_AXES}
    for part in item.split(","):
      axis, _, size = part.partition("=")
      axis = axis.strip()
      if axis not in sharding.MESH_AXES or not size.strip().lstrip("-").isdigit():
        raise SystemExit(
          f"--layouts: bad entry {part!r} in {item!r}; expected e.g. "
          f"'fsdp=4,tensor=2' with axes {sharding.MESH_AXES}"
        )
      mesh[axis] = int(size)
    layouts.append(mesh)
  return layouts


def layout_name(mesh_cfg) -> str:
  parts = [f"{a}={s}" for a, s in mesh_cfg.items() if s != 1]
  return " × ".join(parts) if parts else "1 device"


def load_config(path, args, *, timing=False):
  spec = importlib.util.spec_from_file_location("bench_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  if not timing and args.preset:
    for k, v in PRESETS[args.preset].items():
      config.model[k] = v
    config.init_from_hf = ""
  if config.data.source in ("text", "jsonl") and not config.data.paths:
    config.data.paths = config.data.eval_paths = "unused.jsonl"  # nothing is read here
  if config.tokenizer.kind in ("wordpiece", "gpt2", "qwen3") and not config.tokenizer.vocab_path:
    config.tokenizer.vocab_path = "unused"
  if timing:
    overrides = {"batch_size": args.time_batch_size}
  else:
    overrides = {
      "batch_size": args.batch_size,
      "seq_len": args.seq_len,
      "model.num_layers": args.num_layers,
      "model.hidden_size": args.hidden_size,
      "model.num_heads": args.num_heads,
      "model.vocab_size": args.vocab_size,
      "model.dtype": args.dtype,
      "grad_accum_steps": args.grad_accum_steps,
      "model.remat": args.remat,
      "objective": args.objective,
    }
  for key, value in overrides.items():
    if value is None:
      continue
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  if not config.model.vocab_size:  # normally taken from the tokenizer; no tokenizer here
    if config.tokenizer.kind == "wordpiece":
      config.model.vocab_size = 30522  # bert-base-uncased
    else:
      config.model.vocab_size = int(config.tokenizer.vocab_size)
  if config.model.get("backbone", "dit") == "dit":
    config.model.adaln = objectives.get(config.objective).adaln
  config.warmup_steps = 0
  return config


def fake_tokenizer(vocab_size: int):
  """What `run_config.model_and_objective` reads from a tokenizer: the size and the special ids."""
  return types.SimpleNamespace(
    vocab_size=vocab_size, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, mask_id=MASK_ID
  )


def shard_bytes(tree, shardings) -> int:
  """Bytes of one device's shards of `tree` (the largest, should shards be uneven)."""
  total = 0
  for leaf, s in zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(shardings)):
    total += math.prod(s.shard_shape(leaf.shape)) * np.dtype(leaf.dtype).itemsize
  return total


def build(config, mesh_cfg, devices):
  """Jitted step, abstract (sharded) inputs and the state's shardings, as the train loop does."""
  cfg = edge.from_config_dict(config, len(devices))
  model_cfg, obj_cfg = run_config.model_and_objective(cfg, fake_tokenizer(cfg.model.vocab_size))
  mesh = sharding.make_mesh(mesh_cfg, devices)
  init = lambda rng: train_step.create_train_state(cfg.optimization, model_cfg, rng)
  abstract = jax.eval_shape(init, jax.random.key(cfg.seed))
  rules = sharding.rules_from_config(cfg.mesh.with_rules())
  shardings = sharding.state_shardings(abstract, mesh, rules)
  data = sharding.batch_sharding(mesh)
  step = train_step.jit_train_step(
    cfg.optimization, models.build(model_cfg), obj_cfg, mesh, shardings
  )
  shape = (cfg.optimization.batch_size, cfg.seq_len)
  batch = {
    k: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=data) for k in ("tokens", "attention_mask")
  }
  state = jax.tree_util.tree_map(
    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
  )
  return mesh, init, step, state, batch, shardings, abstract


def memory_row(config, mesh_cfg, devices, state_only: bool = False) -> dict:
  mesh, _, step, state, batch, shardings, abstract = build(config, mesh_cfg, devices)
  t0 = time.perf_counter()
  compiled = None if state_only else step.lower(state, batch, jax.random.key(0)).compile()
  compile_s = time.perf_counter() - t0
  mem = None if compiled is None else compiled.memory_analysis()
  get = lambda name: int(getattr(mem, name, 0) or 0) if mem is not None else 0
  args_b, out_b = get("argument_size_in_bytes"), get("output_size_in_bytes")
  alias_b, temp_b = get("alias_size_in_bytes"), get("temp_size_in_bytes")
  return {
    "layout": layout_name(dict(zip(sharding.MESH_AXES, mesh.devices.shape))),
    "params": shard_bytes(abstract.params, shardings.params),
    "ema": shard_bytes(abstract.ema_params, shardings.ema_params),
    "opt": shard_bytes(abstract.opt_state, shardings.opt_state),
    "num_params": sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(abstract.params)),
    "args": args_b,
    "out": out_b,
    "alias": alias_b,
    "temp": temp_b,
    "peak": args_b + out_b - alias_b + temp_b if mem is not None else 0,
    "has_memory": mem is not None,
    "compile_s": compile_s,
  }


def time_row(config, mesh_cfg, devices, steps: int, seed: int) -> dict:
  mesh, init, step, _, _, shardings, _ = build(config, mesh_cfg, devices)
  state = jax.jit(init, out_shardings=shardings)(jax.random.key(config.seed))
  rng = np.random.default_rng(seed)
  shape = (config.batch_size, config.seq_len)
  tokens = rng.integers(MASK_ID + 1, config.model.vocab_size, shape).astype(np.int32)
  tokens[:, 0] = BOS_ID
  batch = sharding.global_batch(
    {"tokens": tokens, "attention_mask": np.ones(shape, np.int32)}, mesh
  )
  key = jax.random.key(seed)
  t0 = time.perf_counter()
  compiled = step.lower(state, batch, key).compile()
  compile_s = time.perf_counter() - t0
  state, metrics = compiled(state, batch, key)  # warm-up
  jax.block_until_ready(metrics)
  t0 = time.perf_counter()
  for _ in range(steps):
    state, metrics = compiled(state, batch, key)
  jax.block_until_ready((state, metrics))
  elapsed = time.perf_counter() - t0
  loss = float(metrics["loss"])
  if not np.isfinite(loss):
    raise FloatingPointError(f"non-finite loss {loss} under {mesh_cfg}")
  return {"step_ms": 1e3 * elapsed / steps, "time_compile_s": compile_s, "loss": loss}


def mib(b: int) -> str:
  return f"{b / 2**20:,.1f}"


def describe(config) -> str:
  m = config.model
  if m.get("backbone", "dit") == "qwen3":
    arch = (
      f"Qwen3 {m.num_layers} layers × {m.hidden_size}, {m.num_heads} / {m.num_kv_heads} "
      f"heads × {m.head_dim}, MLP {m.intermediate_size}"
    )
  else:
    arch = f"DiT {m.num_layers} layers × {m.hidden_size}, {m.num_heads} heads, MLP ×{m.mlp_ratio}"
  return (
    f"{config.objective}, {arch}, V={m.vocab_size}, L={config.seq_len}, global batch "
    f"{config.batch_size} (accum {config.grad_accum_steps}), {m.dtype} compute / fp32 "
    f"params, remat={m.remat}"
  )


def markdown(rows, config, time_config, devices, args) -> str:
  head = (
    f"{describe(config)}; {rows[0]['num_params'] / 1e6:.1f}M parameters. "
    f"{len(devices)} × {devices[0].device_kind} ({devices[0].platform}), jax "
    f"{jax.__version__}. MiB per device."
  )
  cols = [
    "layout",
    "params",
    "EMA",
    "optimizer",
    "arguments",
    "outputs",
    "temp",
    "peak (est.)",
    "compile (s)",
  ]
  timed = any("step_ms" in r for r in rows)
  if timed:
    cols.append("ms / step*")
  lines = [head, "", "| " + " | ".join(cols) + " |", "| --- |" + " ---: |" * (len(cols) - 1)]
  for r in rows:
    mem = [mib(r[k]) if r["has_memory"] else "n/a" for k in ("args", "out", "temp", "peak")]
    cells = [
      r["layout"],
      mib(r["params"]),
      mib(r["ema"]),
      mib(r["opt"]),
      *mem,
      f"{r['compile_s']:.0f}",
    ]
    if timed:
      cells.append(f"{r['step_ms']:.0f}" if "step_ms" in r else "")
    lines.append("| " + " | ".join(cells) + " |")
  if timed:
    lines += [
      "",
      f"*step time of {describe(time_config)}, {args.time_steps} steps after one "
      f"warm-up step, on the same devices.",
    ]
  return "\n".join(lines)


def main(argv=None):
  args = parse_args(argv)
  devices = jax.devices(args.backend)
  config = load_config(args.config, args)
  time_config = load_config(args.time_config, args, timing=True) if args.time_steps else None
  layouts = parse_layouts(args.layouts)
  print(f"{len(devices)} {args.backend} devices; {describe(config)}", flush=True)
  rows = []
  for mesh_cfg in layouts:
    row = memory_row(config, mesh_cfg, devices, args.state_only)
    print(
      f"{row['layout']}: compiled in {row['compile_s']:.0f}s; per device: params "
      f"{mib(row['params'])} MiB, optimizer {mib(row['opt'])} MiB, temp {mib(row['temp'])} "
      f"MiB, peak {mib(row['peak'])} MiB",
      flush=True,
    )
    if time_config is not None:
      row.update(time_row(time_config, mesh_cfg, devices, args.time_steps, args.seed))
      print(f"  {row['step_ms']:.0f} ms/step on the timing config", flush=True)
    rows.append(row)
  print()
  print(markdown(rows, config, time_config, devices, args))


if __name__ == "__main__":
  inputs.run(main)
