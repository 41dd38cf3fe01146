r"""Side by side with the official PyTorch code (kuleshov-group/setdlms), one process, same config.

  python -m benchmarks.official --official_dir=/tmp/setdlms                    # V = 30522
  python -m benchmarks.official --official_dir=/tmp/setdlms --vocab_size=4096
  python -m benchmarks.official --official_dir=/tmp/setdlms --quick            # tiny harness check
  python -m benchmarks.official --official_dir=/tmp/setdlms --check=align      # block alignment
  python -m benchmarks.official --official_dir=/tmp/setdlms --check=exports    # exports, offline

--check=align|exports are correctness checks, not timings: see benchmarks/official_checks.py.
--device=cuda, --train_precision=bf16 (autocast around the official forward, as Composer's
amp_bf16) and the size flags (--num_layers, --hidden_size, --num_heads, --seq_len, --batch_size)
serve `benchmarks/accelerator_check.py --official=PATH`, which drives this script's worker on an
accelerator at the LM1B shapes.

The official code is never part of this repository: fetch kuleshov-group/setdlms, extract it
outside the repo and point --official_dir at it (benchmarks/README.md, "Side by side with the
official code"). It needs transformers 4.x (its requirements pin 4.52.4; 5.x breaks its model
outputs and KV cache), so it runs in a worker subprocess started with --official_python (a venv
of its own, `VENV_HINT`; one over this environment fails: transformers 4.52 imports the `kernels`
package transformers 5 brought), which imports its own `src` package from --official_dir. Nothing of it is stubbed. The driver (this process,
JAX) asks the worker to time each official work and times ours right after it.

Config (both sides): DiT 4 layers x 256, 4 heads, MLP 4D, L = 128, V = --vocab_size, batch 16,
fp32, dropout 0.1, random tokens in [104, V) with BOS = 101 first (the bert-base-uncased ids:
PAD 0, BOS/CLS 101, EOS/SEP 102, MASK 103), no padding. Works, timed interleaved
(`for round: for work: official, then ours`), medians over --rounds:

* train <method>: one optimizer step = forward + loss + backward + clip (norm 1) + AdamW
  (b = 0.9/0.999, eps 1e-8, wd 0, lr 3e-4) + EMA 0.9999, clean tokens/s = B*L / step time.
  Official: the denoiser class its Hydra config instantiates (`model=setdlm|ar|bd3lm|mdlm`, the
  `run_train_*_lm1b.sh` overrides), called as composer's HuggingFaceModel calls it
  (`model(**batch)`, loss = output.loss) on batches made by its own `DenoisingCollator` (t
  sampled there, outside the timed step, as in its data loader), then `loss.backward()`,
  `clip_grad_norm_`, `torch.optim.AdamW.step` (composer's DecoupledAdamW with wd = 0 is the same
  update) and a `_foreach` EMA (what composer's EMA algorithm does). No torch.compile (its LM1B
  scripts set `training.compile_backbone=false`). torch threads = --threads (default: the cores).
  Ours: `benchmarks/training.py` (`benchmark` -> `train_step.create_sharded_state` /
  `train_step.jit_train_step`, `time_steps`) with the same sizes.
* decode <sampler>: unconditional from BOS, N = L - 1 new tokens, greedy, tau off, no stopping,
  no logits processors, random init (zero output head on both sides, so every step is the same
  work). Official: `SetDLM.generate` (set diffusion generation config, predict-and-noise,
  T = L, W = max_window_size), `BD3LM.generate` (block / T = S = 4, KV cache, fused block cache
  = its default), `AR.generate` (KV cache), `model.eval()` under `torch.no_grad`. Ours:
  `benchmarks/sampling.py` (`_model`, `set_generate` / `bd3lm_generate` / `ar_generate`). The
  official sampler is batch-1 only (it asserts it): its batch-8 figure is its batch-1 rate
  (8 sequential calls), marked with a dagger, not timed separately.

Prints a markdown table work | official | ours | ours/official, the load average before and
after, versions and thread counts. --out=DIR also writes official_speed.json (every round's times)
and .md; --record=NAME publishes that JSON as benchmarks/results/NAME.json (a clean commit on
main, a new name), whose table `python -m setdiff_jax.experiments.publish` puts in docs/results.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import types

HERE = os.path.dirname(os.path.abspath(__file__))
# Files of the official checkout this script drives (relative to --official_dir).
REQUIRED_FILES = (
  "src/backbone/dit.py",
  "src/denoiser/setdlm.py",
  "src/denoiser/bd3lm.py",
  "src/denoiser/mdlm.py",
  "src/denoiser/ar.py",
  "src/denoiser/diffusion.py",
  "src/noise_schedule/noise_schedules.py",
  "src/datasets/collator.py",
)
TRAIN_METHODS = ("setdlm", "ar", "bd3lm", "mdlm")
TITLE = "# Speed against the official code (benchmarks/official.py)"
# What the numbers depend on (git pathspecs; the record's staleness): our training step and
# samplers, and the drivers of both sides.
MEASURED = (
  "setdiff_jax",
  ":(exclude)setdiff_jax/experiments",
  ":(exclude)setdiff_jax/interop",
  ":(exclude)setdiff_jax/rl",
  ":(exclude)setdiff_jax/evaluation",
  "benchmarks/official.py",
  "benchmarks/training.py",
  "benchmarks/sampling.py",
)
# The official code's own venv (benchmarks/README.md, "Side by side with the official code").
VENV_HINT = (
  "python -m venv /tmp/setdlms_venv && /tmp/setdlms_venv/bin/pip install torch==2.13.0 numpy "
  "einops hydra-core transformers==4.52.4 tokenizers==0.21.4 huggingface_hub==0.36.2"
)
DECODE_WORKS = ("set4", "set8", "bd3lm", "ar", "set4_b8")
PAD_ID, BOS_ID, EOS_ID, MASK_ID = 0, 101, 102, 103  # bert-base-uncased (training.py's ids)
SET_SIZE, BLOCK_SIZE = 4, 4  # SetDLM S (S_max = 2S), BD3LM block S
LR, BETAS, EPS, CLIP, EMA = 3e-4, (0.9, 0.999), 1e-8, 1.0, 0.9999


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument(
    "--official_dir",
    required=True,
    help="extracted kuleshov-group/setdlms checkout (outside this repository)",
  )
  p.add_argument("--vocab_size", type=int, default=30522)
  p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (medians reported)")
  p.add_argument("--steps", type=int, default=5, help="timed training steps per round")
  p.add_argument("--warmup", type=int, default=2, help="untimed training steps (after compile)")
  p.add_argument("--threads", type=int, default=0, help="torch threads (0: the usable cores)")
  p.add_argument("--train", default=",".join(TRAIN_METHODS), help="training works ('' = none)")
  p.add_argument("--decode", default=",".join(DECODE_WORKS), help="decoding works ('' = none)")
  p.add_argument(
    "--quick",
    action="store_true",
    help="tiny shapes (2 x 64, 2 heads, L=16, V=512, B=4), 1 round, 1 step: "
    "checks the harness, not the speed",
  )
  p.add_argument(
    "--official_python",
    default=sys.executable,
    help="python that runs the official side (transformers 4.x; default: this one)",
  )
  p.add_argument("--seed", type=int, default=0)
  p.add_argument(
    "--device", default="cpu", choices=("cpu", "cuda"), help="the official side's torch device"
  )
  p.add_argument(
    "--train_precision",
    default="fp32",
    choices=("fp32", "bf16"),
    help="official training: fp32, or bf16 autocast around the forward (Composer amp_bf16)",
  )
  for name in ("num_layers", "hidden_size", "num_heads", "seq_len", "batch_size"):
    p.add_argument(f"--{name}", type=int, default=None, help="overrides the preset size")
  p.add_argument(
    "--check",
    default="speed",
    choices=("speed", "align", "exports"),
    help="speed: the timed works (default); align: block-alignment parity of the "
    "BD3LM / MDLM samplers; exports: our exports in the official classes "
    "(benchmarks/official_checks.py)",
  )
  p.add_argument(
    "--export_steps",
    type=int,
    default=20,
    help="--check=exports: training steps of the two tiny runs before exporting",
  )
  p.add_argument(
    "--keep_tmp",
    action="store_true",
    help="keep the temporary directory (exports, runs, logs) and print its path",
  )
  p.add_argument("--out", default="", help="write official_speed.json / .md here")
  p.add_argument(
    "--record",
    default=None,
    help="publish the report as the record RESULTS_DIR/RECORD.json: only from a clean commit on "
    "main's history, never over another record (needs --out)",
  )
  p.add_argument(
    "--record_resume", action="store_true", help="--record: replace a re-report of the same commit"
  )
  p.add_argument("--results_dir", default=None, help="where --record writes (benchmarks/results)")
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # internal
  args = p.parse_args(argv)
  args.train = _split(args.train, TRAIN_METHODS, "--train")
  args.decode = _split(args.decode, DECODE_WORKS, "--decode")
  if args.quick:
    args.rounds, args.steps, args.warmup = 1, 1, 1
    args.sizes = dict(
      num_layers=2, hidden_size=64, num_heads=2, seq_len=16, batch_size=4, vocab_size=512
    )
  else:
    args.sizes = dict(
      num_layers=4,
      hidden_size=256,
      num_heads=4,
      seq_len=128,
      batch_size=16,
      vocab_size=args.vocab_size,
    )
  for name in ("num_layers", "hidden_size", "num_heads", "seq_len", "batch_size"):
    if getattr(args, name) is not None:
      args.sizes[name] = getattr(args, name)
  if args.sizes["vocab_size"] <= MASK_ID + 1:
    p.error(
      f"--vocab_size={args.sizes['vocab_size']} must exceed {MASK_ID + 1} (random tokens "
      f"are drawn from [{MASK_ID + 1}, V))"
    )
  if args.rounds < 1 or args.steps < 1 or args.warmup < 0:
    p.error("--rounds and --steps must be >= 1, --warmup >= 0")
  if args.export_steps < 1:
    p.error(f"--export_steps={args.export_steps}: the runs need at least one step to export")
  args.threads = args.threads or len(os.sched_getaffinity(0))
  args.official_dir = check_official_dir(args.official_dir)
  return args


def _split(value: str, allowed, flag: str):
  names = [s.strip() for s in value.split(",") if s.strip()]
  bad = [n for n in names if n not in allowed]
  if bad:
    raise SystemExit(f"{flag}: {bad} not in {list(allowed)}")
  return names


def check_official_dir(path: str) -> str:
  """The absolute path of an official checkout, or SystemExit naming what is missing and the fix."""
  fix = (
    "fetch kuleshov-group/setdlms and extract it outside this repository, e.g. "
    "`git -C <mirror> archive HEAD | tar -x -C /tmp/setdlms`, then pass "
    "--official_dir=/tmp/setdlms (benchmarks/README.md, 'Side by side with the official code')"
  )
  path = os.path.abspath(os.path.expanduser(path))
  if not os.path.isdir(path):
    raise SystemExit(f"--official_dir={path}: no such directory; {fix}")
  repo = os.path.dirname(HERE)
  if os.path.commonpath([path, repo]) == repo:
    raise SystemExit(
      f"--official_dir={path} is inside this repository ({repo}); extract the "
      "official code elsewhere (it must never be committed here)"
    )
  missing = [f for f in REQUIRED_FILES if not os.path.isfile(os.path.join(path, f))]
  if missing:
    raise SystemExit(
      f"--official_dir={path} lacks {', '.join(missing)}: not a setdlms checkout; {fix}"
    )
  return path


def work_label(kind: str, name: str) -> str:
  if kind == "train":
    return {
      "setdlm": f"SetDLM train step (S={SET_SIZE}, S_max={2 * SET_SIZE})",
      "ar": "AR train step",
      "bd3lm": f"BD3LM-{BLOCK_SIZE} train step",
      "mdlm": "MDLM train step",
    }[name] + " (clean tok/s)"
  return {
    "set4": "set W=4 decoding, batch 1, tau off (tok/s)",
    "set8": "set W=8 decoding, batch 1",
    "bd3lm": f"BD3LM-{BLOCK_SIZE} decoding, batch 1",
    "ar": "AR decoding (KV cache), batch 1",
    "set4_b8": "set W=4 decoding, batch 8",
  }[name]


def markdown(rows) -> str:
  """rows: dicts with work, official (tok/s or None), ours, and optional mark for official."""
  lines = ["| work | official | ours | ours / official |", "| --- | ---: | ---: | ---: |"]
  for r in rows:
    off, ours = r.get("official"), r.get("ours")
    off_s = "–" if off is None else f"{off:,.0f}{r.get('mark', '')}"
    ours_s = "–" if ours is None else f"{ours:,.0f}"
    ratio = "–" if not off or ours is None else f"{ours / off:.2f}"
    lines.append(f"| {r['work']} | {off_s} | {ours_s} | {ratio} |")
  return "\n".join(lines)


# ----------------------------------------------------------------------------- official side


def import_official(path: str):
  """Import the official `src` package from `path` (appended to sys.path: ours wins any clash)."""
  if path not in sys.path:
    sys.path.append(path)
  import src  # noqa: F401  (the official package)

  src_dir = os.path.dirname(os.path.abspath(src.__file__))
  if os.path.commonpath([src_dir, path]) != path:
    raise SystemExit(
      f"`import src` resolved to {src_dir}, not {path}/src: another `src` package "
      "shadows the official one; run from a clean environment"
    )
  from src.denoiser import ar, diffusion  # noqa: F401

  return types.SimpleNamespace(ar=ar, diffusion=diffusion)


def official_tokenizer():
  """What the denoisers, their generate and the collator read from a tokenizer."""
  return types.SimpleNamespace(
    mask_token_id=MASK_ID,
    bos_token_id=BOS_ID,
    pad_token_id=PAD_ID,
    eos_token_id=EOS_ID,
    cls_token_id=BOS_ID,
    padding_side="right",
  )


def official_model(mods, method: str, sizes: dict):
  """The denoiser the official Hydra config builds for `method` (LM1B scripts' overrides)."""
  L, V = sizes["seq_len"], sizes["vocab_size"]
  block = BLOCK_SIZE if method == "bd3lm" else L  # Hydra `block_size` (backbone + collator)
  backbone = {
    "_target_": "src.backbone.dit.DIT",
    "length": L,
    "causal_attention": method == "ar",
    "adaln": method in ("mdlm", "bd3lm"),
    "hidden_size": sizes["hidden_size"],
    "cond_dim": 128,
    "n_heads": sizes["num_heads"],
    "num_layers": sizes["num_layers"],
    "dropout": 0.1,
    "tie_word_embeddings": True,
    "attn_backend": "sdpa",
    "vocab_size": V,
    "block_size": block,
    "pretrained_model_name_or_path": None,
  }
  tok_cfg = {
    "vocab_size": V,
    "mask_token_id": MASK_ID,
    "bos_token_id": BOS_ID,
    "pad_token_id": PAD_ID,
    "eos_token_id": EOS_ID,
    "pad_vocab_size_multiple": 1,
  }
  common = dict(
    length=L,
    backbone_config=backbone,
    tokenization_config=tok_cfg,
    tokenizer_name="bert-base-uncased",
    attn_backend="sdpa",
    train_on_context=False,
  )
  d = mods.diffusion
  if method == "ar":
    return mods.ar.AR(mods.ar.ARConfig(**common), tokenizer=official_tokenizer()), block
  if method == "setdlm":
    noise = {
      "_target_": "src.noise_schedule.noise_schedules.StaggeredNoise",
      "eps": 1e-3,
      "block_size": L,
      "desired_block_size": SET_SIZE,
      "max_block_size": 2 * SET_SIZE,
      "length": L,
    }
    cfg = d.BD3LMConfig(
      block_size=L,
      eval_block_size=L,
      keep_clean_bos=True,
      setdlm_eos_last_in_target_order=False,
      noise_config=noise,
      **common,
    )
    return d.SetDLM(cfg, tokenizer=official_tokenizer()), block
  noise = {"_target_": "src.noise_schedule.noise_schedules.LinearNoise"}
  if method == "bd3lm":
    cfg = d.BD3LMConfig(
      block_size=block, eval_block_size=block, keep_clean_bos=True, noise_config=noise, **common
    )
    return d.BD3LM(cfg, tokenizer=official_tokenizer()), block
  cfg = d.MDLMConfig(keep_clean_bos=True, noise_config=noise, **common)
  return d.MDLM(cfg, tokenizer=official_tokenizer()), block


def official_train(mods, method: str, sizes: dict, host_batches, args) -> dict:
  """Model, optimizer, EMA copy and collated batches of one official training work."""
  import torch
  from src.datasets.collator import DenoisingCollator

  torch.manual_seed(args.seed)
  model, block = official_model(mods, method, sizes)
  model.to(args.device)
  model.train()
  params = [p for p in model.parameters() if p.requires_grad]
  opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0)
  ema = [p.detach().clone() for p in params]
  collator = DenoisingCollator(
    tokenizer=official_tokenizer(),
    global_batch_size=sizes["batch_size"],
    max_length=sizes["seq_len"],
    sampling_eps=1e-3,
    antithetic_sampling=method == "bd3lm",  # run_train_bd3lm_lm1b.sh; false elsewhere
    block_size=block,
    base_collator=lambda feats: {k: torch.stack([f[k] for f in feats]) for k in feats[0]},
  )
  batches = []
  for hb in host_batches:
    feats = [
      {
        "input_ids": torch.as_tensor(t, dtype=torch.long),
        "attention_mask": torch.as_tensor(a, dtype=torch.long),
      }
      for t, a in zip(hb["tokens"], hb["attention_mask"])
    ]
    batches.append({k: v.to(args.device) for k, v in collator(feats).items()})
  prep = {
    "device": args.device,
    "bf16": args.train_precision == "bf16",
    "model": model,
    "params": params,
    "opt": opt,
    "ema": ema,
    "batches": batches,
    "times": [],
    "i": 0,
    "clean": float(sum(int(b["attention_mask"].sum()) for b in batches[:1])),
  }
  for _ in range(args.warmup):
    official_step(prep)
  return prep


