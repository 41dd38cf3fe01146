"""AR: next-token prediction with a causal mask, the S = 1 end of Set Diffusion (SPEC §1.6)."""

from __future__ import annotations

from setdiff_jax.diffusion import losses
from setdiff_jax.methods.base import ExportFormat, Method
from setdiff_jax.sampling import ar_sampler


class ARExport(ExportFormat):
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


class AR(Method):
  name = "ar"
  adaln = False
  export = ARExport()

  def loss(self, cfg, model, params, batch, rng, *, train):
    return losses.ar_loss(cfg, model, params, batch, rng, train=train)

  exact_likelihood = True
  scores_end_of_text = True
  estimator = "exact next-token NLL"

  def estimator_k(self, k):
    return "exact (K does not apply)"

  uses_threshold = False
  rollout_scoring = "causal"
  infill_unsupported = (
    "it decodes left to right and cannot condition on the text after a gap "
    "(the infill evaluation scores it on the prefix only)"
  )

  continuous_kind = "causal"

  def generate(self, model, params, prompts, sampler_cfg, rng=None):
    return ar_sampler.ar_generate(model, params, prompts, sampler_cfg, rng)
