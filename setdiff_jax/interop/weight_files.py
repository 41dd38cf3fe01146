"""Reading and writing the weight files of an HF-style checkpoint directory (numpy; torch optional).

Weights live in `model.safetensors` (written by us by default, numpy only) or `pytorch_model.bin`
(the official push uses `safe_serialization=False`; reading or writing it needs torch), possibly
sharded with a `*.index.json` whose `weight_map` names the shard of each key.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import re
from typing import Dict, Mapping, Optional, Tuple

import ml_dtypes
import numpy as np

from setdiff_jax import errors

SAFETENSORS_FILE = "model.safetensors"
BIN_FILE = "pytorch_model.bin"
CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
FORMATS = ("safetensors", "bin")
EXPORT_ID_KEY = (
  "setdiff_jax_export_id"  # the safetensors header field; config.json's setdiff_jax.export_id
)

log = logging.getLogger(__name__)


_warned_both = set()  # the folders already warned about (the files are looked up several times)


def weight_files(path: str) -> Tuple[str, list]:
  """(format, [files]) of the weights in directory `path`, in transformers' order: safetensors
  before .bin, and within a format the single file before the index (a folder holding both had
  two saves: transformers' sharded save leaves an earlier single file, its single save an earlier
  index; warned once). The shards an index names must all exist."""
  for fmt, single in (("safetensors", SAFETENSORS_FILE), ("bin", BIN_FILE)):
    index = os.path.join(path, single + ".index.json")
    if os.path.isfile(os.path.join(path, single)):
      if os.path.isfile(index) and path not in _warned_both:
        _warned_both.add(path)
        log.warning(
          "%s holds both %s and %s (two saves into one folder): reading %s, as transformers "
          "does; delete the stale one",
          path,
          single,
          os.path.basename(index),
          single,
        )
      return fmt, [os.path.join(path, single)]
    if os.path.isfile(index):
      weight_map = read_json(index).get("weight_map")
      if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index}: no weight_map naming the shard of each tensor")
      shards = sorted(set(map(str, weight_map.values())))
      missing = [s for s in shards if not os.path.isfile(os.path.join(path, s))]
      if missing:
        raise FileNotFoundError(
          f"{index} names shards that are not in {path!r}: {missing}; copy them in (or delete "
          "the index if it is left from an earlier save)"
        )
      return fmt, [os.path.join(path, s) for s in shards]
  raise FileNotFoundError(
    f"no weights in {path!r}: expected {SAFETENSORS_FILE} or {BIN_FILE} (or a sharded *.index.json)"
  )


def _torch_to_numpy(t) -> np.ndarray:
  import torch  # noqa: F401  (only reached when torch is installed)

  t = t.detach().cpu()
  if t.dtype in (torch.bfloat16, torch.float16):
    t = t.float()
  return t.numpy()


def damaged_safetensors(file: str, e: BaseException) -> ValueError:
  """The error for a safetensors file its reader rejects (truncated, or not safetensors)."""
  return ValueError(
    f"weights file {file} is truncated or damaged ({e}); copy it again (or export it again)"
  )


def _read_safetensors(file: str) -> Dict[str, np.ndarray]:
  from safetensors import SafetensorError
  from safetensors.numpy import load_file

  try:
    return dict(load_file(file))
  except SafetensorError as e:
    raise damaged_safetensors(file, e) from e
  except (TypeError, ValueError) as e:  # a dtype this safetensors cannot give numpy
    try:
      from safetensors.torch import load_file as load_torch
    except ModuleNotFoundError as ie:
      errors.missing_extra(ie, "torch", "torch", f"reading {file} (numpy cannot: {e})")
      raise
    return {k: _torch_to_numpy(v) for k, v in load_torch(file).items()}


def _unreadable_bin(file: str, e: BaseException) -> ValueError:
  """One line for a pytorch_model.bin torch cannot load weights-only (never the advice to unpickle
  it in full, which would run code from the file)."""
  text = str(e)
  unpickler = re.search(r"WeightsUnpickler error:\s*([^\n]+)", text)
  if unpickler and "Unsupported global" in unpickler.group(1):
    return ValueError(
      f"{file} pickles Python objects besides tensors ({unpickler.group(1).split(' was ')[0]}), "
      "which a weights-only load refuses (nothing in it is run): save the state dict alone, "
      "torch.save(model.state_dict(), path), or export it as safetensors"
    )
  why = unpickler.group(1) if unpickler else (text.splitlines() or [type(e).__name__])[0]
  return ValueError(
    f"weights file {file} is truncated or damaged ({why or type(e).__name__}); copy it again (or "
    "export it again)"
  )


def _read_bin(file: str) -> Dict[str, np.ndarray]:
  torch = errors.require_extra(
    "torch",
    "torch",
    f"reading {file} (a pytorch_model.bin; --format=safetensors exports need no torch)",
  )
  try:
    state = torch.load(file, map_location="cpu", weights_only=True)
  except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as e:
    raise _unreadable_bin(file, e) from e
  if (
    isinstance(state, dict)
    and "state_dict" in state
    and not any(hasattr(v, "shape") for v in state.values())
  ):
    state = state["state_dict"]
  return {k: _torch_to_numpy(v) for k, v in state.items() if hasattr(v, "shape")}


def check_tensor(file: str, key: str, array) -> np.ndarray:
  """`array` if it is float32 / float16 / bfloat16 with finite values; else a ValueError naming
  the file and the tensor (integer or float8 weights, or NaN / Inf: a damaged or diverged
  checkpoint). safetensors (0.8) reads bfloat16 into numpy as ml_dtypes.bfloat16, which numpy
  does not count as floating point."""
  array = np.asarray(array)
  if not (np.issubdtype(array.dtype, np.floating) or array.dtype == ml_dtypes.bfloat16):
    raise ValueError(
      f"{file}: tensor {key!r} is {array.dtype}, not floating point; weights must be "
      "float32 / float16 / bfloat16: export the checkpoint with float weights"
    )
  bad = ~np.isfinite(array)
  if bad.any():
    nan, inf = int(np.isnan(array).sum()), int(bad.sum() - np.isnan(array).sum())
    raise ValueError(
      f"{file}: tensor {key!r} holds {nan} NaN and {inf} Inf values; the weights are "
      "damaged or diverged: export them again from a finite checkpoint"
    )
  return array


def label(path: str) -> str:
  """The weights file of a checkpoint directory (or the directory, when sharded) for errors."""
  if os.path.isfile(path):
    return path
  files = weight_files(path)[1]
  return files[0] if len(files) == 1 else path


def read_state_dict(path: str) -> Dict[str, np.ndarray]:
  """All tensors of the checkpoint directory `path` (or a single weight file) as numpy arrays.

  Half-precision tensors keep their type from safetensors (bf16 as ml_dtypes.bfloat16) and come
  back as float32 from a .bin (through torch). The importers check the parameters (not the known
  buffers, e.g. a bool attention mask) with `check_tensor`.
  """
  if os.path.isfile(path):
    fmt, files = ("safetensors" if path.endswith(".safetensors") else "bin"), [path]
  else:
    fmt, files = weight_files(path)
  state: Dict[str, np.ndarray] = {}
  for file in files:
    state.update(_read_safetensors(file) if fmt == "safetensors" else _read_bin(file))
  return state


def _sort_header_metadata(file: str):
  """safetensors writes the header's metadata from a hash map, in an order that varies between
  calls: rewritten in place, sorted (the same length), the same export is the same bytes."""
  with open(file, "r+b") as f:
    size = int.from_bytes(f.read(8), "little")
    header = json.loads(f.read(size))
    header["__metadata__"] = dict(sorted(header.get("__metadata__", {}).items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(text) <= size:
      f.seek(8)
      f.write(text.ljust(size))  # safetensors pads its header with spaces too


def write_state_dict(
  state: Mapping[str, np.ndarray],
  out_dir: str,
  fmt: str = "safetensors",
  export_id: Optional[str] = None,
) -> str:
  """Writes `state` (numpy arrays) as `model.safetensors` (numpy) or `pytorch_model.bin` (torch);
  `export_id` goes into the safetensors header (`export_id_of`)."""
  if fmt not in FORMATS:
    raise ValueError(f"format={fmt!r}; use one of {FORMATS}")
  os.makedirs(out_dir, exist_ok=True)
  arrays = {k: np.ascontiguousarray(v) for k, v in state.items()}
  if fmt == "safetensors":
    from safetensors.numpy import save_file

    file = os.path.join(out_dir, SAFETENSORS_FILE)
    metadata = {"format": "pt"}  # "pt": transformers loads it as torch
    if export_id is not None:
      metadata[EXPORT_ID_KEY] = export_id
    save_file(arrays, file, metadata=metadata)
    _sort_header_metadata(file)
  else:
    torch = errors.require_extra(
      "torch", "torch", "--format=bin (--format=safetensors needs only numpy)"
    )
    file = os.path.join(out_dir, BIN_FILE)
    torch.save({k: torch.from_numpy(v.copy()) for k, v in arrays.items()}, file)
  return file


def export_id(state: Mapping[str, np.ndarray]) -> str:
  """A digest of the tensors (names, dtypes, shapes, bytes): weights from another export (other
  values) get another id, the same weights again the same one (a re-export is byte-identical).
  A pytorch_model.bin of ours reads back (`read_state_dict`) with the id it was written with."""
  digest = hashlib.sha256()
  for name in sorted(state):
    _digest_tensor(digest, name, state[name])
  return digest.hexdigest()[:32]


def _digest_tensor(digest, name: str, array):
  array = np.ascontiguousarray(array)
  digest.update(f"{name}:{array.dtype}:{array.shape}".encode("utf-8"))
  digest.update(array.tobytes())


def file_export_id(path: str) -> str:
  """`export_id` of the tensors in directory `path`'s weights as they are on disk now. A single
  model.safetensors is read one tensor at a time (the memory of its largest tensor, not of the
  model: the Qwen3 importer reads slices and never holds the file whole)."""
  from safetensors import SafetensorError, safe_open

  fmt, files = weight_files(path)
  if fmt == "bin" or len(files) != 1:
    return export_id(read_state_dict(path))
  digest = hashlib.sha256()
  try:
    with safe_open(files[0], "np") as f:
      for name in sorted(f.keys()):
        _digest_tensor(digest, name, f.get_tensor(name))
  except SafetensorError as e:
    raise damaged_safetensors(files[0], e) from e
  return digest.hexdigest()[:32]


def export_id_of(path: str) -> Optional[str]:
  """The export id in the header of directory `path`'s single model.safetensors (None for other
  layouts, or a file another tool wrote: HF's save_pretrained keeps only "format")."""
  from safetensors import SafetensorError, safe_open

  fmt, files = weight_files(path)
  if fmt != "safetensors" or len(files) != 1:
    return None
  try:
    with safe_open(files[0], "np") as f:
      return (f.metadata() or {}).get(EXPORT_ID_KEY)
  except SafetensorError as e:
    raise damaged_safetensors(files[0], e) from e


def read_json(path: str) -> dict:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
    raise ValueError(f"{path}: not valid JSON ({e})") from e


def write_json(obj, path: str):
  with open(path, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=False)
    f.write("\n")


__all__ = [
  "check_tensor",
  "label",
  "read_state_dict",
  "write_state_dict",
  "export_id",
  "export_id_of",
  "file_export_id",
  "weight_files",
  "read_json",
  "write_json",
  "SAFETENSORS_FILE",
  "BIN_FILE",
  "CONFIG_FILE",
  "GENERATION_CONFIG_FILE",
  "FORMATS",
]