def official_step(prep) -> float:
  import torch

  batch = prep["batches"][prep["i"] % len(prep["batches"])]
  prep["i"] += 1
  with torch.autocast(device_type=prep["device"], dtype=torch.bfloat16, enabled=prep["bf16"]):
    loss = prep["model"](**batch).loss  # composer HuggingFaceModel: outputs = model(**batch)
  loss.backward()
  torch.nn.utils.clip_grad_norm_(prep["params"], CLIP)
  prep["opt"].step()
  prep["opt"].zero_grad(set_to_none=True)
  with torch.no_grad():
    torch._foreach_mul_(prep["ema"], EMA)
    torch._foreach_add_(prep["ema"], prep["params"], alpha=1 - EMA)
  return float(loss.detach())


def _sync(device: str):
  if device == "cuda":
    import torch

    torch.cuda.synchronize()


def official_time_train(prep, args):
  _sync(prep["device"])
  t0 = time.perf_counter()
  for _ in range(args.steps):
    loss = official_step(prep)
  _sync(prep["device"])
  prep["times"].append(time.perf_counter() - t0)
  if loss != loss:
    raise FloatingPointError("official: non-finite loss")
  prep["loss"] = loss


def official_decoder(mods, work: str, sizes: dict, device: str = "cpu"):
  """(generate thunk returning the number of new tokens) for one decoding work, batch 1, fp32."""
  import torch
  from transformers import GenerationConfig

  L = sizes["seq_len"]
  n = L - 1
  method = {"set4": "setdlm", "set8": "setdlm", "bd3lm": "bd3lm", "ar": "ar"}[work]
  torch.manual_seed(0)
  model, _ = official_model(mods, method, sizes)
  model.to(device)
  model.eval()
  tok = official_tokenizer()
  prompt = torch.tensor([[BOS_ID]], device=device)
  common = dict(
    num_steps=L,
    first_hitting=False,
    sampling_strategy="predict_and_noise",
    noise_removal=False,
    confidence_based_noising=False,
    confidence_threshold=1e6,
    align_inputs_to_blocks=False,
    nucleus_p=1.0,
    do_sample=False,
    use_cache=True,
    pad_token_id=MASK_ID,
  )
  if method == "setdlm":
    gc = mods.diffusion.SetDiffusionGenerationConfig(
      max_window_size=int(work[3:]), block_size=L, fused_block_cache=None, **common
    )
  elif method == "bd3lm":
    gc = mods.diffusion.DiffusionGenerationConfig(
      block_size=BLOCK_SIZE, fused_block_cache=None, **{**common, "num_steps": BLOCK_SIZE}
    )
  else:
    gc = GenerationConfig(do_sample=False, use_cache=True)

  def run() -> int:
    with torch.no_grad():
      out = model.generate(
        inputs=prompt,
        generation_config=gc,
        logits_processor=None,
        stopping_criteria=None,
        max_new_tokens=n,
        return_dict_in_generate=True,
        device=device,
        tokenizer=tok,
        disable_pbar=True,
      )
    seqs = getattr(out, "sequences", out)
    return int(seqs.shape[-1]) - 1

  return run


