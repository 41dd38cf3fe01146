"""Translation between our run config and the official `config.json` (SPEC §9.2), plain Python.

Official fields written/read (a `BD3LMConfig` for SetDLM/BD3LM, `MDLMConfig`, `ARConfig`):
  model_type, architectures, length, block_size, eval_block_size, attn_backend, keep_clean_bos,
  train_on_context, setdlm_eos_last_in_target_order, setdlm_fht_cache_order, tokenizer_name,
  the special ids at top level and in `tokenization_config`, `backbone_config` (the `DIT`
  constructor arguments, `_target_` flattened to `backbone_dit.DIT`) and `noise_config`
  (`StaggeredNoise` fields with S and S_max, or `LinearNoise`; null for AR).
Our extras (architecture knobs the official `DIT` cannot express, provenance, the full run config)
go in a top-level `setdiff_jax` block, which the official `PretrainedConfig` keeps as an unused
attribute.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

FORMAT_VERSION = 1
DIT_TARGET = "backbone_dit.DIT"
STAGGERED_TARGET = "noise_schedule_noise_schedules.StaggeredNoise"
LINEAR_TARGET = "noise_schedule_noise_schedules.LinearNoise"
SPECIAL_KEYS = ("bos_id", "eos_id", "pad_id", "mask_id")
HF_SPECIAL = {"bos_id": "bos_token_id", "eos_id": "eos_token_id", "pad_id": "pad_token_id",
              "mask_id": "mask_token_id"}

# objective -> (model_type, architecture): SetDLM reuses BD3LMConfig (SPEC §9.2).
HF_CLASSES = {"setdlm": ("bd3lm", "SetDLM"), "bd3lm": ("bd3lm", "BD3LM"),
              "mdlm": ("mdlm", "MDLM"), "ar": ("ar", "AR")}


def _get(cfg, key, default=None):
  if cfg is None:
    return default
  if isinstance(cfg, Mapping):
    return cfg.get(key, default)
  try:
    return cfg[key] if key in cfg else default
  except TypeError:
    return getattr(cfg, key, default)


def effective_max_set_size(desired: int, max_set_size) -> int:
  """Our config's S_max (0/None = 2S) as a number."""
  return 2 * int(desired) if not max_set_size else int(max_set_size)


def normalize_max_set_size(block_size: int, desired: int, stored: Optional[int]) -> int:
  """S_max the way the official eval loader rebuilds it (SPEC §1.2 caveat, §8.5).

  A stored value strictly below the schedule span is kept; anything else (the `max_block_size = L`
  of older released configs, a missing value, a value above the span) becomes min(2S, span).
  """
  if stored is not None and int(stored) < int(block_size):
    return int(stored)
  return min(2 * int(desired), int(block_size))


def normalize_special_ids(tokenizer=None, special_ids: Optional[Mapping] = None) -> Dict[str, int]:
  """{bos_id, eos_id, pad_id, mask_id} from a tokenizer object or a dict (either key style)."""
  out: Dict[str, int] = {}
  if tokenizer is not None:
    for k in SPECIAL_KEYS:
      out[k] = int(getattr(tokenizer, k))
  for k, v in dict(special_ids or {}).items():
    name = {hf: ours for ours, hf in HF_SPECIAL.items()}.get(k, k)
    if name not in SPECIAL_KEYS:
      raise ValueError(f"unknown special id {k!r}; expected {SPECIAL_KEYS}")
    if v is not None:
      out[name] = int(v)
  missing = [k for k in SPECIAL_KEYS if k not in out]
  if missing:
    raise ValueError(f"export needs the tokenizer's special ids; missing {missing}. Pass "
                     f"tokenizer=... or special_ids={{'bos_id': .., 'eos_id': .., 'pad_id': .., "
                     f"'mask_id': ..}}")
  return out


