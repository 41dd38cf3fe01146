"""The correctness checks of `benchmarks/official.py --check=align|exports` (not timings).

  --check=align    block alignment (issue 22): our BD3LM / block-wise MDLM samplers with
                   `SamplerConfig.align_to_blocks` on and off against the official
                   `generate(align_inputs_to_blocks=...)`, greedy, on the same weights (a random
                   DiT exported with `interop.export_checkpoint`, loaded in the official class),
                   prompts of lengths P not a multiple of the block size G and some that are.
                   Table: rows and tokens equal per method / G / N / setting.
  --check=exports  exports in the official classes (issue 24): a tiny DiT SetDLM (configs/tiny_sw.py)
                   and a tiny Qwen3 SetDLM (configs/tiny_qwen3.py from a local random Qwen3 made
                   as the README walkthrough makes it), trained a few steps and exported with
                   `launch/export.py`, everything with HF_HUB_OFFLINE=1 / TRANSFORMERS_OFFLINE=1;
                   the official side follows README "Load in the official code" statement by
                   statement (`SetDLM.from_pretrained` after the `_target_` renames) and the
                   backbone logits are compared with ours (`interop.jax_logits` on the run's
                   checkpoint), fp32, max abs error.

The driver half (our side, JAX) runs in official.py's process; the `worker_*` functions run in
its official worker (transformers 4.52.4 venv) and import only torch, numpy and the official
`src` package. Files travel through a temporary directory (npz / json).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}

# --check=align: a random DiT (adaLN, as the official MDLM/BD3LM), L = 32, V = 64.
ALIGN_L, ALIGN_V, ALIGN_D, ALIGN_LAYERS, ALIGN_HEADS = 32, 64, 64, 2, 4
ALIGN_SPECIAL = {"bos_id": 2, "eos_id": 3, "pad_id": 0, "mask_id": 4}
# (method, G, N, prompt lengths): P % G != 0 for most, P % G == 0 for some. The last MDLM case
# has N % G != 0, where the official MDLM decodes past N into its M padding (SPEC §4.8).
ALIGN_CASES = (
  ("bd3lm", 4, 10, (1, 2, 3, 4, 5, 6, 7, 8, 9, 11)),
  ("bd3lm", 8, 12, (3, 5, 8, 11)),
  ("mdlm", 4, 12, (1, 2, 3, 4, 5, 6, 7, 8, 9, 11)),
  ("mdlm", 8, 16, (3, 5, 8, 11)),
  ("mdlm", 4, 10, (1, 2, 3, 4, 5, 6, 7, 8, 9, 11)),
)


# ----------------------------------------------------------------------------- official side


def restore_targets(cfg_dict: dict) -> dict:
  """The official eval loader's rule: flattened Hub `_target_` names back to `src.*` modules
  (`backbone_dit.DIT` -> `src.backbone.dit.DIT`, `noise_schedule_x.Y` -> `src.noise_schedule.x.Y`)."""
  t = cfg_dict.get("_target_", "")
  for flat, full in (("backbone_", "src.backbone."), ("noise_schedule_", "src.noise_schedule.")):
    if t.startswith(flat):
      cfg_dict["_target_"] = full + t[len(flat) :]
  return cfg_dict


def _official_tokenizer(special: dict):
  return types.SimpleNamespace(
    mask_token_id=special["mask_id"],
    bos_token_id=special["bos_id"],
    pad_token_id=special["pad_id"],
    eos_token_id=special["eos_id"],
    cls_token_id=special["bos_id"],
    padding_side="right",
  )


def worker_align(mods, req) -> dict:
  """Official generate on every prompt (batch 1, as it requires), align on and off; returns the
  generated tokens (sequence minus the prompt, leftover masks compacted away)."""
  import torch
  from src.denoiser.bd3lm import BD3LM, BD3LMConfig
  from src.denoiser.mdlm import MDLM, MDLMConfig

  cls, cfg_cls = {"bd3lm": (BD3LM, BD3LMConfig), "mdlm": (MDLM, MDLMConfig)}[req["method"]]
  special = req["special"]
  config = cfg_cls.from_pretrained(req["export"])
  restore_targets(config.backbone_config)
  if config.noise_config is not None:
    restore_targets(config.noise_config)
  tok = _official_tokenizer(special)
  model = cls.from_pretrained(req["export"], config=config, tokenizer=tok).eval()
  g, n = req["block_size"], req["max_new_tokens"]
  out = {}
  for align in (False, True):
    gc = mods.diffusion.DiffusionGenerationConfig(
      num_steps=g,
      block_size=g,
      first_hitting=False,
      sampling_strategy="predict_and_noise",
      noise_removal=False,
      confidence_based_noising=True,
      confidence_threshold=1e6,
      align_inputs_to_blocks=align,
      nucleus_p=1.0,
      do_sample=False,
      use_cache=req["method"] == "bd3lm",  # MDLM: no cache (its use_cache quirk, SPEC §4.8)
      fused_block_cache=None,
      pad_token_id=special["mask_id"],
    )
    rows = []
    for p in req["prompts"]:
      with torch.no_grad():
        res = model.generate(
          inputs=torch.tensor([p]),
          generation_config=gc,
          logits_processor=None,
          stopping_criteria=None,
          max_new_tokens=n,
          return_dict_in_generate=True,
          device="cpu",
          tokenizer=tok,
          disable_pbar=True,
        )
      seq = getattr(res, "sequences", res)[0].tolist()
      if seq[: len(p)] != list(p):
        raise AssertionError(f"official output does not start with its prompt: {seq} vs {p}")
      rows.append(seq[len(p) :])
    out["on" if align else "off"] = rows
  return out


def worker_exports(mods, req) -> dict:
  """README "Load in the official code", statement by statement, for each export; the official
  backbone's logits on the request's rows, written to an npz beside them."""
  del mods
  import torch
  from src.denoiser.setdlm import SetDLM  # bd3lm.BD3LM, mdlm.MDLM, ar.AR likewise
  from src.denoiser.bd3lm import BD3LMConfig  # the config class of SetDLM and BD3LM

  out = {}
  for kind, EXPORT_DIR in req["exports"].items():
    config = BD3LMConfig.from_pretrained(EXPORT_DIR)
    if kind == "dit":
      assert config.backbone_config["_target_"] == "backbone_dit.DIT", config.backbone_config
      config.backbone_config["_target_"] = "src.backbone.dit.DIT"  # was backbone_dit.DIT
    else:
      assert config.backbone_config["_target_"] == "backbone_automodel.AutoModelFromPreTrained"
      config.backbone_config["_target_"] = "src.backbone.automodel.AutoModelFromPreTrained"
    config.noise_config["_target_"] = "src.noise_schedule.noise_schedules.StaggeredNoise"
    config.tokenizer_name = EXPORT_DIR  # our tokenizer files are there
    model, info = SetDLM.from_pretrained(EXPORT_DIR, config=config, output_loading_info=True)
    model = model.eval()
    rows = np.load(req["rows"][kind])
    tokens = torch.as_tensor(rows["tokens"], dtype=torch.long)
    positions = torch.as_tensor(rows["positions"], dtype=torch.long)
    allowed = torch.as_tensor(rows["allowed"])[:, None]  # [B, 1, S, S], True = attend
    with torch.no_grad():
      if kind == "dit":  # DIT's SDPA takes the boolean mask
        logits = model.backbone(tokens, attention_mask=allowed, position_ids=positions).logits
      else:  # the HF Qwen3 takes an additive float mask
        add = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
        logits = model.backbone(
          tokens, attention_mask=add, position_ids=positions, use_cache=False
        ).logits
    # The one key from_pretrained reports missing: the static training mask, a buffer the
    # official pushes leave out too (skip_params_for_push), built in __init__; still intact?
    length = config.length
    grid = torch.arange(2 * length)
    static_ok = bool(
      torch.equal(
        model.static_attention_mask,
        model._block_mask(None, None, grid[:, None], grid[None, :], seq_length=length),
      )
    )
    path = req["rows"][kind].replace(".npz", "_official.npz")
    np.savez(path, logits=logits.float().numpy())
    out[kind] = {
      "logits": path,
      "class": f"{type(model).__module__}.{type(model).__name__}",
      "backbone": f"{type(model.backbone).__module__}.{type(model.backbone).__name__}",
      "tokenizer": type(model.tokenizer).__name__,
      "template": config.backbone_config.get("pretrained_model_name_or_path"),
      "dtype": str(logits.dtype),
      "static_mask_intact": static_ok,
      **{k: sorted(v) for k, v in info.items() if k != "error_msgs"},
    }
  return out


# ----------------------------------------------------------------------------- our side: align


def _align_config(method: str, g: int):
  from setdiff_jax.config.run import default_config

  c = default_config()
  c.objective, c.seq_len = method, ALIGN_L
  c.model.update(
    vocab_size=ALIGN_V,
    hidden_size=ALIGN_D,
    num_layers=ALIGN_LAYERS,
    num_heads=ALIGN_HEADS,
    cond_dim=16,
    adaln=True,
  )
  if method == "bd3lm":
    c.loss.block_size = g
  return c


def _random_params(config, seed: int):
  """Every leaf random (a fresh init has a zero head: all ties), a strong head so that greedy
  choices and confidences are well separated."""
  from setdiff_jax import models
  from setdiff_jax.interop import name_map
  from setdiff_jax.models import dit

  rng = np.random.default_rng(seed)

  def leaf(path, s):
    if path[-1] == "scale":
      return (1.0 + 0.2 * rng.standard_normal(s.shape)).astype(np.float32)
    std = 1.0 / np.sqrt(s.shape[0]) if len(s.shape) == 2 else 0.2
    if path[0] == "head" and path[-1] == "kernel":
      std *= 4.0
    return (std * rng.standard_normal(s.shape)).astype(np.float32)

  flat = name_map.flatten(models.param_shapes(dit.DiTConfig.from_config(config.model)))
  return name_map.unflatten({p: leaf(p, s) for p, s in flat.items()})


def _prompts(lengths, seed: int, reps: int = 2):
  rng = np.random.default_rng(seed)
  lo = max(ALIGN_SPECIAL.values()) + 1  # no special id (a mask would make it an infill task)
  return [
    [ALIGN_SPECIAL["bos_id"]] + rng.integers(lo, ALIGN_V, p - 1).tolist()
    for p in lengths
    for _ in range(reps)
  ]


def _ours_align(method, config, params, prompts, g, n, align: bool):
  from setdiff_jax.models.dit import DiT, DiTConfig
  from setdiff_jax.sampling import SamplerConfig, bd3lm_generate, mdlm_generate

  s = ALIGN_SPECIAL
  cfg = SamplerConfig(
    mask_token_id=s["mask_id"],
    eos_token_id=s["eos_id"],
    pad_token_id=s["pad_id"],
    bos_token_id=s["bos_id"],
    max_new_tokens=n,
    num_steps=g,
    block_size=g,
    greedy=True,
    stop_at_eos=False,
    max_length=ALIGN_L,
    align_to_blocks=align,
  )
  from setdiff_jax import models

  model = DiT(models.replace(DiTConfig.from_config(config.model), dropout=0.0))
  fn = bd3lm_generate if method == "bd3lm" else mdlm_generate
  return [list(map(int, r)) for r in fn(model, params, prompts, cfg).generated]


def compare_rows(official, ours):
  """(rows equal, rows, tokens equal, tokens): position by position over the longer row."""
  rows_eq = sum(a == b for a, b in zip(official, ours))
  tok_eq = sum(sum(x == y for x, y in zip(a, b)) for a, b in zip(official, ours))
  total = sum(max(len(a), len(b)) for a, b in zip(official, ours))
  return rows_eq, len(official), tok_eq, total


def run_align(args, official, tmp) -> list:
  """Our samplers and the official generate on the same exported weights; returns table rows."""
  from setdiff_jax.interop import export_checkpoint

  results = []
  for method, g, n, lengths in ALIGN_CASES:
    config = _align_config(method, g)
    params = _random_params(config, args.seed + g)
    export = os.path.join(tmp, f"align_{method}_{g}")
    export_checkpoint(config, params, export, special_ids=ALIGN_SPECIAL)
    prompts = _prompts(lengths, args.seed + 100 * g)
    t0 = time.perf_counter()
    off = official(
      "align",
      method=method,
      export=export,
      special=ALIGN_SPECIAL,
      block_size=g,
      max_new_tokens=n,
      prompts=prompts,
    )
    t_off = time.perf_counter() - t0
    for setting in ("off", "on"):
      ours = _ours_align(method, config, params, prompts, g, n, setting == "on")
      their = off[setting]
      for group, sel in (
        ("P % G != 0", [len(p) % g != 0 for p in prompts]),
        ("P % G == 0", [len(p) % g == 0 for p in prompts]),
      ):
        o = [r for r, k in zip(their, sel) if k]
        u = [r for r, k in zip(ours, sel) if k]
        if not o:
          continue
        results.append(
          dict(
            method=method,
            g=g,
            n=n,
            align=setting,
            group=group,
            lengths=sorted({len(p) for p, k in zip(prompts, sel) if k}),
            cmp=compare_rows(o, u),
            gen=(sum(map(len, o)) / len(o), sum(map(len, u)) / len(u)),
          )
        )
      bad = [(len(p), a, b) for p, a, b in zip(prompts, their, ours) if a != b]
      for plen, a, b in bad[:3]:
        print(
          f"  differs: {method} G={g} align {setting} P={plen}: official {a} ours {b}", flush=True
        )
    print(f"align {method} G={g} N={n}: {len(prompts)} prompts, official {t_off:.1f} s", flush=True)
  return results


def align_table(results) -> str:
  lines = [
    "| method | G | N | align | prompts | P | rows equal | tokens equal | "
    "mean gen. tokens (official / ours) |",
    "| --- | ---: | ---: | --- | --- | --- | ---: | ---: | ---: |",
  ]
  for r in results:
    re_, rows, te, toks = r["cmp"]
    lines.append(
      f"| {r['method']} | {r['g']} | {r['n']} | {r['align']} | {r['group']} | "
      f"{','.join(map(str, r['lengths']))} | {re_}/{rows} | {te}/{toks} | "
      f"{r['gen'][0]:.1f} / {r['gen'][1]:.1f} |"
    )
  return "\n".join(lines)


# ----------------------------------------------------------------------------- our side: exports


def _run(cmd, log, timeout=900):
  """A launcher, from the repository root, offline; its output appended to `log`."""
  env = dict(os.environ, **OFFLINE, PYTHONPATH=REPO)
  t0 = time.perf_counter()
  with open(log, "a") as f:
    f.write(f"$ {' '.join(cmd)}\n")
    f.flush()
    proc = subprocess.run(
      cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout
    )
  if proc.returncode:
    raise SystemExit(f"{' '.join(cmd)} failed (rc {proc.returncode}); see {log}")
  return time.perf_counter() - t0


def _make_qwen3_dir(demo: str):
  """README "Walkthrough: a tiny local Qwen3 into a SetDLM on CPU", its first block (local files
  only): the packaged GPT-2 BPE + Qwen3 specials, a tiny random Qwen3, embedded-corpus lines."""
  import transformers
  from setdiff_jax.data import sources, tokenizers

  hf_dir = os.path.join(demo, "hf")
  os.makedirs(hf_dir, exist_ok=True)
  tok = tokenizers.gpt2_tokenizer(
    tokenizers.packaged_vocab("gpt2/vocab.json"), tokenizers.packaged_vocab("gpt2/merges.txt")
  )
  tok.hf.save(os.path.join(hf_dir, "tokenizer.json"))
  config = transformers.Qwen3Config(
    vocab_size=tok.vocab_size,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    tie_word_embeddings=True,
    bos_token_id=tok.bos_id,
    eos_token_id=tok.eos_id,
  )
  transformers.Qwen3ForCausalLM(config).save_pretrained(hf_dir)
  for split, name, n in (("train", "train.txt", 400), ("validation", "eval.txt", 50)):
    with open(os.path.join(demo, name), "w", encoding="utf-8") as f:
      f.writelines(doc + "\n" for doc in sources.embedded_corpus(split)[:n])
  return hf_dir


def _rows(vocab: int, length: int, seed: int, batch: int = 3):
  """Random tokens, permuted positions, a random mask with the diagonal (True = attend)."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, (batch, length))
  positions = np.stack([rng.permutation(length) for _ in range(batch)])
  allowed = np.tril(np.ones((length, length), bool))[None].repeat(batch, 0)
  allowed |= rng.random((batch, length, length)) < 0.3
  return tokens, positions, allowed