# ----------------------------------------------------------------------------- our side


def ours_train(train_bench, method: str, sizes: dict, args):
  argv = [
    f"--num_layers={sizes['num_layers']}",
    f"--hidden_size={sizes['hidden_size']}",
    f"--num_heads={sizes['num_heads']}",
    f"--seq_len={sizes['seq_len']}",
    f"--vocab_size={sizes['vocab_size']}",
    f"--batch_size={sizes['batch_size']}",
    "--dtype=float32",
    "--dropout=0.1",
    f"--warmup={args.warmup}",
    f"--steps={args.steps}",
    f"--seed={args.seed}",
    f"--objectives={method}",
  ]
  bargs = train_bench.parse_args(argv)
  config = train_bench.load_config(bargs)
  config.loss.desired_set_size, config.loss.block_size = SET_SIZE, BLOCK_SIZE
  config.learning_rate, config.adam_b1, config.adam_b2 = LR, *BETAS
  config.weight_decay, config.grad_clip_norm, config.ema_decay = 0.0, CLIP, EMA
  config.adam_eps = EPS
  prep = train_bench.benchmark(config, method, bargs)
  prep["bargs"] = bargs
  return prep, config


def ours_decoder(sampling_bench, work: str, sizes: dict):
  from setdiff_jax.sampling import (
    CommitPolicy,
    SamplerConfig,
    ar_generate,
    bd3lm_generate,
    set_generate,
  )

  model, params, seq_len, ids, _ = sampling_bench.build_model()
  base = SamplerConfig(
    **ids, max_new_tokens=seq_len - 1, max_length=seq_len, stop_at_eos=False, greedy=True, seed=0
  )
  batch = 8 if work.endswith("_b8") else 1
  prompts = [[ids["bos_token_id"]]] * batch
  if work.startswith("set"):
    fn, cfg = set_generate, base.replace(window=int(work[3]), policy=CommitPolicy())
  elif work == "bd3lm":
    fn, cfg = bd3lm_generate, base.replace(block_size=BLOCK_SIZE)
  else:
    fn, cfg = ar_generate, base

  def run() -> int:
    return int(fn(model, params, prompts, cfg).num_generated)

  return run


