"""The one timed decode loop: untimed warm-up (compilation), then each call timed to its result."""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

import jax


def time_calls(
  fn: Callable[..., Any], calls: Sequence[Tuple], *, warmup: Optional[Tuple] = None
) -> Tuple[List[Any], List[float], float]:
  """Runs fn(*args) for every args in `calls`, each timed until its result is on the host.

  `warmup` args (if given) run first, untimed, so compilation is not counted.
  Returns (outputs, seconds per call, warm-up seconds).
  """
  warm = 0.0
  if warmup is not None:
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*warmup))
    warm = time.perf_counter() - t0
  outputs, seconds = [], []
  for args in calls:
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    seconds.append(time.perf_counter() - t0)
    outputs.append(out)
  return outputs, seconds, warm


__all__ = ["time_calls"]
