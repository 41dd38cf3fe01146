"""Translation between our run config and the official `config.json` (SPEC §9.2), plain Python.

Official fields written/read (a `BD3LMConfig` for SetDLM/BD3LM, `MDLMConfig`, `ARConfig`):
  model_type, architectures, length, block_size, eval_block_size, attn_backend, keep_clean_bos,
  train_on_context, setdlm_eos_last_in_target_order, setdlm_fht_cache_order, tokenizer_name,
  the special ids at top level and in `tokenization_config`, `backbone_config` (the `DIT`
  constructor arguments, `_target_` flattened to `backbone_dit.DIT`) and `noise_config`
  (`StaggeredNoise` fields with S and S_max, or `LinearNoise`; null for AR).
Our extras (architecture knobs the official `DIT` cannot express, provenance, the full run config)
go in a top-level `setdiff_jax` block, which the official `PretrainedConfig` keeps as an unused
attribute. What differs per method (classes, noise config, block size, sampler knobs, the loss
fields read back) comes from its export format (`interop/formats.py`).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

from setdiff_jax import objectives
from setdiff_jax.interop import formats
from setdiff_jax.interop.backbone_config import DIT_TARGET, backbone_fields

FORMAT_VERSION = 1
SPECIAL_KEYS = ("bos_id", "eos_id", "pad_id", "mask_id")
HF_SPECIAL = {
  "bos_id": "bos_token_id",
  "eos_id": "eos_token_id",
  "pad_id": "pad_token_id",
  "mask_id": "mask_token_id",
}

# objective -> (model_type, architecture): SetDLM reuses BD3LMConfig (SPEC §9.2).
HF_CLASSES = {f.name: (f.model_type, f.architecture) for f in formats.REGISTRY.values()}
HF_MODEL_TYPES = frozenset(t for t, _ in HF_CLASSES.values())  # the official config.json kinds


def _get(cfg, key, default=None):
  if cfg is None:
    return default
  if isinstance(cfg, Mapping):
    return cfg.get(key, default)
  try:
    return cfg[key] if key in cfg else default
  except TypeError:
    return getattr(cfg, key, default)


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
    raise ValueError(
      f"export needs the tokenizer's special ids; missing {missing}. Pass "
      f"tokenizer=... or special_ids={{'bos_id': .., 'eos_id': .., 'pad_id': .., "
      f"'mask_id': ..}}"
    )
  return out


def to_hf_config(
  run_config,
  *,
  vocab_size: int,
  hidden_size: int,
  num_layers: int,
  num_heads: int,
  mlp_ratio: int,
  cond_dim: int,
  adaln: bool,
  special_ids: Mapping[str, int],
  tokenizer_vocab_size: Optional[int] = None,
  rope_base: float = 10000.0,
  extra: Optional[Mapping] = None,
) -> Dict[str, Any]:
  """The `config.json` dict for an export of a run with these backbone dims."""
  objective = str(_get(run_config, "objective", objectives.DEFAULT))
  if objective not in HF_CLASSES:
    raise ValueError(f"cannot export objective={objective!r}; expected one of {list(HF_CLASSES)}")
  fmt = formats.get(objective)
  model_type, arch = HF_CLASSES[objective]
  length = int(_get(run_config, "seq_len"))
  model = _get(run_config, "model", {})
  loss = loss_dict(_get(run_config, "loss", {}))
  block = fmt.block_size(length, loss)
  keep_clean_bos = bool(loss.get("keep_clean_bos", True))
  noise = fmt.noise_config(length, loss)

  ids = {HF_SPECIAL[k]: int(v) for k, v in special_ids.items()}
  tokenization = {
    "vocab_size": int(tokenizer_vocab_size or vocab_size),
    **ids,
    "pad_vocab_size_multiple": 1,
  }
  backbone = {
    "_target_": DIT_TARGET,
    "length": length,
    "causal_attention": fmt.causal_attention,
    "adaln": bool(adaln),
    "hidden_size": int(hidden_size),
    "cond_dim": int(cond_dim),
    "n_heads": int(num_heads),
    "num_layers": int(num_layers),
    "dropout": float(_get(model, "dropout", 0.1)),
    "tie_word_embeddings": True,
    "attn_backend": "sdpa",
    "vocab_size": int(vocab_size),
    "block_size": block,
    "pretrained_model_name_or_path": None,
  }
  cfg = {
    "model_type": model_type,
    "architectures": [arch],
    "length": length,
    "block_size": block,
    "eval_block_size": block,
    "attn_backend": "sdpa",
    "keep_clean_bos": keep_clean_bos,
    "train_on_context": False,
    "setdlm_eos_last_in_target_order": bool(loss.get("eos_last", False)),
    "setdlm_fht_cache_order": False,
    "tokenizer_name": None,  # the official loader then uses the checkpoint directory
    **tokenization,
    "tokenization_config": dict(tokenization),
    "backbone_config": backbone,
    "noise_config": noise,
    "torch_dtype": "float32",
    "setdiff_jax": {
      "format_version": FORMAT_VERSION,
      "objective": objective,
      "mlp_ratio": int(mlp_ratio),
      "rope_base": float(rope_base),
      **dict(extra or {}),
    },
  }
  return cfg


def generation_config(run_config, special_ids: Mapping[str, int]) -> Dict[str, Any]:
  """A `generation_config.json`: HF fields plus the set-diffusion sampler knobs (SPEC §4.1)."""
  fmt = formats.get(str(_get(run_config, "objective", objectives.DEFAULT)))
  length = int(_get(run_config, "seq_len"))
  loss = loss_dict(_get(run_config, "loss", {}))
  sampling = _get(run_config, "sampling", None)
  gen = {
    "bos_token_id": int(special_ids["bos_id"]),
    "eos_token_id": int(special_ids["eos_id"]),
    "pad_token_id": int(special_ids["pad_id"]),
    "mask_token_id": int(special_ids["mask_id"]),
    "do_sample": False,
    "use_cache": True,
    "max_length": length,
  }
  gen.update(fmt.generation_fields(length, loss))
  for ours, theirs in (
    ("window_size", "max_window_size"),
    ("max_window_size", "max_window_size"),
    ("confidence_threshold", "confidence_threshold"),
    ("nucleus_p", "nucleus_p"),
    ("num_steps", "num_steps"),
    ("do_sample", "do_sample"),
  ):
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
  for hay in (
    " ".join(cfg.get("architectures") or []).lower(),
    str(cfg.get("model_type", "")).lower(),
    str(path_hint).lower(),
  ):
    for fmt in formats.HF_MATCH_ORDER:
      if re.search(fmt.name_pattern, hay):
        return fmt.name
  raise ValueError(
    f"cannot tell the model family from config.json (architectures="
    f"{cfg.get('architectures')}, model_type={cfg.get('model_type')})"
  )


def loss_dict(loss) -> Dict[str, Any]:
  """A run config's `loss` block as a plain dict (ConfigDict, dict or None)."""
  if loss is None:
    return {}
  return dict(loss.to_dict() if hasattr(loss, "to_dict") else loss)


