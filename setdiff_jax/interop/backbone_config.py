"""The official `backbone_config` block of config.json (SPEC §9.2), in our field names.

Plain Python (no jax): the PyTorch reference reads it too, and imports without jax.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping

DIT_TARGET = "backbone_dit.DIT"


def is_qwen3(cfg: Mapping) -> bool:
  """An official Qwen3 SetDLM config.json (`backbone_automodel.AutoModelFromPreTrained`)."""
  target = str((cfg.get("backbone_config") or {}).get("_target_", DIT_TARGET)).lower()
  return "automodel" in target or "qwen" in target


def backbone_fields(cfg: Mapping) -> Dict[str, Any]:
  """The DiT hyperparameters in our names, from `config.json` (no validation against weights)."""
  bb = cfg.get("backbone_config") or {}
  extra = cfg.get("setdiff_jax") or {}
  if is_qwen3(cfg):
    # Qwen3 SetDLM: the architecture is read by interop/qwen3_hf.py (our block or the weights).
    return {
      "vocab_size": bb.get("vocab_size", cfg.get("vocab_size")),
      "hidden_size": bb.get("hidden_size"),
      "num_layers": bb.get("num_layers"),
      "num_heads": bb.get("num_attention_heads"),
      "cond_dim": 128,
      "adaln": False,
      "dropout": 0.0,
      "causal_attention": bool(bb.get("use_causal_mask", False)),
      "mlp_ratio": 4,
      "rope_base": float(bb.get("rope_theta", 1e6)),
    }
  out = {
    "vocab_size": bb.get("vocab_size", cfg.get("vocab_size")),
    "hidden_size": bb.get("hidden_size"),
    "num_layers": bb.get("num_layers"),
    "num_heads": bb.get("n_heads"),
    "cond_dim": bb.get("cond_dim", 128),
    "adaln": bool(bb.get("adaln", False)),
    "dropout": bb.get("dropout", 0.1),
    "causal_attention": bool(bb.get("causal_attention", False)),
    "mlp_ratio": int(extra.get("mlp_ratio", 4)),
    "rope_base": float(extra.get("rope_base", 10000.0)),
  }
  missing = [k for k in ("hidden_size", "num_layers", "num_heads") if out[k] in (None, -1)]
  if missing:
    raise ValueError(f"config.json backbone_config lacks {missing}")
  return out


__all__ = ["DIT_TARGET", "backbone_fields", "is_qwen3"]
