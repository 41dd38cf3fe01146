"""Device mesh and shardings.

Mesh axes are `data`, `fsdp` and `tensor`, sized from `config.mesh` (one axis may be -1 = all the
remaining devices). The batch is sharded over (`data`, `fsdp`); parameters, EMA and optimizer state are sharded by
logical-axis rules (`DEFAULT_RULES`: FSDP over the model dimension, tensor parallelism over
heads / MLP / vocabulary), which replicate them on a data-only mesh; the same jitted step runs on
1 CPU, 8 emulated CPU devices, a GPU or a TPU slice. Global batches are assembled from each process's local rows with
`jax.make_array_from_process_local_data`, so no host ever reads the global batch.
"""

from __future__ import annotations

import math
import os
from typing import Callable, Mapping, Optional, Sequence

from absl import logging
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from setdiff_jax import layer_names

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


# The cluster of `initialize_distributed`, from flags (`setdiff_jax.cli`) or these variables
# (what `launch/local_cluster.py` sets); without them TPU / GPU / SLURM auto-detection runs.
COORDINATOR_ENV = "SETDIFF_COORDINATOR_ADDRESS"  # host:port of process 0's coordinator
NUM_PROCESSES_ENV = "SETDIFF_NUM_PROCESSES"
PROCESS_ID_ENV = "SETDIFF_PROCESS_ID"
# Seconds to wait for all processes to join; seconds without a heartbeat after which a process
# counts as lost and the others stop with an error (instead of waiting in a collective forever).
INIT_TIMEOUT_ENV = "SETDIFF_INIT_TIMEOUT_S"
HEARTBEAT_TIMEOUT_ENV = "SETDIFF_HEARTBEAT_TIMEOUT_S"
DEFAULT_INIT_TIMEOUT_S = 300
DEFAULT_HEARTBEAT_TIMEOUT_S = 100


def _from_flag_or_env(flag: str, env: str):
  """The absl flag `flag` if set (launchers define it through `setdiff_jax.cli`), else $env."""
  from absl import flags  # pylint: disable=g-import-not-at-top

  try:
    value = flags.FLAGS[flag].value if flag in flags.FLAGS else None
  except flags.UnparsedFlagAccessError:
    value = None
  if value is None or value == "":
    value = os.environ.get(env) or None
  return value


def _int_setting(value, what: str, minimum: int):
  if value is None:
    return None
  try:
    number = int(value)
  except (TypeError, ValueError):
    number = None
  if number is None or number < minimum:
    raise ValueError(f"{what}={value!r} is not an integer >= {minimum}")
  return number


def cluster_settings(
  coordinator_address: Optional[str] = None,
  num_processes: Optional[int] = None,
  process_id: Optional[int] = None,
) -> Optional[dict]:
  """The explicit cluster (arguments > flags > environment), or None to auto-detect.

  Raises ValueError naming the flag / variable when the description is incomplete.
  """
  coordinator = coordinator_address or _from_flag_or_env("coordinator_address", COORDINATOR_ENV)
  num = (
    num_processes
    if num_processes is not None
    else _from_flag_or_env("num_processes", NUM_PROCESSES_ENV)
  )
  pid = process_id if process_id is not None else _from_flag_or_env("process_id", PROCESS_ID_ENV)
  if coordinator is None and num is None and pid is None:
    return None
  if coordinator is None or num is None or pid is None:
    raise ValueError(
      "a multi-process run needs all three of --coordinator_address (or $"
      + COORDINATOR_ENV
      + "), --num_processes (or $"
      + NUM_PROCESSES_ENV
      + ") and --process_id (or $"
      + PROCESS_ID_ENV
      + f"); got coordinator_address={coordinator!r}, num_processes={num!r}, "
      f"process_id={pid!r}"
    )
  num = _int_setting(num, "--num_processes", 1)
  pid = _int_setting(pid, "--process_id", 0)
  if pid >= num:
    raise ValueError(f"--process_id={pid} must be < --num_processes={num}")
  if ":" not in str(coordinator):
    raise ValueError(
      f"--coordinator_address={coordinator!r} must be HOST:PORT, e.g. 127.0.0.1:12355"
    )
  return {
    "coordinator_address": str(coordinator),
    "num_processes": num,
    "process_id": pid,
    "initialization_timeout": _int_setting(os.environ.get(INIT_TIMEOUT_ENV), INIT_TIMEOUT_ENV, 1)
    or DEFAULT_INIT_TIMEOUT_S,
    "heartbeat_timeout_seconds": _int_setting(
      os.environ.get(HEARTBEAT_TIMEOUT_ENV), HEARTBEAT_TIMEOUT_ENV, 1
    )
    or DEFAULT_HEARTBEAT_TIMEOUT_S,
  }