def from_hf_config(cfg: Mapping, path_hint: str = "") -> Tuple[Dict[str, Any], List[str]]:
  """Our fields from an official or exported `config.json`.

  Returns ({"objective", "seq_len", "model": {...}, "loss": {...}, "special_ids": {...},
  "stored_max_set_size", "tokenizer_vocab_size"}, warnings). Applies the S_max normalisation.
  """
  warns: List[str] = []
  objective = objective_from_hf(cfg, path_hint)
  bb = backbone_fields(cfg)
  noise = cfg.get("noise_config") or {}
  length = (
    cfg.get("length") or (cfg.get("backbone_config") or {}).get("length") or noise.get("length")
  )
  if length is None:
    raise ValueError("config.json has no `length`")
  length = int(length)
  model = {
    k: bb[k]
    for k in ("hidden_size", "num_layers", "num_heads", "cond_dim", "adaln", "dropout", "mlp_ratio")
  }
  model["vocab_size"] = int(bb["vocab_size"]) if bb["vocab_size"] is not None else 0
  if bb["rope_base"] != 10000.0:
    model["rope_base"] = bb["rope_base"]
  fmt = formats.get(objective)
  loss: Dict[str, Any] = {}
  kcb = cfg.get("keep_clean_bos")
  if isinstance(kcb, bool):
    loss["keep_clean_bos"] = kcb
  else:
    loss["keep_clean_bos"] = fmt.default_keep_clean_bos
    warns.append(
      f"config.json keep_clean_bos={kcb!r}; using {loss['keep_clean_bos']} (the "
      f"official eval loader's default)"
    )
  loss.update(fmt.loss_fields(cfg, length, path_hint, warns))
  stored = noise.get("max_block_size")  # only the staggered schedule stores S_max
  tok = cfg.get("tokenization_config") or {}
  special = {}
  for ours, hf in HF_SPECIAL.items():
    v = tok.get(hf, cfg.get(hf))
    if v is not None:
      special[ours] = int(v)
  return {
    "objective": objective,
    "seq_len": length,
    "model": model,
    "loss": loss,
    "special_ids": special,
    "stored_max_set_size": stored,
    "tokenizer_vocab_size": tok.get("vocab_size", cfg.get("vocab_size")),
    "causal_attention": bb["causal_attention"],
  }, warns


__all__ = [
  "to_hf_config",
  "generation_config",
  "from_hf_config",
  "backbone_fields",
  "objective_from_hf",
  "normalize_special_ids",
  "HF_CLASSES",
  "FORMAT_VERSION",
]
