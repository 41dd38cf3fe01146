"""The typed run config at the command-line edge: a ConfigDict (`--config=configs/x.py
--config.a.b=...`, or a workdir's config.json) checked with every rule, the method registry's
and the sampler's included, before anything is built or compiled.

  cfg = edge.from_config_dict(config, jax.device_count())   # ValueError: one line, field + fix

This module sits above `objectives` and `sampling`; `config/run.py` (below them) builds the same
typed config without those rules, for the workdir layer.
"""

from __future__ import annotations

from typing import Optional

import jax

from setdiff_jax import objectives
from setdiff_jax.config import fields
from setdiff_jax.config import run as run_lib
from setdiff_jax.sampling import policies

OBJECTIVES = fields.Choice(tuple(objectives.NAMES))
RL_POLICIES = fields.Choice(tuple(policies.POLICIES))


def check_choices(config):
  """The fields whose choices are registries above the typed layer: objective (the methods) and
  rl.policy (the commit policies); fields `config` lacks are not checked."""
  for key, allowed in (("objective", OBJECTIVES), ("rl.policy", RL_POLICIES)):
    value = fields.lookup(config, key)
    if value is not fields.MISSING and not allowed.ok(value):
      raise fields.out_of_range(key, value, allowed)


def from_config_dict(config, num_devices: Optional[int] = None) -> run_lib.RunConfig:
  """The typed run config of `config` (a ConfigDict or a config.json's dict), after every check:
  no unknown field, the fields' ranges and choices, the rules between sections, the method's
  rules (`Method.validate`) and, given `num_devices`, the batches against the mesh. Raises
  ValueError naming the field and the fix."""

  def check(ok, msg):
    if not ok:
      raise ValueError(f"invalid config: {msg}")

  config = run_lib.as_config_dict(config)  # a config.json's dict too (the methods read attributes)
  check_choices(config)
  run = run_lib.from_config_dict(config)
  objectives.get(run.objective).validate(config, check)
  if num_devices is not None:
    run.check_mesh(num_devices)
    check(  # jax.nn.dot_product_attention's cuDNN kernel: "cuDNN is not detected" at init
      run.model.attention != "cudnn" or jax.default_backend() == "gpu",
      f"model.attention='cudnn' needs an NVIDIA GPU with cuDNN (this machine's backend is "
      f"{jax.default_backend()}): set --config.model.attention=xla (or dense)",
    )
  return run


__all__ = ["from_config_dict", "check_choices", "OBJECTIVES", "RL_POLICIES"]
