"""BD3LM: block diffusion, blocks of S left to right, masked diffusion inside (SPEC §1.6, §4.7)."""

from __future__ import annotations

from setdiff_jax.diffusion import losses
from setdiff_jax.methods.base import Method
from setdiff_jax.methods.mdlm import MDLM, LinearNoiseExport
from setdiff_jax.sampling import baselines


class BD3LMExport(LinearNoiseExport):
  model_type, architecture = "bd3lm", "BD3LM"
  name_pattern = "bd3lm"

  def block_size(self, seq_len, loss):
    return int(loss.get("block_size", 4))

  def loss_fields(self, cfg, seq_len, path_hint, warns):
    return {
      "block_size": int(
        cfg.get("block_size") or (cfg.get("backbone_config") or {}).get("block_size")
      )
    }


class BD3LM(Method):
  name = "bd3lm"
  adaln = True
  export = BD3LMExport()

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

  rollout_scoring = "block_replay"
  infill_unsupported = (
    "its blocks are decoded left to right and cannot see the text after a gap "
    "(the infill evaluation scores it on the prefix only)"
  )

  def sampler_fields(self, cfg):
    return dict(super().sampler_fields(cfg), block_size=int(cfg.block_size))

  def generate(self, model, params, prompts, sampler_cfg, rng=None):
    return baselines.bd3lm_generate(model, params, prompts, sampler_cfg, rng)