def to_hf_config(run_config, *, vocab_size: int, hidden_size: int, num_layers: int,
                 num_heads: int, mlp_ratio: int, cond_dim: int, adaln: bool,
                 special_ids: Mapping[str, int], tokenizer_vocab_size: Optional[int] = None,
                 rope_base: float = 10000.0, extra: Optional[Mapping] = None) -> Dict[str, Any]:
  """The `config.json` dict for an export of a run with these backbone dims."""
  objective = str(_get(run_config, "objective", "setdlm"))
  if objective not in HF_CLASSES:
    raise ValueError(f"cannot export objective={objective!r}; expected one of {list(HF_CLASSES)}")
  model_type, arch = HF_CLASSES[objective]
  length = int(_get(run_config, "seq_len"))
  model = _get(run_config, "model", {})
  loss = _get(run_config, "loss", {})
  desired = int(_get(loss, "desired_set_size", 4))
  bd3lm_block = int(_get(loss, "block_size", 4))
  block = bd3lm_block if objective == "bd3lm" else length
  keep_clean_bos = bool(_get(loss, "keep_clean_bos", True))

  if objective == "setdlm":
    noise = {"_target_": STAGGERED_TARGET, "eps": 1e-3, "block_size": length,
             "desired_block_size": desired,
             "max_block_size": effective_max_set_size(desired, _get(loss, "max_set_size", 0)),
             "length": length}
  elif objective in ("mdlm", "bd3lm"):
    noise = {"_target_": LINEAR_TARGET, "block_size": block, "length": length}
  else:
    noise = None

  ids = {HF_SPECIAL[k]: int(v) for k, v in special_ids.items()}
  tokenization = {"vocab_size": int(tokenizer_vocab_size or vocab_size), **ids,
                  "pad_vocab_size_multiple": 1}
  backbone = {
      "_target_": DIT_TARGET, "length": length, "causal_attention": objective == "ar",
      "adaln": bool(adaln), "hidden_size": int(hidden_size), "cond_dim": int(cond_dim),
      "n_heads": int(num_heads), "num_layers": int(num_layers),
      "dropout": float(_get(model, "dropout", 0.1)), "tie_word_embeddings": True,
      "attn_backend": "sdpa", "vocab_size": int(vocab_size), "block_size": block,
      "pretrained_model_name_or_path": None,
  }
  cfg = {
      "model_type": model_type, "architectures": [arch],
      "length": length, "block_size": block, "eval_block_size": block,
      "attn_backend": "sdpa", "keep_clean_bos": keep_clean_bos, "train_on_context": False,
      "setdlm_eos_last_in_target_order": bool(_get(loss, "eos_last", False)),
      "setdlm_fht_cache_order": False,
      "tokenizer_name": None,  # the official loader then uses the checkpoint directory
      **tokenization,
      "tokenization_config": dict(tokenization),
      "backbone_config": backbone,
      "noise_config": noise,
      "torch_dtype": "float32",
      "setdiff_jax": {"format_version": FORMAT_VERSION, "objective": objective,
                      "mlp_ratio": int(mlp_ratio), "rope_base": float(rope_base),
                      **dict(extra or {})},
  }
  return cfg


