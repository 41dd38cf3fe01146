"""Reading a training run for inference: resolved config, tokenizer and parameters only.

  state = workdir.load_inference_state("/tmp/run")          # latest step, EMA parameters
  model = workdir.inference_model(state.model_config)       # fp32, a CPU-safe attention path

Used by sampling, evaluation and export. Restores *parameters only* (EMA or raw) with an orbax
partial restore, onto a mesh of the current devices, whatever mesh the run was saved from: no
optimizer, no Adam moments (a quarter of the memory of the full train state), no training
imports.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from absl import logging
import jax
import ml_collections
import orbax.checkpoint as ocp

from setdiff_jax import errors, models, paths, sharding
from setdiff_jax.workdir import fallback
from setdiff_jax.workdir import checkpoints as checkpointing
from setdiff_jax import layer_names
from setdiff_jax.config import run as run_config
from setdiff_jax.workdir.tokenizer import build_tokenizer


@dataclasses.dataclass
class InferenceState:
  config: ml_collections.ConfigDict
  model_config: Any
  objective_config: Any
  params: Any
  tokenizer: Any
  step: int


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The run's resolved config (WORKDIR/config.json, written by launch/train.py)."""
  return checkpointing.load_config(workdir)


RESTORE_ATTEMPTS = 3  # reads of the newest step that a run's retention may delete meanwhile


def restore_params(
  workdir: str, abstract_params, *, step: Optional[int] = None, use_ema: bool = True
):
  """(params, step): one parameter set of a checkpoint, restored into `abstract_params`'s
  shardings (a tree of `jax.ShapeDtypeStruct` with `.sharding`), nothing else read.

  A run still training deletes its older steps as it saves (keep_checkpoints): a step deleted
  while it is read is read again from the newest one (`step` None, up to RESTORE_ATTEMPTS
  times), else named in a CheckpointError (the raw FileNotFoundError named a bare folder)."""
  directory = checkpointing.checkpoint_dir(workdir)
  for attempt in range(RESTORE_ATTEMPTS):
    try:
      return _restore_params_once(directory, abstract_params, step, use_ema)
    except FileNotFoundError as e:
      gone = _deleted_step(directory, e)
      if gone is None:
        raise
      if step is None and attempt < RESTORE_ATTEMPTS - 1:
        logging.info("checkpoint %s was deleted while it was read; reading the newest again", gone)
        continue
      advice = (
        "pass a --step it still keeps, or leave --step out for its newest"
        if step is not None
        else f"that happened {RESTORE_ATTEMPTS} times in a row: read it once it saves less "
        "often, or once it has stopped"
      )
      raise errors.CheckpointError(
        f"checkpoint {gone} was deleted while it was read: the run writing {directory} is still "
        f"training and keeps only its newest checkpoints (keep_checkpoints); {advice}"
      ) from e
  raise AssertionError("unreachable")


def _deleted_step(directory, e: FileNotFoundError) -> Optional[str]:
  """The step folder of `directory` that `e` found missing and that is gone now, else None."""
  root = str(directory).rstrip("/") + "/"
  missing = str(e.filename or "")
  if not missing.startswith(root):
    return None
  name = missing[len(root) :].split("/", 1)[0]
  folder = root + name
  return folder if name.isdigit() and not paths.exists(folder) else None


def _restore_params_once(directory, abstract_params, step: Optional[int], use_ema: bool):
  handler = ocp.PyTreeCheckpointHandler()
  options = ocp.CheckpointManagerOptions(create=False, enable_async_checkpointing=False)
  with checkpointing._quiet_orbax():
    manager = ocp.CheckpointManager(
      directory, item_names=("state",), item_handlers={"state": handler}, options=options
    )
  try:
    checkpointing.resolve_step(manager, None if step is None else int(step))
    key = "ema_params" if use_ema else "params"
    item = {key: abstract_params}
    restore_args = jax.tree_util.tree_map(
      lambda a: ocp.ArrayRestoreArgs(sharding=a.sharding, global_shape=a.shape, dtype=a.dtype), item
    )
    args = ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True)
    # The newest step that loads (damaged newer ones are named in a warning), unless `step`.
    restored, step, _ = fallback.restore_with_fallback(
      manager,
      item,
      step=None if step is None else int(step),
      partial=True,
      restore_fn=lambda s: manager.restore(s, args=ocp.args.Composite(state=args))["state"],
    )
  finally:
    checkpointing.close(manager)
  return restored[key], step


# The weight files of an export (`launch/export.py`) or a Hugging Face checkpoint directory.
EXPORT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def check_training_run(workdir: str):
  """ValueError when `workdir` is an export or Hugging Face checkpoint (weight files, no
  checkpoints/): its config.json is not a run's, and reading it as one fails far from the cause."""
  if paths.isdir(checkpointing.checkpoint_dir(workdir)):
    return
  found = [f for f in EXPORT_FILES if paths.exists(paths.join(workdir, f))]
  if found:
    raise ValueError(
      f"{workdir} is an exported or Hugging Face checkpoint ({found[0]}, no checkpoints/), not a "
      "training run: load it with setdiff_jax.interop.import_checkpoint, or start a run from a "
      "Hugging Face Qwen3 with --config.init_from_hf=DIR"
    )