def initialize_distributed(
  coordinator_address: Optional[str] = None,
  num_processes: Optional[int] = None,
  process_id: Optional[int] = None,
) -> None:
  """Joins a multi-process cluster; a no-op on one host.

  The cluster comes from the arguments, else the `--coordinator_address / --num_processes /
  --process_id` flags, else `$SETDIFF_COORDINATOR_ADDRESS / $SETDIFF_NUM_PROCESSES /
  $SETDIFF_PROCESS_ID` (set by `launch/local_cluster.py`), else JAX's auto-detection (TPU pod
  metadata, SLURM, ...). Every launcher calls this first (all hosts run the same command).
  """
  settings = cluster_settings(coordinator_address, num_processes, process_id)
  if settings is not None:
    if jax.distributed.is_initialized():
      return
    logging.info(
      "joining cluster %s as process %d of %d",
      settings["coordinator_address"],
      settings["process_id"],
      settings["num_processes"],
    )
    jax.distributed.initialize(**settings)
    return
  try:
    jax.distributed.initialize()
  except (ValueError, RuntimeError) as e:  # no coordinator / single host
    logging.debug("jax.distributed.initialize skipped (%s); running single-process", e)


BARRIER_TIMEOUT_ENV = "SETDIFF_BARRIER_TIMEOUT_S"  # e.g. while process 0 trains the tokenizer
DEFAULT_BARRIER_TIMEOUT_S = 3600
_barriers = {}


def _timeout_ms(timeout_s: Optional[float]) -> tuple:
  if timeout_s is None:
    timeout_s = (
      _int_setting(os.environ.get(BARRIER_TIMEOUT_ENV), BARRIER_TIMEOUT_ENV, 1)
      or DEFAULT_BARRIER_TIMEOUT_S
    )
  return timeout_s, int(timeout_s * 1000)


def _client():
  from jax._src import distributed  # pylint: disable=g-import-not-at-top

  return distributed.global_state.client


def _wait(client, name: str, key: str, timeout_s: float, timeout_ms: int):
  try:
    client.wait_at_barrier(key, timeout_ms)
  except Exception as e:  # noqa: BLE001 - the runtime raises its own error type
    raise TimeoutError(
      f"process {jax.process_index()} waited for the other processes at "
      f"{name!r} and they did not all arrive within {timeout_s:g}s (a process "
      f"died or hangs; ${BARRIER_TIMEOUT_ENV} sets the limit): "
      f"{' '.join(str(e).split())[:300]}"
    ) from e


def barrier(name: str, timeout_s: Optional[float] = None) -> None:
  """Waits until every process reaches `barrier(name)`; a no-op on one process.

  Bounded: raises TimeoutError after `timeout_s` (default `$SETDIFF_BARRIER_TIMEOUT_S`, else
  3600 s), naming the barrier, instead of waiting forever for a process that is gone.
  """
  if jax.process_count() == 1:
    return
  timeout_s, timeout_ms = _timeout_ms(timeout_s)
  client = _client()
  if client is None:  # a cluster JAX joined without its coordination service: a collective
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    multihost_utils.sync_global_devices(name)
    return
  _barriers[name] = _barriers.get(name, 0) + 1  # every process calls them in the same order
  _wait(client, name, f"setdiff_jax/{name}/{_barriers[name]}", timeout_s, timeout_ms)


