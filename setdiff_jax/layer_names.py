"""Per-layer <-> scanned parameter names of a backbone (`model.scan_layers`).

An unrolled backbone holds one subtree per layer, `blocks_{i}` (DiT) or `layers_{i}` (Qwen3);
a scanned one (`nn.scan` over the layers) holds a single subtree `blocks` / `layers` whose every
leaf has a leading layer axis [num_layers, ...]. The two are the same model:

  stack_layers(params)    {"blocks_0": t0, "blocks_1": t1, ...} -> {"blocks": stack(t0, t1, ...)}
  unstack_layers(params)  the inverse; unstack_layers(stack_layers(p)) == p
  to_layout(params, scanned)   either layout -> the asked one (a no-op when it already is)
  is_scanned(params)

The on-disk PyTorch / HF layout is always per layer: the interop name maps unstack first, and
loaders stack where the run scans. Leaves may be numpy arrays, jax arrays (stacked with their
own array namespace, so jitted and sharded arrays stay on device) or `jax.ShapeDtypeStruct`s
(shapes only; a `NamedSharding` gains / loses a replicated leading axis), so the same functions
reshape parameters, abstract parameter trees and sharding specs.

numpy only (the PyTorch reference imports the name maps, which import this module).
"""

from __future__ import annotations

import re
from typing import Any, Dict, Mapping

import numpy as np

LAYER_PREFIXES = ("blocks", "layers")  # DiT, Qwen3
_LAYER_KEY = re.compile(r"^(%s)_(\d+)$" % "|".join(LAYER_PREFIXES))


def _is_abstract(x) -> bool:
  return type(x).__name__ == "ShapeDtypeStruct"


def _spec_with(sharding, change):
  """`sharding` with its PartitionSpec changed by `change(tuple) -> tuple` (NamedSharding)."""
  spec = getattr(sharding, "spec", None)
  if spec is None or not hasattr(sharding, "mesh"):
    return sharding
  return type(sharding)(sharding.mesh, type(spec)(*change(tuple(spec))))


def _stack(leaves):
  first = leaves[0]
  if _is_abstract(first):
    sharding = _spec_with(getattr(first, "sharding", None), lambda s: (None,) + s)
    return type(first)((len(leaves),) + tuple(first.shape), first.dtype, sharding=sharding)
  xp = first.__array_namespace__() if hasattr(first, "__array_namespace__") else np
  return xp.stack([xp.asarray(x) for x in leaves])


def _take(x, i: int):
  if _is_abstract(x):
    sharding = _spec_with(getattr(x, "sharding", None), lambda s: s[1:])
    return type(x)(tuple(x.shape[1:]), x.dtype, sharding=sharding)
  return x[i]


def _map(fn, *trees):
  """tree_map over nested dicts (leaves: anything that is not a Mapping)."""
  first = trees[0]
  if isinstance(first, Mapping):
    for t in trees[1:]:
      if not isinstance(t, Mapping) or set(t) != set(first):
        raise ValueError(
          f"layers differ in structure: {sorted(first)} vs "
          f"{sorted(t) if isinstance(t, Mapping) else type(t).__name__}"
        )
    return {k: _map(fn, *(t[k] for t in trees)) for k in first}
  return fn(*trees)


def _first_leaf(tree):
  while isinstance(tree, Mapping):
    tree = next(iter(tree.values()))
  return tree


def is_scanned(params: Mapping) -> bool:
  """True when `params` holds a stacked `blocks` / `layers` subtree."""
  return any(isinstance(params.get(p), Mapping) for p in LAYER_PREFIXES)


def stack_layers(params: Mapping) -> Dict[str, Any]:
  """Per-layer subtrees `{prefix}_{i}` -> one `{prefix}` subtree with leaves [num_layers, ...].

  Other top-level entries are kept as they are. Raises ValueError when the layer indices are not
  0..n-1, when the layers differ in structure, or when both layouts are present.
  """
  out, groups = {}, {}
  for k, v in params.items():
    m = _LAYER_KEY.match(str(k))
    if m:
      groups.setdefault(m.group(1), {})[int(m.group(2))] = v
    else:
      out[k] = v
  for prefix, layers in groups.items():
    if prefix in out:
      raise ValueError(
        f"parameters hold both {prefix!r} (scanned) and {prefix}_<i> (per-layer) "
        "subtrees; a tree has one layout"
      )
    if sorted(layers) != list(range(len(layers))):
      raise ValueError(f"{prefix}_<i>: layer indices {sorted(layers)} are not 0..{len(layers) - 1}")
    out[prefix] = _map(lambda *xs: _stack(xs), *(layers[i] for i in range(len(layers))))
  return out


def unstack_layers(params: Mapping) -> Dict[str, Any]:
  """The inverse of `stack_layers`: `{prefix}` [num_layers, ...] -> `{prefix}_{i}` subtrees."""
  out = {}
  for k, v in params.items():
    if k in LAYER_PREFIXES and isinstance(v, Mapping):
      n = int(_first_leaf(v).shape[0])
      for i in range(n):
        out[f"{k}_{i}"] = _map(lambda x, i=i: _take(x, i), v)
    else:
      out[k] = v
  return out


def to_layout(params: Mapping, scanned: bool) -> Dict[str, Any]:
  """`params` in the scanned (True) or per-layer (False) layout, whichever it is in now."""
  if bool(scanned) == is_scanned(params):
    return params
  return stack_layers(params) if scanned else unstack_layers(params)


__all__ = ["LAYER_PREFIXES", "is_scanned", "stack_layers", "unstack_layers", "to_layout"]
