r"""Sampler speed: tokens/s, forward calls and tokens/step of every sampler (not a test).

  python -m benchmarks.sampling                       # random-init 4 x 256, 4 heads, L=128, V=30522
  python -m benchmarks.sampling --workdir=/tmp/setdiff_tiny   # a trained run (workdir.py)
  python -m benchmarks.sampling --num_layers=2 --hidden_size=64 --vocab_size=2048 --seq_len=64

Rows: set sampler (KV cache) for W in --windows and tau in --thresholds, the no-cache set sampler
(one uncached forward over all committed tokens per step) for the same settings, BD3LM (S =
--block_size, fused block cache), MDLM (sub-blocks of --mdlm_block, canvas padded to L) and AR,
at each batch size in --batch_sizes. Unconditional generation from BOS, N = L - 1, no EOS stop
(as the reference's LM1B throughput mode); greedy. tokens/s counts generated tokens over the
timed run(s); compile time (first call minus a timed call) is reported separately. The last lines
state the cached / no-cache speed ratio per setting.

GFLOP/s and MFU: XLA's `cost_analysis()` FLOPs of one model call with the shapes of one step of
that sampler (set: P pending + W mask slots over a cache of L + W, head on the W masks, P = 1
with tau off and W with tau on, an upper bound; BD3LM: S slots over a cache of L; AR: one slot
over L; MDLM: the L-slot canvas, head on G; set no-cache: L + W slots) x steps / run time, and
that / the peak (--peak_gflops, or the 2048^3 matmul probe of benchmarks/training.py). The commit
rule, argsorts and cache writes are not counted: the gap to the model FLOPs is the sampler's own
overhead (plus the memory-bound head at batch 1).

A random-init DiT has a zero output head: every distribution is uniform, so tau never fires and
tokens/step is 1. --head_scale > 0 draws a random head (N(0, head_scale^2 / D)) so some
predictions are confident and tau has something to do (a mechanical check of the parallel path,
not a quality claim). Timings on a shared machine vary; repeat with --repeats.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Callable, List


if __name__ == "__main__" and not __package__:  # a file run cannot import configs/, benchmarks/
  sys.exit("error: run it from the repository root as `python -m benchmarks.sampling [flags]`")

from absl import flags  # noqa: E402

from setdiff_jax import cli  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Trained run to load (default: a random-init model).")
flags.DEFINE_integer("num_layers", 4, "Random init: layers.")
flags.DEFINE_integer("hidden_size", 256, "Random init: width.")
flags.DEFINE_integer("num_heads", 4, "Random init: heads.")
flags.DEFINE_integer("seq_len", 128, "Random init: context length L.")
flags.DEFINE_integer("vocab_size", 30522, "Random init: vocabulary.")
flags.DEFINE_float(
  "head_scale", 0.0, "Random init: std * sqrt(D) of a random output head (0: keep the zero head)."
)
flags.DEFINE_integer("seed", 0, "Init / sampling seed.")
flags.DEFINE_list("batch_sizes", ["1", "8", "32"], "Batch sizes.")
flags.DEFINE_list("windows", ["1", "4", "8", "16"], "Set-sampler windows W.")
flags.DEFINE_list("thresholds", ["off", "0.9"], "Confidence thresholds tau ('off' = none).")
flags.DEFINE_list("samplers", ["set", "set_nocache", "bd3lm", "mdlm", "ar"], "Which samplers.")
flags.DEFINE_list("nocache_windows", ["1", "16"], "W values for the no-cache set sampler.")
flags.DEFINE_integer("block_size", 4, "BD3LM block size S (the run's own for bd3lm runs).")
flags.DEFINE_integer("mdlm_block", 32, "MDLM sub-block G.")
flags.DEFINE_integer("max_new_tokens", 0, "N (0 = L - 1).")
flags.DEFINE_integer("repeats", 1, "Timed runs per row (after the compiling run).")
flags.DEFINE_float(
  "peak_gflops", 0.0, "Peak GFLOP/s for the MFU column (0: measure with a 2048^3 matmul probe)."
)
flags.DEFINE_bool("scan_layers", False, "Random init: nn.scan over the blocks (model.scan_layers).")


def build_model():
  import jax
  import jax.numpy as jnp
  import numpy as np

  from setdiff_jax.models import init_params
  from setdiff_jax.models.dit import DiT, DiTConfig

  if FLAGS.workdir:
    from setdiff_jax.workdir import load as workdir_lib

    st = workdir_lib.load_inference_state(FLAGS.workdir)
    oc = st.objective_config
    ids = dict(
      mask_token_id=oc.mask_token_id,
      eos_token_id=oc.eos_token_id,
      pad_token_id=oc.pad_token_id,
      bos_token_id=st.tokenizer.bos_id,
    )
    desc = f"{FLAGS.workdir} (step {st.step}, objective {oc.name})"
    return (
      workdir_lib.inference_model(st.model_config),
      st.params,
      int(st.config.seq_len),
      ids,
      desc,
    )
  cfg = DiTConfig(
    vocab_size=FLAGS.vocab_size,
    hidden_size=FLAGS.hidden_size,
    num_layers=FLAGS.num_layers,
    num_heads=FLAGS.num_heads,
    dropout=0.0,
    scan_layers=FLAGS.scan_layers,
  )
  params = jax.jit(init_params, static_argnums=(0, 2))(cfg, jax.random.PRNGKey(FLAGS.seed))
  if FLAGS.head_scale > 0:
    rng = np.random.default_rng(FLAGS.seed)
    head = rng.standard_normal((cfg.hidden_size, cfg.vocab_size)) * FLAGS.head_scale
    params["head"]["kernel"] = jnp.asarray(head / np.sqrt(cfg.hidden_size), jnp.float32)
  ids = dict(mask_token_id=103, eos_token_id=102, pad_token_id=0, bos_token_id=101)
  desc = (
    f"random init {cfg.num_layers} x {cfg.hidden_size}, {cfg.num_heads} heads, "
    f"L={FLAGS.seq_len}, V={cfg.vocab_size}, head_scale={FLAGS.head_scale}, "
    f"scan_layers={cfg.scan_layers}"
  )
  return DiT(cfg), params, FLAGS.seq_len, ids, desc


def step_flops(
  model, params, seq_len: int, slots: int, cache_len: int, head_rows: int, batch: int
) -> float:
  """XLA FLOPs of one model call: `slots` query rows per row over a cache of `cache_len` entries
  (0: no cache), logits for the last `head_rows` slots only."""
  import jax
  import jax.numpy as jnp

  from setdiff_jax.sampling.cache import as_forward, cache_seq_axis, empty_cache

  fwd = as_forward(model, params)
  tokens = jnp.zeros((batch, slots), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(slots, dtype=jnp.int32) % seq_len, (batch, slots))
  head_start = slots - head_rows
  kv = None
  if cache_len:
    one = jax.eval_shape(
      lambda: fwd.apply(
        fwd.params, tokens[:, :1], positions[:, :1], jnp.ones((batch, 1, 1), bool), None, 1
      )
    )[1]
    kv = empty_cache(one, cache_len, cache_seq_axis(fwd)).kv
  mask = jnp.ones((batch, slots, cache_len + slots), bool)
  call = jax.jit(fwd.apply, static_argnums=5)
  cost = call.lower(fwd.params, tokens, positions, mask, kv, head_start).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float((cost or {}).get("flops", 0.0))


def _time(fn: Callable, repeats: int):
  t0 = time.perf_counter()
  out = fn()
  first = time.perf_counter() - t0
  runs, cpus = [], []
  for _ in range(max(repeats, 1)):
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    runs.append(time.perf_counter() - t0)
    cpus.append(time.process_time() - c0)
  run = statistics.median(runs)
  return out, run, max(first - min(runs), 0.0), statistics.median(cpus)


def main(argv):
  del argv
  import jax
  import numpy as np

  from setdiff_jax.sampling import (
    CommitPolicy,
    SamplerConfig,
    ar_generate,
    bd3lm_generate,
    mdlm_generate,
    reference_generate,
    set_generate,
  )

  model, params, seq_len, ids, desc = build_model()
  n = FLAGS.max_new_tokens or seq_len - 1
  base = SamplerConfig(
    **ids, max_new_tokens=n, max_length=seq_len, stop_at_eos=False, greedy=True, seed=FLAGS.seed
  )
  print(
    f"model: {desc}; backend {jax.default_backend()} ({jax.device_count()} devices); "
    f"prompt = BOS, N = {n}"
  )
  taus = [None if t == "off" else float(t) for t in FLAGS.thresholds]
  rows: List[dict] = []

  from benchmarks import training  # the matmul peak probe

  peak = FLAGS.peak_gflops or training.matmul_peak_gflops()

  def bench(name, fn, cfg, batch, shape):
    """shape: (slots, cache_len, head_rows) of one step's model call (see step_flops)."""
    prompts = [[ids["bos_token_id"]]] * batch
    out, run, compile_s, cpu_s = _time(lambda: fn(model, params, prompts, cfg), FLAGS.repeats)
    steps = max(int(np.max(out.forward_calls)), 1)  # loop iterations (every row runs each one)
    flops = step_flops(model, params, seq_len, *shape, batch)
    gflops = flops * steps / run / 1e9
    row = dict(
      name=name,
      batch=batch,
      tok_s=out.num_generated / run,
      run_s=run,
      compile_s=compile_s,
      calls=float(np.mean(out.forward_calls)),
      tps=out.tokens_per_step,
      tokens=out.num_generated,
      ms_step=1e3 * run / steps,
      cpu_ms_step=1e3 * cpu_s / steps,
      step_gflop=flops / 1e9,
      gflops=gflops,
      mfu=gflops / peak,
    )
    rows.append(row)
    print(
      f"  {name:<26} B={batch:<3} {row['tok_s']:9.1f} tok/s  run {run:7.2f} s  "
      f"compile {compile_s:6.1f} s  calls/row {row['calls']:6.1f}  tok/step {row['tps']:5.2f}",
      flush=True,
    )

  for batch in [int(b) for b in FLAGS.batch_sizes]:
    for w in [int(x) for x in FLAGS.windows]:
      for tau in taus:
        cfg = base.replace(window=w, policy=CommitPolicy("threshold", tau))
        pending = 1 if tau is None else w
        if "set" in FLAGS.samplers:
          bench(
            f"set {cfg.setting.name}",
            set_generate,
            cfg,
            batch,
            (pending + w, seq_len + w, w),
          )
        if "set_nocache" in FLAGS.samplers and str(w) in FLAGS.nocache_windows:
          bench(
            f"set-nocache {cfg.setting.name}",
            reference_generate,
            cfg,
            batch,
            (seq_len + w, 0, w),
          )
    s_, g = FLAGS.block_size, min(FLAGS.mdlm_block, n)
    # The baselines' rows: (--samplers name, label, sampler, config, one step's call shape).
    for sampler, label, fn, cfg, shape in (
      ("bd3lm", f"bd3lm S={s_}", bd3lm_generate, base.replace(block_size=s_), (s_, seq_len, s_)),
      (
        "mdlm",
        f"mdlm G={FLAGS.mdlm_block}",
        mdlm_generate,
        base.replace(block_size=FLAGS.mdlm_block),
        (seq_len, 0, g),
      ),
      ("ar", "ar", ar_generate, base, (1, seq_len, 1)),
    ):
      if sampler in FLAGS.samplers:
        bench(label, fn, cfg, batch, shape)

  print(
    f"\nload average {os.getloadavg()[0]:.2f}; median of {FLAGS.repeats} timed run(s); "
    "ms/step = run time / forward calls of the longest row; cpu = process CPU time"
  )
  source = "--peak_gflops" if FLAGS.peak_gflops else "2048^3 fp32 matmul probe"
  print(f"peak {peak:.1f} GFLOP/s ({source}); GFLOP/step = XLA FLOPs of one step's model call")
  print(
    "| sampler | batch | tokens/s | x batch 1 | run s | ms / step | cpu ms / step | "
    "compile s | forward calls/row | tokens/step | GFLOP/step | GFLOP/s | MFU |"
  )
  print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
  by = {(r["name"], r["batch"]): r for r in rows}
  for r in rows:
    one = by.get((r["name"], 1))
    scale = f"{r['tok_s'] / one['tok_s']:.2f}" if one else "-"
    print(
      f"| {r['name']} | {r['batch']} | {r['tok_s']:.1f} | {scale} | {r['run_s']:.2f} | "
      f"{r['ms_step']:.2f} | {r['cpu_ms_step']:.2f} | {r['compile_s']:.1f} | "
      f"{r['calls']:.1f} | {r['tps']:.2f} | {r['step_gflop']:.3f} | {r['gflops']:.1f} | "
      f"{100 * r['mfu']:.0f} % |"
    )
  print()
  for (name, batch), r in by.items():
    if name.startswith("set-nocache"):
      cached = by.get((name.replace("set-nocache", "set"), batch))
      if cached:
        print(
          f"cached / no-cache speed ratio, {name[12:]} B={batch}: "
          f"{cached['tok_s'] / r['tok_s']:.1f}x"
        )


if __name__ == "__main__":
  cli.run(main)
