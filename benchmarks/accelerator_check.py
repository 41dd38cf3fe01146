"""The prepared accelerator check: one command on one GPU or TPU host, bounded in time, one table.

  python -m benchmarks.accelerator_check --output_dir=OUT        # accelerator host, <= 7 min
  python -m benchmarks.accelerator_check --tiny --output_dir=OUT  # every section, CPU
  python -m benchmarks.accelerator_check --output_dir=OUT --official=/tmp/setdlms \
      --official_python=/tmp/setdlms_venv/bin/python              # + the official code

Always finishes, always reports. Each section runs in its own child process (its own process
group), one at a time, with a time limit (--timeouts, and never past --budget_s of the whole run);
a section that overruns is killed and recorded as cut, with the rows it finished. A section that
fails records its error; the others run on. Before anything runs the plan is printed: the sections
in priority order with their limits; those whose limits fit in the budget after the earlier ones'
always start, the later ones only with the time earlier sections leave (at least MIN_START_S).
Sections, in priority order (a short lease measures what matters first):

  device        device kind and count, backend, jax version, the published bf16 peak (PEAKS), the
                measured device copy bandwidth (the decoding memory floor) and a bf16 matmul.
  train         the lm1b_sw SetDLM step (12 x 768 DiT, L = 128, V = 30,522, bf16 compute, dropout
                0.1, batch --train_batch): ms/step, clean tok/s, MFU = model FLOPs / step time /
                the published peak; then SetDLM and AR at batch 128 (the official rows, with
                their MFU too); then a `jax.profiler` trace of the first step summarised per op
                class (matmuls, attention, layer norms, head + loss, optimizer, copies + casts,
                RNG + order sampling, elementwise + other). Model FLOPs (benchmarks/step_flops.py,
                not XLA's count, which credits the masked-out attention pairs): what the method's
                loss makes the backbone compute, e.g. SetDLM
                  6 B (P_token * 2L  +  D V * L)  +  12 layers D B * pairs
                (every per-slot matmul parameter forward + backward over the 2L two-stream slots,
                the output head over the noisy L only, attention over the (query, key) pairs the
                set-causal mask allows); AR: L - 1 slots, head on all, causal pairs. The parameter
                init (`jax.jit` of the model's own init with out-shardings) is timed and printed.
  decode_dit    KV-cached decoding at the LM1B shapes, batch 1, from BOS, 127 new tokens, greedy,
                tau off: SetDLM S = 4 (W = 4) and AR, fp32 (the official rows), then with bf16
                decoding weights (`decoding.decode_weights`): kept tokens per call, ms per call,
                tok/s, compiled programs, and the memory floor (parameter MiB read per call /
                the device section's copy bandwidth).
  official      (--official=PATH) the official PyTorch code in its own process and python
                (`benchmarks/official.py`'s worker): SetDLM and AR training steps (bf16 autocast,
                AdamW, clip 1.0, batch 128; official_ms_per_step) and KV-cached decoding (SetDLM
                S = 4 and AR, batch 1, fp32, 127 tokens, tau off; official_ms_per_token) at the
                same shapes; the table's ratio column is ours / official. This child initialises
                no JAX backend (the backend comes from the device section), so the torch worker
                has the accelerator's memory to itself.
  decode_qwen3  set vs AR decoding of the same random-init Qwen3 (0.6B shapes: 28 x 1024, 16 / 8
                heads, head_dim 128, MLP 3072, V = 151,936, bf16 compute) from a 32-token prompt,
                N = 128 new tokens, no EOS stop, batch 1 and 64: AR, and SetDLM W = 8 with
                T = N / 4 steps (4 tokens committed per call by the schedule).
  attention     every attention implementation (models/attention.py) on the set-causal (SetDLM)
                and block (BD3LM, S = 4) training masks, 2L slots, forward + backward, bf16 rows
                first, then fp32: max |diff| of the output and the gradients vs fp32 dense, ms.
                An implementation that refuses (cudnn off GPU, or a dtype) records its error.
  levers        the training speed levers (LEVERS, in priority order) against the section's
                own reference row (SetDLM, batch --train_batch, dense attention, fused head over
                vocabulary chunks of 1024): cuDNN attention, the fused head over the whole
                vocabulary, the plain logits head + loss, XLA attention, scan_layers, twice the
                batch. Each: ms/step, tokens/s, speed-up, and where the parameters are the same
                draw the loss after the same steps (same batches and keys) minus the reference's;
                a lever this backend refuses records its error.
  levers_xla    (GPU) the same train row and the batch-1 SetDLM S = 4 decode row under XLA:GPU
                flags (GPU_FLAGS: latency-hiding scheduler, cuBLAS instead of Triton GEMMs,
                command buffers for the loop bodies), in a child with its own XLA_FLAGS.
  stack         a Qwen3-1.7B-shaped layer stack (28 x 2048, V = 1,024) at L = 1024, batch 1,
                bf16: forward + backward ms and the compiled program's memory.

Parameters of the decode and stack models are drawn leaf by leaf (one tiny program per distinct
shape; one program over hundreds of draws compiled for minutes on XLA:GPU); the time is printed.

Output (--output_dir, a new folder or one without results: a second run into it is refused; few
files: a device run brings back at most 8): results.jsonl (the plan, then one line per row, appended
by the section's child the moment it is measured, and one per section), results.json and table.md
(rewritten after every section; table.md is also printed), check.log (the children's output),
train_trace.json.gz (the profiled steps). SIGTERM or SIGINT to the driver (a `timeout`, a lease
ending) kills the running section's process group, records it as cut and writes the table of what
there is. --tiny shrinks every shape (CPU); --sections picks sections (the order stays the
priority order).
"""

from __future__ import annotations

import argparse
import collections
import functools
import glob
import gzip
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

if __name__ == "__main__" and not __package__:  # a file run cannot import configs/, benchmarks/
  sys.exit("error: run it from the repository root as `python -m benchmarks.accelerator_check`")

from benchmarks import section_runner  # noqa: E402

ROOT = section_runner.ROOT

