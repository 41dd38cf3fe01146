"""How each method reads and writes the official `config.json` / `generation_config.json`
(SPEC §9.2): one `ExportFormat` per method, keyed by the method's name (`setdiff_jax.objectives`).

  fmt = formats.get(config.objective)
  fmt.noise_config(seq_len, loss) / fmt.generation_fields(...) / fmt.loss_fields(...)
  formats.HF_MATCH_ORDER   the order in which an official config's names are matched

`setdiff_jax.methods` binds each to its method's objective and decoder.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

from setdiff_jax import objectives
from setdiff_jax.diffusion.orders import effective_max_set_size

# `_target_` names of the official noise schedules in config.json (SPEC §9.2).
STAGGERED_TARGET = "noise_schedule_noise_schedules.StaggeredNoise"
LINEAR_TARGET = "noise_schedule_noise_schedules.LinearNoise"


def normalize_max_set_size(block_size: int, desired: int, stored: Optional[int]) -> int:
  """S_max the way the official eval loader rebuilds it (SPEC §1.2 caveat, §8.5).

  A stored value strictly below the schedule span is kept; anything else (the `max_block_size = L`
  of older released configs, a missing value, a value above the span) becomes min(2S, span).
  """
  if stored is not None and int(stored) < int(block_size):
    return int(stored)
  return min(effective_max_set_size(desired), int(block_size))


def infer_desired_from_name(name: str) -> Optional[int]:
  """S from a run/repo name: `d{S}`, `tgt{S}` or `smax{2S}` (as the official eval loader)."""
  name = str(name).lower()
  for pat in (r"(?:^|[^a-z0-9])d(\d+)(?:$|[^a-z0-9])", r"(?:^|[^a-z0-9])tgt(\d+)(?:$|[^a-z0-9])"):
    m = re.search(pat, name)
    if m:
      return int(m.group(1))
  m = re.search(r"(?:^|[^a-z0-9])smax(\d+)(?:$|[^a-z0-9])", name)
  return int(m.group(1)) // 2 if m else None


class ExportFormat:
  """How a method reads and writes the official `config.json` / `generation_config.json`.

  Defaults are the diffusion baselines'; each method's subclass overrides what differs.
  """

  name: str = ""  # the method's name (its objective's)
  model_type: str = ""  # official `model_type` / `architectures[0]`
  architecture: str = ""
  causal_attention: bool = False  # `backbone_config.causal_attention`
  name_pattern: str = ""  # regex naming the method in architectures / model_type / a path
  default_keep_clean_bos: bool = True  # `loss.keep_clean_bos` of an imported run

  def block_size(self, seq_len: int, loss: Mapping) -> int:
    """`block_size` / `eval_block_size` of the official config."""
    return int(seq_len)

  def noise_config(self, seq_len: int, loss: Mapping) -> Optional[Dict[str, Any]]:
    return None

  def generation_fields(self, seq_len: int, loss: Mapping) -> Dict[str, Any]:
    """Sampler knobs of `generation_config.json` (default: the diffusion samplers' fields)."""
    return {
      "num_steps": int(seq_len),
      "sampling_strategy": "predict_and_noise",
      "confidence_threshold": 1e6,
      "nucleus_p": 1.0,
      "block_size": self.block_size(seq_len, loss),
    }

  def loss_fields(
    self, cfg: Mapping, seq_len: int, path_hint: str, warns: List[str]
  ) -> Dict[str, Any]:
    """Our `loss.*` fields read back from an official config.json (appends warnings)."""
    return {}

  def warnings(self, seq_len: int, loss: Mapping) -> List[str]:
    """Caveats of exporting this run's settings (logged by the exporter)."""
    return []

  def __repr__(self):
    return f"<export format {self.name}>"


class ARExport(ExportFormat):
  name = objectives.AR.name
  model_type, architecture = "ar", "AR"
  causal_attention = True
  name_pattern = r"(^|[^a-z])ar([^a-z]|$)"
  default_keep_clean_bos = False

  def generation_fields(self, seq_len, loss):
    return {}

  def loss_fields(self, cfg, seq_len, path_hint, warns):
    if not bool((cfg.get("backbone_config") or {}).get("causal_attention", False)):
      warns.append("AR model with causal_attention=false in backbone_config")
    return {}


class LinearNoiseExport(ExportFormat):
  """The masked-diffusion baselines' export: a linear noise schedule over `block_size`."""

  def noise_config(self, seq_len, loss):
    return {
      "_target_": LINEAR_TARGET,
      "block_size": self.block_size(seq_len, loss),
      "length": int(seq_len),
    }


class MDLMExport(LinearNoiseExport):
  name = objectives.MDLM.name
  model_type, architecture = "mdlm", "MDLM"
  name_pattern = "mdlm"


class BD3LMExport(LinearNoiseExport):
  name = objectives.BD3LM.name
  model_type, architecture = "bd3lm", "BD3LM"
  name_pattern = "bd3lm"

  def block_size(self, seq_len, loss):
    return int(loss.get("block_size", 4))

  def loss_fields(self, cfg, seq_len, path_hint, warns):
    return {
      "block_size": int(
        cfg.get("block_size") or (cfg.get("backbone_config") or {}).get("block_size")
      )
    }


class SetDLMExport(ExportFormat):
  name = objectives.SetDLM.name
  model_type, architecture = "bd3lm", "SetDLM"  # SetDLM reuses BD3LMConfig (SPEC §9.2)
  name_pattern = "setdlm"

  def noise_config(self, seq_len, loss):
    desired = int(loss.get("desired_set_size", 4))
    return {
      "_target_": STAGGERED_TARGET,
      "eps": 1e-3,
      "block_size": int(seq_len),
      "desired_block_size": desired,
      "max_block_size": effective_max_set_size(desired, loss.get("max_set_size", 0)),
      "length": int(seq_len),
    }

  def generation_fields(self, seq_len, loss):
    return dict(
      super().generation_fields(seq_len, loss),
      max_window_size=int(loss.get("desired_set_size", 4)),
      kv_cache=True,
    )

  def loss_fields(self, cfg, seq_len, path_hint, warns):
    noise = cfg.get("noise_config") or {}
    span = int(
      noise.get("block_size") or cfg.get("eval_block_size") or cfg.get("block_size") or seq_len
    )
    if span != seq_len:
      warns.append(
        f"noise_config.block_size={span} != length={seq_len}; the schedule span is "
        f"always L here (SPEC §1.2): using {seq_len}"
      )
      span = seq_len
    desired = noise.get("desired_block_size")
    if desired is None:
      desired = infer_desired_from_name(path_hint)
      if desired is None:
        raise ValueError(
          "config.json noise_config lacks desired_block_size and the path does not "
          "name it (d{S} / tgt{S} / smax{2S})"
        )
      warns.append(f"S={desired} inferred from the path {path_hint!r}")
    desired = int(desired)
    stored = noise.get("max_block_size")
    s_max = normalize_max_set_size(span, desired, stored)
    if stored is None or int(stored) != s_max:
      warns.append(
        f"noise_config.max_block_size={stored} normalised to S_max={s_max} = "
        f"min(2S, L) (SPEC §1.2 / §8.5: released configs store L but were trained "
        f"with 2S)"
      )
    for key in ("k", "b"):
      if noise.get(key) is not None:
        warns.append(f"noise_config.{key}={noise[key]} is not supported by our config; ignored")
    default = effective_max_set_size(desired)
    return {
      "desired_set_size": desired,
      "max_set_size": 0 if s_max == default else s_max,
      "eos_last": bool(cfg.get("setdlm_eos_last_in_target_order", False)),
    }

  def warnings(self, seq_len: int, loss: Mapping) -> List[str]:
    s = int(loss.get("desired_set_size", 4))
    s_max = effective_max_set_size(s, loss.get("max_set_size", 0))
    if normalize_max_set_size(seq_len, s, s_max) != s_max:
      return [
        f"S_max={s_max} = L: importers (ours and the official eval loader) will read it as "
        f"min(2S, L)={min(effective_max_set_size(s), seq_len)} (SPEC §1.2 caveat)"
      ]
    return []


REGISTRY: Dict[str, ExportFormat] = {
  f.name: f for f in (SetDLMExport(), ARExport(), MDLMExport(), BD3LMExport())
}
# Order in which official config.json names are matched (SetDLM configs say model_type "bd3lm").
HF_MATCH_ORDER: Tuple[ExportFormat, ...] = tuple(
  REGISTRY[o.name] for o in (objectives.SetDLM, objectives.BD3LM, objectives.MDLM, objectives.AR)
)


def get(name: str) -> ExportFormat:
  """The export format of method `name`; ValueError listing the known methods otherwise."""
  return REGISTRY[objectives.get(name).name]


__all__ = [
  "REGISTRY",
  "HF_MATCH_ORDER",
  "STAGGERED_TARGET",
  "LINEAR_TARGET",
  "ExportFormat",
  "get",
  "normalize_max_set_size",
  "infer_desired_from_name",
  "SetDLMExport",
  "ARExport",
  "MDLMExport",
  "BD3LMExport",
]
