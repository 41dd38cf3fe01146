"""The one declarative name map between our Flax parameters and the official `DIT` state dict.

SPEC §3.9. Every row of `NAME_MAP` says: official key (relative to the `DIT` module, i.e. without
the `backbone.` prefix an exported denoiser adds), our Flax path, whether the 2-D tensor is
transposed (PyTorch `Linear.weight` is (out, in); a Flax kernel is (in, out)), the PyTorch shape in
symbols, and which models carry it. `{i}` is the block index. Both directions (`flax_to_torch`,
`torch_to_flax`) and both shape checks are driven by this table, so it is the only place that
knows the correspondence.

Symbols: V vocabulary, D hidden size, F = mlp_ratio * D, C adaLN conditioning width, T = 256 the
sinusoidal time-embedding width; a leading integer multiplies (e.g. "3D").

Our side of the map is the per-layer tree; a scanned tree (`model.scan_layers`, stacked
`blocks/...`) is unstacked first (`layer_names.py`), so the official keys never depend on it.

This module needs only numpy (the PyTorch reference imports it).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from setdiff_jax import layer_names

PREFIX = "backbone."  # an exported denoiser's state dict nests the DiT under `backbone`
TIME_EMBED_DIM = 256  # TimestepEmbedder frequency width (SPEC §3.4)


@dataclasses.dataclass(frozen=True)
class Entry:
  torch: str  # official key without PREFIX, e.g. "blocks.{i}.attn_qkv.weight"
  flax: str  # our path, "/"-separated, e.g. "blocks_{i}/attn_qkv/kernel"
  transpose: bool  # True for Linear weights (out, in) <-> kernels (in, out)
  shape: Tuple[str, ...]  # PyTorch shape in symbols
  adaln_only: bool = False  # present only in adaLN (MDLM/BD3LM) models

  @property
  def per_layer(self) -> bool:
    return "{i}" in self.torch


NAME_MAP: Tuple[Entry, ...] = (
  Entry("vocab_embed.embedding", "embed/embedding", False, ("V", "D")),
  Entry("sigma_map.mlp.0.weight", "sigma_map/dense0/kernel", True, ("C", "T"), True),
  Entry("sigma_map.mlp.0.bias", "sigma_map/dense0/bias", False, ("C",), True),
  Entry("sigma_map.mlp.2.weight", "sigma_map/dense1/kernel", True, ("C", "C"), True),
  Entry("sigma_map.mlp.2.bias", "sigma_map/dense1/bias", False, ("C",), True),
  Entry("blocks.{i}.norm1.weight", "blocks_{i}/norm1/scale", False, ("D",)),
  Entry("blocks.{i}.attn_qkv.weight", "blocks_{i}/attn_qkv/kernel", True, ("3D", "D")),
  Entry("blocks.{i}.attn_out.weight", "blocks_{i}/attn_out/kernel", True, ("D", "D")),
  Entry("blocks.{i}.norm2.weight", "blocks_{i}/norm2/scale", False, ("D",)),
  Entry("blocks.{i}.mlp.0.weight", "blocks_{i}/mlp_in/kernel", True, ("F", "D")),
  Entry("blocks.{i}.mlp.0.bias", "blocks_{i}/mlp_in/bias", False, ("F",)),
  Entry("blocks.{i}.mlp.2.weight", "blocks_{i}/mlp_out/kernel", True, ("D", "F")),
  Entry("blocks.{i}.mlp.2.bias", "blocks_{i}/mlp_out/bias", False, ("D",)),
  Entry("blocks.{i}.adaLN_modulation.weight", "blocks_{i}/adaln/kernel", True, ("6D", "C"), True),
  Entry("blocks.{i}.adaLN_modulation.bias", "blocks_{i}/adaln/bias", False, ("6D",), True),
  Entry("output_layer.norm_final.weight", "final_norm/scale", False, ("D",)),
  Entry("output_layer.adaLN_modulation.weight", "final_adaln/kernel", True, ("2D", "C"), True),
  Entry("output_layer.adaLN_modulation.bias", "final_adaln/bias", False, ("2D",), True),
  Entry("output_layer.linear.weight", "head/kernel", True, ("V", "D")),
  Entry("output_layer.linear.bias", "head/bias", False, ("V",)),
)

# Keys that are not parameters. They are checked where that makes sense, then ignored on import.
ROTARY_KEY = "rotary_emb.inv_freq"  # persistent buffer, recomputed (checked on import)
IGNORED_BUFFERS: Tuple[str, ...] = (
  "static_attention_mask",  # denoiser-level SDPA mask buffer (SetDLM may keep it)
  "rotary_emb.cos_cached",  # non-persistent in the reference; never in a file
  "rotary_emb.sin_cached",
  "sampling_eps_min",  # denoiser-level scalars of legacy Lightning checkpoints
  "sampling_eps_max",
)


def rotary_inv_freq(head_dim: int, base: float = 10000.0) -> np.ndarray:
  """The expected `rotary_emb.inv_freq` buffer, float32 (head_dim/2,): base^(-2j/head_dim)."""
  exponent = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
  return (np.float32(1.0) / (np.float32(base) ** exponent)).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Dims:
  """The sizes that fix every shape in the map."""

  vocab_size: int
  hidden_size: int
  num_layers: int
  mlp_ratio: int = 4
  cond_dim: int = 128
  adaln: bool = False

  def symbol(self, s: str) -> int:
    m = re.fullmatch(r"(\d*)([VDFCT])", s)
    if not m:
      raise ValueError(f"bad shape symbol {s!r}")
    base = {
      "V": self.vocab_size,
      "D": self.hidden_size,
      "F": self.mlp_ratio * self.hidden_size,
      "C": self.cond_dim,
      "T": TIME_EMBED_DIM,
    }[m.group(2)]
    return base * (int(m.group(1)) if m.group(1) else 1)


@dataclasses.dataclass(frozen=True)
class Row:
  """One expanded map row: concrete key, path and shapes."""

  torch_key: str  # without PREFIX
  flax_path: Tuple[str, ...]
  transpose: bool
  torch_shape: Tuple[int, ...]

  @property
  def flax_shape(self) -> Tuple[int, ...]:
    return tuple(reversed(self.torch_shape)) if self.transpose else self.torch_shape


def expand(dims: Dims) -> List[Row]:
  """Concrete rows for a model of these dims (per-layer rows repeated, adaLN rows if adaLN)."""
  rows = []
  for e in NAME_MAP:
    if e.adaln_only and not dims.adaln:
      continue
    shape = tuple(dims.symbol(s) for s in e.shape)
    layers = range(dims.num_layers) if e.per_layer else [None]
    for i in layers:
      fmt = (lambda s: s.format(i=i)) if i is not None else (lambda s: s)
      rows.append(Row(fmt(e.torch), tuple(fmt(e.flax).split("/")), e.transpose, shape))
  return rows


# ----------------------------------------------------------------------------- nested dicts
def flatten(tree: Mapping, prefix: Tuple[str, ...] = ()) -> Dict[Tuple[str, ...], object]:
  out = {}
  for k, v in tree.items():
    if isinstance(v, Mapping):
      out.update(flatten(v, prefix + (str(k),)))
    else:
      out[prefix + (str(k),)] = v
  return out


def unflatten(flat: Mapping[Tuple[str, ...], object]) -> Dict:
  out: Dict = {}
  for path, v in flat.items():
    node = out
    for k in path[:-1]:
      node = node.setdefault(k, {})
    node[path[-1]] = v
  return out


# ----------------------------------------------------------------------------- inference of dims
def dims_from_params(params: Mapping, cond_dim: Optional[int] = None) -> Dims:
  """Dims read off our parameter tree (shapes only; per-layer or scanned layout)."""
  params = layer_names.unstack_layers(params)
  flat = flatten(params)
  shape = lambda *p: tuple(np.shape(flat[p]))
  vocab, hidden = shape("embed", "embedding")
  layers = sum(1 for k in params if re.fullmatch(r"blocks_\d+", str(k)))
  mlp = shape("blocks_0", "mlp_in", "kernel")[1] if layers else 4 * hidden
  adaln = "sigma_map" in params
  if adaln:
    cond_dim = shape("sigma_map", "dense0", "kernel")[1]
  return Dims(vocab, hidden, layers, mlp // hidden, 128 if cond_dim is None else cond_dim, adaln)


# ----------------------------------------------------------------------------- conversion
class CheckpointMismatchError(ValueError):
  """Raised when a state dict and the expected parameter set disagree; lists every problem."""

  def __init__(self, missing=(), unexpected=(), shape_mismatches=(), context: str = ""):
    self.missing = list(missing)
    self.unexpected = list(unexpected)
    self.shape_mismatches = list(shape_mismatches)  # (key, found, expected)
    lines = [f"checkpoint does not match the model{(' (' + context + ')') if context else ''}:"]
    if self.missing:
      lines.append(f"  missing keys ({len(self.missing)}): " + ", ".join(self.missing))
    if self.unexpected:
      lines.append(f"  unexpected keys ({len(self.unexpected)}): " + ", ".join(self.unexpected))
    for key, found, expected in self.shape_mismatches:
      lines.append(f"  shape mismatch: {key}: found {tuple(found)}, expected {tuple(expected)}")
    super().__init__("\n".join(lines))


def flax_to_torch(
  params: Mapping,
  dims: Optional[Dims] = None,
  *,
  prefix: str = "",
  include_rotary: Optional[int] = None,
  rope_base: float = 10000.0,
) -> Dict[str, np.ndarray]:
  """Our parameter tree -> official state dict (numpy, PyTorch orientation, C-contiguous).

  Args:
    params: nested dict of arrays (numpy or jax), `models.init_params` layout, per-layer or
      scanned (`model.scan_layers`: unstacked here, so the keys are the same either way).
    dims: expected dims (default: read off `params`); every path must exist with its shape.
    prefix: prepended to every key ("backbone." for an exported denoiser).
    include_rotary: head dim; if given, also writes the `rotary_emb.inv_freq` buffer.
  """
  params = layer_names.unstack_layers(params)
  dims = dims or dims_from_params(params)
  flat = flatten(params)
  rows = expand(dims)
  expected = {r.flax_path for r in rows}
  missing = ["/".join(r.flax_path) for r in rows if r.flax_path not in flat]
  unexpected = ["/".join(p) for p in flat if p not in expected]
  mismatches = [
    ("/".join(r.flax_path), np.shape(flat[r.flax_path]), r.flax_shape)
    for r in rows
    if r.flax_path in flat and tuple(np.shape(flat[r.flax_path])) != r.flax_shape
  ]
  if missing or unexpected or mismatches:
    raise CheckpointMismatchError(missing, unexpected, mismatches, "our parameter tree")
  out = {}
  for r in rows:
    a = np.asarray(flat[r.flax_path])
    out[prefix + r.torch_key] = np.ascontiguousarray(a.T if r.transpose else a)
  if include_rotary:
    out[prefix + ROTARY_KEY] = rotary_inv_freq(include_rotary, rope_base)
  return out


def split_known_buffers(state: Mapping[str, object]) -> Tuple[Dict[str, object], Dict[str, object]]:
  """(parameters, buffers): the rotary inv_freq and IGNORED_BUFFERS go to the second dict."""
  params, buffers = {}, {}
  for k, v in state.items():
    (buffers if k == ROTARY_KEY or k in IGNORED_BUFFERS else params)[k] = v
  return params, buffers


def torch_to_flax(state: Mapping[str, object], dims: Dims, *, context: str = "") -> Dict:
  """Official (prefix-stripped, buffers removed) state dict -> our nested parameter dict (numpy).

  Raises CheckpointMismatchError listing every missing key, unexpected key and shape mismatch.
  Arrays keep their dtype; transposed weights are made C-contiguous.
  """
  rows = expand(dims)
  expected = {r.torch_key for r in rows}
  missing = [r.torch_key for r in rows if r.torch_key not in state]
  unexpected = sorted(k for k in state if k not in expected)
  mismatches = [
    (r.torch_key, tuple(np.shape(state[r.torch_key])), r.torch_shape)
    for r in rows
    if r.torch_key in state and tuple(np.shape(state[r.torch_key])) != r.torch_shape
  ]
  if missing or unexpected or mismatches:
    raise CheckpointMismatchError(missing, unexpected, mismatches, context)
  flat = {}
  for r in rows:
    a = np.asarray(state[r.torch_key])
    flat[r.flax_path] = np.ascontiguousarray(a.T) if r.transpose else a
  return unflatten(flat)


def strip_prefix(state: Mapping[str, object], prefix: str = PREFIX) -> Dict[str, object]:
  """Removes `backbone.` (when any key has it) and torch.compile's `_orig_mod.` from keys.

  Keys outside the backbone (e.g. the denoiser's `static_attention_mask`) keep their name.
  """
  has_prefix = any(k.startswith(prefix) for k in state)
  out = {}
  for k, v in state.items():
    nk = k[len(prefix) :] if has_prefix and k.startswith(prefix) else k
    nk = nk.replace("_orig_mod.", "")
    out[nk] = v
  return out


def describe(dims: Optional[Dims] = None) -> str:
  """The map as a text table (for docs and reports)."""
  lines = [f"{'official key (after ' + PREFIX + ')':44s} {'our path':32s} transform  shape"]
  for e in NAME_MAP:
    lines.append(
      f"{e.torch:44s} {e.flax:32s} {'transpose' if e.transpose else 'copy':10s} "
      f"({', '.join(e.shape)}){'  [adaLN]' if e.adaln_only else ''}"
    )
  lines.append(f"{ROTARY_KEY:44s} {'(recomputed; checked)':32s}")
  for k in IGNORED_BUFFERS:
    lines.append(f"{k:44s} {'(ignored)':32s}")
  return "\n".join(lines)


__all__ = [
  "PREFIX",
  "NAME_MAP",
  "Entry",
  "Dims",
  "Row",
  "expand",
  "flatten",
  "unflatten",
  "dims_from_params",
  "flax_to_torch",
  "torch_to_flax",
  "split_known_buffers",
  "strip_prefix",
  "rotary_inv_freq",
  "CheckpointMismatchError",
  "ROTARY_KEY",
  "IGNORED_BUFFERS",
  "describe",
]
