"""What a training method is: the base class every registry entry subclasses.

A method (SetDLM, AR, MDLM, BD3LM) owns everything that differs between methods; train, sampling
dispatch, evaluation and interop ask it instead of comparing names. Its members, by group:

  identity        `name`; `adaln`: which DiT variant it trains (SPEC §3.4)
  loss            `validate(config, check)`: its run-config rules, called once by
                  `workdir.config.validate_config`; `loss(cfg, model, params, batch, rng, train=)`
                  -> (loss, metrics), which draws the method's order / noise through `orders.py`
  likelihood      `exact_likelihood`, `scores_end_of_text`, `eval_batch` (per-row draw for the
                  bound), `num_draws`, `aggregate_draws`, `estimator` / `estimator_k`
  decoding        `generate(model, params, prompts, sampler_cfg, rng)`, `sampler_fields(cfg)`
                  (defaults of its SamplerConfig), `decoding_settings(...)`, `uses_threshold`,
                  `uses_window`; infilling: `canvas_infill(...)` or `infill_unsupported` (why not)
  export          `export`: an `ExportFormat`, its fields of the official config.json (SPEC §9.2)

Adding a method: subclass `Method` (and `ExportFormat`) in a module of this package, give it its
loss (in `diffusion/losses.py`) and sampler (in `sampling/`), and register it in
`methods/__init__.py`.
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


class ExportFormat:
  """How a method reads and writes the official `config.json` / `generation_config.json` (SPEC §9.2).

  Defaults are the diffusion baselines'; each method's subclass overrides what differs.
  """

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


class Method:
  """Defaults shared by the methods; each registry entry overrides what differs."""

  # ------------------------------------------------------------------ identity
  name: str = ""
  adaln: bool = False  # the adaLN DiT (constant sigma = 0)
  export: ExportFormat = ExportFormat()

  # ------------------------------------------------------------------ validation and loss
  def validate(self, config, check: Callable[[bool, str], None]) -> None:
    """Run-config rules of this method (`check(ok, message)` raises on a violation)."""
    if not uses_dit(config):  # Qwen3 has no time conditioning, whatever the method (SPEC §3.10)
      check(
        not config.model.adaln,
        f"model.backbone={config.model.backbone} has no adaLN (set model.adaln=False)",
      )
      return
    want = self.adaln
    check(
      bool(config.model.adaln) == want,
      f"objective={self.name} uses the DiT {'with' if want else 'without'} adaLN "
      f"(set model.adaln={want})",
    )

  def loss(self, cfg, model, params, batch, rng, *, train: bool):
    raise NotImplementedError

  # ------------------------------------------------------------------ likelihood bound
  exact_likelihood: bool = False  # the bound is the exact NLL (a generative-perplexity judge)
  # Its loss also scores the label just after a row's text (AR: the first pad, so that it learns
  # to stop). Only a causal method may set it: to score a continuation alone, the lm_eval adapter
  # then marks the row's tail as real context, which no earlier position can see.
  scores_end_of_text: bool = False
  estimator: str = ""

  def eval_batch(self, cfg, batch: Dict[str, Any], key) -> Dict[str, Any]:
    """The one-row batch whose eval loss is the bound for draw `key` (default: unchanged)."""
    return batch

  def num_draws(self, requested: int) -> int:
    """How many random draws the K-draw estimate uses (1 for a deterministic bound)."""
    return 1 if self.exact_likelihood else max(1, int(requested))

  def aggregate_draws(self, nll: np.ndarray) -> np.ndarray:
    """Per-sequence K-draw value [N] from per-draw NLLs [K, N] (default: the mean of K draws)."""
    return np.mean(nll, 0)

  def estimator_k(self, k: int) -> str:
    return f"mean of K={k} draws per sequence"

  # ------------------------------------------------------------------ decoding
  uses_threshold: bool = True  # the confidence threshold tau applies to its sampler
  uses_window: bool = False  # its sampler has the set window W
  infill_unsupported: Optional[str] = None  # why `canvas_infill` is unavailable (None: available)

  def sampler_fields(self, cfg) -> Dict[str, Any]:
    """Method-specific defaults of its `SamplerConfig` for a run with objective config `cfg`."""
    return {"window": int(getattr(cfg, "desired_set_size", DEFAULT_WINDOW))}

  def generate(self, model, params, prompts, sampler_cfg, rng=None):
    raise NotImplementedError

  # The `sampling.continuous` loop of its sampler ('set', 'ar'); None: static batches only.
  continuous_kind: Optional[str] = None

  def decoding_settings(
    self, cfg, windows: Optional[Sequence[int]], thresholds: Sequence[Optional[float]]
  ) -> List[Dict[str, Any]]:
    """The (window, threshold) settings a speed/sample sweep measures for this method."""
    if not self.uses_threshold:
      return [{"window": None, "threshold": None}]
    return [{"window": None, "threshold": t} for t in thresholds]

  # How `rl.scoring` scores a sampled rollout exactly (issue 28): 'two_stream' (one pass with the
  # cached set sampler's mask), 'causal' (one causal pass), 'block_replay' (one forward per
  # decoding step); None: no exact scoring.
  rollout_scoring: Optional[str] = None

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

  def __repr__(self):
    return f"<method {self.name}>"
