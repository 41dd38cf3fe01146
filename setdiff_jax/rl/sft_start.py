"""The SFT run an RL run starts from: which of its steps (rl.init_step, recorded on the first
start), checked before anything is written, and loaded as the starting parameters and, with
rl.kl_beta > 0, as the frozen KL reference on every resume.

Which parameters that step held is recorded too: WORKDIR/sft_reference.json keeps a fingerprint
of the parameters loaded at the first start (`params_fingerprint`: exact integer sums over their
bits, the same on any storage, mesh or process count), and a resume that reloads the reference
refuses other parameters at that step (an SFT run trained again at the same path: its KL
reference would be another model). A record without a fingerprint (an older run) is not compared.
"""

from __future__ import annotations

import hashlib
import json
from typing import Optional

from absl import logging
import jax
import jax.numpy as jnp

from setdiff_jax import errors, paths, trainer
from setdiff_jax.trainer import session
from setdiff_jax.data import tokenizers
from setdiff_jax.rl import config as rl_config
from setdiff_jax.sampling import placement
from setdiff_jax.workdir import checkpoints as checkpointing
from setdiff_jax.workdir import load as workdir_lib
from setdiff_jax.workdir import lock as workdir_lock
from setdiff_jax.workdir import tokenizer as workdir_tokenizer


REFERENCE_FILE = "sft_reference.json"  # in the RL workdir: {init_from, step, params_fingerprint}


def _mix(v):
  """A bijective scramble of uint32 words (a murmur3-style finaliser): neighbouring values and
  positions land far apart, so the wrapped sums below see any change of bits or order."""
  v = v * jnp.uint32(0x85EBCA6B)
  v = v ^ (v >> 13)
  v = v * jnp.uint32(0xC2B2AE35)
  return v ^ (v >> 16)


def _leaf_sums(x) -> jax.Array:
  """[2] uint32: two wrapped sums over the leaf's bits, each element mixed with its flat index.
  Integer sums are exact in any order, so sharding or the device count does not change them."""
  if x.dtype.itemsize not in (1, 2, 4):
    x = jax.lax.bitcast_convert_type(x, jnp.uint32)  # 8-byte elements: a trailing axis of 2 words
  words = jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * x.dtype.itemsize}"))
  words = words.astype(jnp.uint32)
  index = jnp.zeros(words.shape, jnp.uint32)
  stride = 1
  for axis in reversed(range(words.ndim)):
    index = index + jax.lax.broadcasted_iota(jnp.uint32, words.shape, axis) * jnp.uint32(stride)
    stride = stride * words.shape[axis] % (1 << 32)
  a = _mix(words ^ _mix(index + jnp.uint32(0x9E3779B9)))
  b = _mix(a + index * jnp.uint32(0x27D4EB2F))
  return jnp.stack([jnp.sum(a, dtype=jnp.uint32), jnp.sum(b, dtype=jnp.uint32)])


@jax.jit
def _tree_sums(params):
  return jax.tree_util.tree_map(_leaf_sums, params)


def params_fingerprint(params) -> str:
  """SHA-256 (hex) of a parameter tree's leaf names, dtypes, shapes and `_leaf_sums`: equal for
  the same parameters wherever they live, different for a retrained model (64 bits a leaf)."""
  sums = placement.to_host(_tree_sums(params))
  digest = hashlib.sha256()
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  for (path, leaf), (_, leaf_sums) in zip(flat, jax.tree_util.tree_flatten_with_path(sums)[0]):
    digest.update(f"{jax.tree_util.keystr(path)}|{leaf.dtype}|{tuple(leaf.shape)}|".encode())
    digest.update(leaf_sums.astype("<u4").tobytes())
  return digest.hexdigest()


def record_reference(workdir: str, init_from: str, step: int, fingerprint: str):
  """Writes WORKDIR/sft_reference.json at the run's first start (process 0)."""
  record = {"init_from": init_from, "step": int(step), "params_fingerprint": fingerprint}
  paths.write_text(paths.join(workdir, REFERENCE_FILE), json.dumps(record, indent=1) + "\n")


