"""The methods' decoders (generation, infilling, decode defaults, rollout scoring), by name.

  decoder = decoders.get(objective_config.name)
  out = decoder.generate(model, params, prompts, sampler_cfg, rng)

Entries (each a `Decoder` subclass in its own module; see `base.py` for what one owns):
  setdlm  `setdlm.SetDLMDecoder`   ar  `ar.ARDecoder`   mdlm  `mdlm.MDLMDecoder`
  bd3lm  `bd3lm.BD3LMDecoder`
Keyed by the methods' names (`setdiff_jax.objectives`); `setdiff_jax.methods` binds each to its
objective and export format.
"""

from __future__ import annotations

from typing import Dict

from setdiff_jax import objectives
from setdiff_jax.decoders.ar import ARDecoder
from setdiff_jax.decoders.base import DEFAULT_WINDOW, Decoder
from setdiff_jax.decoders.bd3lm import BD3LMDecoder
from setdiff_jax.decoders.mdlm import MDLMDecoder
from setdiff_jax.decoders.setdlm import SetDLMDecoder

REGISTRY: Dict[str, Decoder] = {
  d.name: d for d in (SetDLMDecoder(), ARDecoder(), MDLMDecoder(), BD3LMDecoder())
}


def get(name: str) -> Decoder:
  """The decoder of method `name`; ValueError listing the known methods otherwise."""
  return REGISTRY[objectives.get(name).name]


__all__ = [
  "REGISTRY",
  "DEFAULT_WINDOW",
  "Decoder",
  "get",
  "SetDLMDecoder",
  "ARDecoder",
  "MDLMDecoder",
  "BD3LMDecoder",
]
