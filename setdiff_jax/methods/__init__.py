"""The method registry: one entry per training method, the only place that tells them apart.

  method = methods.get(config.objective)      # or methods.get(objective_config.name)
  loss, metrics = method.loss(obj_cfg, model, params, batch, rng, train=True)
  out = method.generate(model, params, prompts, sampler_cfg, rng)

Entries (each a `Method` subclass in its own module; see `base.py` for what an entry owns):
  setdlm  `setdlm.SetDLM`   ar  `ar.AR`   mdlm  `mdlm.MDLM`   bd3lm  `bd3lm.BD3LM`
"""

from __future__ import annotations

from typing import Dict, Tuple

from setdiff_jax.methods.ar import AR
from setdiff_jax.methods.base import DEFAULT_WINDOW, Method, effective_max_set_size
from setdiff_jax.methods.bd3lm import BD3LM
from setdiff_jax.methods.mdlm import MDLM
from setdiff_jax.methods.setdlm import SetDLM

REGISTRY: Dict[str, Method] = {m.name: m for m in (SetDLM(), AR(), MDLM(), BD3LM())}
NAMES: Tuple[str, ...] = tuple(REGISTRY)
# The method a config gets when it names none (configs/default.py, imported checkpoints).
DEFAULT = SetDLM.name
# Order in which official config.json names are matched (SetDLM configs say model_type "bd3lm").
HF_MATCH_ORDER: Tuple[Method, ...] = tuple(
  REGISTRY[n] for n in (SetDLM.name, BD3LM.name, MDLM.name, AR.name)
)


def get(name: str) -> Method:
  """The registry entry of `name`; ValueError listing the known methods otherwise."""
  try:
    return REGISTRY[str(name)]
  except KeyError:
    raise ValueError(f"objective={name!r}; expected one of {NAMES}") from None


def compute_loss(cfg, model, params, batch, rng, *, train: bool):
  """The training loss (train=True) or likelihood bound (train=False) of `cfg.name`'s method."""
  return get(cfg.name).loss(cfg, model, params, batch, rng, train=train)


__all__ = [
  "REGISTRY",
  "NAMES",
  "DEFAULT",
  "HF_MATCH_ORDER",
  "DEFAULT_WINDOW",
  "Method",
  "get",
  "compute_loss",
  "effective_max_set_size",
  "SetDLM",
  "AR",
  "MDLM",
  "BD3LM",
]
