"""Export our parameters to the official checkpoint layout (SPEC §9.2-9.3). No torch needed
unless `fmt="bin"`.

Writes into `out_dir`:
  model.safetensors | pytorch_model.bin   `backbone.`-prefixed DiT keys, PyTorch orientation, fp32,
                                          plus the `backbone.rotary_emb.inv_freq` buffer
  config.json                             the fields the reference reads (see hf_config.py)
  generation_config.json                  special ids and sampler defaults
  tokenizer.json, special_tokens.json,    when a tokenizer is given (ours: `Tokenizer.save`),
  tokenizer_config.json,                  plus the HF files that let `AutoTokenizer` load it
  special_tokens_map.json
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Any, Callable, Mapping, Optional

import numpy as np

import jax

from setdiff_jax import errors, models, objectives, paths
from setdiff_jax import layer_names
from setdiff_jax.workdir import fallback
from setdiff_jax.workdir import load as workdir_lib
from setdiff_jax.interop import pretrained
from setdiff_jax.interop import formats, hf_config, name_map, qwen3_hf, qwen3_map
from setdiff_jax.interop import staging, weight_files
from setdiff_jax.interop.export_dir import check_export_dir

log = logging.getLogger(__name__)


def _to_numpy_tree(params):
  """Nested dict of host numpy float arrays (gathers jax arrays, including sharded ones), in the
  per-layer layout whatever `model.scan_layers` was (the file layout never depends on it)."""
  flat = name_map.flatten(layer_names.unstack_layers(params))
  out = {}
  for path, v in flat.items():
    if hasattr(v, "is_fully_addressable") and not v.is_fully_addressable:
      from jax.experimental import multihost_utils

      v = multihost_utils.process_allgather(v, tiled=True)
    out[path] = np.asarray(v)
  return name_map.unflatten(out)


def _run_config_json(config) -> Optional[dict]:
  try:
    if hasattr(config, "to_json_best_effort"):
      return json.loads(config.to_json_best_effort())
    return json.loads(json.dumps(dict(config), default=str))
  except (TypeError, ValueError) as e:  # never block an export on provenance
    log.warning("run config not serialisable (%s); exporting without it", e)
    return None


def _get(cfg, key, default=None):
  return hf_config._get(cfg, key, default)


def _write_tokenizer(tokenizer, out_dir: str, special: Mapping[str, int], length: int):
  tokenizer.save(out_dir)
  id_to_token = getattr(tokenizer, "id_to_token", None)
  tokens = {}
  if callable(id_to_token):
    for k in hf_config.SPECIAL_KEYS:
      tok = id_to_token(special[k])
      if tok is not None:
        tokens[k.replace("_id", "_token")] = tok
  tok_cfg = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "model_max_length": int(length),
    "clean_up_tokenization_spaces": False,
    **tokens,
  }
  weight_files.write_json(tok_cfg, os.path.join(out_dir, "tokenizer_config.json"))
  weight_files.write_json(tokens, os.path.join(out_dir, "special_tokens_map.json"))


def _check_dims(model_cfg, dims: name_map.Dims, special: Mapping[str, int]) -> float:
  """Refuses a run config that disagrees with its parameters' dims or special ids outside the
  vocabulary; warns when the official code cannot load the export. Returns the RoPE base."""
  for key, got in (
    ("hidden_size", dims.hidden_size),
    ("num_layers", dims.num_layers),
    ("mlp_ratio", dims.mlp_ratio),
    ("adaln", dims.adaln),
  ):
    want = _get(model_cfg, key, None)
    if want is not None and want != got:
      raise ValueError(f"config model.{key}={want} but the parameters have {got}")
  want_vocab = int(_get(model_cfg, "vocab_size", 0) or 0)
  if want_vocab and want_vocab != dims.vocab_size:
    raise ValueError(
      f"config model.vocab_size={want_vocab} but the parameters have {dims.vocab_size}"
    )
  rope_base = float(_get(model_cfg, "rope_base", 10000.0) or 10000.0)
  if dims.mlp_ratio != 4 or rope_base != 10000.0:
    log.warning(
      "mlp_ratio=%s / rope_base=%s: the official DIT fixes 4 / 10000, so this export "
      "loads in our importer and PyTorch reference but not in the official code",
      dims.mlp_ratio,
      rope_base,
    )
  for k, v in special.items():
    if not 0 <= v < dims.vocab_size:
      raise ValueError(f"special id {k}={v} outside the vocabulary (V={dims.vocab_size})")
  return rope_base


def _check_heads(model_cfg, dims: name_map.Dims, rope_base: float) -> int:
  """model.num_heads, refused (one ValueError) unless the backbone our importer rebuilds from the
  export's config.json is valid: D divisible by H, even head dim (rotary)."""
  num_heads = _get(model_cfg, "num_heads", None)
  if num_heads is None:
    raise ValueError(
      "config model.num_heads is not set; the export's config.json needs the run's head "
      f"count: set model.num_heads (a divisor of hidden_size={dims.hidden_size})"
    )
  fields = {
    **dict(model_cfg),
    "hidden_size": dims.hidden_size,
    "num_layers": dims.num_layers,
    "mlp_ratio": dims.mlp_ratio,
    "cond_dim": dims.cond_dim,
    "adaln": dims.adaln,
    "rope_base": rope_base,
  }
  try:
    fields["num_heads"] = int(num_heads)
    models.backbone_config(fields, dims.vocab_size)  # the checks the importer's model makes
  except (TypeError, ValueError) as e:
    raise ValueError(
      f"config model (num_heads={num_heads!r}, hidden_size={dims.hidden_size}) cannot be "
      f"exported: {e}; our importer would refuse that config.json: fix the model field named "
      "(set model.num_heads to the run's head count: hidden_size / num_heads an even integer)"
    ) from e
  return fields["num_heads"]


