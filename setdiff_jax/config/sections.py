"""The sections of a run config, one frozen dataclass per concern, each field with its default,
its range and a comment: the table users read (`configs/default.py` starts from these defaults).

A section checks its own fields when it is built (one error line naming `--config.<field>` and
the allowed values); the rules between sections live in `config/run.py`, the rules of a method in
its registry entry (`config/edge.py` asks it). Field names in the ConfigDict are the section's
prefix and the field name (`model.hidden_size`) unless a field says otherwise (`learning_rate`
is top-level: the optimizer's fields were top-level before the config was typed).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from setdiff_jax import models
from setdiff_jax.config import fields
from setdiff_jax.config.fields import BOOL, Choice, Section, integer, number, setting
from setdiff_jax.data import tokenizers
from setdiff_jax.diffusion import losses
from setdiff_jax.models import attention, layer_stack

_POSITIVE = number(0, lo_open=True)
_PROBABILITY = number(0, 1, hi_open=True)


# fmt: off
@dataclasses.dataclass(frozen=True)
class Model(Section):
  """The backbone (SPEC §3); sizes are small here, the lm1b_* configs use 12 x 768. With
  init_from_hf, a field left 0 is the Hugging Face checkpoint's (`run.py` checks the others)."""

  PREFIX = "model"
  # dit (setdiff_jax/models/dit.py) | qwen3 (setdiff_jax/models/qwen3.py)
  backbone: str = setting("dit", Choice(tuple(models.BACKBONES)))
  vocab_size: int = setting(0, integer(0))        # 0 = the tokenizer's; else >= it (padding)
  hidden_size: int = setting(256, integer(1))     # D
  num_layers: int = setting(4, integer(0))        # 0 only with init_from_hf (all of its layers)
  num_heads: int = setting(4, integer(1))         # head dim = D / heads (even, for rotary)
  mlp_ratio: int = setting(4, _POSITIVE)          # MLP width = mlp_ratio * D
  cond_dim: int = setting(128, integer(1))        # adaLN conditioning width (adaLN models only)
  adaln: bool = setting(False, BOOL)              # True for the MDLM/BD3LM baselines (sigma = 0)
  dropout: float = setting(0.1, _PROBABILITY)     # residual-branch dropout
  # compute dtype (params stay fp32)
  dtype: str = setting("float32", Choice(("float32", "bfloat16", "float16")))
  # dense | xla | cudnn | ... (setdiff_jax/models/attention.py)
  attention: str = setting("dense", Choice(attention.IMPLEMENTATIONS))
  # What each block keeps for the backward pass: none | full | dots_saveable |
  # dots_with_no_batch_dims_saveable | save_attention_out (setdiff_jax/models/layer_stack.py; an old
  # config's False / True means none / full).
  remat: str = setting("none")
  # nn.scan over the blocks (one compiled layer body: compile time flat in depth); parameters are
  # stacked `blocks/...` [num_layers, ...]; exports keep the per-layer PyTorch names.
  scan_layers: bool = setting(False, BOOL)
  # Training head + cross-entropy walked in vocabulary chunks of this many columns (never an
  # [N, V] array; faster on CPU); 0 = all columns at once (setdiff_jax/models/fused_head.py).
  head_vocab_chunk: int = setting(1024, integer(0))
  # RoPE theta (DiT: 10000; Qwen3: the checkpoint's rope_theta, 1e6)
  rope_base: float = setting(10000.0, _POSITIVE)
  # Qwen3 only (ignored by the DiT); with init_from_hf, 0 = take the checkpoint's value.
  num_kv_heads: int = setting(0, integer(0))      # grouped-query KV heads (0 = num_heads)
  head_dim: int = setting(0, integer(0))          # 0 = hidden_size / num_heads
  intermediate_size: int = setting(0, integer(0)) # SwiGLU width (0 = 3 * hidden_size)
  rms_norm_eps: float = setting(1e-6, _POSITIVE)
  tie_embeddings: bool = setting(True, BOOL)      # LM head tied to the embedding (Qwen3-0.6B/1.7B)

  def skip_range_check(self, name, value):
    return value == 0  # init_from_hf's "the checkpoint's value"; `run.py` refuses it otherwise

  def __post_init__(self):
    super().__post_init__()
    try:
      object.__setattr__(self, "remat", layer_stack.normalize_remat(self.remat))
    except ValueError as e:
      raise ValueError(f"invalid config: {e}") from None