def time_decode(run, times: list):
  t0 = time.perf_counter()
  n = run()
  times.append((n, time.perf_counter() - t0))


def rate(times) -> float:
  return statistics.median(n / s for n, s in times)


# ----------------------------------------------------------------------------- worker process


def worker_main(args):
  """The official side: JSON requests on stdin, one JSON reply per line on the original stdout."""
  proto = os.fdopen(os.dup(1), "w", buffering=1)
  os.dup2(2, 1)  # anything the official code prints goes to stderr, never into the protocol
  import numpy as np
  import torch

  torch.set_num_threads(args.threads)
  mods = import_official(args.official_dir)
  import transformers

  train, decode = {}, {}
  for line in sys.stdin:
    req = json.loads(line)
    try:
      cmd = req["cmd"]
      if cmd == "info":
        out = {
          "torch": torch.__version__,
          "transformers": transformers.__version__,
          "threads": torch.get_num_threads(),
          "interop": torch.get_num_interop_threads(),
          "python": sys.executable,
        }
      elif cmd == "prepare_train":
        data = np.load(req["batches"])
        host = [
          {"tokens": data[f"tokens{i}"], "attention_mask": data[f"mask{i}"]}
          for i in range(int(data["n"]))
        ]
        train[req["name"]] = official_train(mods, req["name"], args.sizes, host, args)
        out = {"clean": train[req["name"]]["clean"]}
      elif cmd == "time_train":
        prep = train[req["name"]]
        official_time_train(prep, args)
        out = {"seconds": prep["times"][-1], "loss": prep["loss"]}
      elif cmd == "prepare_decode":
        decode[req["name"]] = official_decoder(mods, req["name"], args.sizes, args.device)
        decode[req["name"]]()  # warm-up
        out = {}
      elif cmd == "time_decode":
        _sync(args.device)
        t0 = time.perf_counter()
        n = decode[req["name"]]()
        _sync(args.device)
        out = {"tokens": n, "seconds": time.perf_counter() - t0}
      elif cmd in ("align", "exports"):
        import official_checks  # benchmarks/official_checks.py (numpy, torch, official code)

        out = getattr(official_checks, f"worker_{cmd}")(mods, req)
      elif cmd == "quit":
        break
      else:
        raise ValueError(f"unknown request {cmd!r}")
    except Exception:  # reported to the driver, which stops with it
      out = {"error": traceback.format_exc()}
    proto.write(json.dumps(out) + "\n")


