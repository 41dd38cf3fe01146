"""MDLM's decoder: masked diffusion over the whole canvas (SPEC §4.8)."""

from __future__ import annotations

import numpy as np

from setdiff_jax.decoders.base import Decoder
from setdiff_jax.objectives import mdlm as objective
from setdiff_jax.sampling import baselines
from setdiff_jax.sampling.mdlm_infill import mdlm_infill


class MDLMDecoder(Decoder):
  name = objective.MDLM.name
  uses_block_grid = True

  def generate(self, model, params, prompts, sampler_cfg, rng=None):
    return baselines.mdlm_generate(model, params, prompts, sampler_cfg, rng)

  def canvas_infill(self, model, params, canvases, sampler_cfg, rng=None, *, shapes=None):
    """Every M of each canvas generated with the whole canvas visible (SPEC §4.8).

    With `shapes`, canvases are padded to its length / step-table width and the batch is completed
    with BOS-only rows, so every batch compiles to one shape.
    """
    rows = [list(c) for c in canvases]
    n = len(rows)
    kwargs = {}
    if shapes:
      bos = int(
        sampler_cfg.bos_token_id
        if sampler_cfg.bos_token_id is not None
        else sampler_cfg.pad_token_id
      )
      rows += [[bos]] * max(0, shapes["batch_size"] - n)
      kwargs = {"length": shapes["length"], "max_targets": shapes["max_targets"]}
    out = mdlm_infill(model, params, rows, sampler_cfg, rng, **kwargs)
    return {k: np.asarray(v)[:n] for k, v in out.items()}
