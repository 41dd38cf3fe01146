"""The method registry: a method's name bound to its three pieces, the only place holding all three.

  method = methods.get("setdlm")
  method.objective   loss and likelihood bound   (`setdiff_jax.objectives`, beside diffusion/)
  method.decoder     generation, infilling, decode defaults, rollout scoring
                     (`setdiff_jax.decoders`, beside sampling/)
  method.export      the official config.json fields (`setdiff_jax.interop.formats`)

Each layer of the library imports only the piece it needs (training the objective, decoding the
decoder, interop the export format), each keyed by the method's name; no library module imports
this package, which sits above them all (tests/test_architecture.py checks both, and that the
three tables name the same methods). Adding a method: its objective (loss in
`diffusion/losses.py`), decoder (sampler in `sampling/`) and export format, each registered in
its package.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Tuple

from setdiff_jax import decoders, objectives
from setdiff_jax.interop import formats


@dataclasses.dataclass(frozen=True)
class Method:
  name: str
  objective: objectives.Objective
  decoder: decoders.Decoder
  export: formats.ExportFormat


NAMES: Tuple[str, ...] = objectives.NAMES
DEFAULT = objectives.DEFAULT
REGISTRY: Dict[str, Method] = {
  n: Method(n, objectives.get(n), decoders.get(n), formats.get(n)) for n in NAMES
}


def get(name: str) -> Method:
  """The registry entry of `name`; ValueError listing the known methods otherwise."""
  return REGISTRY[objectives.get(name).name]


__all__ = ["REGISTRY", "NAMES", "DEFAULT", "Method", "get"]
