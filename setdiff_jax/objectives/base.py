"""What a method's training objective is: the base class every objective subclasses.

An objective owns what differs between methods in training and in the likelihood bound:

  identity        `name` (the method's one spelling: a config's `objective`); `adaln`: which DiT
                  variant it trains (SPEC §3.4); `size_field`: the loss field a sized name sets
  loss            `validate(config, check)`: its run-config rules, called once by
                  `config.edge.from_config_dict`; `loss(cfg, model, params, batch, rng, train=)`
                  -> (loss, metrics), which draws the method's order / noise through `orders.py`
  likelihood      `exact_likelihood`, `scores_end_of_text`, `eval_batch` (per-row draw for the
                  bound), `num_draws`, `aggregate_draws`, `estimator` / `estimator_k`

Its decoding is its decoder's (`setdiff_jax.decoders`), its checkpoint files its export format's
(`setdiff_jax.interop.formats`); `setdiff_jax.methods` binds the three under the name.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np


def logmeanexp(x: np.ndarray, axis: int = 0) -> np.ndarray:
  """log(mean(exp(x))) along `axis`, stable (float64)."""
  x = np.asarray(x, np.float64)
  m = np.max(x, axis=axis, keepdims=True)
  return np.squeeze(m + np.log(np.mean(np.exp(x - m), axis=axis, keepdims=True)), axis=axis)


def row_length(batch, method: str) -> int:
  """L of `batch["tokens"]` [B, L]: static (a shape), so a loss checks it before tracing, at no
  cost under jit. ValueError naming `method` unless the tokens are a 2-D batch of rows."""
  shape = tuple(getattr(batch.get("tokens"), "shape", ()))
  if len(shape) != 2:
    raise ValueError(
      f"objective={method}: batch['tokens'] must be [batch, length] token ids, got shape "
      f"{shape}; pass rows of equal length (e.g. tokens[None] for one row)"
    )
  return shape[1]


def uses_dit(config) -> bool:
  """Whether the run trains the DiT (`model.backbone`, setdiff_jax/models/), whose adaLN variant
  the MDLM / BD3LM baselines use."""
  return str(config.model.get("backbone", "dit") or "dit") == "dit"


class Objective:
  """Defaults shared by the objectives; each method's subclass overrides what differs."""

  # ------------------------------------------------------------------ identity
  name: str = ""
  adaln: bool = False  # the adaLN DiT (constant sigma = 0)
  # The loss field the size of a sized name sets ('setdlm4': S, 'bd3lm4': the block size, as in
  # configs/compare.py); None: the method takes no size.
  size_field: Optional[str] = None
  # The method-specific `loss.*` fields it reads (training or decoding); `keep_clean_bos` is read
  # by every method. A field no method of the run reads is refused at training (set, it would be
  # ignored) and is no part of a resume's structure (`objectives.unread_loss_fields`).
  loss_fields: Tuple[str, ...] = ()

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

  def __repr__(self):
    return f"<objective {self.name}>"