class OfficialWorker:
  """A subprocess (--official_python) that holds the official models and times them on request."""

  def __init__(self, args, argv):
    cmd = [args.official_python, os.path.abspath(__file__), "--worker"] + list(argv)
    # Offline: nothing on the official side may reach a hub (its loaders would try).
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    self.proc = subprocess.Popen(
      cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, env=env
    )

  def __call__(self, cmd: str, **kw) -> dict:
    self.proc.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
    self.proc.stdin.flush()
    line = self.proc.stdout.readline()
    if not line:
      raise SystemExit(
        f"the official worker ({self.proc.args[0]}) exited (rc "
        f"{self.proc.wait()}); its stderr is above"
      )
    out = json.loads(line)
    if "error" in out:
      raise SystemExit(f"official side failed on {cmd} {kw}:\n{out['error']}")
    return out

  def close(self):
    if self.proc.poll() is None:
      self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
      self.proc.stdin.flush()
      self.proc.wait(timeout=60)


def check_official_env(info: dict, python: str):
  if not info["transformers"].startswith("4."):
    raise SystemExit(
      f"--official_python={python} has transformers {info['transformers']}; the official code "
      "needs 4.x (its requirements.txt pins 4.52.4; 5.x renames `past_key_values` in model "
      f"outputs and changes DynamicCache). Make a venv of its own: `{VENV_HINT}`, then pass "
      "--official_python=/tmp/setdlms_venv/bin/python"
    )


