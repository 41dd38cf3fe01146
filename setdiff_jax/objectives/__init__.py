"""The methods' training objectives (loss and likelihood bound), one per method, by name.

  objective = objectives.get(config.objective)      # or objectives.get(objective_config.name)
  loss, metrics = objective.loss(obj_cfg, model, params, batch, rng, train=True)

Entries (each an `Objective` subclass in its own module; see `base.py` for what one owns):
  setdlm  `setdlm.SetDLM`   ar  `ar.AR`   mdlm  `mdlm.MDLM`   bd3lm  `bd3lm.BD3LM`
Their names are the methods' names: the decoders (`setdiff_jax.decoders`) and export formats
(`setdiff_jax.interop.formats`) key their tables by them, and `setdiff_jax.methods` binds the
three.
"""

from __future__ import annotations

from typing import Dict, Tuple

from setdiff_jax.objectives.ar import AR
from setdiff_jax.objectives.base import Objective, logmeanexp
from setdiff_jax.objectives.bd3lm import BD3LM
from setdiff_jax.objectives.mdlm import MDLM
from setdiff_jax.objectives.setdlm import SetDLM

REGISTRY: Dict[str, Objective] = {o.name: o for o in (SetDLM(), AR(), MDLM(), BD3LM())}
NAMES: Tuple[str, ...] = tuple(REGISTRY)
# The method a config gets when it names none (configs/default.py, imported checkpoints).
DEFAULT = SetDLM.name


def get(name: str) -> Objective:
  """The objective of method `name`; ValueError listing the known methods otherwise."""
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
  "Objective",
  "get",
  "compute_loss",
  "logmeanexp",
  "SetDLM",
  "AR",
  "MDLM",
  "BD3LM",
]