AGREE_BYTES = 4096  # the longest value `agree` exchanges without a coordination service


def agree(name: str, value: str, timeout_s: Optional[float] = None) -> list:
  """Every process's `value` (a short string) for the decision `name`, in process order, so
  all processes decide alike from the same list; [value] on one process.

  Every process calls it at the same points (the n-th call of `name` meets the n-th); bounded
  like `barrier` (TimeoutError). Exchanged through the coordination service's key-value store
  (a set, a barrier, one directory read; no device collective, nothing to compile); the key of
  the previous round is deleted, so a long run does not grow the store.
  """
  if jax.process_count() == 1:
    return [value]
  timeout_s, timeout_ms = _timeout_ms(timeout_s)
  count, me = jax.process_count(), jax.process_index()
  client = _client()
  if client is None:  # a fixed-size byte array through a collective
    import numpy as np  # pylint: disable=g-import-not-at-top
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    raw = value.encode("utf-8")[:AGREE_BYTES]
    local = np.zeros((AGREE_BYTES + 4,), np.uint8)
    local[:4] = np.frombuffer(np.uint32(len(raw)).tobytes(), np.uint8)
    local[4 : 4 + len(raw)] = np.frombuffer(raw, np.uint8)
    rows = np.asarray(multihost_utils.process_allgather(local))
    return [
      bytes(r[4 : 4 + int(np.frombuffer(r[:4].tobytes(), np.uint32)[0])]).decode("utf-8")
      for r in rows
    ]
  n = _barriers[f"agree/{name}"] = _barriers.get(f"agree/{name}", 0) + 1
  prefix = f"setdiff_jax/agree/{name}/{n}/"
  client.key_value_set(prefix + str(me), value)
  _wait(client, name, prefix.rstrip("/"), timeout_s, timeout_ms)
  # Every process has read round n-1 before it reached this round's barrier.
  if n > 1:
    client.key_value_delete(f"setdiff_jax/agree/{name}/{n - 1}/{me}")
  values = {key.rsplit("/", 1)[-1]: v for key, v in client.key_value_dir_get(prefix)}
  return [values[str(i)] for i in range(count)]


def check_all_see(name: str, expected: str, read: Callable[[], str], what: str, other: str):
  """ValueError on every process unless every process other than 0 reads `expected` (process 0's
  value, already agreed) with `read()` ("" when nothing is there): a workdir that is not shared
  by every host, or a stale copy of it, would give the processes different files. `what` names
  the thing in the message ("the tokenizer process 0 saved in DIR"); `other` says what a
  different value means ("other files there"). Every process calls it at the same point."""
  problem = ""
  if jax.process_index() != 0:
    seen = read()
    if seen != expected:
      problem = (
        f"process {jax.process_index()} of {jax.process_count()} does not see {what} "
        f"({other if seen else 'nothing there'}): every process of a run needs the same "
        "--workdir on storage they all share (e.g. gs://bucket/run or a shared file system), "
        "not a copy per host"
      )
  problems = [p for p in agree(name, problem) if p]
  if problems:
    raise ValueError(problems[0])


def mesh_shape(mesh_cfg: Mapping[str, int], num_devices: int, what: str = "config.mesh") -> tuple:
  """Resolves the (data, fsdp, tensor) sizes; raises a readable error naming `what` (the config
  field or the launcher flag they came from) when they do not fit."""
  sizes = [int(mesh_cfg.get(a, 1)) for a in MESH_AXES]
  free = [i for i, s in enumerate(sizes) if s == -1]
  if len(free) > 1:
    raise ValueError(f"{what}: at most one axis may be -1, got {dict(zip(MESH_AXES, sizes))}")
  if any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"{what} sizes must be positive or -1, got {dict(zip(MESH_AXES, sizes))}")
  fixed = math.prod(s for s in sizes if s != -1)
  if free:
    if num_devices % fixed:
      raise ValueError(
        f"{what} {dict(zip(MESH_AXES, sizes))}: {num_devices} devices are not "
        f"divisible by the fixed axes' product {fixed}"
      )
    sizes[free[0]] = num_devices // fixed
  if math.prod(sizes) != num_devices:
    raise ValueError(
      f"{what} {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices "
      f"but {num_devices} are available; set one axis to -1 or change the sizes"
    )
  return tuple(sizes)


