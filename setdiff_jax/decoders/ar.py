"""AR's decoder: left to right, one token per step (SPEC §1.6)."""

from __future__ import annotations

from setdiff_jax.decoders.base import Decoder
from setdiff_jax.objectives import ar as objective
from setdiff_jax.sampling import ar_sampler


class ARDecoder(Decoder):
  name = objective.AR.name
  uses_threshold = False
  rollout_scoring = "causal"
  infill_unsupported = (
    "it decodes left to right and cannot condition on the text after a gap "
    "(the infill evaluation scores it on the prefix only)"
  )

  continuous_kind = "causal"

  def generate(self, model, params, prompts, sampler_cfg, rng=None):
    return ar_sampler.ar_generate(model, params, prompts, sampler_cfg, rng)
