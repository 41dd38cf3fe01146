"""AR: next-token prediction with a causal mask, the S = 1 end of Set Diffusion (SPEC §1.6)."""
from __future__ import annotations

from setdiff_jax.diffusion import losses
from setdiff_jax.methods.base import Method
from setdiff_jax.sampling import baselines


class AR(Method):
  name = "ar"
  description = "autoregressive: one token per step, left to right, causal attention"
  adaln = False
  order_kind = "left_to_right"
  uses_threshold = False
  exact_likelihood = True
  infill_unsupported = ("it decodes left to right and cannot condition on the text after a gap "
                        "(the infill evaluation scores it on the prefix only)")
  hf_model_type, hf_architecture = "ar", "AR"
  hf_causal_attention = True
  scores_end_of_text = True
  hf_name_pattern = r"(^|[^a-z])ar([^a-z]|$)"
  estimator = "exact next-token NLL"

  def estimator_k(self, k):
    return "exact (K does not apply)"

  def loss(self, cfg, model, params, batch, rng, *, train):
    return losses.ar_loss(cfg, model, params, batch, rng, train=train)

  def generate(self, model, params, prompts, sampler_cfg, rng=None):
    return baselines.ar_generate(model, params, prompts, sampler_cfg, rng)

  def hf_generation_fields(self, seq_len, loss):
    return {}

  def hf_loss_fields(self, cfg, seq_len, path_hint, warns):
    if not bool((cfg.get("backbone_config") or {}).get("causal_attention", False)):
      warns.append("AR model with causal_attention=false in backbone_config")
    return {}

  def hf_default_keep_clean_bos(self):
    return False