SECTIONS = (
  "device",
  "train",
  "decode_dit",
  "official",
  "decode_qwen3",
  "attention",
  "levers",
  "levers_xla",
  "stack",
)
TEST_SECTIONS = ("sleep",)  # test-only: overruns its limit (the time bound's test)
# Per-section limits, seconds: (accelerator, --tiny on a shared CPU). On an accelerator the first
# six add up to the default budget, 420 s (a 15-minute lease: 1-2 min start, the run script's
# setup, the check, the files back), so each of them starts; levers, levers_xla and stack run only
# on what the earlier sections leave. Each limit includes its child's start (imports, the JAX
# client: about 10 s); the estimates behind them, on an H100 / H200: device 15 s; train 3 rows x
# (compile 20-30 s + steps) + init + profile ~110 s; decode_dit 4 rows x ~12 s; official (torch
# worker start ~15 s, 2 train + 2 decode works) ~55 s; decode_qwen3 4 rows x ~15 s; attention
# 40 small programs, bf16 (cuDNN's) first.
TIMEOUTS = {
  "device": (30, 90),
  "train": (140, 300),
  "decode_dit": (60, 240),
  "official": (80, 300),
  "decode_qwen3": (70, 240),
  "attention": (40, 240),
  "levers": (150, 300),
  "levers_xla": (60, 120),
  "stack": (40, 120),
  "sleep": (5, 5),
}
BUDGET_S = (420.0, 1500.0)  # the default --budget_s: (accelerator, --tiny)
MIN_START_S = 20.0  # a section past the plan starts only with this much left (or its whole limit)
# XLA:GPU flags measured by `levers_xla` (its child's environment only; GPU only).
GPU_FLAGS = (
  "--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_triton_gemm=false "
  "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUDNN,CUSTOM_CALL,WHILE,CONDITIONAL"
)
# Each section child's own environment. `official`: its JAX never preallocates (it initialises
# no backend at all unless the device section left no backend name; then it holds the CUDA
# context only), so the torch worker it starts has the accelerator's memory.
SECTION_ENV = {
  "levers_xla": {"XLA_FLAGS": GPU_FLAGS},
  "official": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
}
# Published dense bf16 peaks per chip, TFLOP/s (vendor data sheets, half the sparsity figure).
# A name matches device_kind as whole words ("L4" is not "L40"), and the longest match wins (so
# "H100 PCIe" beats "H100", "TPU v5 lite" beats "TPU v5"). jax's TPU device_kind: v5e "TPU v5
# lite", v5p "TPU v5", v6e "TPU v6 lite".
PEAKS = (
  ("H200", 989.0),
  ("GH200", 989.0),
  ("H100 PCIe", 756.0),
  ("H100 NVL", 835.0),
  ("H100", 989.0),
  ("A100", 312.0),
  ("L40S", 362.0),
  ("L40", 181.0),
  ("L4", 121.0),
  ("A10G", 125.0),
  ("TPU v6 lite", 918.0),
  ("TPU v6e", 918.0),
  ("TPU v5p", 459.0),
  ("TPU v5", 459.0),
  ("TPU v5 lite", 197.0),
  ("TPU v5e", 197.0),
  ("TPU v4", 275.0),
  ("TPU v3", 123.0),
)
# LM1B shapes of the official recipe (DiT 12 x 768, 12 heads, L = 128, bert-base-uncased).
LM1B = dict(num_layers=12, hidden_size=768, num_heads=12, seq_len=128, vocab_size=30522)
TINY = dict(num_layers=1, hidden_size=64, num_heads=2, seq_len=16, vocab_size=512)
OFFICIAL_BATCH = 128


def peak_tflops(kind: str):
  """The published bf16 peak of the PEAKS name that matches `kind` as whole words, the longest
  such name (None if none)."""
  found = [
    (len(name), tf)
    for name, tf in PEAKS
    if re.search(rf"(?<!\w){re.escape(name)}(?!\w)", kind, re.IGNORECASE)
  ]
  return max(found)[1] if found else None


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke run)")
  p.add_argument("--sections", default=",".join(SECTIONS))
  p.add_argument(
    "--output_dir", default="accelerator_check_out", help="a new folder, or one without results"
  )
  p.add_argument(
    "--budget_s",
    type=float,
    default=None,
    help="the whole run's limit (default 420 s; --tiny 1500 s); no section runs past it",
  )
  p.add_argument(
    "--timeouts", default="", help="per-section limits, e.g. train=200,attention=30 (seconds)"
  )
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--train_batch", type=int, default=256)
  p.add_argument("--official", default="", help="the official work tree (kuleshov-group/setdlms)")
  p.add_argument(
    "--official_python",
    default=sys.executable,
    help="python of the official side (torch + transformers 4.x; default: this one)",
  )
  p.add_argument("--child", default="", help=argparse.SUPPRESS)  # internal: run one section
  p.add_argument("--work", default="", help=argparse.SUPPRESS)
  p.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.budget_s is None:
    args.budget_s = BUDGET_S[1 if args.tiny else 0]
  args.limits = section_limits(args.timeouts, args.tiny)
  # Absolute, so that the children (cwd = the repository root) write and read the same folders.
  args.output_dir = os.path.abspath(args.output_dir)
  args.official = os.path.abspath(args.official) if args.official else ""
  if os.sep in args.official_python:  # a path, not a name on PATH
    args.official_python = os.path.abspath(args.official_python)
  return args


def section_limits(timeouts: str, tiny: bool) -> dict:
  """{section: seconds}: TIMEOUTS with --timeouts (NAME=SECONDS,...) applied."""
  limits = {k: v[1 if tiny else 0] for k, v in TIMEOUTS.items()}
  for item in filter(None, (s.strip() for s in timeouts.split(","))):
    name, _, sec = item.partition("=")
    try:
      seconds = float(sec)
    except ValueError:
      seconds = None
    if name not in limits or seconds is None or not seconds > 0:
      raise SystemExit(
        f"error: --timeouts={timeouts!r}: use NAME=SECONDS (SECONDS > 0) with NAME in {SECTIONS}"
      )
    limits[name] = seconds
  return limits


def _median_ms(fn, *args, repeats: int = 3) -> float:
  import jax

  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return 1e3 * statistics.median(times)


