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


def unread_loss_fields(name) -> Tuple[str, ...]:
  """The method-specific `loss.*` fields method `name` never reads (another method's); () for a
  name that is no method (an older config: nothing is assumed)."""
  if str(name) not in REGISTRY:
    return ()
  every = dict.fromkeys(f for o in REGISTRY.values() for f in o.loss_fields)
  return tuple(f for f in every if f not in REGISTRY[str(name)].loss_fields)


def check_loss_fields(config, defaults) -> None:
  """ValueError for a `loss.*` field set away from its default (`defaults`: {field: value}) that
  the run's method never reads: it would be ignored, yet recorded (and structural on resume)."""
  name = config.get("objective", DEFAULT)
  for field in unread_loss_fields(name):
    value = config.loss.get(field, defaults[field])
    if value != defaults[field]:
      readers = ", ".join(o.name for o in REGISTRY.values() if field in o.loss_fields)
      raise ValueError(
        f"loss.{field}={value!r} is not read by objective={name}; it applies to objective "
        f"{readers} only: drop it, or where the --config file sets it, set "
        f"--config.loss.{field}={defaults[field]!r} (its default)"
      )


def compute_loss(cfg, model, params, batch, rng, *, train: bool):
  """The training loss (train=True) or likelihood bound (train=False) of `cfg.name`'s method."""
  return get(cfg.name).loss(cfg, model, params, batch, rng, train=train)


__all__ = [
  "REGISTRY",
  "NAMES",
  "DEFAULT",
  "Objective",
  "get",
  "unread_loss_fields",
  "check_loss_fields",
  "compute_loss",
  "logmeanexp",
  "SetDLM",
  "AR",
  "MDLM",
  "BD3LM",
]
