"""SetDLM: sets of tokens in a staggered order, two-stream set-causal mask (SPEC §1.2-§1.5, §4)."""

from __future__ import annotations

import numpy as np

from setdiff_jax.diffusion import losses, orders
from setdiff_jax.objectives.base import Objective, logmeanexp


class SetDLM(Objective):
  name = "setdlm"
  size_field = "desired_set_size"
  adaln = False
  loss_fields = ("desired_set_size", "max_set_size", "eos_last")  # S is also the sampler's W

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
