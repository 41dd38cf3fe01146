"""The SFT run an RL run starts from: which of its steps (rl.init_step, recorded on the first
start), checked before anything is written, and loaded as the starting parameters and, with
rl.kl_beta > 0, as the frozen KL reference on every resume.

Which checkpoint that step was is recorded too: WORKDIR/sft_reference.json holds the SHA-256 of
the step's checksums.json (the size and CRC-32 of each of its files) at the first start, so a
resume refuses an SFT step trained again or changed since (its KL reference would be another
model). An SFT step without checksums.json (an object store, an older run) records none.
"""

from __future__ import annotations

import hashlib
import json
from typing import Optional

from absl import logging

from setdiff_jax import errors, paths, trainer
from setdiff_jax.workdir import checkpoints as checkpointing
from setdiff_jax.workdir import fallback
from setdiff_jax.workdir import load as workdir_lib
from setdiff_jax.workdir import lock as workdir_lock


REFERENCE_FILE = "sft_reference.json"  # in the RL workdir: {init_from, step, checksums_sha256}


def step_digest(init_from: str, step: int) -> Optional[str]:
  """SHA-256 of the SFT run's checkpoints/<step>/checksums.json; None where it has none."""
  path = paths.join(checkpointing.checkpoint_dir(init_from), str(step), fallback.CHECKSUM_FILE)
  return hashlib.sha256(paths.read_bytes(path)).hexdigest() if paths.isfile(path) else None


def record_reference(workdir: str, init_from: str, step: int):
  """Writes WORKDIR/sft_reference.json at the run's first start (process 0)."""
  record = {"init_from": init_from, "step": int(step)}
  record["checksums_sha256"] = step_digest(init_from, step)
  paths.write_text(paths.join(workdir, REFERENCE_FILE), json.dumps(record, indent=1) + "\n")


def _check_same_reference(r, workdir: str, step: int):
  """Refuses a resume whose SFT step differs from the one its first start recorded."""
  path = paths.join(workdir, REFERENCE_FILE)
  if not paths.isfile(path):
    return  # a run of a version that recorded none
  try:
    recorded = json.loads(paths.read_text(path)).get("checksums_sha256")
  except ValueError as e:
    raise errors.CheckpointError(f"{path} is damaged ({e}); restore it from a backup") from e
  now = step_digest(r.init_from, step)
  if recorded and now != recorded:
    raise errors.CheckpointError(
      f"rl.init_from={r.init_from!r} step {step} is not the checkpoint this RL run started from "
      f"(its checksums.json differs from the one recorded at the first start, {path}): the SFT "
      "run was trained again or changed since, and the KL reference (rl.kl_beta="
      f"{r.kl_beta}) would be another model. Restore that SFT run from a backup, or start a new "
      "RL run (a new --workdir)"
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
  KL reference (else the RL checkpoint is all a resume reads), and then must be the checkpoint
  the first start recorded (`sft_reference.json`). Reads listings and one small file only."""
  step = int(r.init_step)
  if not step:
    return
  resume = bool(workdir_lock.saved_steps(workdir))
  if resume and (float(r.kl_beta) <= 0 or (recorded and recorded != step)):
    return  # nothing reloaded; or a changed rl.init_step, which the resume check names
  sft_steps = workdir_lock.saved_steps(r.init_from)
  if step not in sft_steps:
    raise _init_step_missing(r, sft_steps, resume)
  if resume:
    _check_same_reference(r, workdir, step)


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


def restore_from_sft(r, state, manager):
  """(state, KL reference params or None, SFT step): the RL checkpoint, else the SFT run's
  parameters at rl.init_step (0: its newest intact step, the one returned for config.json)."""
  sft_step = {"step": int(r.init_step) or None}  # a resume: the step its first start recorded

  def from_sft(state):
    params, sft_step["step"] = load_sft(r, state.params, sft_step["step"], resume=False)
    sft_step["fresh"] = True
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
  except BaseException:
    checkpointing.close(manager)
    raise
  return state, ref_params, sft_step["step"]


__all__ = [
  "REFERENCE_FILE",
  "step_digest",
  "record_reference",
  "recorded_init_step",
  "check_init_step",
  "load_sft",
  "restore_from_sft",
]