def generation_config(run_config, special_ids: Mapping[str, int]) -> Dict[str, Any]:
  """A `generation_config.json`: HF fields plus the set-diffusion sampler knobs (SPEC §4.1)."""
  objective = str(_get(run_config, "objective", "setdlm"))
  length = int(_get(run_config, "seq_len"))
  loss = _get(run_config, "loss", {})
  sampling = _get(run_config, "sampling", None)
  s = int(_get(loss, "desired_set_size", 4))
  gen = {"bos_token_id": int(special_ids["bos_id"]), "eos_token_id": int(special_ids["eos_id"]),
         "pad_token_id": int(special_ids["pad_id"]), "mask_token_id": int(special_ids["mask_id"]),
         "do_sample": False, "use_cache": True, "max_length": length}
  if objective != "ar":
    gen.update({"num_steps": length, "sampling_strategy": "predict_and_noise",
                "confidence_threshold": 1e6, "nucleus_p": 1.0,
                "block_size": int(_get(loss, "block_size", 4)) if objective == "bd3lm" else length})
  if objective == "setdlm":
    gen.update({"max_window_size": s, "kv_cache": True})
  for ours, theirs in (("window_size", "max_window_size"), ("max_window_size", "max_window_size"),
                       ("confidence_threshold", "confidence_threshold"),
                       ("nucleus_p", "nucleus_p"), ("num_steps", "num_steps"),
                       ("do_sample", "do_sample")):
    v = _get(sampling, ours, None)
    if v is not None and not isinstance(v, Mapping):
      gen[theirs] = v
  return gen


# ----------------------------------------------------------------------------- import side
def objective_from_hf(cfg: Mapping, path_hint: str = "") -> str:
  """setdlm | bd3lm | mdlm | ar, from `architectures` (then `model_type`, then the path)."""
  ours = (cfg.get("setdiff_jax") or {}).get("objective")
  if ours in HF_CLASSES:
    return ours
  for hay in (" ".join(cfg.get("architectures") or []).lower(), str(cfg.get("model_type", "")).lower(),
              str(path_hint).lower()):
    for name in ("setdlm", "bd3lm", "mdlm"):
      if name in hay:
        return name
    if re.search(r"(^|[^a-z])ar([^a-z]|$)", hay):
      return "ar"
  raise ValueError(f"cannot tell the model family from config.json (architectures="
                   f"{cfg.get('architectures')}, model_type={cfg.get('model_type')})")


def infer_desired_from_name(name: str) -> Optional[int]:
  """S from a run/repo name: `d{S}`, `tgt{S}` or `smax{2S}` (as the official eval loader)."""
  name = str(name).lower()
  for pat in (r"(?:^|[^a-z0-9])d(\d+)(?:$|[^a-z0-9])", r"(?:^|[^a-z0-9])tgt(\d+)(?:$|[^a-z0-9])"):
    m = re.search(pat, name)
    if m:
      return int(m.group(1))
  m = re.search(r"(?:^|[^a-z0-9])smax(\d+)(?:$|[^a-z0-9])", name)
  return int(m.group(1)) // 2 if m else None


def backbone_fields(cfg: Mapping) -> Dict[str, Any]:
  """The DiT hyperparameters in our names, from `config.json` (no validation against weights)."""
  bb = cfg.get("backbone_config") or {}
  target = str(bb.get("_target_", DIT_TARGET))
  if "automodel" in target.lower() or "qwen" in target.lower():
    raise NotImplementedError(
        f"backbone {target!r} (Qwen3 GSM8K/CNN-DM models) is not supported; only the DiT is")
  extra = cfg.get("setdiff_jax") or {}
  out = {"vocab_size": bb.get("vocab_size", cfg.get("vocab_size")),
         "hidden_size": bb.get("hidden_size"), "num_layers": bb.get("num_layers"),
         "num_heads": bb.get("n_heads"), "cond_dim": bb.get("cond_dim", 128),
         "adaln": bool(bb.get("adaln", False)), "dropout": bb.get("dropout", 0.1),
         "causal_attention": bool(bb.get("causal_attention", False)),
         "mlp_ratio": int(extra.get("mlp_ratio", 4)),
         "rope_base": float(extra.get("rope_base", 10000.0))}
  missing = [k for k in ("hidden_size", "num_layers", "num_heads") if out[k] in (None, -1)]
  if missing:
    raise ValueError(f"config.json backbone_config lacks {missing}")
  return out


