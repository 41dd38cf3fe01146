"""Interop with the official PyTorch / HF checkpoint layout (SPEC §3.9, §9).

  export_checkpoint(config, params, out_dir, tokenizer=None, special_ids=None, fmt="safetensors")
  import_checkpoint(path) -> (config, params)
  forward_logits(config, params, tokens, positions, allowed) -> logits   (PyTorch reference)
  jax_logits(config, params, tokens, positions, allowed) -> logits       (ours, any backbone)
  export_qwen3_official / export_qwen3_hf(config, params, out_dir, tokenizer=None)   (Qwen3)

Submodules: `name_map` (the one declarative key map, numpy only), `hf_config` (config.json
translation), `weight_files`, `export`, `import_`, `torch_reference` (torch + numpy only).
Attributes are imported lazily, so `setdiff_jax.interop.torch_reference` imports without jax and
the exporter without torch.
"""

import importlib

_LAZY = {
  "export_checkpoint": ("export", "export_checkpoint"),
  "export_workdir": ("export", "export_workdir"),
  "import_checkpoint": ("import_", "import_checkpoint"),
  "jax_logits": ("logits", "jax_logits"),
  "export_qwen3_official": ("export", "export_qwen3_official"),
  "export_qwen3_hf": ("export", "export_qwen3_hf"),
  "QWEN3_NAME_MAP": ("qwen3_map", "NAME_MAP"),
  "load_tokenizer": ("import_", "load_tokenizer"),
  "InteropWarning": ("import_", "InteropWarning"),
  "CheckpointMismatchError": ("name_map", "CheckpointMismatchError"),
  "NAME_MAP": ("name_map", "NAME_MAP"),
  "forward_logits": ("torch_reference", "forward_logits"),
  "load_reference": ("torch_reference", "load_reference"),
  "TorchDiT": ("torch_reference", "TorchDiT"),
}

__all__ = sorted(_LAZY)


def __getattr__(name):
  if name in _LAZY:
    module, attr = _LAZY[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + list(_LAZY))
