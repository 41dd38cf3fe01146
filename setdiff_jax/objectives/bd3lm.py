"""BD3LM: block diffusion, blocks of S left to right, masked diffusion inside (SPEC §1.6, §4.7)."""

from __future__ import annotations

import numbers

from setdiff_jax.diffusion import losses
from setdiff_jax.objectives.base import Objective, row_length
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
    length, block = row_length(batch, self.name), cfg.block_size
    # the rows are cut into blocks of S ([B, L / S, S]): the run config's rule, for direct calls
    if not (isinstance(block, numbers.Integral) and block >= 1 and length % block == 0):
      raise ValueError(
        f"objective=bd3lm needs block_size={block!r} to be >= 1 and divide the row length "
        f"{length}; pad the rows to a multiple of block_size or pick a block_size dividing it"
      )
    return losses.bd3lm_loss(cfg, model, params, batch, rng, train=train)

  # the bound is MDLM's inside each block: the same estimator
  estimator = MDLM.estimator
  estimator_k = MDLM.estimator_k
