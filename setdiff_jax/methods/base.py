"""What a training method is: the base class every registry entry subclasses.

A method (SetDLM, AR, MDLM, BD3LM) owns everything that differs between methods; train, sampling
dispatch, evaluation and interop ask it instead of comparing names:

  validation      `validate_run(config, check)` (run-config rules), `validate_objective(cfg, L)`
  backbone        `adaln`: which DiT variant the method trains (SPEC §3.4)
  order / noise   `order_kind` (the generation order it trains, an `orders.ORDER_KINDS` entry);
                  the draw itself happens inside its loss, through `orders.py`
  loss and bound  `loss(cfg, model, params, batch, rng, train=)` -> (loss, metrics)
  likelihood      `eval_batch` (per-row draw for the bound), `num_draws`, `aggregate_draws`,
                  `estimator` / `estimator_k` descriptions
  sampler         `generate(model, params, prompts, sampler_cfg, rng)`, `sampler_fields(cfg)`
                  (defaults of its SamplerConfig), `decoding_settings(...)`, `uses_threshold`
  infilling       `infill(...)` or `infill_unsupported` (the reason)
  export          `hf_*` fields of the official config.json (SPEC §9.2)

Adding a method: subclass `Method` in a module of this package, give it its loss (in
`objectives.py`) and sampler (in `sampling/`), and register it in `methods/__init__.py`.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from setdiff_jax.diffusion.orders import effective_max_set_size  # noqa: F401  (re-exported)

DEFAULT_WINDOW = 4  # SetDLM S (and the set sampler's W) when a config does not say
# `_target_` names of the official noise schedules in config.json (SPEC §9.2).
STAGGERED_TARGET = "noise_schedule_noise_schedules.StaggeredNoise"
LINEAR_TARGET = "noise_schedule_noise_schedules.LinearNoise"


def logmeanexp(x: np.ndarray, axis: int = 0) -> np.ndarray:
  """log(mean(exp(x))) along `axis`, stable (float64)."""
  x = np.asarray(x, np.float64)
  m = np.max(x, axis=axis, keepdims=True)
  return np.squeeze(m + np.log(np.mean(np.exp(x - m), axis=axis, keepdims=True)), axis=axis)


def uses_dit(config) -> bool:
  """Whether the run trains the DiT (`model.backbone`, setdiff_jax/models/), whose adaLN variant
  the MDLM / BD3LM baselines use."""
  return str(config.model.get("backbone", "dit") or "dit") == "dit"


class Method:
  """Defaults shared by the methods; each registry entry overrides what differs."""
  name: str = ""
  description: str = ""
  adaln: bool = False               # the adaLN DiT (constant sigma = 0)
  order_kind: str = "left_to_right"
  uses_threshold: bool = True       # the confidence threshold tau applies to its sampler
  exact_likelihood: bool = False    # the bound is the exact NLL (a generative-perplexity judge)
  infill_unsupported: Optional[str] = None  # why `infill` is unavailable (None: available)
  hf_model_type: str = ""           # official config.json `model_type` / `architectures[0]`
  hf_architecture: str = ""
  hf_causal_attention: bool = False
  uses_window: bool = False         # its sampler has the set window W
  # Its loss also scores the label just after a row's text (AR: the first pad, so that it learns
  # to stop). Only a causal method may set it: to score a continuation alone, the lm_eval adapter
  # then marks the row's tail as real context, which no earlier position can see.
  scores_end_of_text: bool = False

  # ------------------------------------------------------------------ validation
  def validate_run(self, config, check: Callable[[bool, str], None]) -> None:
    """Run-config rules of this method (`check(ok, message)` raises on a violation)."""
    if not uses_dit(config):  # Qwen3 has no time conditioning, whatever the method (SPEC §3.10)
      check(not config.model.adaln, f"model.backbone={config.model.backbone} has no adaLN "
            f"(set model.adaln=False)")
      return
    want = self.adaln
    check(bool(config.model.adaln) == want,
          f"objective={self.name} uses the DiT {'with' if want else 'without'} adaLN "
          f"(set model.adaln={want})")

  def validate_objective(self, cfg, seq_len: int) -> None:
    """Raises ValueError naming the conflicting fields of an `ObjectiveConfig`."""

  # ------------------------------------------------------------------ loss and bound
  def loss(self, cfg, model, params, batch, rng, *, train: bool):
    raise NotImplementedError

  def eval_batch(self, cfg, batch: Dict[str, Any], key) -> Dict[str, Any]:
    """The one-row batch whose eval loss is the bound for draw `key` (default: unchanged)."""
    return batch

  def num_draws(self, requested: int) -> int:
    """How many random draws the K-draw estimate uses (1 for a deterministic bound)."""
    return 1 if self.exact_likelihood else max(1, int(requested))

  def aggregate_draws(self, nll: np.ndarray) -> np.ndarray:
    """Per-sequence K-draw value [N] from per-draw NLLs [K, N] (default: the mean of K draws)."""
    return np.mean(nll, 0)

  estimator: str = ""
  def estimator_k(self, k: int) -> str:
    return f"mean of K={k} draws per sequence"

  # ------------------------------------------------------------------ sampling
  def sampler_fields(self, cfg) -> Dict[str, Any]:
    """Method-specific defaults of its `SamplerConfig` for a run with objective config `cfg`."""
    return {"window": int(getattr(cfg, "desired_set_size", DEFAULT_WINDOW))}

  def generate(self, model, params, prompts, sampler_cfg, rng=None):
    raise NotImplementedError

  def decoding_settings(self, cfg, windows: Optional[Sequence[int]],
                        thresholds: Sequence[Optional[float]]) -> List[Dict[str, Any]]:
    """The (window, threshold) settings a speed/sample sweep measures for this method."""
    if not self.uses_threshold:
      return [{"window": None, "threshold": None}]
    return [{"window": None, "threshold": t} for t in thresholds]

  @property
  def infills_canvas(self) -> bool:
    """Whether `canvas_infill` can fill masks with the text on both sides visible."""
    return self.infill_unsupported is None

  def canvas_infill(self, model, params, canvases, sampler_cfg, rng=None, *, shapes=None):
    """Fills every M of each canvas -> `InfillResult` (see `sampling.infill_result`).

    `shapes` (optional: length, max_targets, max_visible, batch_size) pins the compiled shapes
    to maxima over a data set, so every batch of an evaluation reuses one compilation.
    """
    raise ValueError(f"objective={self.name} cannot infill: {self.infill_unsupported}")

  # ------------------------------------------------------------------ official config.json
  def hf_block_size(self, seq_len: int, loss: Mapping) -> int:
    """`block_size` / `eval_block_size` of the official config."""
    return int(seq_len)

  def hf_noise_config(self, seq_len: int, loss: Mapping) -> Optional[Dict[str, Any]]:
    return None

  def hf_generation_fields(self, seq_len: int, loss: Mapping) -> Dict[str, Any]:
    """Sampler knobs of `generation_config.json` (default: the diffusion samplers' fields)."""
    return {"num_steps": int(seq_len), "sampling_strategy": "predict_and_noise",
            "confidence_threshold": 1e6, "nucleus_p": 1.0,
            "block_size": self.hf_block_size(seq_len, loss)}

  def hf_loss_fields(self, cfg: Mapping, seq_len: int, path_hint: str,
                     warns: List[str]) -> Dict[str, Any]:
    """Our `loss.*` fields read back from an official config.json (appends warnings)."""
    return {}

  def hf_default_keep_clean_bos(self) -> bool:
    return True

  hf_name_pattern: str = ""  # regex naming the method in architectures / model_type / a path

  def export_warnings(self, seq_len: int, loss: Mapping) -> List[str]:
    """Caveats of exporting this run's settings (logged by the exporter)."""
    return []

  def __repr__(self):
    return f"<method {self.name}>"
