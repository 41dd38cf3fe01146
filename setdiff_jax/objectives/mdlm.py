"""MDLM: masked diffusion over the whole sequence, bidirectional attention (SPEC §1.6, §4.8)."""

from __future__ import annotations

from setdiff_jax.diffusion import losses
from setdiff_jax.objectives.base import Objective


class MDLM(Objective):
  name = "mdlm"
  adaln = True
  loss_fields = ("antithetic", "sampling_eps")

  def loss(self, cfg, model, params, batch, rng, *, train):
    return losses.mdlm_loss(cfg, model, params, batch, rng, train=train)

  estimator = "1/t NELBO, one (t, mask) draw per sequence"

  def estimator_k(self, k):
    return f"mean of K={k} NELBO draws per sequence (same bound, lower variance)"