# ----------------------------------------------------------------------------- driver


def main(argv=None):
  argv = sys.argv[1:] if argv is None else list(argv)
  args = parse_args(argv)
  if args.worker:
    return worker_main(args)
  if args.record:
    if not args.out or args.check != "speed":
      raise SystemExit("error: --record needs --out=DIR and --check=speed (the timings it records)")
    from benchmarks import compare_methods

    compare_methods.check_record(args)  # refused before anything is measured
  if args.out:
    from benchmarks import inputs

    inputs.check_output_dir(args.out, "--out")  # before measuring: the report is written last
  load_before = os.getloadavg()
  import numpy as np
  from benchmarks import training as train_bench
  from benchmarks import sampling as sampling_bench

  sizes = args.sizes
  sampling_bench.FLAGS(
    [
      "official",
      f"--num_layers={sizes['num_layers']}",
      f"--hidden_size={sizes['hidden_size']}",
      f"--num_heads={sizes['num_heads']}",
      f"--seq_len={sizes['seq_len']}",
      f"--vocab_size={sizes['vocab_size']}",
      f"--seed={args.seed}",
    ]
  )
  official = OfficialWorker(args, argv)
  tmp = tempfile.mkdtemp(prefix="setdiff_official_")
  try:
    info = official("info")
    check_official_env(info, args.official_python)
    if args.check != "speed":
      return run_check(args, official, tmp, info)
    print(
      f"sizes {sizes}; rounds {args.rounds}, {args.warmup} warm-up + {args.steps} timed "
      f"train steps; load average before {load_before[0]:.2f}",
      flush=True,
    )
    works = []  # (kind, name, official times, ours state)
    for m in args.train:
      ours, config = ours_train(train_bench, m, sizes, args)
      host = train_bench.random_batches(config, 4, args.seed)  # the batches ours times
      path = os.path.join(tmp, f"{m}.npz")
      arrays = {f"tokens{i}": b["tokens"] for i, b in enumerate(host)}
      arrays.update({f"mask{i}": b["attention_mask"] for i, b in enumerate(host)})
      np.savez(path, n=len(host), **arrays)
      off = {"times": [], **official("prepare_train", name=m, batches=path)}
      works.append(("train", m, off, ours))
      print(f"prepared train {m} (ours compiled in {ours['compile_s']:.1f} s)", flush=True)
    for w in args.decode:
      t0 = time.perf_counter()
      ours = {"run": ours_decoder(sampling_bench, w, sizes), "times": []}
      ours["run"]()  # compiles
      off = None
      if not w.endswith("_b8"):
        official("prepare_decode", name=w)
        off = {"times": []}
      works.append(("decode", w, off, ours))
      print(f"prepared decode {w} ({time.perf_counter() - t0:.1f} s incl. compile)", flush=True)

    for r in range(args.rounds):
      for kind, name, off, ours in works:
        if kind == "train":
          res = official("time_train", name=name)
          off["times"].append(res["seconds"])
          train_bench.time_steps(ours, ours["bargs"])
          msg = (
            f"official {off['clean'] * args.steps / res['seconds']:,.0f} "
            f"(loss {res['loss']:.3f}), ours {ours['clean'] / ours['times'][-1]:,.0f} "
            f"(loss {ours['loss']:.3f}) clean tok/s"
          )
        else:
          msg = ""
          if off:
            res = official("time_decode", name=name)
            off["times"].append((res["tokens"], res["seconds"]))
            msg = f"official {rate(off['times'][-1:]):,.1f} tok/s, "
          time_decode(ours["run"], ours["times"])
          msg += f"ours {rate(ours['times'][-1:]):,.1f} tok/s"
        print(f"round {r}: {kind} {name}: {msg}  (load {os.getloadavg()[0]:.2f})", flush=True)
  finally:
    official.close()
    if args.keep_tmp:
      print(f"kept {tmp}")
    else:
      shutil.rmtree(tmp, ignore_errors=True)

  rows = table_rows(works, args)
  lines = summary_lines(rows, works, args, info, load_before, os.getloadavg())
  text = "\n".join(lines)
  print("\n" + text)
  if args.out:
    write_report(args, argv, rows, works, text)
  return rows


