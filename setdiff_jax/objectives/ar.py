"""AR: next-token prediction with a causal mask, the S = 1 end of Set Diffusion (SPEC §1.6)."""

from __future__ import annotations

from setdiff_jax.diffusion import losses
from setdiff_jax.objectives.base import Objective, row_length


class AR(Objective):
  name = "ar"
  adaln = False
  loss_fields = ("ar_first_answer_token",)

  def loss(self, cfg, model, params, batch, rng, *, train):
    length = row_length(batch, self.name)
    if length < 2:  # x[:, :-1] predicts x[:, 1:]: a row of one token has no next token
      raise ValueError(
        f"objective=ar needs rows of at least 2 tokens (BOS and one more), got length "
        f"{length}; pass longer rows (a run config's seq_len is >= 4)"
      )
    return losses.ar_loss(cfg, model, params, batch, rng, train=train)

  exact_likelihood = True
  scores_end_of_text = True
  estimator = "exact next-token NLL"

  def estimator_k(self, k):
    return "exact (K does not apply)"