def _write_export(stage: str, config, state, hf_cfg, special, tokenizer, fmt: str):
  """Writes the weight file, config.json, generation_config.json and the tokenizer files into the
  staging folder `stage` (`staging.staged`). config.json and a model.safetensors carry one
  export id, which `import_checkpoint` compares (for a pytorch_model.bin, which has no header, with
  the id of the tensors read back): the weights of one export never import under another's
  config.json."""
  export_id = weight_files.export_id(state)
  hf_cfg["setdiff_jax"]["export_id"] = export_id
  weight_files.write_state_dict(state, stage, fmt, export_id=export_id)
  weight_files.write_json(
    hf_config.generation_config(config, special),
    os.path.join(stage, weight_files.GENERATION_CONFIG_FILE),
  )
  if tokenizer is not None:
    _write_tokenizer(tokenizer, stage, special, int(_get(config, "seq_len")))
  weight_files.write_json(hf_cfg, os.path.join(stage, weight_files.CONFIG_FILE))


def export_checkpoint(
  config,
  params,
  out_dir: str,
  *,
  tokenizer=None,
  special_ids: Optional[Mapping[str, int]] = None,
  fmt: str = "safetensors",
  step: Optional[int] = None,
  ema: Optional[bool] = None,
  overwrite: bool = True,
) -> str:
  """Writes `params` of the run `config` to `out_dir` in the official layout; returns out_dir.

  Args:
    config: our run ConfigDict (`seq_len`, `objective`, `model.*`, `loss.*`), or a mapping alike.
    params: nested dict of arrays (numpy or jax), `models.init_params` layout.
    tokenizer: optional object with bos_id/eos_id/pad_id/mask_id/vocab_size and `save(dir)`;
      its files are written and its ids used.
    special_ids: {bos_id, eos_id, pad_id, mask_id} (or *_token_id); needed without a tokenizer,
      and overriding it when both are given.
    fmt: "safetensors" (numpy only) or "bin" (torch).
    step, ema: provenance recorded in config.json's `setdiff_jax` block.
    overwrite: replace the files of a non-empty `out_dir` (else FileExistsError). A training
      workdir, or a folder inside one, is always refused (ValueError).
  """
  if fmt not in weight_files.FORMATS:
    raise ValueError(f"format={fmt!r}; use one of {weight_files.FORMATS}")
  if str(_get(_get(config, "model", {}), "backbone", "dit") or "dit") == "qwen3":
    if fmt != "safetensors":
      raise ValueError(
        f"fmt={fmt!r}: Qwen3 exports are written as model.safetensors only (fmt='safetensors')"
      )
    return export_qwen3_official(
      config,
      params,
      out_dir,
      tokenizer=tokenizer,
      special_ids=special_ids,
      step=step,
      ema=ema,
      overwrite=overwrite,
    )
  special = hf_config.normalize_special_ids(tokenizer, special_ids)
  params = _to_numpy_tree(params)
  model_cfg = _get(config, "model", {})
  dims = name_map.dims_from_params(params, cond_dim=_get(model_cfg, "cond_dim", 128))
  rope_base = _check_dims(model_cfg, dims, special)
  num_heads = _check_heads(model_cfg, dims, rope_base)
  length = int(_get(config, "seq_len"))
  method_format = formats.get(str(_get(config, "objective", objectives.DEFAULT)))
  for warning in method_format.warnings(length, hf_config.loss_dict(_get(config, "loss", {}))):
    log.warning("%s", warning)

  extra = {
    "step": None if step is None else int(step),
    "ema": ema,
    "run_config": _run_config_json(config),
  }
  cfg = hf_config.to_hf_config(
    config,
    vocab_size=dims.vocab_size,
    hidden_size=dims.hidden_size,
    num_layers=dims.num_layers,
    num_heads=num_heads,
    mlp_ratio=dims.mlp_ratio,
    cond_dim=dims.cond_dim,
    adaln=dims.adaln,
    special_ids=special,
    tokenizer_vocab_size=getattr(tokenizer, "vocab_size", None),
    rope_base=rope_base,
    extra=extra,
  )
  state = name_map.flax_to_torch(
    params,
    dims,
    prefix=name_map.PREFIX,
    include_rotary=dims.hidden_size // num_heads,
    rope_base=rope_base,
  )
  state = {k: v.astype(np.float32) if v.dtype != np.float32 else v for k, v in state.items()}

  with staging.staged(out_dir, overwrite) as stage:
    _write_export(stage, config, state, cfg, special, tokenizer, fmt)
  log.info("exported %d tensors to %s (%s)", len(state), out_dir, fmt)
  return out_dir