def table_rows(works, args) -> list:
  """The table's rows: work, official and ours tok/s (medians over the rounds), per-round times."""
  rows = []
  for kind, name, off, ours in works:
    if kind == "train":
      o = statistics.median(off["clean"] * args.steps / t for t in off["times"])
      u = statistics.median(ours["clean"] / t for t in ours["times"])
      rows.append(
        {
          "work": work_label(kind, name),
          "official": o,
          "ours": u,
          "official_seconds": list(off["times"]),
          "ours_seconds": list(ours["times"]),
        }
      )
      continue
    row = {"work": work_label(kind, name), "ours": rate(ours["times"])}
    row["ours_tokens_seconds"] = [list(t) for t in ours["times"]]
    if off:
      row["official"] = rate(off["times"])
      row["official_tokens_seconds"] = [list(t) for t in off["times"]]
    else:  # batch 8: the official sampler is batch-1 only
      base = next((o for k, n, o, _ in works if n == "set4" and o), None)
      row["official"], row["mark"] = (rate(base["times"]), " †") if base else (None, "")
    rows.append(row)
  return rows


def summary_lines(rows, works, args, info, load_before, load_after) -> list:
  """The printed (and recorded) table with its footnotes: sizes, rounds, load, versions."""
  import jax

  lines = [markdown(rows), ""]
  b1 = next((w[3] for w in works if w[1] == "set4"), None)
  b8 = next((w[3] for w in works if w[1] == "set4_b8"), None)
  if b1 and b8:
    lines.append(
      f"ours set W=4: batch 8 / batch 1 tok/s = {rate(b8['times']) / rate(b1['times']):.2f}x"
    )
  if b8:
    lines.append(
      "† the official sampler is batch-1 only (asserted in SetDLM.generate): its batch-8 "
      "figure is its batch-1 rate (8 sequential calls), not timed separately."
    )
  lines += [
    f"{'QUICK (tiny shapes: a harness check, not a speed claim); ' if args.quick else ''}"
    f"sizes {args.sizes}; fp32; medians of {args.rounds} interleaved round(s) ({args.steps} timed "
    f"train steps per round after {args.warmup} warm-up; one decode call per round)",
    f"load average (1/5/15 min) before {'/'.join(f'{x:.2f}' for x in load_before)}, after "
    f"{'/'.join(f'{x:.2f}' for x in load_after)}; {os.cpu_count()} CPUs "
    f"({len(os.sched_getaffinity(0))} usable)",
    f"official: torch {info['torch']} (threads {info['threads']}, interop {info['interop']}), "
    f"transformers {info['transformers']}, {info['python']}",
    f"ours: jax {jax.__version__} ({jax.default_backend()}, {jax.device_count()} device(s), "
    f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r})",
  ]
  return lines


