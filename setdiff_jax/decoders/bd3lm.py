"""BD3LM's decoder: blocks of S left to right, masked diffusion inside (SPEC §4.7)."""

from __future__ import annotations

from setdiff_jax.decoders.base import Decoder
from setdiff_jax.objectives import bd3lm as objective
from setdiff_jax.sampling import baselines


class BD3LMDecoder(Decoder):
  name = objective.BD3LM.name
  uses_block_grid = True
  rollout_scoring = "block_replay"
  infill_unsupported = (
    "its blocks are decoded left to right and cannot see the text after a gap "
    "(the infill evaluation scores it on the prefix only)"
  )

  def sampler_fields(self, cfg):
    return dict(super().sampler_fields(cfg), block_size=int(cfg.block_size))

  def generate(self, model, params, prompts, sampler_cfg, rng=None):
    return baselines.bd3lm_generate(model, params, prompts, sampler_cfg, rng)
