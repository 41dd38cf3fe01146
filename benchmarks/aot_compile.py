"""Ahead-of-time compile for TPU slices on a CPU host: compiled memory per chip, no TPU needed.

  python -m venv --system-site-packages /tmp/tpu_venv
  /tmp/tpu_venv/bin/pip install "libtpu==0.0.42.*"     # the version jax 0.10.2's [tpu] extra pins
  /tmp/tpu_venv/bin/python -m benchmarks.aot_compile    # every program x every topology
  /tmp/tpu_venv/bin/python -m benchmarks.aot_compile --topologies=v5e-8 --programs=lm1b_sw_train

libtpu ships the TPU compiler; `jax.experimental.topologies.get_topology_desc` describes a slice
(v5e-8 = 8 v5e chips 2x4; v4-8 = 4 v4 chips 2x2x1 in megacore mode, one device per chip) with
compile-only devices, and `jit(...).lower(abstract inputs).compile()` runs XLA's TPU pipeline
(SPMD partitioning, fusion, buffer assignment) on them. A sharding mistake, a kernel that does
not lower for TPU, or a program that does not fit the chip's HBM fails here as it would on the
slice. Nothing is materialised: parameters, optimizer state and batches are
`jax.ShapeDtypeStruct`s with the library's own shardings (`train_step.abstract_sharded_state`:
the TrainState under `jax.eval_shape` with `sharding.state_shardings` and the config's rules;
`sharding.make_mesh` with the config's mesh on the topology's devices;
`train_step.jit_train_step`).

Programs:
  lm1b_sw_train          configs/lm1b_sw.py: the SetDLM training step, 12 x 768 DiT, L=128,
                         global batch 512, bf16 compute, mesh data=-1 (all chips).
  gsm8k_sw_qwen3_train   configs/gsm8k_sw_qwen3.py with Qwen3-1.7B-Base's shapes (28 x 2048,
                         16 / 8 heads, head_dim 128, MLP 6144, V=151,936, tied head): the SetDLM
                         training step, L=1024, global batch 16, remat full, mesh fsdp=-1.
  gsm8k_sw_qwen3_decode  the same model's cached SetDLM decoding loop (`set_sampler.set_core`:
                         context prefill + every cached step in a while loop, W = S = 4 from
                         `decoding.sampler_config_for`) for --decode_batch prompts of
                         --decode_prompt tokens and --decode_new_tokens new tokens, parameters
                         placed as `workdir.load_inference_state` places them (training rules,
                         config mesh), rows split over (data, fsdp) (`sampling.placement`).

Columns: arguments / outputs / temporaries = XLA's memory_analysis of the compiled program, per
chip (arguments include the donated train state, outputs alias it); peak = arguments + outputs -
aliased + temporaries; fits = peak <= the chip's HBM (16 GiB v5e, 32 GiB v4). compile s is the
wall clock of lower + compile on this host.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

if __name__ == "__main__" and not __package__:  # a file run cannot import benchmarks/
  sys.exit("error: run it from the repository root as `python -m benchmarks.aot_compile [flags]`")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from benchmarks import inputs  # noqa: E402

GIB = 2**30
# name -> (get_topology_desc name, its keyword arguments, HBM per chip in GiB)
TOPOLOGIES = {
  "v5e-8": ("v5e:2x4", {}, 16),
  "v4-8": ("v4:2x2x1", {"chip_config_name": "megacore"}, 32),
  "v5e-1": ("v5e:1x1", {}, 16),
}
PROGRAMS = ("lm1b_sw_train", "gsm8k_sw_qwen3_train", "gsm8k_sw_qwen3_decode")
# Qwen3-1.7B-Base's config.json fields that `interop.pretrained.model_fields` reads.
QWEN3_1P7B = {
  "model_type": "qwen3",
  "vocab_size": 151936,
  "hidden_size": 2048,
  "num_hidden_layers": 28,
  "num_attention_heads": 16,
  "num_key_value_heads": 8,
  "head_dim": 128,
  "intermediate_size": 6144,
  "rope_theta": 1000000.0,
  "rms_norm_eps": 1e-6,
  "tie_word_embeddings": True,
  "hidden_act": "silu",
}


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--topologies", default="v5e-8,v4-8", help=f"from {tuple(TOPOLOGIES)}")
  p.add_argument("--programs", default=",".join(PROGRAMS))
  p.add_argument("--decode_batch", type=int, default=64)
  p.add_argument("--decode_prompt", type=int, default=256)
  p.add_argument("--decode_new_tokens", type=int, default=256)
  p.add_argument("--tiny", action="store_true", help="2-layer, 64-wide models (a smoke run)")
  p.add_argument("--out", default="", help="also write the rows as JSON to this file")
  args = p.parse_args(argv)
  for flag, value, known in (
    ("--topologies", args.topologies, TOPOLOGIES),
    ("--programs", args.programs, PROGRAMS),
  ):
    bad = [x for x in value.split(",") if x not in known]
    if bad:
      raise SystemExit(f"error: {flag}={value!r}: unknown {bad}; choose from {tuple(known)}")
  inputs.check_output_file(args.out, "--out")  # before compiling: the rows are written last
  return args


def topology_devices(name: str):
  """The compile-only devices of a TPU topology (needs libtpu)."""
  from jax.experimental import topologies

  topo, kwargs, _ = TOPOLOGIES[name]
  return topologies.get_topology_desc(topo, "tpu", **kwargs).devices


# ----------------------------------------------------------------------------- configs
def _fake_tokenizer(vocab: int):
  import types

  return types.SimpleNamespace(vocab_size=vocab, pad_id=0, bos_id=1, eos_id=2, mask_id=vocab - 1)


def run_config(program: str, tiny: bool):
  """(typed run config, backbone config, objective config) of a program, shapes resolved
  without files."""
  from setdiff_jax.config import run as run_cfg
  from setdiff_jax.interop import pretrained

  if program.startswith("lm1b_sw"):
    from configs import lm1b_sw

    config = lm1b_sw.get_config()
    config.model.vocab_size = 30522  # bert-base-uncased
  else:
    from configs import gsm8k_sw_qwen3

    config = gsm8k_sw_qwen3.get_config()
    for k, v in pretrained.model_fields(QWEN3_1P7B).items():
      config.model[k] = v
  if tiny:
    config.model.num_layers, config.model.hidden_size = 2, 64
    if config.model.backbone == "qwen3":
      config.model.head_dim, config.model.intermediate_size = 16, 128
    config.model.num_heads = 4
    if config.model.backbone == "qwen3":
      config.model.num_kv_heads = 4
    config.model.vocab_size, config.seq_len, config.batch_size = 512, 64, 16
  cfg = run_cfg.from_config_dict(config, check_data=False)  # shapes only: no data is read
  model_cfg, obj_cfg = run_cfg.model_and_objective(cfg, _fake_tokenizer(cfg.model.vocab_size))
  return cfg, model_cfg, obj_cfg


# ----------------------------------------------------------------------------- programs
def lower_train(config, model_cfg, obj_cfg, mesh):
  from setdiff_jax import models, sharding, train_step

  state, shardings = train_step.abstract_sharded_state(config, model_cfg, mesh)
  opt = config.optimization
  step = train_step.jit_train_step(opt, models.build(model_cfg), obj_cfg, mesh, shardings)
  rows = sharding.batch_sharding(mesh)
  shape = (opt.batch_size, config.seq_len)
  batch = {
    k: jax.ShapeDtypeStruct(shape, np.int32, sharding=rows)
    for k in ("tokens", "attention_mask", "context_mask")
  }
  rng = jax.ShapeDtypeStruct(
    (), jax.eval_shape(lambda: jax.random.key(0)).dtype, sharding=NamedSharding(mesh, P())
  )
  return step.lower(state, batch, rng), f"batch {opt.batch_size} x L {config.seq_len}"


def lower_decode(config, model_cfg, obj_cfg, mesh, args):
  from setdiff_jax import decoding, models, train_step
  from setdiff_jax.sampling import cache, placement, set_sampler

  state, _ = train_step.abstract_sharded_state(config, model_cfg, mesh)
  params = state.params
  b, plen, n = args.decode_batch, args.decode_prompt, args.decode_new_tokens
  if args.tiny:
    b, plen, n = 8, 16, 16
  cfg = decoding.sampler_config_for(
    obj_cfg, _fake_tokenizer(model_cfg.vocab_size), config.seq_len, max_new_tokens=n
  )
  prompts = [[5] * plen] * b  # only the shapes matter: the host inputs fix Lc, Vc, K
  inp = set_sampler.prompted_inputs(prompts, cfg, cfg.seed)
  batch_spec = placement.batch_spec(mesh, b)
  inp = jax.tree_util.tree_map(
    lambda x: jax.ShapeDtypeStruct(
      np.shape(x), np.asarray(x).dtype, sharding=NamedSharding(mesh, batch_spec)
    ),
    inp,
  )
  key = jax.ShapeDtypeStruct((2,), np.uint32, sharding=NamedSharding(mesh, P()))
  apply = cache.backbone_apply_fn(models.build(model_cfg).config)
  static = cfg.static().replace(max_new_tokens=1, max_length=None)  # as set_sampler._run
  with placement.on(mesh):
    lowered = set_sampler.set_core.lower(
      apply, params, inp, key, cfg=static, stop_eos=cfg.stops_at_eos, history="generated"
    )
  return lowered, f"batch {b}, prompt {plen} + N {n}, W {cfg.window}"


def memory_row(compiled) -> dict:
  mem = compiled.memory_analysis()
  if mem is None:
    return {}
  get = lambda f: int(getattr(mem, f, 0) or 0)  # noqa: E731
  args_b, out_b = get("argument_size_in_bytes"), get("output_size_in_bytes")
  alias_b, temp_b = get("alias_size_in_bytes"), get("temp_size_in_bytes")
  return {
    "arguments_gib": args_b / GIB,
    "outputs_gib": out_b / GIB,
    "aliased_gib": alias_b / GIB,
    "temps_gib": temp_b / GIB,
    "peak_gib": (args_b + out_b - alias_b + temp_b) / GIB,
  }


def one(program: str, topology: str, args) -> dict:
  from setdiff_jax import sharding

  config, model_cfg, obj_cfg = run_config(program, args.tiny)
  devices = topology_devices(topology)
  mesh = sharding.make_mesh(config.mesh.sizes(), devices)
  row = {
    "program": program,
    "topology": topology,
    "chips": len(devices),
    "device_kind": devices[0].device_kind,
    "mesh": ",".join(f"{a}={s}" for a, s in mesh.shape.items() if s > 1) or "1 device",
    "hbm_gib": TOPOLOGIES[topology][2],
  }
  t0 = time.perf_counter()
  try:
    if program.endswith("_train"):
      lowered, shape = lower_train(config, model_cfg, obj_cfg, mesh)
    else:
      lowered, shape = lower_decode(config, model_cfg, obj_cfg, mesh, args)
    compiled = lowered.compile()
  except Exception as e:  # a program that does not compile for the slice: say why, go on
    row.update(
      error=f"{type(e).__name__}: {' '.join(str(e).split())[:400]}",
      compile_s=time.perf_counter() - t0,
    )
    traceback.print_exc()
    return row
  row.update(shape=shape, compile_s=time.perf_counter() - t0, **memory_row(compiled))
  if "peak_gib" in row:
    row["fits"] = row["peak_gib"] <= row["hbm_gib"]
  return row


def table(rows) -> str:
  f = lambda r, k: "-" if r.get(k) is None else f"{r[k]:.2f}"  # noqa: E731
  lines = [
    "| program | topology | mesh | shape | arguments GiB | outputs GiB | temps GiB | "
    "peak GiB / chip | HBM GiB | fits | compile s |",
    "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
  ]
  for r in rows:
    fits = r.get("error", "")[:120] if "error" in r else ("yes" if r.get("fits") else "NO")
    lines.append(
      f"| {r['program']} | {r['topology']} ({r['chips']} x {r['device_kind']}) | "
      f"{r['mesh']} | {r.get('shape', '-')} | {f(r, 'arguments_gib')} | "
      f"{f(r, 'outputs_gib')} | {f(r, 'temps_gib')} | {f(r, 'peak_gib')} | "
      f"{r['hbm_gib']} | {fits} | {r['compile_s']:.1f} |"
    )
  return "\n".join(lines)


def main(argv=None):
  args = parse_args(argv)
  try:
    import libtpu  # noqa: F401
  except ImportError:
    raise SystemExit(
      "error: libtpu is not importable in this Python; install it in a separate "
      "venv: python -m venv --system-site-packages /tmp/tpu_venv && "
      "/tmp/tpu_venv/bin/pip install 'libtpu==0.0.42.*'"
    )
  rows = []
  for topology in args.topologies.split(","):
    for program in args.programs.split(","):
      rows.append(one(program, topology, args))
      print(json.dumps(rows[-1]), flush=True)
  print(
    f"\njax {jax.__version__}, libtpu {_libtpu_version()}, host load {os.getloadavg()[0]:.1f}\n"
  )
  print(table(rows))
  if args.out:
    with open(args.out, "w") as fh:
      json.dump(rows, fh, indent=1)
  return rows


def _libtpu_version() -> str:
  import importlib.metadata

  try:
    return importlib.metadata.version("libtpu")
  except importlib.metadata.PackageNotFoundError:
    return "?"


if __name__ == "__main__":
  inputs.run(main)
