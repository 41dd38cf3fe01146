"""Device mesh and shardings.

Mesh axes are `data`, `fsdp` and `tensor`, sized from `config.mesh` (one axis may be -1 = all the
remaining devices). The batch is sharded over (`data`, `fsdp`); parameters are replicated here
(data parallelism); the same jitted step runs on 1 CPU, 8 emulated CPU devices, a GPU or a TPU
slice. Global batches are assembled from each process's local rows with
`jax.make_array_from_process_local_data`, so no host ever reads the global batch.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


def mesh_shape(mesh_cfg: Mapping[str, int], num_devices: int) -> tuple:
  """Resolves the (data, fsdp, tensor) sizes; raises a readable error when they do not fit."""
  sizes = [int(mesh_cfg.get(a, 1)) for a in MESH_AXES]
  free = [i for i, s in enumerate(sizes) if s == -1]
  if len(free) > 1:
    raise ValueError(f"config.mesh: at most one axis may be -1, got {dict(zip(MESH_AXES, sizes))}")
  if any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"config.mesh sizes must be positive or -1, got {dict(zip(MESH_AXES, sizes))}")
  fixed = math.prod(s for s in sizes if s != -1)
  if free:
    if num_devices % fixed:
      raise ValueError(f"config.mesh {dict(zip(MESH_AXES, sizes))}: {num_devices} devices are not "
                       f"divisible by the fixed axes' product {fixed}")
    sizes[free[0]] = num_devices // fixed
  if math.prod(sizes) != num_devices:
    raise ValueError(f"config.mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices "
                     f"but {num_devices} are available; set one axis to -1 or change the sizes")
  return tuple(sizes)


def make_mesh(mesh_cfg: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(mesh_cfg, len(devices))
  device_array = np.asarray(devices).reshape(shape)
  auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
  return Mesh(device_array, MESH_AXES, axis_types=auto)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis split over data x fsdp; other axes replicated."""
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_divisor(mesh: Mesh) -> int:
  return mesh.shape["data"] * mesh.shape["fsdp"]


def global_batch(local_batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict:
  """Process-local rows -> global jax arrays sharded over the batch axes."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}