def check_same_reference(r, workdir: str, step: int, ref_params):
  """Refuses a resume whose reloaded KL reference `ref_params` (SFT step `step`) differs from the
  parameters its first start loaded there (WORKDIR/sft_reference.json)."""
  path = paths.join(workdir, REFERENCE_FILE)
  if not paths.isfile(path):
    return  # a run of a version that recorded none
  try:
    recorded = json.loads(paths.read_text(path)).get("params_fingerprint")
  except ValueError as e:
    raise errors.CheckpointError(f"{path} is damaged ({e}); restore it from a backup") from e
  if recorded and params_fingerprint(ref_params) != recorded:
    raise errors.CheckpointError(
      f"rl.init_from={r.init_from!r} step {step} is not the checkpoint this RL run started from "
      f"(its parameters differ from those recorded at the first start, {path}): the SFT run was "
      f"trained again or changed since, and the KL reference (rl.kl_beta={r.kl_beta}) would be "
      "another model. Restore that SFT run from a backup, or start a new RL run (a new --workdir)"
    )


def check_same_sft_config(run, workdir: str):
  """Refuses a resume (WORKDIR holds RL checkpoints) whose SFT run's config.json changed since
  the first start in a field the checkpoints depend on (the RL run's `run` takes all but its own
  fields and rl.* from there): named as the SFT run's change, not as overrides of this command
  line (it has none there)."""
  path = paths.join(workdir, checkpointing.CONFIG_FILE)
  if not paths.isfile(path):
    return  # the resume check names a missing config.json
  try:
    old = json.loads(paths.read_text(path))
  except ValueError:
    return  # a damaged config.json: the resume check names it
  started_from = (old.get("rl") or {}).get("init_from")
  if started_from and paths.resolve(started_from) != paths.resolve(run.rl.init_from):
    return  # another SFT run, not a changed one: the resume check names rl.init_from old -> new
  changes = [
    (k, o, n)
    for k, o, n in workdir_lock.structural_changes(old, run, session.unread_settings)
    if k.split(".")[0] not in rl_config.OWN_FIELDS + ("rl", "init_from")
  ]
  if changes:
    diff = "; ".join(f"{k}: {json.dumps(o)} -> {json.dumps(n)}" for k, o, n in changes)
    raise errors.ConfigMismatchError(
      f"rl.init_from={run.rl.init_from!r}: its config.json differs from the one this RL run "
      f"started with (recorded in {path}) in fields the checkpoints depend on: {diff}. The SFT "
      "run was changed since; restore its config.json from a backup, or start a new RL run (a "
      "new --workdir)"
    )


def check_same_tokenizer(r, tokenizer, workdir: str):
  """Refuses a resume (WORKDIR holds RL checkpoints) whose SFT run's tokenizer (`tokenizer`,
  built from rl.init_from) gives ids other than the RL workdir's copy, saved at the first start:
  the rollouts would encode the prompts and read the answers with ids the RL checkpoints were
  not trained with."""
  if not tokenizers.saved_in(workdir):
    return  # none saved (a run of an older version): the resume saves this one
  difference = workdir_tokenizer.id_difference(tokenizer, workdir)
  if difference is not None:
    raise errors.CheckpointError(
      f"rl.init_from={r.init_from!r}: its tokenizer/ is not the one this RL run started with "
      f"(the copy in {paths.join(workdir, tokenizers.TOKENIZER_SUBDIR)}: {difference}): the SFT "
      "run was changed since. Restore its tokenizer/ from a backup (or copy this run's there), "
      "or start a new RL run (a new --workdir)"
    )


def recorded_init_step(workdir: str) -> int:
  """rl.init_step in WORKDIR's config.json when it has checkpoints (0: none recorded)."""
  path = paths.join(workdir, checkpointing.CONFIG_FILE)
  if not workdir_lock.saved_steps(workdir) or not paths.isfile(path):
    return 0
  try:
    return int(json.loads(paths.read_text(path)).get("rl", {}).get("init_step", 0) or 0)
  except ValueError:
    return 0  # a damaged config.json: check_resume names it