def from_hf_config(cfg: Mapping, path_hint: str = "") -> Tuple[Dict[str, Any], List[str]]:
  """Our fields from an official or exported `config.json`.

  Returns ({"objective", "seq_len", "model": {...}, "loss": {...}, "special_ids": {...},
  "stored_max_set_size", "tokenizer_vocab_size"}, warnings). Applies the S_max normalisation.
  """
  warns: List[str] = []
  objective = objective_from_hf(cfg, path_hint)
  bb = backbone_fields(cfg)
  noise = cfg.get("noise_config") or {}
  length = cfg.get("length") or (cfg.get("backbone_config") or {}).get("length") or noise.get("length")
  if length is None:
    raise ValueError("config.json has no `length`")
  length = int(length)
  model = {k: bb[k] for k in ("hidden_size", "num_layers", "num_heads", "cond_dim", "adaln",
                              "dropout", "mlp_ratio")}
  model["vocab_size"] = int(bb["vocab_size"]) if bb["vocab_size"] is not None else 0
  if bb["rope_base"] != 10000.0:
    model["rope_base"] = bb["rope_base"]
  loss: Dict[str, Any] = {}
  kcb = cfg.get("keep_clean_bos")
  if isinstance(kcb, bool):
    loss["keep_clean_bos"] = kcb
  else:
    loss["keep_clean_bos"] = objective in ("setdlm", "mdlm", "bd3lm")
    warns.append(f"config.json keep_clean_bos={kcb!r}; using {loss['keep_clean_bos']} (the "
                 f"official eval loader's default)")
  stored = None
  if objective == "setdlm":
    span = int(noise.get("block_size") or cfg.get("eval_block_size") or cfg.get("block_size") or length)
    if span != length:
      warns.append(f"noise_config.block_size={span} != length={length}; the schedule span is "
                   f"always L here (SPEC §1.2): using {length}")
      span = length
    desired = noise.get("desired_block_size")
    if desired is None:
      desired = infer_desired_from_name(path_hint)
      if desired is None:
        raise ValueError("config.json noise_config lacks desired_block_size and the path does not "
                         "name it (d{S} / tgt{S} / smax{2S})")
      warns.append(f"S={desired} inferred from the path {path_hint!r}")
    desired = int(desired)
    stored = noise.get("max_block_size")
    s_max = normalize_max_set_size(span, desired, stored)
    if stored is None or int(stored) != s_max:
      warns.append(f"noise_config.max_block_size={stored} normalised to S_max={s_max} = "
                   f"min(2S, L) (SPEC §1.2 / §8.5: released configs store L but were trained "
                   f"with 2S)")
    loss["desired_set_size"] = desired
    loss["max_set_size"] = 0 if s_max == 2 * desired else s_max
    loss["eos_last"] = bool(cfg.get("setdlm_eos_last_in_target_order", False))
    for key in ("k", "b"):
      if noise.get(key) is not None:
        warns.append(f"noise_config.{key}={noise[key]} is not supported by our config; ignored")
  elif objective == "bd3lm":
    loss["block_size"] = int(cfg.get("block_size") or (cfg.get("backbone_config") or {}).get("block_size"))
  if objective == "ar" and not bb["causal_attention"]:
    warns.append("AR model with causal_attention=false in backbone_config")
  tok = cfg.get("tokenization_config") or {}
  special = {}
  for ours, hf in HF_SPECIAL.items():
    v = tok.get(hf, cfg.get(hf))
    if v is not None:
      special[ours] = int(v)
  return {"objective": objective, "seq_len": length, "model": model, "loss": loss,
          "special_ids": special, "stored_max_set_size": stored,
          "tokenizer_vocab_size": tok.get("vocab_size", cfg.get("vocab_size")),
          "causal_attention": bb["causal_attention"]}, warns


__all__ = ["to_hf_config", "generation_config", "from_hf_config", "backbone_fields",
           "objective_from_hf", "normalize_max_set_size", "effective_max_set_size",
           "normalize_special_ids", "infer_desired_from_name", "HF_CLASSES", "FORMAT_VERSION"]
