"""BD3LM: block diffusion, blocks of S left to right, masked diffusion inside (SPEC §1.6, §4.7)."""
from __future__ import annotations

from setdiff_jax.diffusion import losses
from setdiff_jax.methods.base import Method, uses_dit
from setdiff_jax.methods.mdlm import MDLM
from setdiff_jax.sampling import baselines


class BD3LM(MDLM):
  name = "bd3lm"
  description = "block diffusion: blocks of S left to right, a block-causal two-stream mask"
  order_kind = "blocks"
  hf_model_type, hf_architecture = "bd3lm", "BD3LM"
  hf_name_pattern = "bd3lm"
  infill_unsupported = ("its blocks are decoded left to right and cannot see the text after a gap "
                        "(the infill evaluation scores it on the prefix only)")

  def validate_run(self, config, check):
    check(config.seq_len % config.loss.block_size == 0,
          f"objective=bd3lm needs loss.block_size={config.loss.block_size} to divide "
          f"seq_len={config.seq_len}")
    if not uses_dit(config):
      return Method.validate_run(self, config, check)
    check(config.model.adaln, "objective=bd3lm uses the adaLN DiT (set model.adaln=True), as the "
          "reference's LM1B baseline")

  def validate_objective(self, cfg, seq_len):
    if seq_len % cfg.block_size:
      raise ValueError(f"objective=bd3lm needs block_size={cfg.block_size} to divide "
                       f"seq_len={seq_len}")

  def loss(self, cfg, model, params, batch, rng, *, train):
    return losses.bd3lm_loss(cfg, model, params, batch, rng, train=train)

  def sampler_fields(self, cfg):
    return dict(super().sampler_fields(cfg), block_size=int(cfg.block_size))

  def generate(self, model, params, prompts, sampler_cfg, rng=None):
    return baselines.bd3lm_generate(model, params, prompts, sampler_cfg, rng)

  canvas_infill = Method.canvas_infill  # blocks see no suffix: see infill_unsupported

  def hf_block_size(self, seq_len, loss):
    return int(loss.get("block_size", 4))

  def hf_loss_fields(self, cfg, seq_len, path_hint, warns):
    return {"block_size": int(cfg.get("block_size")
                              or (cfg.get("backbone_config") or {}).get("block_size"))}