def export_qwen3_hf(config, params, out_dir: str, *, tokenizer=None, overwrite: bool = True) -> str:
  """A plain HF Qwen3 directory (`Qwen3ForCausalLM.from_pretrained` loads it); `overwrite` as in
  `export_checkpoint`."""
  params = _to_numpy_tree(params)
  m = qwen3_hf.resolved_model(config, params)
  state = qwen3_map.from_flax(params, qwen3_hf.dims_of(m), "hf")
  special = hf_config.normalize_special_ids(tokenizer, {}) if tokenizer is not None else {}
  cfg = {
    **qwen3_hf.template_config(m),
    **{hf_config.HF_SPECIAL[k]: v for k, v in special.items() if k != "mask_id"},
  }
  with staging.staged(out_dir, overwrite) as stage:
    weight_files.write_state_dict(state, stage, "safetensors")
    if tokenizer is not None:
      tokenizer.save(stage)
    weight_files.write_json(cfg, os.path.join(stage, weight_files.CONFIG_FILE))
  return out_dir


def export_qwen3_official(
  config,
  params,
  out_dir: str,
  *,
  tokenizer=None,
  special_ids: Optional[Mapping[str, int]] = None,
  step=None,
  ema=None,
  overwrite: bool = True,
) -> str:
  """A Qwen3 run in the official SetDLM layout (SPEC §3.10, §9.2): `backbone.model.*` keys
  (PyTorch orientation, fp32, lm_head written even when tied, as the denoiser's state dict),
  config.json with the official fields plus the architecture, tokenizer weight_files.
  `overwrite` as in `export_checkpoint`."""
  params = _to_numpy_tree(params)
  m = qwen3_hf.resolved_model(config, params)
  special = hf_config.normalize_special_ids(tokenizer, special_ids)
  cfg = hf_config.to_hf_config(
    config,
    vocab_size=m["vocab_size"],
    hidden_size=m["hidden_size"],
    num_layers=m["num_layers"],
    num_heads=m["num_heads"],
    mlp_ratio=0,
    cond_dim=0,
    adaln=False,
    special_ids=special,
    tokenizer_vocab_size=getattr(tokenizer, "vocab_size", None),
    rope_base=m["rope_base"],
    extra={
      "step": step,
      "ema": ema,
      "qwen3": pretrained.to_hf_fields(m),
      "run_config": _run_config_json(config),
    },
  )
  causal = cfg["backbone_config"]["causal_attention"]  # the method's (registry) choice
  # The template the official loader reads (AutoConfig, offline): this export's own folder. It
  # resolves against the process's directory, so the path is absolute; after moving the export,
  # re-point it (README "Load in the official code"). Our importer never reads it.
  template = os.path.abspath(os.path.join(out_dir, qwen3_hf.TEMPLATE_DIR))
  cfg["backbone_config"] = qwen3_hf.official_backbone_config(m, causal, template)
  cfg["setdiff_jax"].pop("mlp_ratio", None)
  cfg["setdiff_jax"]["qwen3_template"] = qwen3_hf.TEMPLATE_DIR
  state = qwen3_map.from_flax(params, qwen3_hf.dims_of(m), "official")
  with staging.staged(out_dir, overwrite) as stage:
    os.makedirs(os.path.join(stage, qwen3_hf.TEMPLATE_DIR))
    weight_files.write_json(
      qwen3_hf.template_config(m),
      os.path.join(stage, qwen3_hf.TEMPLATE_DIR, weight_files.CONFIG_FILE),
    )
    _write_export(stage, config, state, cfg, special, tokenizer, "safetensors")
  return out_dir