def load_inference_state(
  workdir: str,
  *,
  step: Optional[int] = None,
  use_ema: bool = True,
  mesh_config: Optional[dict] = None,
  mesh_what: str = "--mesh",
) -> InferenceState:
  """Parameters (EMA by default), config and tokenizer of a training workdir's checkpoint.

  The parameters are restored onto a mesh of the current devices (`mesh_config`, default: all
  devices on the data axis, i.e. replicated; e.g. {"data": 1, "fsdp": -1} keeps them sharded),
  each with its training sharding (`sharding.state_shardings` with the run's
  `config.sharding_rules`): FSDP over `fsdp`, tensor parallelism over `tensor`. The samplers then
  decode on that mesh (`sampling.placement`): the batch over (data, fsdp), the KV cache over
  batch and heads. `mesh_what`: how errors name the mesh setting (the launchers' --mesh, the
  lm_eval adapter's 'model_args mesh').
  """
  check_training_run(workdir)
  config = load_config(workdir)
  run = run_config.from_config_dict(config)
  tokenizer = build_tokenizer(run, workdir, allow_training=False)
  model_config, objective_config = run_config.model_and_objective(run, tokenizer)
  mesh = sharding.make_mesh(mesh_config or {"data": -1, "fsdp": 1, "tensor": 1}, what=mesh_what)
  abstract = models.param_shapes(model_config)
  shardings = sharding.state_shardings(
    abstract, mesh, sharding.rules_from_config(run.mesh.with_rules())
  )
  abstract = jax.tree_util.tree_map(
    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
  )
  params, step = restore_params(workdir, abstract, step=step, use_ema=use_ema)
  return InferenceState(config, model_config, objective_config, params, tokenizer, int(step))


def load_params(path: str, like, *, use_ema: bool = False, step: Optional[int] = None):
  """Parameters only from a run (a workdir or its checkpoints/ folder; `init_from`), restored
  with the shapes, dtypes and shardings of `like` (e.g. freshly initialised parameters); `step`
  None: the newest intact checkpoint (`load_params_and_step` also says which).

  The source run may use the other `model.scan_layers` layout (per-layer `blocks_{i}` vs stacked
  `blocks`): it is restored in its own layout (read from its config.json) and converted.
  """
  return load_params_and_step(path, like, use_ema=use_ema, step=step)[0]


def load_params_and_step(path: str, like, *, use_ema: bool = False, step: Optional[int] = None):
  """(parameters, the step they came from): `load_params`."""
  path = paths.resolve(path).rstrip("/")
  run = path.rsplit("/", 1)[0] if path.rsplit("/", 1)[-1] == checkpointing.CHECKPOINT_DIR else path
  if not paths.isdir(checkpointing.checkpoint_dir(run)):
    raise FileNotFoundError(
      f"init_from={path!r}: no {checkpointing.CHECKPOINT_DIR}/ folder found there"
    )
  abstract = jax.tree_util.tree_map(
    lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), like
  )
  want_scanned = layer_names.is_scanned(like)
  source_scanned = want_scanned
  if paths.isfile(paths.join(run, checkpointing.CONFIG_FILE)):
    source_scanned = bool(load_config(run).model.get("scan_layers", False))
  try:
    restored, step = restore_params(
      run, layer_names.to_layout(abstract, source_scanned), step=step, use_ema=use_ema
    )
  except FileNotFoundError as e:
    raise FileNotFoundError(f"init_from={path!r}: {e}") from e
  except errors.DamagedCheckpointError as e:
    if not hasattr(e, "none_loads"):
      raise
    raise errors.DamagedCheckpointError(
      f"init_from={path!r}, the run this one starts from, has no intact checkpoint "
      f"({e.none_loads}): restore that run's checkpoints/ from a backup, or set init_from to "
      "another run"
    ) from e
  if source_scanned == want_scanned:
    return restored, int(step)
  shardings = jax.tree_util.tree_map(lambda a: a.sharding, like)
  convert = jax.jit(lambda p: layer_names.to_layout(p, want_scanned), out_shardings=shardings)
  return convert(restored), int(step)


def inference_model(model_config, dtype: Optional[str] = "float32"):
  """The backbone (DiT, Qwen3) for sampling: compute dtype `dtype` (None keeps the run's; the reference generates in
  fp32, SPEC §3.7) and, off GPU, the XLA attention path in place of `cudnn`."""
  changes = {}
  if dtype is not None:
    changes["dtype"] = dtype
  if model_config.attention == "cudnn" and jax.default_backend() != "gpu":
    changes["attention"] = "xla"
  return models.build(dataclasses.replace(model_config, **changes) if changes else model_config)


__all__ = [
  "InferenceState",
  "load_config",
  "restore_params",
  "check_training_run",
  "load_inference_state",
  "load_params",
  "load_params_and_step",
  "inference_model",
]
