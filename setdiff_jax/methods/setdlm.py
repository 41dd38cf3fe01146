"""SetDLM: sets of tokens in a staggered order, two-stream set-causal mask (SPEC §1.2-§1.5, §4)."""

from __future__ import annotations

import re
from typing import List, Mapping, Optional

import numpy as np

from setdiff_jax.diffusion import losses, orders
from setdiff_jax.methods.base import (
  STAGGERED_TARGET,
  ExportFormat,
  Method,
  effective_max_set_size,
  logmeanexp,
)
from setdiff_jax.sampling import set_sampler


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


class SetDLMExport(ExportFormat):
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


class SetDLM(Method):
  name = "setdlm"
  adaln = False
  export = SetDLMExport()

  def validate(self, config, check):
    super().validate(config, check)
    try:  # the schedule's own rules (S in [1, L], S <= S_max <= L; 0 means 2S), checked once
      orders.staggered_params(
        config.seq_len, config.loss.desired_set_size, config.loss.max_set_size or None
      )
    except ValueError as e:
      check(False, f"objective=setdlm with seq_len={config.seq_len}: loss.{e}")

  def loss(self, cfg, model, params, batch, rng, *, train):
    return losses.setdlm_loss(cfg, model, params, batch, rng, train=train)

  estimator = "one sampled staggered order per sequence (upper bound on -log p)"

  def eval_batch(self, cfg, batch, key):
    """The bound of draw `key` is the exact NLL under the order drawn from that key."""
    return dict(batch, order=losses.setdlm_order(cfg, batch, key, train=False))

  def aggregate_draws(self, nll):
    """log p(x) >= log mean_k p(x | sigma_k): the K-order importance-sampling bound."""
    return -logmeanexp(-np.asarray(nll, np.float64), 0)

  def estimator_k(self, k):
    return f"log-mean-exp over K={k} orders per sequence (tighter bound)"

  uses_window = True
  rollout_scoring = "two_stream"

  continuous_kind = "set"

  def generate(self, model, params, prompts, sampler_cfg, rng=None):
    return set_sampler.set_generate(model, params, prompts, sampler_cfg, rng)

  def decoding_settings(self, cfg, windows, thresholds):
    ws = list(windows) if windows else [int(cfg.desired_set_size)]
    return [{"window": int(w), "threshold": t} for w in ws for t in thresholds]

  def canvas_infill(self, model, params, canvases, sampler_cfg, rng=None, *, shapes=None):
    """Every M of each canvas generated with prefix and suffix cached (SPEC §4.5).

    With `shapes`, two filler rows set the canvas length / span and the visible-context maxima
    and filler rows complete the batch, so every batch compiles to one shape.
    """
    rows = [list(c) for c in canvases]
    n = len(rows)
    if shapes:
      bos = int(
        sampler_cfg.bos_token_id
        if sampler_cfg.bos_token_id is not None
        else sampler_cfg.pad_token_id
      )
      m = int(sampler_cfg.mask_token_id)
      lc, m_max, v_max = shapes["length"], shapes["max_targets"], shapes["max_visible"]
      fill = [[bos] * (lc - m_max) + [m] * m_max, [bos] * v_max + [m]]
      rows += fill + [fill[0]] * max(0, shapes["batch_size"] - n)
    out = set_sampler.set_infill(model, params, rows, sampler_cfg, rng)
    return {
      "canvas": np.asarray(out.canvas)[:n],
      "num_steps": np.asarray(out.num_steps)[:n],
      "num_committed": np.asarray(out.num_committed)[:n],
      "forward_calls": np.asarray(out.forward_calls)[:n],
    }
