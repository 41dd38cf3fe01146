"""Reading Hugging Face Qwen3 directories and Qwen3 SetDLM checkpoints (SPEC §3.10, §9).

  read_hf(path, num_layers=None) -> (model_fields, params, special_ids, tokenizer_dir)
  read_official(path, raw) -> (model_fields, params, notes)
  resolved_model(config, params) -> model_fields      (for the exporters in export.py)

`params` are numpy fp32 in our layout (first `num_layers` layers); `import_.import_checkpoint`
turns these pieces into a run config. The HF-directory checks, the shard listing and the sharded
loader live in `setdiff_jax/interop/pretrained.py` (training uses them too); the key correspondence is
`qwen3_map.py`.

The official `config.json` does not carry the Qwen3 architecture (the official loader reads a
template from `backbone_config.pretrained_model_name_or_path`, the hub id of a Qwen3 base in the
released checkpoints; our exports point it at their own `qwen3_config/` folder), so `read_official`
takes it from our `setdiff_jax.qwen3` block when present, else from the weight shapes plus the
public Qwen3 defaults (theta 1e6, eps 1e-6), with a note.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from setdiff_jax.interop import pretrained
from setdiff_jax.data import tokenizers
from setdiff_jax.interop import qwen3_map
from setdiff_jax.interop import weight_files
from setdiff_jax.interop.name_map import flatten, unflatten

AUTOMODEL_TARGET = "backbone_automodel.AutoModelFromPreTrained"
# The official loader builds the backbone with AutoConfig.from_pretrained(backbone_config.
# pretrained_model_name_or_path, **overrides) (reinit_model: no weights read). Our exports carry
# that template themselves, a plain Qwen3 config.json in this sub-folder, so no hub is needed.
TEMPLATE_DIR = "qwen3_config"


def template_config(m: Mapping) -> dict:
  """The `config.json` of a plain HF Qwen3 with the run's architecture (no weights).
  `sliding_window: null` as the released Qwen3 configs: transformers 4.x (the official code's)
  defaults it to 4096 and then warns "Sliding Window Attention is enabled" on every layer."""
  return {
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
    **pretrained.to_hf_fields(m),
    "sliding_window": None,
    "torch_dtype": "float32",
    # the released Qwen3's value: with plain RoPE (the only kind we load) the logits do not
    # depend on it; the context the run trained on is its config.json's seq_len
    "max_position_embeddings": 40960,
  }


def dims_of(m: Mapping) -> qwen3_map.Dims:
  return qwen3_map.Dims.from_config(pretrained.backbone_cfg_of(m))


def _read_rows(shards, rows, stripped_to_key, layout_keys):
  """Reads the needed tensors shard by shard (numpy, float32)."""
  from safetensors import safe_open

  by_file: Dict[str, list] = {}
  for r in rows:
    key = stripped_to_key[r.hf_key]
    by_file.setdefault(layout_keys[key][1], []).append((r, key))
  flat = {}
  for file in shards:
    with safe_open(file, framework="np") as f:
      for r, key in by_file.get(file, []):
        a = np.asarray(weight_files.check_tensor(file, key, f.get_tensor(key)), np.float32)
        flat[r.flax_path] = np.ascontiguousarray(a.T) if r.transpose else a
  return flat


def _read_params(path: str, m: Dict[str, Any], context: str, available: int):
  """Params (numpy) of the first m['num_layers'] layers of the safetensors weights in `path`,
  whose config declares `available` layers (a weight of a layer beyond them is refused)."""
  shards = pretrained.weight_shards(path)
  shapes = pretrained.shard_shapes(shards)
  stripped = qwen3_map.strip(shapes, qwen3_map.detect_layout(shapes))
  dims = dims_of(m)
  rows = qwen3_map.check_keys(
    {k: shapes[v][0] for k, v in stripped.items()},
    dims,
    context=context,
    available_layers=available,
  )
  flat = _read_rows(shards, rows, stripped, shapes)
  if dims.tie_embeddings and qwen3_map.TIED_HEAD_KEY in stripped:
    head = _read_rows(
      shards, [qwen3_map.Row(qwen3_map.TIED_HEAD_KEY, ("h",), False, (), None)], stripped, shapes
    )[("h",)]
    qwen3_map.check_tied(head, flat[("embed", "embedding")], context)
  return unflatten(flat)


def read_hf(path: str, num_layers: Optional[int] = None, *, with_tokenizer: bool = True):
  """(model fields, params, special ids, tokenizer dir) of a plain HF Qwen3 directory."""
  raw = pretrained.read_hf_config(path)
  m = pretrained.model_fields(raw, os.path.join(path, weight_files.CONFIG_FILE))
  pretrained.resolve_layers(m, int(raw["num_hidden_layers"]), num_layers, path)
  params = _read_params(path, m, path, int(raw["num_hidden_layers"]))
  special, tok_dir = {}, None
  if with_tokenizer and os.path.isfile(os.path.join(path, "tokenizer.json")):
    special = tokenizers.qwen3_tokenizer(path).special_ids()
    tok_dir = os.path.abspath(path)
  return m, params, special, tok_dir


def official_model_fields(raw: Mapping, shapes: Mapping[str, tuple], where: str, notes: List[str]):
  """Our model fields for an official Qwen3 SetDLM config.json + its (stripped) weight shapes."""
  ours = (raw.get("setdiff_jax") or {}).get("qwen3")
  if isinstance(ours, Mapping):
    return pretrained.model_fields({**ours, "model_type": "qwen3"}, where)
  bb = raw.get("backbone_config") or {}
  dims = qwen3_map.dims_from_shapes(shapes, bb.get("num_attention_heads"))
  theta = float(bb.get("rope_theta", pretrained.DEFAULT_THETA))
  eps = float(bb.get("rms_norm_eps", pretrained.DEFAULT_EPS))
  notes.append(
    f"{where}: the Qwen3 architecture is not in config.json (the official loader "
    f"reads it from {bb.get('pretrained_model_name_or_path')!r}); dims read off the "
    f"weights, rope_theta={theta}, rms_norm_eps={eps} (the public Qwen3 values)"
  )
  tie = bool(bb.get("tie_word_embeddings", True))  # Qwen3-0.6B/1.7B-Base tie the head
  return {
    "backbone": "qwen3",
    "vocab_size": dims.vocab_size,
    "hidden_size": dims.hidden_size,
    "num_layers": dims.num_layers,
    "num_heads": dims.num_heads,
    "num_kv_heads": dims.num_kv_heads,
    "head_dim": dims.head_dim,
    "intermediate_size": dims.intermediate_size,
    "rope_base": theta,
    "rms_norm_eps": eps,
    "tie_embeddings": tie,
    "adaln": False,
  }


def read_official(path: str, raw: Mapping):
  """(model fields, params, notes) of an official (or our exported) Qwen3 SetDLM directory."""
  notes: List[str] = []
  if not any(
    os.path.isfile(os.path.join(path, f))
    for f in (weight_files.SAFETENSORS_FILE, pretrained.INDEX_FILE)
  ):
    # pytorch_model.bin (the official push): read whole (needs torch), then map
    full = weight_files.read_state_dict(path)
    state = {k: full[v] for k, v in qwen3_map.strip(full, "official").items()}
    m = official_model_fields(raw, {k: np.shape(v) for k, v in state.items()}, path, notes)
    params = qwen3_map.to_flax(state, dims_of(m), context=path, available_layers=m["num_layers"])
    params = unflatten({p: np.asarray(a, np.float32) for p, a in flatten(params).items()})
  else:
    shapes = pretrained.shard_shapes(pretrained.weight_shards(path))
    stripped = {k: shapes[v][0] for k, v in qwen3_map.strip(shapes, "official").items()}
    m = official_model_fields(raw, stripped, path, notes)
    params = _read_params(path, m, path, m["num_layers"])  # any key outside the map is an error
  return m, params, notes


def resolved_model(config, params) -> Dict[str, Any]:
  """The Qwen3 model fields of a run, with the vocabulary of `params`."""
  model = dict(config.get("model", {}) if hasattr(config, "get") else config["model"])
  cfg = pretrained.backbone_cfg_of(model)
  vocab = int(np.shape(flatten(params)[("embed", "embedding")])[0])
  fields = {
    f: getattr(cfg, f)
    for f in (
      "hidden_size",
      "num_layers",
      "num_heads",
      "num_kv_heads",
      "head_dim",
      "intermediate_size",
      "rope_base",
      "rms_norm_eps",
      "tie_embeddings",
    )
  }
  return {**fields, "vocab_size": vocab}


def official_backbone_config(m: Mapping, causal: bool, base: str) -> dict:
  """The `backbone_config` of a Qwen3 SetDLM: AutoModelFromPreTrained + AutoConfig overrides
  (`reinit_model`: the official loader builds exactly this architecture, then loads weights).
  `base`: the config template AutoConfig reads (an export's own TEMPLATE_DIR, absolute)."""
  hf = pretrained.to_hf_fields(m)
  return {
    "_target_": AUTOMODEL_TARGET,
    "automodel_cls": "AutoModelForCausalLM",
    "pretrained_model_name_or_path": base,
    "revision": None,
    "trust_remote_code": True,
    "num_layers": int(m["num_layers"]),
    "keep_top_layers": False,
    "reinit_model": True,
    "attn_implementation": "sdpa",
    "use_causal_mask": bool(causal),
    **{k: v for k, v in hf.items() if k != "num_hidden_layers"},
  }


__all__ = [
  "read_hf",
  "read_official",
  "official_model_fields",
  "resolved_model",
  "official_backbone_config",
  "template_config",
  "dims_of",
  "AUTOMODEL_TARGET",
  "TEMPLATE_DIR",
]
