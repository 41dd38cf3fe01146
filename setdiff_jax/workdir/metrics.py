"""The run's metrics on disk: `MetricWriter` writes WORKDIR/metrics.jsonl and TensorBoard events.

metrics.jsonl is what `divergence.logged_losses` reads back on a resume.
"""

from __future__ import annotations

import json
import os
from typing import Dict

from setdiff_jax import paths


class MetricWriter:
  """TensorBoard events (tensorboardX) + WORKDIR/metrics.jsonl; no-op off process 0.

  metrics.jsonl goes through `setdiff_jax.paths` (object stores included); TensorBoard events
  are written for local workdirs only (an object-store workdir keeps metrics.jsonl)."""

  def __init__(self, workdir: str, enabled: bool):
    self.enabled = enabled
    self._tb = None
    self._jsonl = None
    if enabled:
      if not paths.is_remote(workdir):
        from tensorboardX import SummaryWriter

        self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
      self._jsonl = paths.AppendFile(paths.join(workdir, "metrics.jsonl"))

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