def run_exports(args, official, tmp) -> list:
  """Train, export (launch/export.py), load officially, compare logits; returns table rows."""
  from setdiff_jax.interop import jax_logits
  from setdiff_jax.workdir import load as workdir_lib

  py, log = sys.executable, os.path.join(tmp, "exports.log")
  steps = str(args.export_steps)
  every = [
    f"--config.num_train_steps={steps}",
    f"--config.eval_every_steps={steps}",
    f"--config.checkpoint_every_steps={steps}",
    "--config.num_eval_samples=0",
    "--config.log_every_steps=1",
    "--config.warmup_steps=1",
  ]  # logits away from 0
  times = {}
  dit_run, dit_out = os.path.join(tmp, "dit_run"), os.path.join(tmp, "dit_export")
  times["dit train"] = _run(
    [
      py,
      "launch/train.py",
      "--config=configs/tiny_sw.py",
      f"--workdir={dit_run}",
      *every,
      "--config.num_eval_steps=1",
    ],
    log,
  )
  times["dit export"] = _run(
    [py, "launch/export.py", f"--workdir={dit_run}", f"--out={dit_out}", "--verify"], log
  )
  demo = os.path.join(tmp, "qwen3_demo")
  t0 = time.perf_counter()
  hf_dir = _make_qwen3_dir(demo)
  times["qwen3 make dir"] = time.perf_counter() - t0
  q_run, q_out = os.path.join(demo, "run"), os.path.join(demo, "export")
  times["qwen3 train"] = _run(
    [
      py,
      "launch/train.py",
      "--config=configs/tiny_qwen3.py",
      f"--workdir={q_run}",
      f"--config.init_from_hf={hf_dir}",
      f"--config.data.paths={demo}/train.txt",
      f"--config.data.eval_paths={demo}/eval.txt",
      "--config.data.overlong=wrap",
      *every,
    ],
    log,
  )
  times["qwen3 export"] = _run(
    [py, "launch/export.py", f"--workdir={q_run}", f"--out={q_out}", "--verify"], log
  )
  print("; ".join(f"{k} {v:.0f} s" for k, v in times.items()) + f" (log {log})", flush=True)

  runs = {"dit": (dit_run, dit_out), "qwen3": (q_run, q_out)}
  ours, paths = {}, {}
  for kind, (run, _) in runs.items():
    state = workdir_lib.load_inference_state(run)  # EMA, as launch/export.py's default
    import jax

    params = jax.device_get(state.params)
    vocab = int(state.config.model.vocab_size or state.tokenizer.vocab_size)
    tokens, positions, allowed = _rows(vocab, int(state.config.seq_len), args.seed)
    ours[kind] = jax_logits(state.config, params, tokens, positions, allowed)
    paths[kind] = os.path.join(tmp, f"rows_{kind}.npz")
    np.savez(paths[kind], tokens=tokens, positions=positions, allowed=allowed)
  res = official("exports", exports={k: v[1] for k, v in runs.items()}, rows=paths)
  rows = []
  for kind in runs:
    theirs = np.load(res[kind]["logits"])["logits"]
    err = float(np.max(np.abs(theirs.astype(np.float64) - ours[kind])))
    scale = float(np.max(np.abs(ours[kind])))
    rows.append(dict(kind=kind, shape=tuple(theirs.shape), err=err, scale=scale, **res[kind]))
  return rows


def exports_table(rows) -> str:
  lines = [
    "| export | official class (backbone) | missing / unexpected keys | rows x S x V | "
    "max abs logits error | max abs logit | relative |",
    "| --- | --- | --- | --- | ---: | ---: | ---: |",
  ]
  for r in rows:
    missing = r.get("missing_keys", [])
    keys = f"{', '.join(missing) or 0} / {len(r.get('unexpected_keys', []))}"
    if "static_mask_intact" in r:
      keys += f" (static mask {'intact' if r['static_mask_intact'] else 'CHANGED'})"
    lines.append(
      f"| {r['kind']} | {r['class']} ({r['backbone']}) | {keys} | "
      f"{' x '.join(map(str, r['shape']))} | {r['err']:.2e} | {r['scale']:.2f} | "
      f"{r['err'] / max(r['scale'], 1e-30):.2e} |"
    )
  return "\n".join(lines)
