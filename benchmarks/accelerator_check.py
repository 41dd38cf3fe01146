"""The prepared accelerator check: one command on one GPU or TPU host, <= 8 minutes, one table.

  python benchmarks/accelerator_check.py                  # on the accelerator host
  python benchmarks/accelerator_check.py --tiny           # every section on CPU, tiny shapes

Sections (each appends one JSON line to OUT.jsonl as soon as it finishes, so a run cut short still
reports; at the end OUT.json holds them all and OUT.md the table, which is also printed):

  device      device kind and count, backend, jax version, the published bf16 peak (PEAKS)
  attention   every attention implementation (models/attention.py IMPLEMENTATIONS) against dense
              on the set-causal (SetDLM) and block (BD3LM, S=4) training masks, 2L slots, forward
              + backward of sum(w * attend), fp32, L = 128 and 1024: max |diff| of the output and
              the gradients vs dense, median ms. An implementation that does not run on this
              backend (cudnn off GPU) is reported with its error.
  train       the lm1b_sw SetDLM training step (configs/lm1b_sw.py: 12 x 768 DiT, L=128, bf16,
              batch --train_batch) on random tokens: ms/step, clean tokens/s, MFU = model FLOPs
              / step time / the device's published bf16 peak. Model FLOPs (stated, not XLA's
              count, which credits the masked-out half of attention):
                6 * P_matmul * B * 2L            (every matmul parameter, fwd + bwd, 2L slots)
              + 12 * layers * d * B * (2L)^2 * f (attention scores and values, fwd + bwd, f = the
                                                  fraction of (query, key) pairs the mask allows)
  decode      set decoding vs AR decoding of the same random-init Qwen3 (0.6B shapes: 28 x
              1024, 16 / 8 heads, head_dim 128, MLP 3072, V = 151,936, bf16) from a 32-token
              prompt, N = 128 new tokens, no EOS stop, at batch 1 and 64. Rows: AR; SetDLM W=8
              with T = N/4 steps (4 tokens committed per step by the schedule; a random-init
              model's confidences never cross a threshold, so the schedule sets the parallelism).
              Columns: kept tokens per forward call, tok/s, ms/step (= ms per forward call),
              compiled programs, compile-inclusive seconds.
  stack       a Qwen3-1.7B-shaped layer stack (28 x 2048, 16 / 8 heads, head_dim 128, MLP 6144;
              a 1,024-token vocabulary so that the layers dominate) at L = 1024, batch 1, bf16:
              forward + backward step time and the compiled program's memory (arguments +
              outputs + temporaries, XLA's memory_analysis).

--tiny shrinks every shape (CPU, under a minute or two); --sections picks sections; --budget_s
skips the sections that would start after that many seconds (recorded as skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

SECTIONS = ("device", "attention", "train", "decode", "stack")
# Published dense bf16 peaks per chip, TFLOP/s (vendor data sheets; matched on device_kind).
PEAKS = (
  ("H200", 989.0),
  ("H100", 989.0),
  ("A100", 312.0),
  ("L40S", 362.0),
  ("L4", 121.0),
  ("A10G", 125.0),
  ("TPU v6", 918.0),
  ("TPU v5p", 459.0),
  ("TPU v5 lite", 197.0),
  ("TPU v5e", 197.0),
  ("TPU v4", 275.0),
  ("TPU v3", 123.0),
)


def peak_tflops(kind: str):
  for name, tf in PEAKS:
    if name.lower() in kind.lower():
      return tf
  return None


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke run)")
  p.add_argument("--sections", default=",".join(SECTIONS))
  p.add_argument("--out", default="accelerator_check", help="OUT.jsonl / OUT.json / OUT.md")
  p.add_argument("--budget_s", type=float, default=450.0)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--train_batch", type=int, default=256)
  return p.parse_args(argv)


def _median_ms(fn, *args, repeats: int = 3) -> float:
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return 1e3 * statistics.median(times)


# ----------------------------------------------------------------------------- sections
def section_device(args):
  dev = jax.devices()[0]
  return {
    "device_kind": dev.device_kind,
    "device_count": jax.device_count(),
    "backend": jax.default_backend(),
    "jax": jax.__version__,
    "peak_bf16_tflops": peak_tflops(dev.device_kind),
  }


def section_attention(args):
  from setdiff_jax.diffusion import masks
  from setdiff_jax.models import attention

  lengths, heads, dh = ((16,), 2, 8) if args.tiny else ((128, 1024), 8, 64)
  rows = []
  for length in lengths:
    b, s = (2 if args.tiny else (16 if length <= 128 else 2)), 2 * length
    for kind in ("set", "block"):
      static = (
        masks.set_causal_mask(length) if kind == "set" else masks.block_causal_mask(length, 4)
      )
      q, k, v, w = [
        jax.random.normal(x, (b, s, heads, dh)) for x in jax.random.split(jax.random.key(0), 4)
      ]
      dense = jnp.asarray(static)[None] & masks.two_stream_padding(jnp.ones((b, length), bool))
      ref = None
      for impl in attention.IMPLEMENTATIONS:
        row = {"L": length, "mask": kind, "batch": b, "impl": impl}
        try:
          m = attention.with_tiles(dense, static, impl)

          def fwd_bwd(q, k, v, m, impl=impl):
            """The output and the gradients of sum(w * out) wrt q, k, v: one program."""
            out, vjp = jax.vjp(lambda q, k, v: attention.attend(q, k, v, m, impl), q, k, v)
            return out, vjp(w)

          fwd_bwd = jax.jit(fwd_bwd)
          out, grads = fwd_bwd(q, k, v, m)
          if ref is None:
            ref = (out, grads)
          row["max_abs_diff_out"] = float(jnp.max(jnp.abs(out - ref[0])))
          row["max_abs_diff_grad"] = max(
            float(jnp.max(jnp.abs(a - r))) for a, r in zip(grads, ref[1])
          )
          row["fwd_bwd_ms"] = _median_ms(fwd_bwd, q, k, v, m, repeats=args.repeats)
        except Exception as e:  # an implementation this backend lacks: say which and why
          row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        rows.append(row)
  return {"rows": rows}


def section_train(args):
  import training as tb  # benchmarks/training.py: fake tokenizer, random batches
  from configs import lm1b_sw
  from setdiff_jax import models, sharding, train_step
  from setdiff_jax.diffusion import masks
  from setdiff_jax.workdir import config as run_config

  config = lm1b_sw.get_config()
  config.model.vocab_size = 30522
  config.batch_size = args.train_batch
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = -1, 1, 1
  if args.tiny:
    config.model.num_layers, config.model.hidden_size, config.model.num_heads = 1, 32, 2
    config.seq_len, config.model.vocab_size, config.batch_size = 16, 256, 8
  config.warmup_steps = 0
  config.model.dropout = 0.0
  run_config.validate_config(config, jax.device_count())
  model_cfg, obj_cfg = run_config.model_and_objective(
    config, tb.fake_tokenizer(config.model.vocab_size)
  )
  mesh = sharding.make_mesh(config.mesh)
  state, shardings = train_step.create_sharded_state(config, model_cfg, mesh)
  step = train_step.jit_train_step(config, models.build(model_cfg), obj_cfg, mesh, shardings)
  host = tb.random_batches(config, 2, 0)
  batches = [sharding.global_batch(b_, mesh) for b_ in host]
  rng = jax.random.key(1)
  t0 = time.perf_counter()
  compiled = step.lower(state, batches[0], rng).compile()
  compile_s = time.perf_counter() - t0
  state, metrics = compiled(state, batches[0], rng)
  jax.block_until_ready(state)
  n = 3 if args.tiny else 10
  t0 = time.perf_counter()
  for i in range(n):
    state, metrics = compiled(state, batches[i % 2], rng)
  jax.block_until_ready((state, metrics))
  step_s = (time.perf_counter() - t0) / n
  # model FLOPs (module doc): matmul parameters = every parameter of rank >= 2 but the table
  p_matmul = sum(
    int(np.prod(x.shape))
    for path, x in jax.tree_util.tree_flatten_with_path(state.params)[0]
    if x.ndim >= 2 and "embedding" not in jax.tree_util.keystr(path)
  )
  b, length, d = config.batch_size, config.seq_len, config.model.hidden_size
  slots = 2 * length
  frac = float(np.mean(masks.set_causal_mask(length)))
  flops = 6 * p_matmul * b * slots + 12 * config.model.num_layers * d * b * slots**2 * frac
  peak = peak_tflops(jax.devices()[0].device_kind)
  achieved = flops / step_s
  return {
    "layers": config.model.num_layers,
    "hidden": d,
    "L": length,
    "batch": b,
    "dtype": config.model.dtype,
    "compile_s": compile_s,
    "step_ms": 1e3 * step_s,
    "tokens_per_s": b * length / step_s,
    "model_tflops_per_step": flops / 1e12,
    "mask_fraction": frac,
    "achieved_tflops": achieved / 1e12,
    "mfu": achieved / (peak * 1e12 * jax.device_count()) if peak else None,
    "loss": float(metrics["loss"]),
  }


def _qwen3(tiny: bool, **shape):
  from setdiff_jax.models.qwen3 import Qwen3Config

  if tiny:
    base = dict(
      vocab_size=512,
      hidden_size=64,
      num_layers=2,
      num_heads=4,
      num_kv_heads=2,
      head_dim=16,
      intermediate_size=128,
    )
  else:
    base = dict(
      vocab_size=151936,
      hidden_size=1024,
      num_layers=28,
      num_heads=16,
      num_kv_heads=8,
      head_dim=128,
      intermediate_size=3072,
    )
  base.update(shape)
  return Qwen3Config(dtype="bfloat16", **base)


def _random_params(cfg, seed: int = 0):
  """Random-init parameters drawn on the device (norm scales 1, matrices N(0, 0.02))."""
  from setdiff_jax import models

  shapes = models.param_shapes(cfg)
  leaves, tree = jax.tree_util.tree_flatten_with_path(shapes)
  keys = jax.random.split(jax.random.key(seed), len(leaves))

  @jax.jit
  def draw(keys):
    out = []
    for (path, leaf), key in zip(leaves, keys):
      if "scale" in jax.tree_util.keystr(path):
        out.append(jnp.ones(leaf.shape, jnp.float32))
      else:
        out.append(0.02 * jax.random.normal(key, leaf.shape, jnp.float32))
    return out

  return jax.tree_util.tree_unflatten(tree, draw(keys))


def section_decode(args):
  from setdiff_jax import models
  from setdiff_jax.sampling import SamplerConfig, ar_generate, set_generate
  from setdiff_jax.sampling import compiles

  cfg = _qwen3(args.tiny)
  model = models.build(cfg)
  params = _random_params(cfg)
  n, plen, window = (16, 8, 4) if args.tiny else (128, 32, 8)
  mask_id = cfg.vocab_size - 1
  base = SamplerConfig(
    mask_token_id=mask_id,
    eos_token_id=None,
    pad_token_id=0,
    max_new_tokens=n,
    max_length=plen + n,
    stop_at_eos=False,
    length_buckets="pow2",
    window=window,
  )
  runs = [("ar", ar_generate, base), ("setdlm T=N/4", set_generate, base.replace(num_steps=n // 4))]
  rows = []
  rng = np.random.default_rng(0)
  for batch in (1, 64 if not args.tiny else 8):
    prompts = [list(rng.integers(1, mask_id, plen)) for _ in range(batch)]
    for name, sampler, scfg in runs:
      before = compiles.compiled_programs()
      t0 = time.perf_counter()
      out = sampler(model, params, prompts, scfg, jax.random.key(0))
      cold = time.perf_counter() - t0
      times = []
      for r in range(args.repeats):
        t0 = time.perf_counter()
        out = sampler(model, params, prompts, scfg, jax.random.key(r + 1))
        times.append(time.perf_counter() - t0)
      sec = statistics.median(times)
      calls = float(np.mean(out.forward_calls))
      rows.append(
        {
          "sampler": name,
          "batch": batch,
          "new_tokens": n,
          "kept_tokens_per_call": float(np.sum(out.num_committed))
          / float(np.sum(out.forward_calls)),
          "tokens_per_s": out.num_generated / sec,
          "ms_per_step": 1e3 * sec / calls,
          "forward_calls": calls,
          "compiled_programs": compiles.compiled_programs() - before,
          "seconds_with_compile": cold,
        }
      )
  return {"model": "qwen3-0.6B-shaped random init" if not args.tiny else "qwen3 tiny", "rows": rows}


def section_stack(args):
  from setdiff_jax import models

  cfg = _qwen3(
    args.tiny,
    vocab_size=1024 if not args.tiny else 512,
    **({} if args.tiny else dict(hidden_size=2048, intermediate_size=6144)),
  )
  length = 64 if args.tiny else 1024
  model = models.build(cfg)
  params = _random_params(cfg)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (1, length)), jnp.int32)
  positions = jnp.arange(length, dtype=jnp.int32)[None]
  mask = jnp.tril(jnp.ones((1, length, length), bool))

  def loss(p):
    logits = model.apply({"params": p}, tokens, positions, mask)
    return jnp.mean(jnp.square(logits.astype(jnp.float32)))

  step = jax.jit(jax.value_and_grad(loss))
  t0 = time.perf_counter()
  compiled = step.lower(params).compile()
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  total = None
  if mem is not None:
    total = sum(
      int(getattr(mem, f, 0) or 0)
      for f in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes")
    )
  return {
    "layers": cfg.num_layers,
    "hidden": cfg.hidden_size,
    "L": length,
    "batch": 1,
    "compile_s": compile_s,
    "step_ms": _median_ms(compiled, params, repeats=args.repeats),
    "compiled_memory_gib": None if total is None else total / 2**30,
  }


RUNNERS = {
  "device": section_device,
  "attention": section_attention,
  "train": section_train,
  "decode": section_decode,
  "stack": section_stack,
}


# ----------------------------------------------------------------------------- report
def _f(x, spec=".2f"):
  return "-" if x is None else format(x, spec)


def markdown(results: dict) -> str:
  lines = []
  dev = results.get("device", {})
  if "device_kind" in dev:
    lines.append(
      f"device: {dev['device_count']} x {dev['device_kind']} ({dev['backend']}), "
      f"jax {dev['jax']}, published bf16 peak {_f(dev['peak_bf16_tflops'], '.0f')} "
      "TFLOP/s per chip"
    )
  for name in SECTIONS[1:]:
    r = results.get(name)
    if r is None:
      continue
    lines.append(f"\n{name}")
    if "error" in r or "skipped" in r:
      lines.append(f"  {r.get('error') or r.get('skipped')}")
      continue
    if name == "attention":
      lines += [
        "| L | mask | batch | impl | fwd+bwd ms | max diff out | max diff grad | error |",
        "| ---: | --- | ---: | --- | ---: | ---: | ---: | --- |",
      ]
      lines += [
        f"| {x['L']} | {x['mask']} | {x['batch']} | {x['impl']} | "
        f"{_f(x.get('fwd_bwd_ms'))} | {_f(x.get('max_abs_diff_out'), '.1e')} | "
        f"{_f(x.get('max_abs_diff_grad'), '.1e')} | {x.get('error', '')} |"
        for x in r["rows"]
      ]
    elif name == "train":
      lines += [
        "| layers x d | L | batch | dtype | ms/step | tok/s | model TFLOP/step | "
        "TFLOP/s | MFU | compile s |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| {r['layers']} x {r['hidden']} | {r['L']} | {r['batch']} | {r['dtype']} | "
        f"{_f(r['step_ms'], '.1f')} | {_f(r['tokens_per_s'], ',.0f')} | "
        f"{_f(r['model_tflops_per_step'], '.3f')} | {_f(r['achieved_tflops'])} | "
        f"{_f(r['mfu'], '.1%')} | {_f(r['compile_s'], '.1f')} |",
      ]
    elif name == "decode":
      lines += [
        f"model: {r['model']}",
        "| sampler | batch | kept tok/call | tok/s | ms/step | calls | programs | s with compile |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
      ]
      lines += [
        f"| {x['sampler']} | {x['batch']} | {_f(x['kept_tokens_per_call'])} | "
        f"{_f(x['tokens_per_s'], ',.1f')} | {_f(x['ms_per_step'])} | "
        f"{_f(x['forward_calls'], '.0f')} | {x['compiled_programs']} | "
        f"{_f(x['seconds_with_compile'], '.1f')} |"
        for x in r["rows"]
      ]
    elif name == "stack":
      lines += [
        "| layers x d | L | batch | fwd+bwd ms | compiled memory GiB | compile s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        f"| {r['layers']} x {r['hidden']} | {r['L']} | {r['batch']} | "
        f"{_f(r['step_ms'], '.1f')} | {_f(r['compiled_memory_gib'])} | "
        f"{_f(r['compile_s'], '.1f')} |",
      ]
  return "\n".join(lines)


def main(argv=None) -> dict:
  args = parse_args(argv)
  wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
  bad = [s for s in wanted if s not in SECTIONS]
  if bad:
    raise SystemExit(f"error: --sections={args.sections!r}: unknown {bad}; choose from {SECTIONS}")
  if "device" not in wanted:
    wanted.insert(0, "device")
  start = time.perf_counter()
  results = {}
  with open(args.out + ".jsonl", "a") as log:
    for name in wanted:
      elapsed = time.perf_counter() - start
      t0 = time.perf_counter()
      if elapsed > args.budget_s:
        result = {"skipped": f"--budget_s={args.budget_s:g} spent ({elapsed:.0f} s)"}
      else:
        try:
          result = RUNNERS[name](args)
        except Exception as e:  # one broken section never loses the others
          result = {
            "error": f"{type(e).__name__}: {e}"[:500],
            "traceback": traceback.format_exc()[-2000:],
          }
      result["section_seconds"] = time.perf_counter() - t0
      results[name] = result
      log.write(json.dumps({"section": name, "tiny": args.tiny, **result}) + "\n")
      log.flush()
      print(
        f"[{time.perf_counter() - start:6.1f} s] {name} done"
        f"{' (' + result['error'] + ')' if 'error' in result else ''}",
        flush=True,
      )
  table = markdown(results)
  with open(args.out + ".json", "w") as f:
    json.dump(results, f, indent=1)
  with open(args.out + ".md", "w") as f:
    f.write(table + "\n")
  print("\n" + table)
  return results


if __name__ == "__main__":
  main()