@dataclasses.dataclass(frozen=True)
class Loss(Section):
  """The objective and its details (SPEC §1)."""

  PREFIX = "loss"
  # setdlm | ar | mdlm | bd3lm (SPEC §1.4, §1.6): a name of the methods registry (`edge.py`)
  objective: str = setting(losses.ObjectiveConfig.name, key="objective")
  keep_clean_bos: bool = setting(True, BOOL)      # position 0 first, never masked, not in eval NLL
  desired_set_size: int = setting(4, integer(1))  # SetDLM S (release name smax = 2S)
  max_set_size: int = setting(0, integer(0))      # SetDLM S_max; 0 = 2S (the released setting)
  eos_last: bool = setting(False, BOOL)           # SetDLM: order target EOS after the others
  block_size: int = setting(4, integer(1))        # BD3LM block size S (must divide seq_len)
  antithetic: bool = setting(False, BOOL)         # MDLM/BD3LM: antithetic t sampling in training
  # MDLM/BD3LM: t = (1 - eps) u + eps
  sampling_eps: float = setting(1e-3, number(0, 1, lo_open=True, hi_open=True))
  # AR with a prompt: also train the first answer token (the reference's input-side weight
  # a_j (1 - c_j) skips it; False reproduces the reference exactly). No effect without a prompt.
  ar_first_answer_token: bool = setting(True, BOOL)


@dataclasses.dataclass(frozen=True)
class Optimization(Section):
  """Batches, steps, the optax chain and its schedule (SPEC §5: AdamW b=(0.9, 0.999), eps 1e-8,
  wd 0, clip 1, EMA 0.9999). Top-level fields of the ConfigDict."""

  batch_size: int = setting(32, fields.SHARED["batch_size"])  # global batch (rows per step)
  grad_accum_steps: int = setting(1, integer(1))  # micro-batches per step (must divide batch_size)
  num_train_steps: int = setting(2000, integer(0))  # >= 1 on a new workdir (workdir/lock.py)
  learning_rate: float = setting(3e-4, _POSITIVE)
  warmup_steps: int = setting(100, integer(0))    # linear warm-up from 0
  # constant | cosine (after warm-up)
  lr_schedule: str = setting("constant", Choice(("constant", "cosine")))
  cosine_alpha: float = setting(0.0, number(0, 1))  # cosine: final lr = alpha * peak
  weight_decay: float = setting(0.0, number(0))   # decoupled (AdamW)
  adam_b1: float = setting(0.9, _PROBABILITY)
  adam_b2: float = setting(0.999, _PROBABILITY)
  adam_eps: float = setting(1e-8, _POSITIVE)
  grad_clip_norm: float = setting(1.0, number(0))  # global-norm clipping; 0 disables
  ema_decay: float = setting(0.9999, _PROBABILITY)  # parameter EMA; 0 disables

  @property
  def micro_batch_size(self) -> int:
    return self.batch_size // self.grad_accum_steps


@dataclasses.dataclass(frozen=True)
class Evaluation(Section):
  """What training evaluates, samples and logs, and how often."""

  eval_every_steps: int = setting(500, integer(1))
  # validation batches per eval, >= 1 (-1 = the whole split)
  num_eval_steps: int = setting(20, integer(1, also=(-1,)))
  eval_batch_size: int = setting(32, integer(1))
  log_every_steps: int = setting(50, integer(1))
  num_eval_samples: int = setting(2, integer(0))  # samples decoded and logged per eval (0: none)
  # evaluate and sample with the "ema" or the "raw" parameters
  eval_params: str = setting("ema", Choice(("ema", "raw")))

  @property
  def max_rows(self) -> Optional[int]:
    """Eval rows of one evaluation (None: the whole split)."""
    return None if self.num_eval_steps < 0 else self.num_eval_steps * self.eval_batch_size