def _init_step_missing(r, sft_steps, resume: bool) -> Exception:
  """The error for rl.init_step not among the SFT run's steps `sft_steps`: a bad value on a new
  run; on a resume, the KL reference the SFT run has rotated out since, with the ways out."""
  step = int(r.init_step)
  if not resume:
    return ValueError(
      f"invalid config: rl.init_step={step}: the SFT run rl.init_from={r.init_from!r} has no "
      f"checkpoint at step {step} (its steps: {sft_steps}); set --config.rl.init_step to one of "
      "them (0 = its newest)"
    )
  return errors.CheckpointError(
    f"rl.init_step={step}: this RL run started from step {step} of the SFT run "
    f"rl.init_from={r.init_from!r} and reloads it as its KL reference (rl.kl_beta={r.kl_beta}) "
    f"on every resume, but the SFT run no longer holds that step (its steps now: {sft_steps}; "
    "its keep_checkpoints rotated it out); copy that step's folder back into "
    f"{checkpointing.checkpoint_dir(r.init_from)}/ (from a backup), or start a new RL run (a new "
    "--workdir) from a step it holds; an SFT run that trains on beside RL runs needs a "
    "keep_checkpoints large enough to keep their steps"
  )


def check_init_step(r, workdir: str, recorded: int):
  """Refuses an rl.init_step (explicit, or the one a resume recorded) the SFT run does not hold,
  when the run needs it: a new run starts from it; a resume with rl.kl_beta > 0 reloads it as the
  KL reference (else the RL checkpoint is all a resume reads; `restore_from_sft` compares the one
  it reloads with the first start's record). Reads listings and one small file only."""
  step = int(r.init_step)
  if not step:
    return
  resume = bool(workdir_lock.saved_steps(workdir))
  if resume and (float(r.kl_beta) <= 0 or (recorded and recorded != step)):
    return  # nothing reloaded; or a changed rl.init_step, which the resume check names
  sft_steps = workdir_lock.saved_steps(r.init_from)
  if step not in sft_steps:
    raise _init_step_missing(r, sft_steps, resume)


def load_sft(r, like, step: Optional[int], resume: bool):
  """(params, step) of the SFT run at `step` (None: its newest intact one); a step that is gone
  (rotated out after `check_init_step` looked) is named as rl.init_step, not as a --step flag."""
  try:
    return workdir_lib.load_params_and_step(r.init_from, like, step=step)
  except errors.CheckpointError as e:
    sft_steps = workdir_lock.saved_steps(r.init_from)
    if step is None or isinstance(e, errors.DamagedCheckpointError) or step in sft_steps:
      raise
    raise _init_step_missing(r, sft_steps, resume) from e


def restore_from_sft(r, state, manager, workdir: str):
  """(state, KL reference params or None, SFT step, fingerprint): the RL checkpoint, else the SFT
  run's parameters at rl.init_step (0: its newest intact step, the one returned for
  config.json), with their `params_fingerprint` for `record_reference` (None on a resume, whose
  reloaded KL reference is checked against that record instead)."""
  sft_step = {"step": int(r.init_step) or None}  # a resume: the step its first start recorded

  def from_sft(state):
    params, sft_step["step"] = load_sft(r, state.params, sft_step["step"], resume=False)
    sft_step["fresh"] = True
    sft_step["fingerprint"] = params_fingerprint(params)
    logging.info(
      "initialised parameters from the SFT run %s, step %d", r.init_from, sft_step["step"]
    )
    return state.replace(params=params, ema_params=params)

  state = trainer.restore(manager, state, initialise=from_sft)
  state = state.replace(ema_params=state.params)
  try:
    if sft_step["step"] is None:  # restored from an RL run of a version that did not record it
      sft_step["step"] = workdir_lib.load_params_and_step(r.init_from, state.params)[1]
    ref_params = None
    if float(r.kl_beta) > 0:  # the frozen SFT reference (a copy: params are donated)
      resume = not sft_step.get("fresh")
      ref_params = load_sft(r, state.params, sft_step["step"], resume=resume)[0]
      if resume:
        check_same_reference(r, workdir, sft_step["step"], ref_params)
  except BaseException:
    checkpointing.close(manager)
    raise
  return state, ref_params, sft_step["step"], sft_step.get("fingerprint")


__all__ = [
  "REFERENCE_FILE",
  "params_fingerprint",
  "record_reference",
  "check_same_reference",
  "check_same_sft_config",
  "check_same_tokenizer",
  "recorded_init_step",
  "check_init_step",
  "load_sft",
  "restore_from_sft",
]
