"""Interop with the official PyTorch / HF checkpoint layout (SPEC §3.9, §9).

  export_checkpoint(config, params, out_dir, tokenizer=None, special_ids=None, fmt="safetensors")
  export_workdir(workdir, out, ...)       a training workdir's checkpoint (`launch/export.py`)
  import_checkpoint(path) -> (config, params)
  jax_logits(config, params, tokens, positions, allowed) -> logits       (ours, any backbone)
  export_qwen3_official / export_qwen3_hf(config, params, out_dir, tokenizer=None)   (Qwen3)

Submodules: `name_map` (the one declarative key map, numpy only), `hf_config` (config.json
translation), `formats` (each method's config.json fields), `weight_files`, `export`,
`export_dir` (where an export may be written; stale weights removed), `import_`.
No torch is needed unless a `.bin` file is read or written. The PyTorch reference and the parity
checks behind `launch/export.py --verify` are in `setdiff_jax.testing`.
"""

from setdiff_jax.interop.export import (
  export_checkpoint,
  export_qwen3_hf,
  export_qwen3_official,
  export_workdir,
)
from setdiff_jax.interop.import_ import InteropWarning, import_checkpoint, load_tokenizer
from setdiff_jax.interop.logits import jax_logits
from setdiff_jax.interop.name_map import NAME_MAP, CheckpointMismatchError
from setdiff_jax.interop.qwen3_map import NAME_MAP as QWEN3_NAME_MAP

__all__ = [
  "export_checkpoint",
  "export_workdir",
  "export_qwen3_official",
  "export_qwen3_hf",
  "import_checkpoint",
  "load_tokenizer",
  "InteropWarning",
  "jax_logits",
  "NAME_MAP",
  "QWEN3_NAME_MAP",
  "CheckpointMismatchError",
]