@dataclasses.dataclass(frozen=True)
class Checkpoints(Section):
  """Saves, and where the parameters of a new run come from."""

  checkpoint_every_steps: int = setting(500, integer(1))
  keep_checkpoints: int = setting(3, integer(1))  # keep the last N; the newest verified one stays
  # A workdir with checkpoints but no config.json is refused (its structure cannot be checked);
  # True accepts this run's config as the reconstruction (it is written as the new config.json).
  accept_missing_config: bool = setting(False, BOOL)
  init_from: str = setting("")                    # a checkpoint to load parameters from (fine-tune)
  # Path of a local Hugging Face Qwen3 directory (config.json, *.safetensors, tokenizer.json) to
  # initialise a model.backbone=qwen3 run from; model fields left 0 are read from its config.json
  # and model.num_layers keeps the first layers. Never downloads (SPEC §3.10; pretrained.py).
  init_from_hf: str = setting("")


@dataclasses.dataclass(frozen=True)
class Divergence(Section):
  """The divergence guard (beside the NaN guard): the run stops with one error line, before that
  step's checkpoint is saved, when the loss stays above factor x the median of the last `window`
  step losses (the median taken as >= 1 nat), or above `ceiling`, for `patience` consecutive steps.
  divergence_factor=0 and divergence_ceiling=0 turn the guard off."""

  factor: float = setting(10.0, number(1, lo_open=True, also=(0,)), key="divergence_factor")
  ceiling: float = setting(0.0, number(0), key="divergence_ceiling")  # absolute; 0 = none
  patience: int = setting(3, integer(1), key="divergence_patience")
  window: int = setting(50, integer(1), key="divergence_window")


@dataclasses.dataclass(frozen=True)
class Mesh(Section):
  """The device mesh (batch sharded over data x fsdp; see setdiff_jax/sharding.py)."""

  PREFIX = "mesh"
  data: int = setting(-1, integer(1, also=(-1,)))  # -1 = all remaining devices
  fsdp: int = setting(1, integer(1, also=(-1,)))
  tensor: int = setting(1, integer(1, also=(-1,)))
  # Logical axis -> mesh axis rules for parameters, e.g. (("embed", "fsdp"), ("mlp", "tensor"));
  # () = setdiff_jax.sharding.DEFAULT_RULES (FSDP over the model dim, TP over heads/MLP/vocab).
  rules: Tuple = setting((), key="sharding_rules")

  def __post_init__(self):
    super().__post_init__()
    axes = ("data", "fsdp", "tensor")  # this section's axes (sharding.MESH_AXES)
    example = "e.g. --config.sharding_rules=\"(('embed', 'fsdp'), ('mlp', 'tensor'))\""
    rules = []
    for rule in self.rules:
      if isinstance(rule, str) or not hasattr(rule, "__len__") or len(rule) != 2:
        raise ValueError(
          f"invalid config: sharding_rules entry {rule!r} is not a pair (logical axis, mesh "
          f"axis or None): {example}"
        )
      name, axis = rule
      if not isinstance(name, str) or (axis is not None and axis not in axes):
        raise ValueError(
          f"invalid config: sharding_rules entry {tuple(rule)!r}: give a logical axis name and "
          f"one of {axes} or None: {example}"
        )
      rules.append((name, axis))
    object.__setattr__(self, "rules", tuple(rules))

  def sizes(self) -> dict:
    """{axis: size} as `sharding.make_mesh` / `mesh_shape` take it (-1 = the rest)."""
    return {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}

  def with_rules(self) -> dict:
    """The form `sharding.rules_from_config` reads."""
    return {"sharding_rules": self.rules}


