"""Benchmark arms: a method's name with its size ('setdlm4': S = 4, 'bd3lm4': blocks of 4, 'ar').

Arms parse with `configs.compare.parse_method` (the one spelling of `--methods`); what differs
between them is asked of the method's pieces (`setdiff_jax.objectives`, `setdiff_jax.decoders`),
never of its name: tests/test_architecture.py checks that no benchmark but the drivers of the
official code compares method names.
"""

from __future__ import annotations

from typing import Optional

from configs import compare
from setdiff_jax import decoders, objectives


def objective(arm: str) -> objectives.Objective:
  """The objective of an arm ('bd3lm4' -> BD3LM's)."""
  return objectives.get(compare.parse_method(arm)[0])


def decoder(arm: str) -> decoders.Decoder:
  """The decoder of an arm ('setdlm4' -> SetDLM's)."""
  return decoders.get(compare.parse_method(arm)[0])


def set_size(loss, name: str, size: Optional[int]) -> None:
  """Writes an arm's size into its loss config (in place): S = `desired_set_size` with
  S_max = 2S (the release name smax = 2S), or BD3LM's `block_size`; nothing for a method
  without a size."""
  field = objectives.get(name).size_field
  if field is None:
    return
  loss[field] = size
  if field == "desired_set_size":  # S goes with its schedule's S_max = 2S
    loss.max_set_size = 2 * size


def sampler_decoder(sampler: str) -> decoders.Decoder:
  """The decoder behind a `--samplers` name: 'set' is the set sampler (the decoder with the
  window W), any other name a method's ('ar')."""
  if sampler == "set":
    return next(d for d in decoders.REGISTRY.values() if d.uses_window)
  return decoders.get(sampler)