def random_params(cfg, seed: int = 0):
  """Random parameters of a backbone config, drawn leaf by leaf (norm scales 1, biases 0, the rest
  N(0, 0.02), fp32): one small program per distinct leaf shape. Returns (params, seconds)."""
  import jax
  import jax.numpy as jnp

  from setdiff_jax import models

  t0 = time.perf_counter()
  shapes = models.param_shapes(cfg)
  leaves, tree = jax.tree_util.tree_flatten_with_path(shapes)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  draws = {}
  out = []
  for (path, leaf), key in zip(leaves, keys):
    name = jax.tree_util.keystr(path)
    if "scale" in name:
      out.append(jnp.ones(leaf.shape, jnp.float32))
    elif "bias" in name:
      out.append(jnp.zeros(leaf.shape, jnp.float32))
    else:
      if leaf.shape not in draws:
        draws[leaf.shape] = jax.jit(
          lambda k, s=leaf.shape: 0.02 * jax.random.normal(k, s, jnp.float32)
        )
      out.append(draws[leaf.shape](key))
  params = jax.block_until_ready(jax.tree_util.tree_unflatten(tree, out))
  return params, time.perf_counter() - t0


def param_bytes(params, skip=("embed",)) -> int:
  """Bytes of the parameters a decoding call reads whole (the embedding table is gathered)."""
  import jax

  return sum(
    x.size * x.dtype.itemsize
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]
    if not any(s in jax.tree_util.keystr(path) for s in skip)
  )


# ----------------------------------------------------------------------------- sections
# Each section: fn(args, emit, left) -> summary dict. emit(table, row) records one row at once;
# left() is the seconds before the section's limit (a row that cannot fit is recorded as skipped).


def section_device(args, emit, left):
  import jax
  import jax.numpy as jnp

  dev = jax.devices()[0]
  n = (1 << 22) if args.tiny else (1 << 29)  # bf16 elements: 8 MiB / 1 GiB
  x = jnp.ones((n,), jnp.bfloat16)
  copy = jax.jit(lambda a: a * 2)
  ms = _median_ms(copy, x, repeats=max(args.repeats, 5))
  gbps = 2 * x.nbytes / (ms / 1e3) / 1e9  # read + write
  m = 512 if args.tiny else 8192
  a = jnp.ones((m, m), jnp.bfloat16)
  mm_ms = _median_ms(jax.jit(lambda a, b: a @ b), a, a, repeats=max(args.repeats, 5))
  return {
    "device_kind": dev.device_kind,
    "device_count": jax.device_count(),
    "backend": jax.default_backend(),
    "jax": jax.__version__,
    "peak_bf16_tflops": peak_tflops(dev.device_kind),
    "copy_gb_per_s": gbps,
    "bf16_matmul_tflops": 2 * m**3 / (mm_ms / 1e3) / 1e12,
    "matmul_n": m,
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
  }


def _train_args(args, objective: str, batch: int, flags=()):
  """The training benchmark's arguments and config; `flags`: extra benchmarks/training.py flags
  (a lever's), after the check's own so they win."""
  from benchmarks import training as tb

  shape = TINY if args.tiny else LM1B
  argv = [
    f"--config={os.path.join(ROOT, 'configs', 'lm1b_sw.py')}",
    f"--objectives={objective}",
    f"--num_layers={shape['num_layers']}",
    f"--hidden_size={shape['hidden_size']}",
    f"--num_heads={shape['num_heads']}",
    f"--seq_len={shape['seq_len']}",
    f"--vocab_size={shape['vocab_size']}",
    f"--batch_size={batch}",
    "--dtype=bfloat16",
    "--dropout=0.1",
    f"--steps={2 if args.tiny else 10}",
    f"--warmup={1 if args.tiny else 2}",
    *flags,
  ]
  bargs = tb.parse_args(argv)
  return bargs, tb.load_config(bargs)


def train_row(args, objective: str, batch: int, flags=()):
  """(row, prep, bargs) of one timed training work (benchmarks/training.py's benchmark, without
  its XLA FLOP count: the row's MFU is of the model FLOPs, `step_flops`; `flags` as in
  `_train_args`)."""
  import jax

  from benchmarks import step_flops
  from benchmarks import training as tb

  bargs, config = _train_args(args, objective, batch, flags)
  t0 = time.perf_counter()
  prep = tb.benchmark(config, objective, bargs, compute_flops=False)
  setup_s = time.perf_counter() - t0
  tb.time_steps(prep, bargs)
  step_s = prep["times"][-1] / bargs.steps
  row = {
    "work": f"train {objective} b{batch} bf16",
    "objective": objective,
    "batch": batch,
    "attention": config.model.attention,
    "head_vocab_chunk": prep["vocab_chunk"] if bargs.fused_head else None,
    "ms_per_step": 1e3 * step_s,
    "tokens_per_s": prep["clean"] / bargs.steps / step_s,
    "compile_s": prep["compile_s"],
    "setup_s": setup_s,
    "loss": prep["loss"],
  }
  flops = step_flops.model_flops(
    prep["state"].params, prep["model_config"], prep["objective_config"], batch, config.seq_len
  )
  peak = peak_tflops(jax.devices()[0].device_kind)
  row["model_tflop_per_step"] = flops / 1e12
  row["tflops"] = flops / step_s / 1e12
  row["mfu"] = flops / step_s / (peak * 1e12 * jax.device_count()) if peak else None
  return row, prep, bargs


def section_train(args, emit, left):
  batches = [("setdlm", 16 if args.tiny else args.train_batch)]
  batches += [(o, 8 if args.tiny else OFFICIAL_BATCH) for o in ("setdlm", "ar")]
  summary, profiled = {}, None
  for i, (objective, batch) in enumerate(batches):
    if left() < 10:
      emit("train", {"objective": objective, "batch": batch, "skipped": "section time spent"})
      continue
    if i == 0:
      summary["init_s"] = init_seconds(args, objective, batch)
    row, prep, bargs = train_row(args, objective, batch)
    emit("train", row)
    if i == 0:  # profiled after the official rows (a diagnosis, after the measurements)
      profiled = (prep, bargs)
    del prep
  if profiled and left() > 20:
    try:
      for prow in profile_rows(*profiled, args):
        emit("profile", prow)
    except Exception as e:  # the profile is a diagnosis: its failure never loses the rows
      emit("profile", {"op_class": "error", "error": f"{type(e).__name__}: {e}"[:300]})
  return summary


