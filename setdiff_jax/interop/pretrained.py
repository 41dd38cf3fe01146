"""Initialising a run from a local Hugging Face Qwen3 directory (`config.init_from_hf`; SPEC §3.10).

  config = pretrained.resolve_run_config(config)     # model fields 0 -> the checkpoint's
  params = pretrained.load_params_sharded(path, backbone_cfg, shardings)

Reads `config.json` (checked: a directory, a config.json, `model_type: qwen3`, no attention bias /
sliding window, silu, no RoPE scaling; no rope_theta = transformers' 10000, with a warning), the
safetensors shards (every shard the index names must exist) and loads the first `num_layers`
layers tensor by tensor straight into the target shardings: each device's callback reads only its
slice (`safe_open(...).get_slice`), checked finite, so the host never holds a second copy of the
model. Never downloads. The key correspondence is the one name map, `interop/qwen3_map.py`
(numpy only); `interop/qwen3_hf.py` builds import/export on top of this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

import jax
import numpy as np

from setdiff_jax import paths
from setdiff_jax.config import sections
from setdiff_jax.data import tokenizers
from setdiff_jax.interop import qwen3_map
from setdiff_jax.interop import weight_files
from setdiff_jax.models import qwen3 as qwen3_lib
from setdiff_jax.workdir import lock
from setdiff_jax.interop.name_map import CheckpointMismatchError, flatten, unflatten

INDEX_FILE = "model.safetensors.index.json"
DEFAULT_THETA, DEFAULT_EPS = 1_000_000.0, 1e-6  # every public Qwen3 config
# A config.json without rope_theta: what transformers' Qwen3Config (4.x and 5.x) then uses.
HF_DEFAULT_THETA = 10_000.0

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- HF config
def read_hf_config(path: str) -> dict:
  path = os.fspath(path)
  if not os.path.isdir(path):
    raise FileNotFoundError(
      f"{path!r} is not a directory (a local Hugging Face Qwen3 checkout "
      f"is expected; nothing is downloaded)"
    )
  cfg_path = os.path.join(path, weight_files.CONFIG_FILE)
  if not os.path.isfile(cfg_path):
    raise FileNotFoundError(f"{cfg_path} not found: {path!r} is not a Hugging Face model directory")
  raw = weight_files.read_json(cfg_path)
  if raw.get("model_type") != "qwen3":
    raise ValueError(
      f"{cfg_path}: model_type={raw.get('model_type')!r}; only 'qwen3' "
      f"(Qwen3ForCausalLM) checkpoints are supported"
    )
  return raw


def _rope_theta(raw: Mapping, where: str) -> float:
  """θ of a Qwen3 config.json with plain RoPE: any scaling (`rope_parameters` or the legacy
  `rope_scaling`, key `rope_type` or the older `type`) is refused, never silently dropped."""
  thetas = {}
  if raw.get("rope_theta") is not None:
    thetas["rope_theta"] = float(raw["rope_theta"])
  for field in ("rope_parameters", "rope_scaling"):
    rp = raw.get(field) or {}
    if not isinstance(rp, Mapping) or any(isinstance(v, Mapping) for v in rp.values()):
      raise ValueError(f"{where}: {field}={rp!r} is not supported (one plain RoPE for all layers)")
    for key in ("rope_type", "type"):
      if rp.get(key) not in (None, "default"):
        raise ValueError(
          f"{where}: RoPE scaling {field}.{key}={rp[key]!r} is not supported (plain RoPE only): "
          "use a checkpoint without RoPE scaling"
        )
    if rp.get("rope_theta") is not None:
      thetas[f"{field}.rope_theta"] = float(rp["rope_theta"])
  if len(set(thetas.values())) > 1:  # transformers 4.x and 5.x would read different ones
    raise ValueError(f"{where}: conflicting RoPE θ {thetas}: keep one rope_theta")
  if not thetas:
    log.warning(
      "%s has no rope_theta: using %s, transformers' Qwen3Config default (public Qwen3 configs "
      "set 1e6)",
      where,
      HF_DEFAULT_THETA,
    )
    return HF_DEFAULT_THETA
  return next(iter(thetas.values()))


def model_fields(raw: Mapping, where: str = "config.json") -> Dict[str, Any]:
  """Our `config.model` fields from an HF Qwen3 config dict."""
  for key, ok in (("attention_bias", False), ("use_sliding_window", False)):
    if bool(raw.get(key, False)) != ok:
      raise ValueError(f"{where}: {key}={raw.get(key)} is not supported by our Qwen3")
  if raw.get("hidden_act", "silu") != "silu":
    raise ValueError(f"{where}: hidden_act={raw.get('hidden_act')!r}; only silu is supported")
  heads = int(raw["num_attention_heads"])
  return {
    "backbone": "qwen3",
    "vocab_size": int(raw["vocab_size"]),
    "hidden_size": int(raw["hidden_size"]),
    "num_layers": int(raw["num_hidden_layers"]),
    "num_heads": heads,
    "num_kv_heads": int(raw.get("num_key_value_heads") or heads),
    "head_dim": int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
    "intermediate_size": int(raw["intermediate_size"]),
    "rope_base": _rope_theta(raw, where),
    "rms_norm_eps": float(raw.get("rms_norm_eps", DEFAULT_EPS)),
    "tie_embeddings": bool(raw.get("tie_word_embeddings", False)),
    "adaln": False,
  }


def to_hf_fields(m: Mapping) -> Dict[str, Any]:
  """HF Qwen3Config fields from our `config.model` (resolved) fields."""
  return {
    "vocab_size": int(m["vocab_size"]),
    "hidden_size": int(m["hidden_size"]),
    "intermediate_size": int(m["intermediate_size"]),
    "num_hidden_layers": int(m["num_layers"]),
    "num_attention_heads": int(m["num_heads"]),
    "num_key_value_heads": int(m["num_kv_heads"]),
    "head_dim": int(m["head_dim"]),
    "hidden_act": "silu",
    "rms_norm_eps": float(m["rms_norm_eps"]),
    "rope_theta": float(m["rope_base"]),
    "tie_word_embeddings": bool(m["tie_embeddings"]),
    "attention_bias": False,
    "attention_dropout": 0.0,
    "use_sliding_window": False,
  }


def backbone_cfg_of(m: Mapping) -> qwen3_lib.Qwen3Config:
  return qwen3_lib.Qwen3Config.from_config(m)


# ----------------------------------------------------------------------------- weight files
def weight_shards(path: str) -> List[str]:
  """The safetensors files of `path` (`weight_files.weight_files`: model.safetensors, else the
  index's shards, all of which must exist)."""
  fmt, files = weight_files.weight_files(path)
  if fmt != "safetensors":
    raise FileNotFoundError(
      f"no safetensors weights in {path!r}: expected {weight_files.SAFETENSORS_FILE} or "
      f"{INDEX_FILE} with its shards (found {os.path.basename(files[0])})"
    )
  return files


def shard_shapes(shards: List[str]) -> Dict[str, Tuple[Tuple[int, ...], str]]:
  """{key: (shape, file)} without reading any tensor."""
  from safetensors import SafetensorError, safe_open

  out = {}
  for file in shards:
    try:
      with safe_open(file, framework="np") as f:
        for k in f.keys():
          out[k] = (tuple(f.get_slice(k).get_shape()), file)
    except SafetensorError as e:  # the header check: a truncated file does not cover its tensors
      raise weight_files.damaged_safetensors(file, e) from e
  return out


def resolve_layers(m: Dict[str, Any], available: int, num_layers: Optional[int], where: str):
  if num_layers is None or int(num_layers) <= 0:
    num_layers = available
  if int(num_layers) > available:
    raise ValueError(
      f"num_layers={num_layers} but {where} has only {available} layers "
      f"(set model.num_layers <= {available}, or 0 for all)"
    )
  m["num_layers"] = int(num_layers)


# ----------------------------------------------------------------------------- sharded load
def _stacked_path(path: Tuple[str, ...]) -> Tuple[str, ...]:
  """("layers_3", "q_proj", "kernel") -> ("layers", "q_proj", "kernel") (model.scan_layers)."""
  return (re.sub(r"_\d+$", "", path[0]),) + tuple(path[1:])


def load_params_sharded(path: str, backbone_cfg, shardings, *, context: str = ""):
  """The first `backbone_cfg.num_layers` layers of a HF / official dir as jax arrays placed in
  `shardings` (a pytree like the params), tensor by tensor: each device's callback reads only its
  slice (`safe_open(...).get_slice`), so the host never holds a second full copy. With
  `scan_layers`, each stacked `layers/...` [num_layers, ...] array is read the same way, its
  callback stacking the device's slice of every layer it holds."""
  from safetensors import safe_open

  shards = weight_shards(path)
  shapes = shard_shapes(shards)
  layout = qwen3_map.detect_layout(shapes)
  stripped = qwen3_map.strip(shapes, layout)
  dims = qwen3_map.Dims.from_config(backbone_cfg)
  rows = qwen3_map.check_keys(
    {k: shapes[v][0] for k, v in stripped.items()}, dims, context=context or path
  )
  scanned = bool(getattr(backbone_cfg, "scan_layers", False))
  target = lambda r: _stacked_path(r.flax_path) if scanned and r.layer is not None else r.flax_path
  flat_sh = {p: s for p, s in flatten(shardings).items()}
  groups: Dict[Tuple[str, ...], list] = {}
  for r in rows:
    groups.setdefault(target(r), []).append(r)
  if set(flat_sh) != set(groups):
    raise CheckpointMismatchError(
      sorted("/".join(p) for p in set(groups) - set(flat_sh)),
      sorted("/".join(p) for p in set(flat_sh) - set(groups)),
      (),
      "shardings vs the Qwen3 name map",
    )
  out = {}
  with contextlib.ExitStack() as stack:  # a stacked tensor's layers may sit in several shards
    handles = {f: stack.enter_context(safe_open(f, framework="np")) for f in shards}
    if dims.tie_embeddings and qwen3_map.TIED_HEAD_KEY in stripped:  # never read, else dropped
      _check_tied_in_files(handles, stripped, shapes, context or path)

    def reader(r):
      key = stripped[r.hf_key]
      file = shapes[key][1]
      sl = handles[file].get_slice(key)

      def read(index):  # NaN / Inf / integer weights named here, not blamed on the lr later
        index = tuple(index) + (slice(None),) * (len(r.flax_shape) - len(index))
        if r.transpose:
          a = weight_files.check_tensor(file, key, sl[tuple(reversed(index))])
          return np.ascontiguousarray(np.asarray(a, np.float32).T)
        return np.asarray(weight_files.check_tensor(file, key, sl[index]), np.float32)

      return read

    for p, group in groups.items():
      if not (scanned and group[0].layer is not None):
        out[p] = jax.make_array_from_callback(group[0].flax_shape, flat_sh[p], reader(group[0]))
        continue
      reads = [reader(r) for r in sorted(group, key=lambda r: r.layer)]
      shape = (len(reads),) + group[0].flax_shape

      def read_stacked(index, reads=reads, ndim=len(shape)):
        index = tuple(index) + (slice(None),) * (ndim - len(index))
        return np.stack([reads[j](index[1:]) for j in range(len(reads))[index[0]]])

      out[p] = jax.make_array_from_callback(shape, flat_sh[p], read_stacked)
  return unflatten(out)


def _check_tied_in_files(handles, stripped, shapes, context: str, rows: int = 4096):
  """`qwen3_map.check_tied` on the files, `rows` vocabulary rows at a time (the host never holds
  the whole embedding twice): a head that differs would be dropped for the embedding."""
  head, embed = (stripped[k] for k in (qwen3_map.TIED_HEAD_KEY, qwen3_map.EMBED_KEY))
  a, b = (handles[shapes[k][1]].get_slice(k) for k in (head, embed))
  if tuple(shapes[head][0]) != tuple(shapes[embed][0]):
    raise ValueError(
      f"{context}: tie_word_embeddings=true but lm_head.weight {tuple(shapes[head][0])} and "
      f"model.embed_tokens.weight {tuple(shapes[embed][0])} differ in shape; set "
      "tie_word_embeddings=false in config.json"
    )
  n = int(shapes[embed][0][0])
  for start in range(0, n, rows):  # safetensors slices are not clamped at the end
    end = min(start + rows, n)
    qwen3_map.check_tied(a[start:end], b[start:end], context)


# ----------------------------------------------------------------------------- training init
_FROM_HF = (
  "vocab_size",
  "hidden_size",
  "num_heads",
  "num_kv_heads",
  "head_dim",
  "intermediate_size",
  "rope_base",
)


def _field_default(name: str):
  return {f.name: f.default for f in dataclasses.fields(sections.Model)}[name]


def _resumed_from(workdir: Optional[str]) -> Tuple[Optional[dict], str]:
  """(WORKDIR's config.json, its path) when WORKDIR has checkpoints of a Qwen3 run: a resume
  takes the model and tokenizer from there (the base directory may have moved or gone);
  else (None, "")."""
  if not workdir or not lock.saved_steps(workdir):
    return None, ""
  file = paths.join(workdir, lock.CONFIG_FILE)
  if not paths.isfile(file):
    return None, ""  # check_resume refuses it (or accept_missing_config): the HF dir is needed
  try:
    saved = json.loads(paths.read_text(file))
  except ValueError:
    return None, ""  # check_resume names the damaged file
  model = saved.get("model") or {}
  resolved = all(model.get(k) for k in _FROM_HF + ("num_layers", "rms_norm_eps"))
  if model.get("backbone") != "qwen3" or not resolved or "tie_embeddings" not in model:
    return None, ""
  return saved, file


def _resolve_eps_and_tie(m, source: Mapping, where: str):
  """`rms_norm_eps` / `tie_embeddings` of `source` unless set otherwise. Their defaults are not 0:
  a field at its default (or eps 0) takes the checkpoint's value (an explicit default cannot be
  told apart from none); any other value must agree."""
  eps_default, tie_default = _field_default("rms_norm_eps"), _field_default("tie_embeddings")
  eps, tie = m.get("rms_norm_eps", 0), m.get("tie_embeddings", tie_default)
  if eps and eps != eps_default and float(eps) != float(source["rms_norm_eps"]):
    raise ValueError(
      f"model.rms_norm_eps={eps} but {where} has {source['rms_norm_eps']}; set "
      "--config.model.rms_norm_eps=0 to take the checkpoint's value"
    )
  if bool(tie) != tie_default and bool(tie) != bool(source["tie_embeddings"]):
    raise ValueError(
      f"model.tie_embeddings={tie} but {where} has tie_embeddings={source['tie_embeddings']}; "
      f"drop the override (the default, {tie_default}, takes the checkpoint's value)"
    )
  m.rms_norm_eps = float(source["rms_norm_eps"])
  m.tie_embeddings = bool(source["tie_embeddings"])


def resolve_run_config(config, workdir: Optional[str] = None):
  """A copy of the run `config` with `model.*` filled from `config.init_from_hf`'s config.json.

  Fields left 0 take the checkpoint's value; a non-zero value must equal it; `rms_norm_eps` and
  `tie_embeddings` at their defaults (or eps 0) take the checkpoint's, another value must equal
  it; `model.num_layers` 0 = all, N = the first N (SPEC §3.10 `num_layers`). The tokenizer must
  be the checkpoint's (`qwen3`; without `vocab_path`: the directory's tokenizer.json). When
  `workdir` has checkpoints and a config.json (a resume), the 0 fields and the tokenizer path come
  from that config.json instead, so the base directory is not needed; `lock.check_resume` then
  refuses a changed explicit setting. Raises ValueError naming the field and the fix.
  """
  path = str(config.init_from_hf)
  config = config.copy_and_resolve_references()
  m = config.model
  if str(m.get("backbone", "dit")) != "qwen3":
    raise ValueError(
      f"init_from_hf={path!r} needs model.backbone='qwen3' (got {m.get('backbone')!r})"
    )
  if config.get("init_from"):
    raise ValueError("set either init_from (our checkpoint) or init_from_hf (a HF directory)")
  kind = config.tokenizer.get("kind")
  if kind != "qwen3":  # another tokenizer's ids would index the pretrained embedding wrongly
    raise ValueError(
      f"init_from_hf needs the checkpoint's tokenizer, tokenizer.kind='qwen3' (got {kind!r}): "
      "set --config.tokenizer.kind=qwen3"
    )
  saved, where = _resumed_from(workdir)
  if saved is not None:
    source = saved["model"]
  else:
    where = os.path.join(path, weight_files.CONFIG_FILE)
    source = model_fields(read_hf_config(path), where)
  for k in _FROM_HF:
    ours = m.get(k, 0)
    if not ours:
      m[k] = type(m[k])(source[k]) if k in m and m[k] is not None else source[k]
    elif type(source[k])(ours) != source[k]:
      raise ValueError(
        f"model.{k}={ours} but {where} has {source[k]}; set "
        f"--config.model.{k}=0 to take the checkpoint's value"
      )
  _resolve_eps_and_tie(m, source, where)
  if saved is not None:  # another num_layers: check_resume; the tokenizer is WORKDIR/tokenizer/
    m.num_layers = int(m.get("num_layers", 0) or source["num_layers"])
    if not config.tokenizer.get("vocab_path"):
      config.tokenizer.vocab_path = (saved.get("tokenizer") or {}).get("vocab_path")
    return config
  resolve_layers(m, source["num_layers"], m.get("num_layers", 0), where)
  if not config.tokenizer.get("vocab_path"):
    config.tokenizer.vocab_path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(config.tokenizer.vocab_path):
      raise ValueError(
        f"{path} has no tokenizer.json (init_from_hf takes the tokenizer from there): copy the "
        "checkpoint's tokenizer.json into it, or set --config.tokenizer.vocab_path=FILE"
      )
  _check_tokenizer_fits(config.tokenizer.vocab_path, int(m.vocab_size), where)
  return config


def _check_tokenizer_fits(vocab_path: str, rows: int, where: str):
  """The embedding must have a row for every id of the tokenizer."""
  tok = tokenizers.qwen3_tokenizer(vocab_path)
  if tok.vocab_size > rows:
    raise ValueError(
      f"the tokenizer {vocab_path} has {tok.vocab_size} ids but {where} has vocab_size={rows} "
      f"(embedding rows; ids >= {rows} have none): it is not this checkpoint's tokenizer, set "
      "--config.tokenizer.vocab_path to the tokenizer.json that came with the weights"
    )


__all__ = [
  "read_hf_config",
  "model_fields",
  "to_hf_fields",
  "weight_shards",
  "shard_shapes",
  "resolve_layers",
  "load_params_sharded",
  "resolve_run_config",
  "backbone_cfg_of",
  "INDEX_FILE",
  "DEFAULT_THETA",
  "DEFAULT_EPS",
  "HF_DEFAULT_THETA",
]