def _is_qwen3(config) -> bool:
  return str(config.get("model", {}).get("backbone", "dit")) == "qwen3"


def _check_backbone_options(config, workdir: str, out: str, fmt: str, verify):
  """What a Qwen3 run's export cannot do: a .bin, a remote --out; --verify needs transformers."""
  if not _is_qwen3(config):
    return
  if fmt != "safetensors":
    raise ValueError(
      f"--format={fmt}: {workdir} is a Qwen3 run, exported in the official Qwen3-SetDLM layout "
      "as model.safetensors only; drop --format"
    )
  if verify is not None:
    errors.require_extra("transformers", "torch", "--verify of a Qwen3 export (the HF Qwen3)")
  if paths.is_remote(out):  # its config.json points at its template folder by path
    raise ValueError(
      f"--out={out}: a Qwen3 export is written to a local directory (its "
      "config.json names its template folder by path); export locally, then copy"
    )


def export_workdir(
  workdir: str,
  out: str,
  *,
  use_ema: bool = True,
  step: Optional[int] = None,
  fmt: str = "safetensors",
  verify: Optional[Callable[[Any, Any, str], dict]] = None,
  overwrite: bool = False,
):
  """Exports a training workdir's checkpoint (parameters only, `workdir.load_inference_state`).

  On several hosts every process must call this (restoring and gathering are collective); only
  process 0 writes. Returns (out, report or None): `verify(config, params, local_dir)`, if given,
  checks the written export on process 0 (`setdiff_jax.testing.verify.export_report`: it needs
  torch, and transformers for Qwen3). `out` must be a new or empty directory (`overwrite`: any
  directory but a training workdir, whose earlier export is replaced).
  """
  check_export_dir(out, workdir, overwrite=overwrite)
  # The optional extras, before anything is restored or written: one error line naming the extra.
  if verify is not None and not callable(verify):
    raise TypeError(
      f"export_workdir(verify={verify!r}): pass the check itself, e.g. "
      "setdiff_jax.testing.verify.export_report, or None"
    )
  if verify is not None:
    errors.require_extra("torch", "torch", "--verify (the PyTorch reference)")
  if fmt == "bin":
    errors.require_extra("torch", "torch", "--format=bin (pytorch_model.bin)")
  try:  # what the run's config.json decides, before the restore (minutes for a large run)
    _check_backbone_options(workdir_lib.load_config(workdir), workdir, out, fmt, verify)
  except FileNotFoundError:
    pass  # the restore names what is missing
  state = workdir_lib.load_inference_state(workdir, step=step, use_ema=use_ema)
  if state.params is None:
    raise ValueError(f"checkpoint of {workdir} has no {'EMA ' if use_ema else ''}parameters")
  _check_backbone_options(state.config, workdir, out, fmt, verify)
  params = _to_numpy_tree(state.params)
  report = None
  if jax.process_index() == 0:
    # An object-store --out: written to a local folder, published when complete (`staging`).
    if paths.is_remote(out):
      stage = staging.published_remote(out, overwrite)
    else:  # export_checkpoint stages and publishes it (`staging`)
      stage = contextlib.nullcontext(out)
    with stage as local:
      try:
        export_checkpoint(
          state.config,
          params,
          local,
          tokenizer=state.tokenizer,
          fmt=fmt,
          step=state.step,
          ema=use_ema,
          overwrite=overwrite,
        )
      except Exception as e:  # noqa: BLE001 - ENOSPC / EFBIG in whatever writer type
        what = errors.write_limit(e)
        if what is None:
          raise
        raise errors.DiskFullError(
          f"{what} while exporting to {out} ({fallback.short(e)}); nothing was published there "
          f"(an earlier export there is intact) and the run {workdir} is intact: "
          f"{errors.limit_fix(what)} and export again"
        ) from e
      if verify is not None:
        report = verify(state.config, params, local)
    log.info(
      "exported step %d (%s params) of %s to %s",
      state.step,
      _params_label(state.config, use_ema),
      workdir,
      out,
    )
  return out, report