def init_seconds(args, objective: str, batch: int) -> float:
  """Seconds of the parameter init alone (jit of the model's own init with out-shardings)."""
  import jax

  from benchmarks import training as tb
  from setdiff_jax import sharding, train_step
  from setdiff_jax.config import run as run_config

  _, config = _train_args(args, objective, batch)
  cfg = config.copy_and_resolve_references()
  cfg.objective, cfg.model.adaln = objective, tb.ADALN[objective]
  cfg = run_config.from_config_dict(cfg)
  model_cfg, _ = run_config.model_and_objective(cfg, tb.fake_tokenizer(cfg.model.vocab_size))
  t0 = time.perf_counter()
  mesh = sharding.make_mesh(cfg.mesh.sizes())
  state, _ = train_step.create_sharded_state(cfg, model_cfg, mesh)
  jax.block_until_ready(state)
  seconds = time.perf_counter() - t0
  print(f"train: parameter init (jit of the model's init) {seconds:.1f} s", flush=True)
  return seconds


# -- the profile: trace events -> HLO instructions -> op classes
PROFILE_CLASSES = (
  "matmuls",
  "attention",
  "layer norms",
  "head + loss",
  "optimizer",
  "copies + casts",
  "RNG + order sampling",
  "elementwise + other",  # GELU, rotary, residual adds, dropout masks, embedding gathers
)
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
  "copy-start",
  "copy-done",
  "convert",
}


def hlo_instructions(text: str) -> dict:
  """{instruction name: (opcodes, op_names)} of a compiled HLO text: the instruction's own
  opcode and source names plus those of the computation it calls (a fusion's body)."""
  bodies = {
    m.group(1): m.group(2) for m in re.finditer(r"\n%?([\w.\-]+) [^\n]*\{\n(.*?)\n\}", text, re.S)
  }
  out = {}
  for name, line in re.findall(r"\n\s+(?:ROOT )?%?([\w.\-]+) = ([^\n]*)", text):
    called = re.search(r"calls=%?([\w.\-]+)", line)
    parts = [line] + ([bodies.get(called.group(1), "")] if called else [])
    ops, names = [], []
    for part in parts:  # the opcode: the first `word(` after `=` (types may be tuples)
      ops += re.findall(r"=[^\n]*?\s([a-z][\w\-]*)\(", part)
      names += re.findall(r'op_name="([^"]+)"', part)
    out[name] = (ops, names)
  return out


_SOFTMAX = {"exp", "reduce_max", "reduce_sum", "sub", "div", "max", "select_n", "broadcast_in_dim"}
_LAYERS = ("attn_qkv", "attn_out", "mlp_in", "mlp_out", "adaln", "cond_", "modulation")


def name_class(op_name: str) -> str:
  """The op class of one source op (an HLO op_name: jit(step)/jvp(DiT)/blocks_3/mlp_in/dot_general;
  the head and the loss run outside the DiT module, in the step's own jvp() scope)."""
  scope, _, prim = op_name.rpartition("/")
  if re.search(r"threefry|sample_order|random_|random_bits", scope):
    return "RNG + order sampling"
  if "jvp(" not in op_name and "transpose(" not in op_name:
    return "optimizer"  # after the gradient: clipping, AdamW, EMA
  if re.search(r"/norm\d*\b|final_norm|layer_?norm", scope):
    return "layer norms"
  if any(s in scope for s in _LAYERS):
    return "matmuls"
  if re.search(r"bqhd|bhqk|attend|attention|softmax|blocks_\d+/jit\(_where\)", scope):
    return "attention"
  if re.search(r"blocks_\d+$", scope) and prim in _SOFTMAX:
    return "attention"  # the scores' softmax, inlined in the block's scope
  if "DiT" not in scope and "Qwen3" not in scope:
    return "head + loss"
  return "elementwise + other"


def op_class(ops: list, names: list) -> str:
  """The op class of one executed instruction: layout-only fusions are copies, else the class
  most of its source ops have (ties: PROFILE_CLASSES order)."""
  body = set(ops[1:]) or set(ops)
  if body and body <= _LAYOUT_OPS:
    return "copies + casts"
  votes = collections.Counter(name_class(n) for n in names)
  if len(votes) > 1:
    votes.pop("elementwise + other", None)  # a fusion's named part wins over its unnamed glue
  if not votes:
    return "elementwise + other"
  best = max(votes.values())
  return next(c for c in PROFILE_CLASSES if votes.get(c) == best)


def jax_version() -> str:
  import jax

  return jax.__version__


def trace_times(trace_dir: str):
  """({instruction name: microseconds}, trace path) of the device events in a jax.profiler trace
  (GPU/TPU: the device streams' kernels, named by their `hlo_op`; CPU: the executed thunks)."""
  found = [
    p
    for pattern in ("*.trace.json.gz", "perfetto_trace.json.gz")
    for p in glob.glob(os.path.join(trace_dir, "**", pattern), recursive=True)
  ]
  if not found:
    raise FileNotFoundError(f"no trace JSON under {trace_dir} (jax {jax_version()})")
  path = found[0]
  events = json.load(gzip.open(path))["traceEvents"]
  pid_names = {
    e["pid"]: e.get("args", {}).get("name", "")
    for e in events
    if e.get("ph") == "M" and e.get("name") == "process_name"
  }
  devices = {p for p, n in pid_names.items() if re.search(r"/device:(GPU|TPU)", n)}
  totals = collections.Counter()
  for e in events:
    if e.get("ph") != "X" or (devices and e.get("pid") not in devices):
      continue
    name = (e.get("args") or {}).get("hlo_op") or e.get("name", "")
    totals[name.split(":")[0].strip()] += float(e.get("dur", 0.0))
  return totals, path


def profile_rows(prep, bargs, args):
  """One row per op class: ms per step from a traced run of the compiled step (module doc)."""
  import jax

  from benchmarks import training as tb

  instrs = hlo_instructions(prep["compiled"].as_text())
  steps = bargs.steps
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d, create_perfetto_trace=True):  # (the fallback JSON)
      tb.time_steps(prep, bargs)
    wall = prep["times"][-1]
    times, path = trace_times(d)
    shutil.copy(path, os.path.join(args.output_dir, "train_trace.json.gz"))
  by = collections.Counter()
  for name, us in times.items():
    if name in instrs and instrs[name][0][:1] not in (["while"], ["conditional"], ["call"]):
      # (loops and calls contain other executed instructions: never counted twice)
      by[op_class(*instrs[name])] += us
  total = sum(by.values())
  rows = [
    {
      "op_class": c,
      "ms_per_step": by.get(c, 0.0) / 1e3 / steps,
      "share": by.get(c, 0.0) / total if total else None,
    }
    for c in PROFILE_CLASSES
  ]
  rows.append({"op_class": "step (traced wall)", "ms_per_step": 1e3 * wall / steps, "share": None})
  return rows


