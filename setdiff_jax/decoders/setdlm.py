"""SetDLM's decoder: the KV-cached set sampler, window W and threshold tau (SPEC §4)."""

from __future__ import annotations

import numpy as np

from setdiff_jax.decoders.base import Decoder
from setdiff_jax.objectives import setdlm as objective
from setdiff_jax.sampling import set_sampler


class SetDLMDecoder(Decoder):
  name = objective.SetDLM.name
  uses_window = True
  rollout_scoring = "two_stream"

  continuous_kind = "set"

  def generate(self, model, params, prompts, sampler_cfg, rng=None):
    return set_sampler.set_generate(model, params, prompts, sampler_cfg, rng)

  def decoding_settings(self, cfg, windows, thresholds):
    ws = list(windows) if windows else [int(cfg.desired_set_size)]
    return [{"window": int(w), "threshold": t} for w in ws for t in thresholds]

  def canvas_infill(self, model, params, canvases, sampler_cfg, rng=None, *, shapes=None):
    """Every M of each canvas generated with prefix and suffix cached (SPEC §4.5).

    With `shapes`, two filler rows set the canvas length / span and the visible-context maxima
    and filler rows complete the batch, so every batch compiles to one shape.
    """
    rows = [list(c) for c in canvases]
    n = len(rows)
    if shapes:
      bos = int(
        sampler_cfg.bos_token_id
        if sampler_cfg.bos_token_id is not None
        else sampler_cfg.pad_token_id
      )
      m = int(sampler_cfg.mask_token_id)
      lc, m_max, v_max = shapes["length"], shapes["max_targets"], shapes["max_visible"]
      fill = [[bos] * (lc - m_max) + [m] * m_max, [bos] * v_max + [m]]
      rows += fill + [fill[0]] * max(0, shapes["batch_size"] - n)
    out = set_sampler.set_infill(model, params, rows, sampler_cfg, rng)
    return {
      "canvas": np.asarray(out.canvas)[:n],
      "num_steps": np.asarray(out.num_steps)[:n],
      "num_committed": np.asarray(out.num_committed)[:n],
      "forward_calls": np.asarray(out.forward_calls)[:n],
    }
