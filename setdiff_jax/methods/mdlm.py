"""MDLM: masked diffusion over the whole sequence, bidirectional attention (SPEC §1.6, §4.8)."""

from __future__ import annotations

import numpy as np

from setdiff_jax.diffusion import losses
from setdiff_jax.methods.base import LINEAR_TARGET, ExportFormat, Method
from setdiff_jax.sampling import baselines
from setdiff_jax.sampling.mdlm_infill import mdlm_infill


class LinearNoiseExport(ExportFormat):
  """The masked-diffusion baselines' export: a linear noise schedule over `block_size`."""

  def noise_config(self, seq_len, loss):
    return {
      "_target_": LINEAR_TARGET,
      "block_size": self.block_size(seq_len, loss),
      "length": int(seq_len),
    }


class MDLMExport(LinearNoiseExport):
  model_type, architecture = "mdlm", "MDLM"
  name_pattern = "mdlm"


class MDLM(Method):
  name = "mdlm"
  adaln = True
  export = MDLMExport()

  def loss(self, cfg, model, params, batch, rng, *, train):
    return losses.mdlm_loss(cfg, model, params, batch, rng, train=train)

  estimator = "1/t NELBO, one (t, mask) draw per sequence"

  def estimator_k(self, k):
    return f"mean of K={k} NELBO draws per sequence (same bound, lower variance)"

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