def _dit(args, dtype="float32"):
  from setdiff_jax.models.dit import DiT, DiTConfig

  s = TINY if args.tiny else LM1B
  cfg = DiTConfig(
    vocab_size=s["vocab_size"],
    hidden_size=s["hidden_size"],
    num_layers=s["num_layers"],
    num_heads=s["num_heads"],
    dropout=0.0,
    dtype=dtype,
  )
  return DiT(cfg), cfg, s["seq_len"]


def _device_summary(args):
  path = os.path.join(args.work, "device.json") if args.work else ""
  if path and os.path.exists(path):
    return json.load(open(path))
  return {}


def backend(args) -> str:
  """The device section's JAX backend ("gpu", "tpu", "cpu"). Only if that section left none does
  this process initialise a backend to ask (under the official section's SECTION_ENV: no
  preallocation)."""
  known = _device_summary(args).get("backend")
  if known:
    return known
  import jax

  return jax.default_backend()


def decode_row(sampler, model, params, prompts, scfg, repeats: int, rng_seed: int = 0) -> dict:
  """Times one decoding work: a compiling call, then the median of `repeats` calls."""
  import jax
  import numpy as np

  from setdiff_jax.sampling import compiles

  before = compiles.compiled_programs()
  t0 = time.perf_counter()
  out = sampler(model, params, prompts, scfg, jax.random.key(rng_seed))
  cold = time.perf_counter() - t0
  times = []
  for r in range(repeats):
    t0 = time.perf_counter()
    out = sampler(model, params, prompts, scfg, jax.random.key(rng_seed + r + 1))
    times.append(time.perf_counter() - t0)
  sec = statistics.median(times)
  calls = float(np.mean(out.forward_calls))
  return {
    "batch": len(prompts),
    "new_tokens": int(scfg.max_new_tokens),
    # below N where a step budget T < N leaves masks (SPEC §4.2 compaction drops them)
    "generated_per_row": float(out.num_generated) / len(prompts),
    "kept_tokens_per_call": float(np.sum(out.num_committed)) / float(np.sum(out.forward_calls)),
    "tokens_per_s": out.num_generated / sec,
    "ms_per_call": 1e3 * sec / calls,
    "forward_calls": calls,
    "compiled_programs": compiles.compiled_programs() - before,
    "seconds_with_compile": cold,
    "_out": out,
  }


def dit_decode_config(seq_len: int, window=None):
  """The DiT decode rows' sampler config: greedy from BOS, L - 1 new tokens, no EOS stop, tau off
  (`window`: the set sampler's W; None for AR)."""
  from setdiff_jax.sampling import CommitPolicy, SamplerConfig

  base = SamplerConfig(
    mask_token_id=103,
    eos_token_id=102,
    pad_token_id=0,
    bos_token_id=101,
    max_new_tokens=seq_len - 1,
    max_length=seq_len,
    stop_at_eos=False,
    greedy=True,
  )
  return base if window is None else base.replace(window=window, policy=CommitPolicy())


def section_decode_dit(args, emit, left):
  from setdiff_jax import decoding
  from setdiff_jax.sampling import ar_generate, set_generate

  summary = {}
  bw = _device_summary(args).get("copy_gb_per_s")
  fp32 = {}
  for weights in ("float32", "bfloat16"):
    model, cfg, seq_len = _dit(args, weights)
    params, init_s = random_params(cfg)
    summary.setdefault("init_s", init_s)
    params = decoding.decode_weights(params, weights)
    nbytes = param_bytes(params)
    for name, tag, sampler, scfg in (
      ("setdlm S=4", "setdlm4", set_generate, dit_decode_config(seq_len, window=4)),
      ("ar", "ar", ar_generate, dit_decode_config(seq_len)),
    ):
      if left() < 10:
        emit("decode_dit", {"sampler": name, "weights": weights, "skipped": "section time spent"})
        continue
      row = decode_row(sampler, model, params, [[101]], scfg, args.repeats)
      out = row.pop("_out")
      row = {
        "work": f"decode {tag} b1 {'fp32' if weights == 'float32' else 'bf16 weights'}",
        "sampler": name,
        "weights": weights,
        **row,
      }
      row["weight_mib_per_call"] = nbytes / 2**20
      if bw:
        row["floor_ms"] = nbytes / (bw * 1e9) * 1e3
        row["x_floor"] = row["ms_per_call"] / row["floor_ms"]
      if weights == "float32":
        fp32[name] = out
      else:  # bf16 weights: do the tokens stay those of fp32?
        ref = fp32.get(name)
        if ref is not None:
          same = sum(a == b for a, b in zip(ref.generated[0], out.generated[0]))
          row["tokens_equal_fp32"] = f"{same}/{len(ref.generated[0])}"
      emit("decode_dit", row)
  return summary


def section_decode_qwen3(args, emit, left):
  import numpy as np

  from setdiff_jax import models
  from setdiff_jax.models.qwen3 import Qwen3Config
  from setdiff_jax.sampling import SamplerConfig, ar_generate, set_generate

  shape = (
    dict(
      vocab_size=512,
      hidden_size=64,
      num_layers=2,
      num_heads=4,
      num_kv_heads=2,
      head_dim=16,
      intermediate_size=128,
    )
    if args.tiny
    else dict(
      vocab_size=151936,
      hidden_size=1024,
      num_layers=28,
      num_heads=16,
      num_kv_heads=8,
      head_dim=128,
      intermediate_size=3072,
    )
  )
  cfg = Qwen3Config(dtype="bfloat16", **shape)
  model = models.build(cfg)
  params, init_s = random_params(cfg)
  print(f"decode_qwen3: parameters drawn leaf by leaf in {init_s:.1f} s", flush=True)
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
  rng = np.random.default_rng(0)
  for batch in (1, 8 if args.tiny else 64):
    prompts = [list(rng.integers(1, mask_id, plen)) for _ in range(batch)]
    for name, sampler, scfg in runs:
      if left() < 15:
        emit("decode_qwen3", {"sampler": name, "batch": batch, "skipped": "section time spent"})
        continue
      row = decode_row(sampler, model, params, prompts, scfg, args.repeats)
      row.pop("_out")
      emit("decode_qwen3", {"sampler": name, **row})
  return {"model": "qwen3 tiny" if args.tiny else "qwen3-0.6B-shaped random init", "init_s": init_s}


