"""Where decoding runs: the mesh of the parameters, the batch and the KV cache on it.

The samplers decode on the mesh their parameters live on (`workdir.load_inference_state` places
them with the training rules, `sharding.state_shardings`): no mesh argument is threaded through.

  mesh = mesh_of(params)            # None: plain single-device arrays
  with on(mesh):                    # jax.set_mesh; a no-op for None
    rows = place_rows(mesh, inputs) # host arrays [B, ...] -> batch over (data, fsdp)
    out = jitted_loop(params, rows, ...)
  host = to_host(out)               # numpy on every process (gathered across processes)

Inside the jitted loops `constrain_kv` pins each KV-cache leaf [B, H, C, Dh] (or [B, C, ...]) to
batch over (data, fsdp) and heads over `tensor`, so the cache of a long decode never sits
replicated. A batch that does not divide by data x fsdp (or heads by tensor) stays replicated on
that axis: the same tokens, only not split.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import jax
from jax.experimental import multihost_utils
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from setdiff_jax.sharding import BATCH_AXES


def mesh_of(params) -> Optional[Mesh]:
  """The mesh of the first leaf of `params` placed with a `NamedSharding` on more than one device,
  else None."""
  for leaf in jax.tree_util.tree_leaves(params):
    sharding = getattr(leaf, "sharding", None)
    if isinstance(sharding, NamedSharding) and sharding.mesh.size > 1:
      return sharding.mesh
  return None


@contextlib.contextmanager
def on(mesh: Optional[Mesh]):
  """`jax.set_mesh(mesh)` around a jitted loop's call (its sharding constraints read it)."""
  if mesh is None:
    yield
    return
  with jax.set_mesh(mesh):
    yield


def _batch_size(mesh) -> int:
  return int(np.prod([mesh.shape[a] for a in BATCH_AXES]))


def batch_spec(mesh, batch: int) -> P:
  """Batch over (data, fsdp) when it divides, else replicated."""
  return P(BATCH_AXES) if batch % _batch_size(mesh) == 0 else P()


def place_rows(mesh: Optional[Mesh], tree):
  """Host arrays with a leading batch axis -> device arrays split over (data, fsdp) (None: the
  tree unchanged)."""
  if mesh is None:
    return tree

  def put(x):
    x = np.asarray(x)
    if x.ndim == 0:
      return jax.device_put(x, NamedSharding(mesh, P()))
    return jax.device_put(x, NamedSharding(mesh, batch_spec(mesh, x.shape[0])))

  return jax.tree_util.tree_map(put, tree)


def to_host(tree):
  """Device arrays -> numpy, the same on every process: rows split over the devices of several
  processes are gathered (every process's host code, e.g. RL rewards, sees the whole batch)."""

  def get(x):
    if isinstance(x, jax.Array) and not (x.is_fully_addressable or x.is_fully_replicated):
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))

  return jax.tree_util.tree_map(get, tree)


def constrain_kv(x: jax.Array, seq_axis: int) -> jax.Array:
  """A KV-cache leaf [B, ..., C, ...]: batch over (data, fsdp), heads (axis 1 of a head-major
  [B, H, C, Dh] leaf, seq_axis 2) over `tensor`. Identity outside `on(mesh)`."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or x.ndim < 2:
    return x
  axes = [None] * x.ndim
  if x.shape[0] % _batch_size(mesh) == 0:
    axes[0] = BATCH_AXES
  tensor = mesh.shape.get("tensor", 1)
  if seq_axis == 2 and x.ndim == 4 and tensor > 1 and x.shape[1] % tensor == 0:
    axes[1] = "tensor"
  return jax.lax.with_sharding_constraint(x, P(*axes))


__all__ = ["mesh_of", "on", "batch_spec", "place_rows", "to_host", "constrain_kv"]
