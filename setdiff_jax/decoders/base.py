"""What a method's decoder is: the base class every decoder subclasses.

A decoder owns how a trained method turns prompts (or canvases) into text:

  generate        `generate(model, params, prompts, sampler_cfg, rng)` -> its sampler's output
  defaults        `sampler_fields(cfg)` (defaults of its SamplerConfig), `decoding_settings(...)`
                  (what a speed / sample sweep measures), `uses_threshold`, `uses_window`,
                  `continuous_kind` (its `sampling.continuous` loop)
  infilling       `canvas_infill(...)` or `infill_unsupported` (why not)
  RL scoring      `rollout_scoring`: how `rl.scoring` scores a sampled rollout exactly

Keyed by the method's name (`setdiff_jax.objectives`); `setdiff_jax.methods` binds it to the
method's objective and export format.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

DEFAULT_WINDOW = 4  # SetDLM S (and the set sampler's W) when a config does not say


class Decoder:
  """Defaults shared by the decoders; each method's subclass overrides what differs."""

  name: str = ""  # the method's name (its objective's)

  uses_threshold: bool = True  # the confidence threshold tau applies to its sampler
  uses_window: bool = False  # its sampler has the set window W
  uses_block_grid: bool = False  # its blocks can sit on the block grid (align_to_blocks)
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
    return f"<decoder {self.name}>"