@functools.lru_cache(maxsize=None)
def _attention_program():
  import jax

  from setdiff_jax.models import attention

  @functools.partial(jax.jit, static_argnums=(5,))
  def run(q, k, v, w, m, impl):
    out, vjp = jax.vjp(lambda q, k, v: attention.attend(q, k, v, m, impl), q, k, v)
    return out, vjp(w)

  return run


def _attention_fwd_bwd(q, k, v, w, m, impl):
  """The output and the gradients of sum(w * out) wrt q, k, v (one jitted program per impl)."""
  return _attention_program()(q, k, v, w, m, impl)


def section_attention(args, emit, left):
  import jax
  import jax.numpy as jnp

  from setdiff_jax.diffusion import masks
  from setdiff_jax.models import attention

  lengths, heads, dh = ((16,), 2, 8) if args.tiny else ((128, 1024), 8, 64)
  cases = {}
  for dtype in ("bfloat16", "float32"):
    for length in lengths:
      b, s = (2 if args.tiny else (16 if length <= 128 else 2)), 2 * length
      for kind in ("set", "block"):
        if (length, kind) not in cases:  # inputs and the fp32 dense reference
          static = (
            masks.set_causal_mask(length) if kind == "set" else masks.block_causal_mask(length, 4)
          )
          xs = [
            jax.random.normal(x, (b, s, heads, dh)) for x in jax.random.split(jax.random.key(0), 4)
          ]
          dense = jnp.asarray(static)[None] & masks.two_stream_padding(jnp.ones((b, length), bool))
          cases[(length, kind)] = (static, xs, dense, None)
        static, xs, dense, ref = cases[(length, kind)]
        for impl in attention.IMPLEMENTATIONS:
          row = {"dtype": dtype, "L": length, "mask": kind, "batch": b, "impl": impl}
          if left() < 5:
            emit("attention", {**row, "skipped": "section time spent"})
            continue
          try:
            if ref is None:  # fp32 dense: the reference of every row
              ref = _attention_fwd_bwd(*xs, attention.with_tiles(dense, static, "dense"), "dense")
              cases[(length, kind)] = (static, xs, dense, ref)
            q, k, v, w = [x.astype(dtype) for x in xs]
            m = attention.with_tiles(dense, static, impl)
            out, grads = _attention_fwd_bwd(q, k, v, w, m, impl)
            f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
            row["max_abs_diff_out"] = float(jnp.max(jnp.abs(f32(out) - ref[0])))
            row["max_abs_diff_grad"] = max(
              float(jnp.max(jnp.abs(f32(a) - r))) for a, r in zip(grads, ref[1])
            )
            row["fwd_bwd_ms"] = _median_ms(
              _attention_fwd_bwd, q, k, v, w, m, impl, repeats=args.repeats
            )
          except Exception as e:  # an implementation this backend or dtype lacks: why
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
          emit("attention", row)
  return {}


def section_stack(args, emit, left):
  import jax
  import jax.numpy as jnp
  import numpy as np

  from setdiff_jax import models
  from setdiff_jax.models.qwen3 import Qwen3Config

  if args.tiny:
    cfg = Qwen3Config(
      dtype="bfloat16",
      vocab_size=512,
      hidden_size=64,
      num_layers=2,
      num_heads=4,
      num_kv_heads=2,
      head_dim=16,
      intermediate_size=128,
    )
  else:
    cfg = Qwen3Config(
      dtype="bfloat16",
      vocab_size=1024,
      hidden_size=2048,
      num_layers=28,
      num_heads=16,
      num_kv_heads=8,
      head_dim=128,
      intermediate_size=6144,
    )
  length = 64 if args.tiny else 1024
  model = models.build(cfg)
  params, init_s = random_params(cfg)
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
  emit(
    "stack",
    {
      "layers": cfg.num_layers,
      "hidden": cfg.hidden_size,
      "L": length,
      "batch": 1,
      "init_s": init_s,
      "compile_s": compile_s,
      "fwd_bwd_ms": _median_ms(compiled, params, repeats=args.repeats),
      "compiled_memory_gib": None if total is None else total / 2**30,
    },
  )
  return {}


def section_official(args, emit, left):
  """The official code's works (benchmarks/official.py's worker, its own python)."""
  import numpy as np

  from benchmarks import official as off
  from benchmarks import training as tb

  if not args.official:
    return {"skipped": "no --official=PATH (the official work tree)"}
  shape = TINY if args.tiny else LM1B
  batch = 8 if args.tiny else OFFICIAL_BATCH
  device = "cuda" if backend(args) == "gpu" else "cpu"
  argv = [
    f"--official_dir={args.official}",
    f"--official_python={args.official_python}",
    f"--device={device}",
    "--train_precision=bf16",
    f"--num_layers={shape['num_layers']}",
    f"--hidden_size={shape['hidden_size']}",
    f"--num_heads={shape['num_heads']}",
    f"--seq_len={shape['seq_len']}",
    f"--vocab_size={shape['vocab_size']}",
    f"--batch_size={batch}",
    f"--steps={2 if args.tiny else 10}",
    f"--warmup={1 if args.tiny else 3}",
  ]
  oargs = off.parse_args(argv)
  worker = off.OfficialWorker(oargs, argv)
  tmp = tempfile.mkdtemp(prefix="acc_official_")
  try:
    info = worker("info")
    off.check_official_env(info, oargs.official_python)
    print(f"official: {info}", flush=True)
    for method in ("setdlm", "ar"):
      if left() < 20:
        emit("official", {"work": f"train {method} b{batch} bf16", "skipped": "section time spent"})
        continue
      _, config = _train_args(args, method, batch)
      host = tb.random_batches(config, 4, 0)
      path = os.path.join(tmp, f"{method}.npz")
      arrays = {f"tokens{i}": b["tokens"] for i, b in enumerate(host)}
      arrays.update({f"mask{i}": b["attention_mask"] for i, b in enumerate(host)})
      np.savez(path, n=len(host), **arrays)
      clean = worker("prepare_train", name=method, batches=path)["clean"]
      res = worker("time_train", name=method)
      emit(
        "official",
        {
          "work": f"train {method} b{batch} bf16",
          "official_tokens_per_s": clean * oargs.steps / res["seconds"],
          "official_ms_per_step": 1e3 * res["seconds"] / oargs.steps,
          "official_loss": res["loss"],
        },
      )
    for work, tag in (("set4", "setdlm4"), ("ar", "ar")):
      if left() < 20:
        emit("official", {"work": f"decode {tag} b1 fp32", "skipped": "section time spent"})
        continue
      worker("prepare_decode", name=work)
      runs = [worker("time_decode", name=work) for _ in range(max(1, min(args.repeats, 3)))]
      rate = statistics.median(r["tokens"] / r["seconds"] for r in runs)
      emit(
        "official",
        {
          "work": f"decode {tag} b1 fp32",
          "official_tokens_per_s": rate,
          "official_ms_per_token": 1e3 / rate,
        },
      )
  finally:
    worker.close()
    shutil.rmtree(tmp, ignore_errors=True)
  return {"official": {k: info[k] for k in ("torch", "transformers", "python")}, "device": device}


