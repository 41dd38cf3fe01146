"""AR: next-token prediction with a causal mask, the S = 1 end of Set Diffusion (SPEC §1.6)."""

from __future__ import annotations

from setdiff_jax.diffusion import losses
from setdiff_jax.objectives.base import Objective


class AR(Objective):
  name = "ar"
  adaln = False
  loss_fields = ("ar_first_answer_token",)

  def loss(self, cfg, model, params, batch, rng, *, train):
    return losses.ar_loss(cfg, model, params, batch, rng, train=train)

  exact_likelihood = True
  scores_end_of_text = True
  estimator = "exact next-token NLL"

  def estimator_k(self, k):
    return "exact (K does not apply)"
