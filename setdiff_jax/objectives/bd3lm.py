"""BD3LM: block diffusion, blocks of S left to right, masked diffusion inside (SPEC §1.6, §4.7)."""

from __future__ import annotations

from setdiff_jax.diffusion import losses
from setdiff_jax.objectives.base import Objective
from setdiff_jax.objectives.mdlm import MDLM


class BD3LM(Objective):
  name = "bd3lm"
  size_field = "block_size"
  adaln = True
  loss_fields = ("block_size", "antithetic", "sampling_eps")  # S is also its decode block

  def validate(self, config, check):
    check(
      config.seq_len % config.loss.block_size == 0,
      f"objective=bd3lm needs loss.block_size={config.loss.block_size} to divide "
      f"seq_len={config.seq_len}",
    )
    super().validate(config, check)

  def loss(self, cfg, model, params, batch, rng, *, train):
    return losses.bd3lm_loss(cfg, model, params, batch, rng, train=train)

  # the bound is MDLM's inside each block: the same estimator
  estimator = MDLM.estimator
  estimator_k = MDLM.estimator_k