# The training levers, in priority order: (name, benchmarks/training.py flags, batch factor,
# same parameter draw as the reference). scan_layers draws its stacked parameters differently, and
# twice the batch sees other rows, so neither has a comparable loss.
LEVERS = (
  ("cudnn attention", ("--attention=cudnn",), 1, True),
  ("head over the whole vocabulary", ("--head_vocab_chunk=0",), 1, True),
  ("logits head + loss", ("--fused_head=0",), 1, True),
  ("xla attention", ("--attention=xla",), 1, True),
  ("scan_layers", ("--scan_layers",), 1, False),
  ("batch x2", (), 2, False),
)
REFERENCE_LEVER = "reference"


def lever_row(args, emit, table, lever, flags=(), factor=1, comparable=True, base_work=None):
  """One training row of `lever` in `table`, paired with the row named `base_work`; a lever this
  backend refuses records why. Returns the row's `work` (None if refused)."""
  batch = (16 if args.tiny else args.train_batch) * factor
  row = {"lever": lever, "objective": "setdlm", "flags": " ".join(flags)}
  if factor != 1:
    row["flags"] = f"--batch_size={batch}"
  try:
    trow, prep, _ = train_row(args, "setdlm", batch, flags)
    del prep
  except Exception as e:  # cudnn off GPU, a dtype it refuses: the reason is the result
    emit(table, {**row, "error": f"{type(e).__name__}: {e}"[:300]})
    return None
  work = trow.pop("work")
  if base_work is None:  # the levers' own reference: ratios pair within one section
    emit(table, {**row, "work": f"levers {work}", **trow})
  else:
    emit(table, {**row, "base_work": base_work, "loss_comparable": comparable, **trow})
  return work


def section_levers(args, emit, left):
  work = lever_row(args, emit, "levers", REFERENCE_LEVER)
  if work is None:
    return {"error": "the reference training row failed (check.log)"}
  for name, flags, factor, comparable in LEVERS:
    if left() < 15:
      emit("levers", {"lever": name, "skipped": "section time spent"})
      continue
    lever_row(args, emit, "levers", name, flags, factor, comparable, base_work=f"levers {work}")
  return {}


def decode_lever_row(args, emit, table: str):
  """The batch-1 SetDLM S = 4 fp32 decode row, for a lever (XLA:GPU flags)."""
  from setdiff_jax.sampling import set_generate

  model, cfg, seq_len = _dit(args)
  params, _ = random_params(cfg)
  scfg = dit_decode_config(seq_len, window=4)  # the decode_dit row it is paired with
  drow = decode_row(set_generate, model, params, [[101]], scfg, args.repeats)
  drow.pop("_out")
  emit(table, {"lever": table, "base_work": "decode setdlm4 b1 fp32", **drow})


def section_levers_xla(args, emit, left):
  import jax

  if jax.default_backend() != "gpu":
    return {"skipped": "XLA:GPU flags (a GPU backend only)"}
  table = "xla gpu flags"
  batch = 16 if args.tiny else args.train_batch
  if left() > 15:  # paired with the levers' reference row, else the train section's
    lever_row(args, emit, table, table, base_work=f"levers train setdlm b{batch} bf16")
  if left() > 15:
    decode_lever_row(args, emit, table)
  return {"xla_flags": os.environ.get("XLA_FLAGS", "")}


def section_sleep(args, emit, left):
  """Test-only: one row (with this child's pid), then sleeps past any limit (the time bound, or a
  signal to the driver, must cut it)."""
  emit("sleep", {"slept": 0, "pid": os.getpid()})
  time.sleep(3600)
  return {}


RUNNERS = {
  "device": section_device,
  "train": section_train,
  "decode_dit": section_decode_dit,
  "official": section_official,
  "decode_qwen3": section_decode_qwen3,
  "attention": section_attention,
  "levers": section_levers,
  "levers_xla": section_levers_xla,
  "stack": section_stack,
  "sleep": section_sleep,
}


# ----------------------------------------------------------------------------- driver
# The check's own files in --output_dir: a folder holding any of them is refused.
RESULT_FILES = ("results.jsonl", "results.json", "table.md", "check.log", "train_trace.json.gz")


def section_order(sections: str) -> list:
  """The sections asked for, in priority order, `device` always first (the others read it)."""
  wanted = [s.strip() for s in sections.split(",") if s.strip()]
  bad = [s for s in wanted if s not in SECTIONS + TEST_SECTIONS]
  if bad:
    raise SystemExit(f"error: --sections={sections!r}: unknown {bad}; choose from {SECTIONS}")
  return [s for s in SECTIONS + TEST_SECTIONS if s in wanted or s == "device"]


def child_argv(args) -> list:
  """The arguments every section child gets (paths already absolute)."""
  argv = [
    f"--output_dir={args.output_dir}",
    f"--repeats={args.repeats}",
    f"--train_batch={args.train_batch}",
    f"--official={args.official}",
    f"--official_python={args.official_python}",
  ]
  return argv + (["--tiny"] if args.tiny else [])


def next_section(runner, name: str, args, elapsed: float) -> dict:
  """Runs section `name` within what is left of the budget, or records why it did not start."""
  left = args.budget_s - elapsed
  if runner.stop.signum:
    status = f"not started: {runner.stop.reason()}"
  elif left < min(args.limits[name], MIN_START_S):
    status = f"not started: --budget_s={args.budget_s:g} spent ({max(left, 0):.0f} s left)"
  else:
    return runner.run(name, min(args.limits[name], left))
  return {"section": name, "status": status, "seconds": 0.0, "summary": {}, "rows": []}


