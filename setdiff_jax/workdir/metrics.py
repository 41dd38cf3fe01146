"""The run's metrics on disk: `MetricWriter` writes WORKDIR/metrics.jsonl and TensorBoard events.

metrics.jsonl is what `rows` reads back on a resume (the divergence guard's history, whether the
entry step was evaluated). A run that resumes from step s after a crash had logged steps past s
that its checkpoints no longer hold: those rows move to WORKDIR/metrics.discarded.jsonl (kept,
each marked with the step the run went back to; so do lines a crash cut), so metrics.jsonl holds
one history, and TensorBoard hides the events past s (`purge_step`).
"""

from __future__ import annotations

import json
import os
from typing import Dict

from setdiff_jax import paths


METRICS_FILE = "metrics.jsonl"
DISCARDED_FILE = "metrics.discarded.jsonl"
TENSORBOARD_DIR = "tensorboard"  # the event files, beside metrics.jsonl


def _step_of(line: str):
  """The row's step; None for a line a crash cut (not JSON, or no newline yet)."""
  if not line.endswith("\n"):
    return None
  try:
    return int(json.loads(line)["step"])
  except (ValueError, KeyError, TypeError):
    return None


def _set_aside_rows_after(workdir: str, start_step: int):
  """Moves the rows of metrics.jsonl with a step > `start_step`, and lines a crash cut (the next
  row would be glued to one), to metrics.discarded.jsonl."""
  path = paths.join(workdir, METRICS_FILE)
  if not paths.isfile(path):
    return
  lines = paths.read_text(path).splitlines(keepends=True)
  steps = [_step_of(ln) for ln in lines]
  keep = "".join(ln for ln, s in zip(lines, steps) if s is not None and s <= start_step)
  if len(keep) == sum(map(len, lines)):
    return
  marked = []
  for ln, s in zip(lines, steps):
    if s is None:
      marked.append({"unreadable_line": ln.rstrip("\n"), "resumed_from_step": int(start_step)})
    elif s > start_step:
      marked.append({**json.loads(ln), "resumed_from_step": int(start_step)})
  gone = paths.join(workdir, DISCARDED_FILE)
  old = paths.read_text(gone) if paths.isfile(gone) else ""
  paths.write_text(gone, old + "".join(json.dumps(m) + "\n" for m in marked))
  paths.write_text(path, keep)  # second: a crash between the two writes loses no row


def rows(workdir: str) -> list:
  """The rows of WORKDIR/metrics.jsonl as dicts, in file order (through `paths`, so object-store
  workdirs too); lines a crash cut are left out, and a run without the file has none."""
  path = paths.join(workdir, METRICS_FILE)
  if not paths.isfile(path):
    return []
  lines = paths.read_text(path).splitlines(keepends=True)
  return [json.loads(ln) for ln in lines if _step_of(ln) is not None]


def logged_at(workdir: str, step: int, key: str) -> bool:
  """Whether metrics.jsonl holds a row of `step` with `key` (e.g. the evaluation of a step a
  signal stopped the run at: `trainer.Schedule.eval_first`)."""
  return any(row["step"] == step and key in row for row in rows(workdir))


class MetricWriter:
  """TensorBoard events (tensorboardX) + WORKDIR/metrics.jsonl; no-op off process 0.

  metrics.jsonl goes through `setdiff_jax.paths` (object stores included); TensorBoard events
  are written for local workdirs only (an object-store workdir keeps metrics.jsonl)."""

  def __init__(self, workdir: str, enabled: bool, start_step: int = 0):
    """`start_step`: the step the run starts (or resumes) from; rows logged past it before are
    set aside (module doc)."""
    self.enabled = enabled
    self._tb = None
    self._jsonl = None
    if enabled:
      _set_aside_rows_after(workdir, start_step)
      if not paths.is_remote(workdir):
        from tensorboardX import SummaryWriter

        self._tb = SummaryWriter(os.path.join(workdir, TENSORBOARD_DIR), purge_step=start_step + 1)
      self._jsonl = paths.AppendFile(paths.join(workdir, METRICS_FILE))

  def scalars(self, step: int, values: Dict[str, float]):
    if not self.enabled:
      return
    for k, v in values.items():
      if self._tb is not None:
        self._tb.add_scalar(k, float(v), step)
    self._jsonl.write(
      json.dumps({"step": int(step), **{k: float(v) for k, v in values.items()}}) + "\n"
    )
    self._jsonl.flush()
    if self._tb is not None:
      self._tb.flush()

  def texts(self, step: int, tag: str, texts):
    if not self.enabled or self._tb is None:
      return
    for i, t in enumerate(texts):
      self._tb.add_text(f"{tag}/{i}", t, step)
    self._tb.flush()

  def close(self):
    if self.enabled:
      if self._tb is not None:
        self._tb.close()
      self._jsonl.close()
