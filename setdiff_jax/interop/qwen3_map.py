"""The one declarative name map between our Qwen3 parameters and the HF `Qwen3ForCausalLM` keys.

Each row: HF key (relative to `Qwen3ForCausalLM`), our Flax path, whether the 2-D tensor is
transposed (PyTorch `Linear.weight` is (out, in)), the PyTorch shape in symbols, and whether the
row exists only for an untied head. Both directions and both shape checks are driven by it.

Layouts (prefixes in front of the HF key):
  hf        ""                   a plain HF directory (`save_pretrained`)
  official  "backbone.model."    a Qwen3 SetDLM export (SPEC §3.10, §9.2): the denoiser holds
                                 `backbone` = AutoModelFromPreTrained whose `model` is the HF model

Symbols: V vocabulary, D hidden, F intermediate, Q = H * Dh, K = KV heads * Dh, E = head dim.
A tied head has no `lm_head.weight` in a `save_pretrained` directory; the official layout carries
it anyway (the denoiser's state dict keeps both names), so the importer accepts it when it equals
the embedding and the exporter writes it for `official`.

numpy only.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from setdiff_jax import layer_names
from setdiff_jax.interop.name_map import CheckpointMismatchError, flatten, unflatten

PREFIXES = {"hf": "", "official": "backbone.model."}
TIED_HEAD_KEY = "lm_head.weight"
EMBED_KEY = "model.embed_tokens.weight"


@dataclasses.dataclass(frozen=True)
class Entry:
  hf: str
  flax: str
  transpose: bool
  shape: Tuple[str, ...]
  untied_only: bool = False

  @property
  def per_layer(self) -> bool:
    return "{i}" in self.hf


NAME_MAP: Tuple[Entry, ...] = (
  Entry("model.embed_tokens.weight", "embed/embedding", False, ("V", "D")),
  Entry("model.layers.{i}.input_layernorm.weight", "layers_{i}/input_norm/scale", False, ("D",)),
  Entry("model.layers.{i}.self_attn.q_proj.weight", "layers_{i}/q_proj/kernel", True, ("Q", "D")),
  Entry("model.layers.{i}.self_attn.k_proj.weight", "layers_{i}/k_proj/kernel", True, ("K", "D")),
  Entry("model.layers.{i}.self_attn.v_proj.weight", "layers_{i}/v_proj/kernel", True, ("K", "D")),
  Entry("model.layers.{i}.self_attn.q_norm.weight", "layers_{i}/q_norm/scale", False, ("E",)),
  Entry("model.layers.{i}.self_attn.k_norm.weight", "layers_{i}/k_norm/scale", False, ("E",)),
  Entry("model.layers.{i}.self_attn.o_proj.weight", "layers_{i}/o_proj/kernel", True, ("D", "Q")),
  Entry(
    "model.layers.{i}.post_attention_layernorm.weight",
    "layers_{i}/post_attn_norm/scale",
    False,
    ("D",),
  ),
  Entry("model.layers.{i}.mlp.gate_proj.weight", "layers_{i}/gate_proj/kernel", True, ("F", "D")),
  Entry("model.layers.{i}.mlp.up_proj.weight", "layers_{i}/up_proj/kernel", True, ("F", "D")),
  Entry("model.layers.{i}.mlp.down_proj.weight", "layers_{i}/down_proj/kernel", True, ("D", "F")),
  Entry("model.norm.weight", "final_norm/scale", False, ("D",)),
  Entry("lm_head.weight", "lm_head/kernel", True, ("V", "D"), True),
)

# Non-parameter buffers some exports carry; ignored on import.
IGNORED = ("model.rotary_emb.inv_freq", "static_attention_mask")


@dataclasses.dataclass(frozen=True)
class Dims:
  vocab_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  intermediate_size: int
  tie_embeddings: bool

  @classmethod
  def from_config(cls, c) -> "Dims":
    return cls(
      int(c.vocab_size),
      int(c.hidden_size),
      int(c.num_layers),
      int(c.num_heads),
      int(c.num_kv_heads),
      int(c.head_dim),
      int(c.intermediate_size),
      bool(c.tie_embeddings),
    )

  def symbol(self, s: str) -> int:
    return {
      "V": self.vocab_size,
      "D": self.hidden_size,
      "F": self.intermediate_size,
      "Q": self.num_heads * self.head_dim,
      "K": self.num_kv_heads * self.head_dim,
      "E": self.head_dim,
    }[s]


@dataclasses.dataclass(frozen=True)
class Row:
  hf_key: str
  flax_path: Tuple[str, ...]
  transpose: bool
  hf_shape: Tuple[int, ...]
  layer: int | None

  @property
  def flax_shape(self) -> Tuple[int, ...]:
    return tuple(reversed(self.hf_shape)) if self.transpose else self.hf_shape


def expand(dims: Dims) -> List[Row]:
  rows = []
  for e in NAME_MAP:
    if e.untied_only and dims.tie_embeddings:
      continue
    shape = tuple(dims.symbol(s) for s in e.shape)
    for i in range(dims.num_layers) if e.per_layer else [None]:
      fmt = (lambda s: s.format(i=i)) if i is not None else (lambda s: s)
      rows.append(Row(fmt(e.hf), tuple(fmt(e.flax).split("/")), e.transpose, shape, i))
  return rows


def detect_layout(keys) -> str:
  """'official' when any key starts with `backbone.model.`, else 'hf'."""
  return "official" if any(k.startswith(PREFIXES["official"]) for k in keys) else "hf"


def strip(keys_or_state, layout: str):
  """{key without the layout prefix: original key}, keys outside the prefix kept as they are."""
  prefix = PREFIXES[layout]
  return {(k[len(prefix) :] if prefix and k.startswith(prefix) else k): k for k in keys_or_state}


def checkpoint_layers(keys) -> int:
  """Number of decoder layers present among (prefix-stripped) HF keys."""
  found = [int(m.group(1)) for k in keys for m in [re.match(r"model\.layers\.(\d+)\.", k)] if m]
  return max(found) + 1 if found else 0


def dims_from_shapes(shapes: Mapping[str, Tuple[int, ...]], num_heads: int | None = None) -> Dims:
  """Dims read off (prefix-stripped) HF key shapes; head counts from q_norm and the projections."""
  need = [
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_norm.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.k_proj.weight",
    "model.layers.0.mlp.gate_proj.weight",
  ]
  missing = [k for k in need if k not in shapes]
  if missing:
    raise CheckpointMismatchError(missing, (), (), "Qwen3 weights: cannot read the dims")
  vocab, hidden = shapes[need[0]]
  head_dim = shapes[need[1]][0]
  heads = shapes[need[2]][0] // head_dim
  kv = shapes[need[3]][0] // head_dim
  if num_heads is not None and int(num_heads) != heads:
    raise ValueError(f"num_attention_heads={num_heads} but q_proj/q_norm give {heads}")
  return Dims(
    vocab,
    hidden,
    checkpoint_layers(shapes),
    heads,
    kv,
    head_dim,
    shapes[need[4]][0],
    TIED_HEAD_KEY not in shapes,
  )


def check_keys(
  shapes: Mapping[str, Tuple[int, ...]],
  dims: Dims,
  *,
  context: str = "",
  available_layers: Optional[int] = None,
  allow_tied_head: bool = True,
) -> List[Row]:
  """The rows to read; raises CheckpointMismatchError listing every missing/unexpected/bad key.

  Layers in [dims.num_layers, available_layers) (the checkpoint's own count, from its config) are
  skipped: the first num_layers are kept; a layer at or above `available_layers` is unexpected
  (None: any layer above num_layers is skipped); a tied model may carry `lm_head.weight` (checked
  equal later).
  """
  rows = expand(dims)
  expected = {r.hf_key for r in rows}
  missing = [r.hf_key for r in rows if r.hf_key not in shapes]
  unexpected = []
  for k in sorted(shapes):
    if k in expected or k in IGNORED:
      continue
    m = re.match(r"model\.layers\.(\d+)\.", k)
    if m and dims.num_layers <= int(m.group(1)) < (available_layers or float("inf")):
      continue
    if k == TIED_HEAD_KEY and dims.tie_embeddings and allow_tied_head:
      continue
    unexpected.append(k)
  bad = [
    (r.hf_key, tuple(shapes[r.hf_key]), r.hf_shape)
    for r in rows
    if r.hf_key in shapes and tuple(shapes[r.hf_key]) != r.hf_shape
  ]
  if missing or unexpected or bad:
    raise CheckpointMismatchError(missing, unexpected, bad, context)
  return rows


def to_flax(
  state: Mapping[str, np.ndarray],
  dims: Dims,
  *,
  context: str = "",
  available_layers: Optional[int] = None,
) -> Dict:
  """(prefix-stripped) HF state dict -> our nested params (numpy); layers in [dims.num_layers,
  available_layers) are dropped (`check_keys`)."""
  rows = check_keys(
    {k: np.shape(v) for k, v in state.items()},
    dims,
    context=context,
    available_layers=available_layers,
  )
  flat = {}
  for r in rows:
    a = np.asarray(state[r.hf_key])
    flat[r.flax_path] = np.ascontiguousarray(a.T) if r.transpose else a
  if dims.tie_embeddings and TIED_HEAD_KEY in state:
    check_tied(state[TIED_HEAD_KEY], state[EMBED_KEY], context)
  return unflatten(flat)


def check_tied(head, embed, context: str = ""):
  if not np.array_equal(np.asarray(head), np.asarray(embed)):
    raise ValueError(
      f"{context}: tie_word_embeddings=true but lm_head.weight differs from "
      f"model.embed_tokens.weight; set tie_word_embeddings=false in config.json"
    )


def from_flax(params: Mapping, dims: Dims, layout: str = "hf") -> Dict[str, np.ndarray]:
  """Our params -> HF state dict with the layout's prefix (official: lm_head written even when
  tied, as the denoiser's state dict holds it). A scanned tree (`layers/...`) is unstacked first."""
  flat = flatten(layer_names.unstack_layers(params))
  rows = expand(dims)
  want = {r.flax_path for r in rows}
  missing = ["/".join(r.flax_path) for r in rows if r.flax_path not in flat]
  unexpected = ["/".join(p) for p in flat if p not in want]
  bad = [
    ("/".join(r.flax_path), np.shape(flat[r.flax_path]), r.flax_shape)
    for r in rows
    if r.flax_path in flat and tuple(np.shape(flat[r.flax_path])) != r.flax_shape
  ]
  if missing or unexpected or bad:
    raise CheckpointMismatchError(missing, unexpected, bad, "our Qwen3 parameter tree")
  prefix = PREFIXES[layout]
  out = {}
  for r in rows:
    a = np.asarray(flat[r.flax_path])
    out[prefix + r.hf_key] = np.ascontiguousarray(a.T if r.transpose else a)
  if dims.tie_embeddings and layout == "official":
    out[prefix + TIED_HEAD_KEY] = out[prefix + "model.embed_tokens.weight"].copy()
  return out


def describe() -> str:
  lines = [f"{'HF key (official: backbone.model. + key)':52s} {'our path':34s} transform  shape"]
  for e in NAME_MAP:
    lines.append(
      f"{e.hf:52s} {e.flax:34s} {'transpose' if e.transpose else 'copy':10s} "
      f"({', '.join(e.shape)}){'  [untied]' if e.untied_only else ''}"
    )
  return "\n".join(lines)


__all__ = [
  "NAME_MAP",
  "Entry",
  "Dims",
  "Row",
  "PREFIXES",
  "expand",
  "detect_layout",
  "strip",
  "checkpoint_layers",
  "dims_from_shapes",
  "check_keys",
  "to_flax",
  "from_flax",
  "check_tied",
  "describe",
  "TIED_HEAD_KEY",
]
