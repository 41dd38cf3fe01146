"""Import an official or exported checkpoint directory into our config and parameters.

  config, params = import_checkpoint(path)

`config` is our run ConfigDict (`run_config.default_config()` layout; the exporter's saved run config when the
directory is ours) with `seq_len`, `objective`, `model.*`, `loss.*` set from config.json, and an
added `interop` block: `source`, `special_ids` {bos_id, eos_id, pad_id, mask_id}, `tokenizer_dir`
(the directory when it holds tokenizer.json, else None), `stored_max_set_size`, `step`, `ema`.
`params` is a nested dict of float32 numpy arrays with exactly the `models.init_params` structure
(stacked `blocks/...` / `layers/...` when the stored run config has `model.scan_layers`).

Documented behaviour:
  - S_max: a stored `max_block_size` >= L (the released configs store L) becomes min(2S, L), as the
    official eval loader does (SPEC §1.2, §8.5), with an `InteropWarning`.
  - any missing key, unexpected key or shape mismatch raises `CheckpointMismatchError`, which
    lists all of them;
  - `static_attention_mask` (and legacy `sampling_eps_min/max`) are ignored with a warning;
    `rotary_emb.inv_freq` is checked against 10000^(-2j/Dh), then dropped (a mismatch raises);
  - Qwen3: a plain HF Qwen3 directory (`model_type: qwen3`; returned with the default method and
    all layers) and an official / exported Qwen3 SetDLM (`backbone_config._target_`
    AutoModelFromPreTrained, keys `backbone.model.*`) are read by `qwen3_hf.py`;
    `config.model.backbone = "qwen3"`.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any, Callable, Dict, Optional, Tuple

import ml_collections
import ml_dtypes
import numpy as np

from setdiff_jax import models
from setdiff_jax import layer_names
from setdiff_jax.data import tokenizers
from setdiff_jax.interop import backbone_config, hf_config, name_map, qwen3_hf
from setdiff_jax.interop import weight_files
from setdiff_jax.config.run import default_config

log = logging.getLogger(__name__)


class InteropWarning(UserWarning):
  """A checkpoint field was normalised or a known non-parameter key ignored."""


def _warn(msg: str):
  log.warning("%s", msg)
  warnings.warn(msg, InteropWarning, stacklevel=3)


def _merge(base: ml_collections.ConfigDict, updates: Dict[str, Any], where: str = ""):
  """Recursively sets `updates` into `base`, skipping (with a log line) values of another type."""
  for k, v in updates.items():
    name = f"{where}{k}"
    if k in base and isinstance(base[k], ml_collections.ConfigDict) and isinstance(v, dict):
      _merge(base[k], v, name + ".")
      continue
    try:
      if k not in base and isinstance(v, dict):
        base[k] = ml_collections.ConfigDict(v)
      else:
        base[k] = v
    except (TypeError, ValueError, KeyError) as e:
      log.info("run config field %s=%r not restored (%s)", name, v, e)


def _check_hidden_size(state, hidden: int, cfg_path: str):
  """The config's width against the weights', before anything derived from it (head_dim, rotary)
  can fail with a less direct message."""
  emb = state.get("vocab_embed.embedding")
  if emb is not None and len(np.shape(emb)) == 2 and int(np.shape(emb)[1]) != hidden:
    raise ValueError(
      f"hidden size mismatch: {cfg_path} says hidden_size={hidden} but the weights "
      f"have hidden size {int(np.shape(emb)[1])} (vocab_embed.embedding "
      f"{tuple(np.shape(emb))}); fix hidden_size in that config.json"
    )


def _stored_dtypes(stored: np.ndarray) -> list:
  """The precisions `stored` may have been saved in: its own when half, else float32 and any
  half type holding it exactly (a .bin or bfloat16 file is read back as float32)."""
  if stored.dtype in (np.float16, ml_dtypes.bfloat16):
    return [stored.dtype]
  got = stored.astype(np.float32)
  halves = [d for d in (np.float16, ml_dtypes.bfloat16) if np.array_equal(got.astype(d), got)]
  return [np.dtype(np.float32)] + halves


def _check_rotary(value, head_dim: int, rope_base: float):
  """`value`, the stored inv_freq buffer [head_dim / 2], must be base^(-2j/head_dim) rounded to
  the precision it was stored in (model.half() saves the buffer in fp16 too): within one ulp of
  that dtype (rtol 1e-6 in float32); a different base or head dim is refused."""
  want = name_map.rotary_inv_freq(head_dim, rope_base)
  stored = np.asarray(value).reshape(-1)
  got = stored.astype(np.float32)
  if got.shape == want.shape:
    for dtype in _stored_dtypes(stored):
      info = ml_dtypes.finfo(dtype)
      rtol = 1e-6 if dtype == np.float32 else float(info.eps)
      rounded = want.astype(dtype).astype(np.float32)
      if np.allclose(got, rounded, rtol=rtol, atol=float(info.smallest_subnormal)):
        return
  raise ValueError(
    f"{name_map.ROTARY_KEY} does not match base={rope_base}, head_dim={head_dim} "
    f"(stored as {stored.dtype}): found {got[:4]}..., expected {want[:4]}...; the checkpoint was "
    "trained with another rope base or head count: fix setdiff_jax.rope_base or "
    "backbone_config.n_heads in its config.json"
  )


def _check_structure(config, params):
  """The params must have exactly the structure and shapes `models.init_params` makes."""
  want = name_map.flatten(models.param_shapes(models.backbone_config(config.model), seq_len=8))
  got = name_map.flatten(params)
  missing = ["/".join(p) for p in want if p not in got]
  extra = ["/".join(p) for p in got if p not in want]
  bad = [
    ("/".join(p), got[p].shape, want[p].shape)
    for p in want
    if p in got and tuple(got[p].shape) != tuple(want[p].shape)
  ]
  if missing or extra or bad:
    raise name_map.CheckpointMismatchError(
      missing, extra, bad, "name map vs setdiff_jax.models.dit (a stale name map?)"
    )


def _without_config(path: str) -> str:
  """What a folder without config.json is, in words."""
  try:
    weight_files.weight_files(path)
  except (FileNotFoundError, OSError, ValueError, KeyError):
    return "not a checkpoint directory"
  return (
    "the folder holds weights but no config.json: an export into it was interrupted (or is "
    "still running), or it was copied in part; export it again (--overwrite) or copy it again"
  )


def _check_export_id(path: str, raw: dict, recompute: Optional[Callable[[], str]] = None):
  """Refuses weights and a config.json of two different exports of ours (an interrupted or
  concurrent export into one folder, or a weight file copied in from another export): each writes
  one new id, a digest of the tensors, into both (`export._write_export`). A model.safetensors
  carries it in its header, compared before any tensor is read (`recompute` None); once the
  weights are read, the importers call it again with `recompute`, the id of the tensors (the DiT
  importer's from what it read, the Qwen3 one's streamed from the file: `file_export_id`): for a
  pytorch_model.bin, which has no header, that is the comparison; for a model.safetensors whose
  header agrees, it finds bytes changed in place since the export. A safetensors without the id
  was written by another tool (HF save_pretrained): not compared, nor are weights under a
  config.json without one (the user's way to import edited weights)."""
  want = (raw.get("setdiff_jax") or {}).get("export_id")
  if not want:
    return
  try:
    fmt = weight_files.weight_files(path)[0]
  except FileNotFoundError:
    return  # no weights: the importer names what is missing
  name = weight_files.BIN_FILE if fmt == "bin" else weight_files.SAFETENSORS_FILE
  header = None if fmt == "bin" else weight_files.export_id_of(path)
  if recompute is None:
    got = header  # None for a .bin: compared once read
  elif fmt == "bin" or header is not None:
    got = recompute()
  else:
    return
  if got is None or got == want:
    return
  if fmt == "bin" or recompute is None:
    cause = (
      f"its {name} and config.json come from two different exports (export ids {got[:8]} and "
      f"{want[:8]}): an export into this folder was interrupted, two ran at once, or the weights "
      "were copied from another export; export it again (--overwrite)"
    )
  else:
    cause = (
      f"the tensors of its {name} changed since the export (they digest to {got[:8]}, the "
      f"export id its header and config.json name is {want[:8]}): the file was damaged (a disk "
      "or an interrupted copy) or edited in place; export it again (--overwrite) or copy it again"
    )
  raise ValueError(
    f"{path}: {cause}. Weights you changed on purpose (fine-tuned in PyTorch): delete "
    'config.json\'s "setdiff_jax": {"export_id"} entry, then the import takes them'
  )


def import_checkpoint(
  path: str, *, check_structure: bool = True
) -> Tuple[ml_collections.ConfigDict, Dict[str, Any]]:
  """(config, params) from an exported or official checkpoint directory (see module doc)."""
  path = os.fspath(path)
  cfg_path = os.path.join(path, weight_files.CONFIG_FILE)
  if not os.path.isfile(cfg_path):
    raise FileNotFoundError(f"{cfg_path} not found: {_without_config(path)}")
  raw = weight_files.read_json(cfg_path)
  _check_export_id(path, raw)
  if raw.get("model_type") == "qwen3":  # a plain Hugging Face Qwen3 directory
    config, params = _qwen3_hf_import(path)
  elif "backbone_config" not in raw and raw.get("model_type") not in hf_config.HF_MODEL_TYPES:
    raise ValueError(
      f"{cfg_path}: model_type={raw.get('model_type')!r} is neither a Hugging Face "
      f"Qwen3 (model_type 'qwen3') nor a SetDLM export "
      f"({sorted(hf_config.HF_MODEL_TYPES)} with a backbone_config)"
    )
  elif backbone_config.is_qwen3(raw):
    config, params = _qwen3_official_import(path, raw)
  else:
    config, params = _dit_import(path, raw)
  # The files are per layer; a run saved with model.scan_layers gets its stacked tree back.
  params = layer_names.to_layout(params, bool(config.model.get("scan_layers", False)))
  if check_structure:
    _check_structure(config, params)
  return config, params


def _qwen3_hf_import(path: str):
  m, params, special, tok_dir = qwen3_hf.read_hf(path)
  config = default_config()
  _merge(config.model, {**m, "dropout": 0.0})
  if tok_dir is not None:
    config.tokenizer.kind = "qwen3"
    config.tokenizer.vocab_path = os.path.join(tok_dir, "tokenizer.json")
  config.interop = ml_collections.ConfigDict(
    {
      "source": os.path.abspath(path),
      "format": "hf",
      "special_ids": special,
      "tokenizer_dir": tok_dir,
      "stored_max_set_size": None,
      "step": None,
      "ema": None,
      "causal_attention": True,
      "tokenizer_vocab_size": None,
    }
  )
  return config, params


def _qwen3_official_import(path: str, raw):
  fields, notes = hf_config.from_hf_config(raw, path_hint=path)
  # Before the read: a damaged file is named as such, not by the first check it fails.
  _check_export_id(path, raw, lambda: weight_files.file_export_id(path))
  m, params, more = qwen3_hf.read_official(path, raw)
  for n in notes + more:
    _warn(n)
  return _assemble(path, raw, fields, m), params


def _assemble(path: str, raw, fields, m):
  """Our run config from the official fields and the model fields `m`."""
  config = default_config()
  extra = raw.get("setdiff_jax") or {}
  if isinstance(extra.get("run_config"), dict):
    _merge(config, extra["run_config"])
  config.objective = fields["objective"]
  config.seq_len = fields["seq_len"]
  _merge(config.model, {k: v for k, v in m.items()})
  _merge(config.loss, fields["loss"])
  has_tokenizer = os.path.isfile(os.path.join(path, "tokenizer.json"))
  config.interop = ml_collections.ConfigDict(
    {
      "source": os.path.abspath(path),
      "special_ids": dict(fields["special_ids"]),
      "tokenizer_dir": os.path.abspath(path) if has_tokenizer else None,
      "tokenizer_vocab_size": fields["tokenizer_vocab_size"],
      "stored_max_set_size": fields["stored_max_set_size"],
      "causal_attention": fields["causal_attention"],
      "step": extra.get("step"),
      "ema": extra.get("ema"),
    }
  )
  return config


def _dit_import(path: str, raw):
  fields, notes = hf_config.from_hf_config(raw, path_hint=path)
  for n in notes:
    _warn(n)

  tensors = weight_files.read_state_dict(path)
  _check_export_id(path, raw, lambda: weight_files.export_id(tensors))
  state, buffers = name_map.split_known_buffers(name_map.strip_prefix(tensors))
  where, known = weight_files.label(path), {id(b) for b in buffers.values()}
  for k, v in tensors.items():  # parameters (by their names in the file): float and finite
    if id(v) not in known:
      weight_files.check_tensor(where, k, v)
  m = fields["model"]
  _check_hidden_size(state, int(m["hidden_size"]), os.path.join(path, weight_files.CONFIG_FILE))
  head_dim = int(m["hidden_size"]) // int(m["num_heads"])
  rope_base = float(m.get("rope_base", 10000.0))
  for k, v in buffers.items():
    if k == name_map.ROTARY_KEY:
      _check_rotary(v, head_dim, rope_base)
    else:
      _warn(f"ignoring non-parameter buffer {k!r} {tuple(np.shape(v))}")

  if int(m["vocab_size"]) <= 0 and "vocab_embed.embedding" in state:
    m["vocab_size"] = int(np.shape(state["vocab_embed.embedding"])[0])
    _warn(f"backbone_config.vocab_size missing; using {m['vocab_size']} from the embedding")
  dims = name_map.Dims(
    int(m["vocab_size"]),
    int(m["hidden_size"]),
    int(m["num_layers"]),
    int(m["mlp_ratio"]),
    int(m["cond_dim"]),
    bool(m["adaln"]),
  )
  params = name_map.torch_to_flax(state, dims, context=path)
  dtypes = {str(a.dtype) for a in name_map.flatten(params).values()}
  if dtypes != {"float32"}:
    _warn(f"weights stored as {sorted(dtypes)}; converted to float32")
    params = name_map.unflatten(
      {p: np.asarray(a, np.float32) for p, a in name_map.flatten(params).items()}
    )

  return _assemble(path, raw, fields, m), params


def load_tokenizer(path: str):
  """Our `Tokenizer` from a checkpoint directory (ours, or an official one with tokenizer.json)."""
  if os.path.isfile(os.path.join(path, "special_tokens.json")):
    return tokenizers.Tokenizer.load(path)
  import tokenizers as hf

  raw = weight_files.read_json(os.path.join(path, weight_files.CONFIG_FILE))
  fields, _ = hf_config.from_hf_config(raw, path_hint=path)
  ids = fields["special_ids"]
  return tokenizers.Tokenizer(
    hf.Tokenizer.from_file(os.path.join(path, "tokenizer.json")), kind="hf", **ids
  )


__all__ = ["import_checkpoint", "load_tokenizer", "default_config", "InteropWarning"]