@dataclasses.dataclass(frozen=True)
class RL(Section):
  """The `rl` section of an RL run (launch/rl.py; the launcher's other fields and defaults are in
  `setdiff_jax/rl/config.py`). The reward, the policy and its argument are checked against their
  registries by `rl/config.validate` and `config/edge.py`."""

  PREFIX = "rl"
  init_from: str = setting("")                    # the SFT workdir (launch/train.py, prompt/answer)
  # The SFT step the run starts from and keeps as its KL reference (0 = the newest intact one at
  # the run's first start, then written into config.json, so a resume reloads that same step).
  init_step: int = setting(0, integer(0))
  # Reward by name (setdiff_jax/rl/rewards.py): exact_match | format | a sum 'exact_match+format'.
  reward: str = setting("exact_match")
  step_cost: float = setting(0.0, number(0))      # lambda: reward -= lambda * decoding steps
  group_size: int = setting(8, integer(2))        # G completions per prompt (>= 2: per-group adv.)
  prompts_per_step: int = setting(4, integer(1))  # P prompts per step (rows = P * G)
  inner_updates: int = setting(1, integer(1))     # mu: optimiser updates per batch of rollouts
  clip_eps: float = setting(0.2, _POSITIVE)       # PPO clip range of the ratio pi / pi_old
  kl_beta: float = setting(0.0, number(0))        # beta: exact KL to the frozen SFT params (0: off)
  adv_eps: float = setting(1e-6, _POSITIVE)      # advantages (r - mean) / (std + adv_eps) per group
  # Positions per chunk of the scorer's output head (rl/scoring.head_scores): log-probs and KL
  # are computed from the hidden states chunk by chunk, so memory holds [B, score_chunk, V]
  # logits, never [B, L, V] (~10 GB fp32 per copy at Qwen3's V = 151,936); 0 = all at once.
  score_chunk: int = setting(32, integer(0))
  # ---- the sampler in RL mode: temperature only, a commit policy whose decision reads the
  # step's distributions, never the sampled tokens (policies.POLICIES[...].token_dependent False),
  # so that the scorer's trajectory likelihood is exact.
  temperature: float = setting(1.0, fields.SHARED["temperature"])
  top_p: float = setting(1.0, fields.SHARED["top_p"])  # must stay 1 (nucleus filtering is refused)
  repetition_penalty: float = setting(1.0, fields.SHARED["repetition_penalty"])  # must stay 1
  # pmax (the n_i highest max-probabilities, + pmax >= tau with policy_arg: threshold's
  # distribution-only counterpart) | margin | entropy_bound | factor | topk | dilated | stable
  policy: str = setting("pmax")
  policy_arg: Optional[float] = setting(None, none_type=float)  # None = the policy's default
  window: int = setting(0, fields.SHARED["window"].with_also(0))  # W of the set sampler (0 = S)
  num_steps: int = setting(0, integer(0))         # T, the step budget (0 = N: 1/step floor)
  # N (0 = seq_len - the longest prompt of the train split)
  max_new_tokens: int = setting(0, fields.SHARED["max_new_tokens"].with_also(0))
  # Rollouts with continuous batching (sampling/continuous.py) over this many slots, refilled as
  # rows end (set sampler, AR; every group still comes back complete); 0 = one static batch.
  continuous_slots: int = setting(0, integer(0))
# fmt: on


# The range-checked fields of the data and tokenizer sections, which stay the data layer's own
# ConfigDicts (`pipeline.default_data_config`, `tokenizers.default_tokenizer_config`; their choice
# fields are checked by `pipeline.validate_data_config` / `tokenizers.validate_tokenizer_config`).
DATA_RANGES = {
  "tokenizer.kind": Choice(tokenizers.KINDS),
  "tokenizer.vocab_size": integer(1),
  "tokenizer.lowercase": Choice((None, True, False)),
  "tokenizer.control_tokens_in_text": BOOL,
  "data.read_threads": integer(0),
  "data.prefetch": integer(0),
  "data.task_operands": integer(1),
  "data.task_max_operand": integer(1),
  "data.task_train_examples": integer(1),
  "data.task_eval_examples": integer(1),
  "data.task_seed": integer(0),
}
# Free-form fields of the tokenizer section (paths).
DATA_FREE_FIELDS = ("tokenizer.vocab_path", "tokenizer.merges_path")

SECTIONS = (Model, Loss, Optimization, Evaluation, Checkpoints, Divergence, Mesh)

__all__ = [
  "Model",
  "Loss",
  "Optimization",
  "Evaluation",
  "Checkpoints",
  "Divergence",
  "Mesh",
  "RL",
  "SECTIONS",
  "DATA_RANGES",
  "DATA_FREE_FIELDS",
]