def write_report(args, argv, rows, works, text) -> None:
  """--out: official_speed.json (rows with every round's times, the printed text) and .md;
  --record=NAME publishes the JSON as benchmarks/results/NAME.json."""
  from benchmarks import compare_methods
  from setdiff_jax.evaluation.results import hardware

  os.makedirs(args.out, exist_ok=True)
  report = dict(
    args={k: v for k, v in vars(args).items() if k not in ("official_dir", "official_python")},
    command="python -m benchmarks.official " + " ".join(_public_argv(argv)),
    hardware=hardware(),
    rows=rows,
    markdown=TITLE + "\n\n" + text + "\n",
  )
  for name, body in (
    ("official_speed.json", json.dumps(report, indent=1)),
    ("official_speed.md", text),
  ):
    tmp = os.path.join(args.out, f".{name}.{os.getpid()}")
    with open(tmp, "w") as f:
      f.write(body + "\n")
    os.replace(tmp, os.path.join(args.out, name))
  compare_methods.publish(args.out, "official_speed", args, MEASURED, images={})


def _public_argv(argv) -> list:
  """The command as anyone can rerun it: the local paths of the official side made generic."""
  out = []
  for a in argv:
    key = a.split("=", 1)[0]
    if key == "--official_dir":
      a = "--official_dir=OFFICIAL_DIR"
    elif key == "--official_python":
      a = "--official_python=OFFICIAL_PYTHON"
    out.append(a)
  return out


def run_check(args, official, tmp, info):
  """--check=align|exports: run it, print its table and the versions."""
  import jax
  from benchmarks import official_checks

  if args.check == "align":
    print(official_checks.align_table(official_checks.run_align(args, official, tmp)))
  else:
    print(official_checks.exports_table(official_checks.run_exports(args, official, tmp)))
  print(
    f"official: torch {info['torch']}, transformers {info['transformers']}, "
    f"{info['python']}, code {args.official_dir} (HF_HUB_OFFLINE=1, TRANSFORMERS_OFFLINE=1)"
  )
  print(f"ours: jax {jax.__version__} ({jax.default_backend()})")


if __name__ == "__main__":
  if __package__:  # the driver (`python -m benchmarks.official`)
    from benchmarks import inputs

    inputs.run(main)
  else:  # the --worker, a file run under the official code's venv (no setdiff_jax there)
    main()
