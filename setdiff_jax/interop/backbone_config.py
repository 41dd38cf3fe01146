"""The official `backbone_config` block of config.json (SPEC §9.2), in our field names.

Plain Python (no jax): the PyTorch reference reads it too, and imports without jax.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping

DIT_TARGET = "backbone_dit.DIT"


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


__all__ = ["DIT_TARGET", "backbone_fields"]