def write_report(results: dict, output_dir: str) -> str:
  """results.json and table.md of what there is (after every section); returns the table."""
  with_ratios(results)
  table = markdown(results)
  with open(os.path.join(output_dir, "results.json"), "w") as f:
    json.dump(results, f, indent=1, default=float)
  with open(os.path.join(output_dir, "table.md"), "w") as f:
    f.write(table + "\n")
  return table


def with_ratios(results: dict) -> None:
  """Adds ours and ours / official to the official rows, matching ours by `work`, and to each
  lever row its speed-up (tokens/s) and, where comparable, loss difference against the reference
  row it names."""
  ours, base = {}, {}
  for name, res in results.items():
    if name != "official":
      for r in res["rows"]:
        if "work" in r and "tokens_per_s" in r:
          ours[r["work"]] = r["tokens_per_s"]
          base[r["work"]] = r
  for name in ("levers", "levers_xla"):
    for r in results.get(name, {}).get("rows", []):
      work = r.get("base_work") or ""
      # the levers' own reference row, else (levers not run) the train section's
      ref = base.get(work) or base.get(work.removeprefix("levers "))
      if ref and r.get("tokens_per_s"):
        r["speedup"] = r["tokens_per_s"] / ref["tokens_per_s"]
        if r.get("loss_comparable", True) and "loss" in r and "loss" in ref:
          r["loss_minus_base"] = r["loss"] - ref["loss"]
  for r in results.get("official", {}).get("rows", []):
    if r.get("work") in ours:
      r["ours_tokens_per_s"] = ours[r["work"]]
      if r.get("official_tokens_per_s"):
        r["ours_over_official"] = ours[r["work"]] / r["official_tokens_per_s"]


def _cell(x) -> str:
  if x is None:
    return "-"
  if isinstance(x, bool):
    return str(x)
  if isinstance(x, float):
    if x != x:
      return "nan"
    a = abs(x)
    if a == 0:
      return "0"
    if a >= 1000:
      return f"{x:,.0f}"
    if a >= 1:
      return f"{x:.3g}" if a < 100 else f"{x:.1f}"
    return f"{x:.2e}" if a < 1e-3 else f"{x:.3f}"
  return str(x).replace("|", "/")


def markdown(results: dict) -> str:
  lines = []
  dev = results.get("device", {}).get("summary", {})
  if "device_kind" in dev:
    lines.append(
      f"device: {dev['device_count']} x {dev['device_kind']} ({dev['backend']}), jax {dev['jax']}, "
      f"published bf16 peak {_cell(dev['peak_bf16_tflops'])} TFLOP/s per chip, measured copy "
      f"{_cell(dev['copy_gb_per_s'])} GB/s, bf16 {dev['matmul_n']}^3 matmul "
      f"{_cell(dev['bf16_matmul_tflops'])} TFLOP/s; XLA_FLAGS={dev.get('xla_flags')!r}"
    )
  for name, res in results.items():
    lines.append(f"\n{name}: {res['status']} ({res['seconds']:.0f} s)")
    extra = {k: v for k, v in res["summary"].items() if k not in ("traceback",)}
    if name != "device" and extra:
      lines.append("  " + ", ".join(f"{k} {_cell(v)}" for k, v in extra.items()))
    tables = collections.OrderedDict()
    for r in res["rows"]:
      tables.setdefault(r["table"], []).append(r)
    for table, rows in tables.items():
      cols = []
      for r in rows:
        cols += [k for k in r if k != "table" and k not in cols]
      lines.append(f"\n{table}")
      lines.append("| " + " | ".join(cols) + " |")
      lines.append("| " + " | ".join("---" for _ in cols) + " |")
      lines += ["| " + " | ".join(_cell(r.get(c)) for c in cols) + " |" for r in rows]
  return "\n".join(lines)


def run_sections(args, order) -> tuple:
  """Runs the sections of `order` one at a time (module doc); returns (results, the signal that
  stopped the driver or None)."""
  args.work = tempfile.mkdtemp(prefix="acc_check_")
  start, results = time.perf_counter(), {}
  log = open(os.path.join(args.output_dir, "check.log"), "w")
  try:
    with section_runner.Stop() as stop:
      argv = child_argv(args)
      runner = section_runner.Runner(
        "benchmarks.accelerator_check", argv, args.output_dir, args.work, log, stop, SECTION_ENV
      )
      for name in order:
        res = results[name] = next_section(runner, name, args, time.perf_counter() - start)
        record_section(results, res, args)
        print(
          f"[{time.perf_counter() - start:6.1f} s] {name}: {res['status']} "
          f"({len(res['rows'])} rows, {res['seconds']:.0f} s)",
          flush=True,
        )
  finally:
    log.close()
    shutil.rmtree(args.work, ignore_errors=True)
  return results, stop.signum


def record_section(results: dict, res: dict, args) -> None:
  """A finished (or unstarted) section `res` of `results`: its status line in results.jsonl, the
  report rewritten, and the device section's summary kept for the later sections (device.json)."""
  if res["section"] == "device" and res["summary"]:
    with open(os.path.join(args.work, "device.json"), "w") as f:
      json.dump(res["summary"], f)
  status = {"status": res["status"], "seconds": res["seconds"], **res["summary"]}
  jsonl = os.path.join(args.output_dir, section_runner.RESULTS_JSONL)
  section_runner.append_line(jsonl, {"section": res["section"], **status})
  write_report(results, args.output_dir)


def main(argv=None) -> dict:
  argv = sys.argv[1:] if argv is None else list(argv)
  args = parse_args(argv)
  if args.child:
    section_runner.child_main(args, RUNNERS)
    return {}
  order = section_order(args.sections)
  section_runner.prepare_output_dir(args.output_dir, RESULT_FILES)
  steps = section_runner.plan(order, args.limits, args.budget_s)
  print(section_runner.plan_text(steps, args.budget_s, MIN_START_S), flush=True)
  jsonl = os.path.join(args.output_dir, section_runner.RESULTS_JSONL)
  section_runner.append_line(jsonl, {"plan": steps, "budget_s": args.budget_s})
  start = time.perf_counter()
  results, signum = run_sections(args, order)
  print("\n" + write_report(results, args.output_dir))
  print(f"\ntotal {time.perf_counter() - start:.0f} s (--budget_s {args.budget_s:g})")
  if signum:
    raise SystemExit(128 + signum)
  return results


if __name__ == "__main__":
  main()