def parse_mesh(text: str | None, what: str = "--mesh") -> dict | None:
  """'data=2,tensor=4' -> {"data": 2, "tensor": 4} (axes left out are 1; one may be -1 = the
  remaining devices); None or '' -> None. A bad entry raises a ValueError naming `what`."""
  if text is None or not str(text).strip():
    return None
  out = {}
  for item in str(text).split(","):
    name, sep, value = item.partition("=")
    name = name.strip()
    try:
      size = int(value)
    except ValueError:
      size = None
    if not sep or name not in MESH_AXES or size is None or name in out:
      raise ValueError(
        f"{what}={text!r}: expected comma-separated AXIS=SIZE with AXIS one of "
        f"{MESH_AXES} (each once) and SIZE an integer or -1, e.g. data=2,tensor=4"
      )
    out[name] = size
  return out


def make_mesh(
  mesh_cfg: Mapping[str, int],
  devices: Sequence[jax.Device] | None = None,
  what: str = "config.mesh",
) -> Mesh:
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(mesh_cfg, len(devices), what)
  auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
  # jax.make_mesh orders the devices by the physical topology (TPU ICI rings) where it knows it.
  return jax.make_mesh(shape, MESH_AXES, axis_types=auto, devices=devices)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis split over data x fsdp; other axes replicated."""
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def global_batch(local_batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict:
  """Process-local rows -> global jax arrays sharded over the batch axes."""
  sharding = batch_sharding(mesh)
  return {
    k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
    for k, v in local_batch.items()
  }


# ------------------------------------------------------------------ parameter sharding (FSDP / TP)
# Logical axis names of each parameter, keyed by the last two path components (layer, name).
# The layer names are those of model.py (SPEC §3.9); anything not listed is replicated.
PARAM_LOGICAL_AXES = {
  # The lookup table's model dimension has its own name: sharded over `fsdp` like the other
  # matrices, it would make the looked-up activations sharded over the model dimension instead
  # of the batch, i.e. every device would hold the whole batch's activations (XLA propagates the
  # table's sharding through the gather). See DEFAULT_RULES.
  ("embed", "embedding"): ("vocab", "embed_lookup"),
  ("attn_qkv", "kernel"): ("embed", "qkv"),
  ("attn_out", "kernel"): ("heads", "embed"),
  ("mlp_in", "kernel"): ("embed", "mlp"),
  ("mlp_in", "bias"): ("mlp",),
  ("mlp_out", "kernel"): ("mlp", "embed"),
  ("mlp_out", "bias"): ("embed",),
  ("head", "kernel"): ("embed", "vocab"),
  ("head", "bias"): ("vocab",),
  ("adaln", "kernel"): ("cond", "modulation"),
  ("final_adaln", "kernel"): ("cond", "modulation"),
  # Qwen3 (setdiff_jax/models/qwen3.py): query heads and KV heads split over `tensor`.
  ("q_proj", "kernel"): ("embed", "heads"),
  ("k_proj", "kernel"): ("embed", "kv_heads"),
  ("v_proj", "kernel"): ("embed", "kv_heads"),
  ("o_proj", "kernel"): ("heads", "embed"),
  ("gate_proj", "kernel"): ("embed", "mlp"),
  ("up_proj", "kernel"): ("embed", "mlp"),
  ("down_proj", "kernel"): ("mlp", "embed"),
  ("lm_head", "kernel"): ("embed", "vocab"),
}

# A scanned backbone (`model.scan_layers`) stacks each layer parameter along a leading axis,
# `blocks/...` / `layers/...` [num_layers, ...]: that axis is the logical "layers" (replicated by
# default; every device holds its shard of every layer, as unrolled).
LAYER_AXIS = "layers"
STACKED_SUBTREES = layer_names.LAYER_PREFIXES  # ("blocks", "layers"): DiT, Qwen3

# Default rules: FSDP shards the model dimension of every matrix over `fsdp`; tensor parallelism
# splits heads / MLP / vocabulary over `tensor`. Norm scales, biases of the model dimension and
# the small adaLN matrices follow the same names. Config: `config.sharding_rules`.
DEFAULT_RULES = (
  ("embed", "fsdp"),
  ("embed_lookup", None),  # the embedding table stays whole over fsdp (split by vocab only)
  ("vocab", "tensor"),
  ("qkv", "tensor"),
  ("heads", "tensor"),
  ("kv_heads", "tensor"),
  ("mlp", "tensor"),
  ("cond", None),
  ("modulation", "fsdp"),
  (LAYER_AXIS, None),
)


def _path_names(path) -> tuple:
  names = []
  for k in path:
    if isinstance(k, jax.tree_util.DictKey):
      names.append(str(k.key))
    elif isinstance(k, jax.tree_util.GetAttrKey):
      names.append(k.name)
  return tuple(names)


def _leaf_names(path) -> tuple:
  return _path_names(path)[-2:]


def logical_axes(path, ndim: int):
  """Logical axis names of the leaf at `path` with `ndim` dims, or None (replicated).

  A leaf under a stacked `blocks` / `layers` subtree with one more dim than its per-layer
  entry gets LAYER_AXIS in front.
  """
  logical = PARAM_LOGICAL_AXES.get(_leaf_names(path))
  if logical is None:
    return None
  if len(logical) == ndim:
    return logical
  names = _path_names(path)
  if len(logical) + 1 == ndim and len(names) >= 3 and names[-3] in STACKED_SUBTREES:
    return (LAYER_AXIS,) + tuple(logical)
  return None


def logical_to_spec(logical: Sequence[str | None], rules, mesh: Mesh | None = None) -> P:
  """Logical axis names -> PartitionSpec by the rules (first match; unknown names replicate)."""
  table = dict((name, axis) for name, axis in rules)
  axes = []
  for name in logical:
    axis = table.get(name)
    if axis is not None and mesh is not None and mesh.shape.get(axis, 1) == 1:
      axis = None  # a size-1 mesh axis shards nothing; keep specs minimal
    axes.append(axis)
  return P(*axes)


def state_shardings(abstract_state, mesh: Mesh, rules=DEFAULT_RULES):
  """NamedSharding per leaf of a (train) state: parameters, EMA and optimizer moments alike.

  Every leaf whose path ends in a known (layer, name) pair gets its logical axes mapped by the
  rules; scalars and unknown leaves are replicated. Raises ValueError when a sharded dimension is
  not divisible by its mesh axis, naming the parameter and the fix.
  """

  def one(path, leaf):
    logical = logical_axes(path, len(leaf.shape))
    if logical is None:
      return NamedSharding(mesh, P())
    spec = logical_to_spec(logical, rules, mesh)
    for dim, axis in zip(leaf.shape, spec):
      if axis is not None and dim % mesh.shape[axis]:
        raise ValueError(
          f"parameter {jax.tree_util.keystr(path)} of shape {leaf.shape} cannot be sharded: "
          f"dimension {dim} is not divisible by mesh axis {axis!r} of size {mesh.shape[axis]}. "
          f"Change config.mesh, the model size, or config.sharding_rules."
        )
    return NamedSharding(mesh, spec)

  return jax.tree_util.tree_map_with_path(one, abstract_state)


def rules_from_config(config) -> tuple:
  """`config.sharding_rules` (list of [logical, mesh_axis_or_None]) or the defaults."""
  rules = config.get("sharding_rules", None) if hasattr(config, "get") else None
  if not rules:
    return DEFAULT_RULES
  out = []
  for item in rules:
    name, axis = item
    if axis is not None and axis not in MESH_AXES:
      raise ValueError(f"sharding_rules: {name!r} -> {axis!r} is not a mesh axis {MESH_AXES}")
    out.append((name, axis))
  return tuple(out)