def _params_label(config, use_ema: bool) -> str:
  """Which parameters were exported, in words (with ema_decay = 0 the EMA copy is the raw one)."""
  if not use_ema:
    return "raw"
  return "EMA = raw (ema_decay=0)" if float(config.get("ema_decay", 1.0) or 0.0) == 0.0 else "EMA"


def repoint_qwen3_template(export_dir: str) -> str:
  """Points a moved Qwen3 export's `backbone_config.pretrained_model_name_or_path` at its own
  template folder again (the official loader resolves it against the current directory, so
  it is stored absolute); returns the new path. Our importer does not need this."""
  path = os.path.join(export_dir, weight_files.CONFIG_FILE)
  cfg = weight_files.read_json(path)
  sub = (cfg.get("setdiff_jax") or {}).get("qwen3_template")
  if not sub or not isinstance(cfg.get("backbone_config"), dict):
    raise ValueError(
      f"{path} is not a Qwen3 export of setdiff_jax with a local template "
      f"(no setdiff_jax.qwen3_template); re-export it with launch/export.py"
    )
  template = os.path.abspath(os.path.join(export_dir, sub))
  if not os.path.isfile(os.path.join(template, weight_files.CONFIG_FILE)):
    raise FileNotFoundError(f"{template}/config.json is missing: copy the whole export folder")
  cfg["backbone_config"]["pretrained_model_name_or_path"] = template
  weight_files.write_json(cfg, path)
  return template


__all__ = [
  "export_checkpoint",
  "check_export_dir",
  "export_workdir",
  "export_qwen3_official",
  "export_qwen3_hf",
  "repoint_qwen3_template",
]
