"""A run's configuration: the package defaults, up-front validation, and what a config builds.

  config = run_config.default_config()            # configs/default.py starts from this
  run_config.validate_config(config, jax.device_count())
  tokenizer = run_config.build_tokenizer(config, workdir)
  model_cfg, obj_cfg = run_config.model_and_objective(config, tokenizer)

Shared by training and by inference loading (`workdir.py`), so neither imports the other. The
defaults live in the package (not in configs/) so an installed wheel needs no source tree.
"""

from __future__ import annotations

from typing import Optional, Tuple

import jax
import ml_collections

from setdiff_jax import models, objectives, paths, ranges, sharding
from setdiff_jax.models import attention, layer_stack
from setdiff_jax.diffusion import losses
from setdiff_jax.data import pipeline, sources, tokenizers
from setdiff_jax.sampling import policies


def default_config() -> ml_collections.ConfigDict:
  """The base run config; every config in configs/ starts from it (see configs/default.py)."""
  # One field a line with its comment aligned (the table users read): not formatted.
  # fmt: off
  c = ml_collections.ConfigDict()

  # ---- what is trained
  c.objective = objectives.DEFAULT   # setdlm | ar | mdlm | bd3lm (SPEC §1.4, §1.6; objectives/)
  c.seed = 0                      # parameter init, data order, per-step rng (fold_in(step))
  c.seq_len = 128                 # L: tokens per training row

  # ---- backbone (SPEC §3); sizes here are small, the lm1b_* configs use 12 x 768
  c.model = ml_collections.ConfigDict()
  c.model.backbone = "dit"        # dit (setdiff_jax/models/dit.py) | qwen3 (setdiff_jax/models/qwen3.py)
  c.model.vocab_size = 0          # 0 = take it from the tokenizer; else must equal it
  c.model.hidden_size = 256       # D
  c.model.num_layers = 4
  c.model.num_heads = 4           # head dim = D / heads (even, for rotary)
  c.model.mlp_ratio = 4           # MLP width = mlp_ratio * D
  c.model.cond_dim = 128          # adaLN conditioning width (adaLN models only)
  c.model.adaln = False           # True for the MDLM/BD3LM baselines (constant sigma = 0)
  c.model.dropout = 0.1           # residual-branch dropout
  c.model.dtype = "float32"       # compute dtype: float32 | bfloat16 (params stay fp32)
  c.model.attention = "dense"     # dense | xla | cudnn (see setdiff_jax/models/attention.py)
  # What each block keeps for the backward pass: none | full | dots_saveable |
  # dots_with_no_batch_dims_saveable | save_attention_out (setdiff_jax/models/layer_stack.py; an old
  # config's False / True means none / full).
  c.model.remat = "none"
  # nn.scan over the blocks (one compiled layer body: compile time flat in depth); parameters are
  # stacked `blocks/...` [num_layers, ...]; exports keep the per-layer PyTorch names.
  c.model.scan_layers = False
  # Training head + cross-entropy walked in vocabulary chunks of this many columns (never an
  # [N, V] array; faster on CPU); 0 = all columns at once (setdiff_jax/models/fused_head.py).
  c.model.head_vocab_chunk = 1024
  c.model.rope_base = 10000.0     # RoPE theta (DiT: 10000; Qwen3: the checkpoint's rope_theta, 1e6)
  # Qwen3 only (ignored by the DiT); with init_from_hf, 0 = take the checkpoint's value.
  c.model.num_kv_heads = 0        # grouped-query KV heads (0 = num_heads)
  c.model.head_dim = 0            # 0 = hidden_size / num_heads
  c.model.intermediate_size = 0   # SwiGLU width (0 = 3 * hidden_size)
  c.model.rms_norm_eps = 1e-6
  c.model.tie_embeddings = True   # LM head tied to the embedding (Qwen3-0.6B/1.7B)

  # ---- objective details (SPEC §1)
  c.loss = ml_collections.ConfigDict()
  c.loss.keep_clean_bos = True    # position 0 first in order, never masked, excluded from eval NLL
  c.loss.desired_set_size = 4     # SetDLM S (release name smax = 2S)
  c.loss.max_set_size = 0         # SetDLM S_max; 0 = 2S (the released setting)
  c.loss.eos_last = False         # SetDLM: order target EOS after the other targets (training)
  c.loss.block_size = 4           # BD3LM block size S (must divide seq_len)
  c.loss.antithetic = False       # MDLM/BD3LM: antithetic t sampling in training
  c.loss.sampling_eps = 1e-3      # MDLM/BD3LM: t = (1 - eps) u + eps
  # AR with a prompt: also train the first answer token (the reference's input-side weight
  # a_j (1 - c_j) skips it; False reproduces the reference exactly). No effect without a prompt.
  c.loss.ar_first_answer_token = True

  # ---- tokenizer (SPEC §5; fields documented in setdiff_jax/data/tokenizers.py)
  c.tokenizer = tokenizers.default_tokenizer_config()  # kind=trained: BPE trained at first run
  c.tokenizer.vocab_size = 4096

  # ---- data (fields documented in setdiff_jax/data/pipeline.py)
  c.data = pipeline.default_data_config()  # the embedded Jane Austen corpus, wrapped

  # ---- optimisation (SPEC §5: AdamW b=(0.9, 0.999), eps 1e-8, wd 0, clip 1, EMA 0.9999)
  c.batch_size = 32               # global batch (sequences per optimizer step)
  c.grad_accum_steps = 1          # micro-batches per step (batch_size must be divisible)
  c.num_train_steps = 2000
  c.learning_rate = 3e-4
  c.warmup_steps = 100            # linear warm-up from 0
  c.lr_schedule = "constant"      # constant | cosine (after warm-up)
  c.cosine_alpha = 0.0            # cosine: final lr = alpha * peak
  c.weight_decay = 0.0            # decoupled (AdamW)
  c.adam_b1 = 0.9
  c.adam_b2 = 0.999
  c.adam_eps = 1e-8
  c.grad_clip_norm = 1.0          # global-norm clipping; 0 disables
  c.ema_decay = 0.9999            # parameter EMA; 0 disables

  # ---- evaluation, logging, checkpoints
  c.eval_every_steps = 500
  c.num_eval_steps = 20           # validation batches per eval, >= 1 (-1 = the whole split)
  c.eval_batch_size = 32
  c.log_every_steps = 50
  c.checkpoint_every_steps = 500
  c.keep_checkpoints = 3          # keep the last N (>= 1); the newest verified one always stays
  c.num_eval_samples = 2          # samples decoded and logged at each eval (0 disables)
  c.eval_params = "ema"           # evaluate and sample with the "ema" or the "raw" parameters
  # Divergence guard (beside the NaN guard): the run stops with one error line, before that
  # step's checkpoint is saved, when the loss stays above divergence_factor x the median of the
  # last divergence_window step losses (the median taken as >= 1 nat), or above
  # divergence_ceiling, for divergence_patience consecutive steps. divergence_factor=0 and divergence_ceiling=0 turn the guard off.
  c.divergence_factor = 10.0
  c.divergence_ceiling = 0.0      # absolute loss ceiling; 0 = none
  c.divergence_patience = 3
  c.divergence_window = 50
  # A workdir with checkpoints but no config.json is refused (its structure cannot be checked);
  # True accepts this run's config as the reconstruction (it is written as the new config.json).
  c.accept_missing_config = False
  c.init_from = ""                # path of a checkpoint to load parameters from (fine-tuning)
  # Path of a local Hugging Face Qwen3 directory (config.json, *.safetensors, tokenizer.json) to
  # initialise a model.backbone=qwen3 run from; model fields left 0 are read from its config.json
  # and model.num_layers keeps the first layers. Never downloads (SPEC §3.10; pretrained.py).
  c.init_from_hf = ""

  # ---- device mesh (batch sharded over data x fsdp; see setdiff_jax/sharding.py)
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1                # -1 = all remaining devices
  c.mesh.fsdp = 1
  c.mesh.tensor = 1
  # Logical axis -> mesh axis rules for parameters, e.g. (("embed", "fsdp"), ("mlp", "tensor"));
  # () = setdiff_jax.sharding.DEFAULT_RULES (FSDP over the model dim, TP over heads/MLP/vocab).
  c.sharding_rules = ()
  # fmt: on
  return c


# ----------------------------------------------------------------------------- field ranges
# The types and the fields several launchers share live in `setdiff_jax/ranges.py`.
_int, _num = ranges.integer, ranges.number


_BOOL = ranges.Choice((True, False))
_POSITIVE = _num(0, lo_open=True)
_PROBABILITY = _num(0, 1, hi_open=True)

# Every field of `default_config()` with its allowed values, checked once by `validate_config`
# (one error line naming field, value and range). Rules between fields (divisibility, set sizes
# against seq_len, adaLN per method) follow in `validate_config` and each method's
# `validate_run`; free-form fields (paths, names, sharding rules) are listed in `FREE_FIELDS`.
FIELD_RANGES = {
  "objective": ranges.Choice(tuple(objectives.NAMES)),
  "seed": ranges.SHARED["seed"],
  "seq_len": _int(4),
  "model.backbone": ranges.Choice(tuple(models.BACKBONES)),
  "model.vocab_size": _int(0),
  "model.hidden_size": _int(1),
  "model.num_layers": _int(0),  # 0 only with init_from_hf (all of the checkpoint's layers)
  "model.num_heads": _int(1),
  "model.mlp_ratio": _POSITIVE,
  "model.cond_dim": _int(1),
  "model.adaln": _BOOL,
  "model.dropout": _PROBABILITY,
  "model.dtype": ranges.Choice(("float32", "bfloat16", "float16")),
  "model.attention": ranges.Choice(attention.IMPLEMENTATIONS),
  "model.scan_layers": _BOOL,
  "model.head_vocab_chunk": _int(0),
  "model.rope_base": _POSITIVE,
  "model.num_kv_heads": _int(0),
  "model.head_dim": _int(0),
  "model.intermediate_size": _int(0),
  "model.rms_norm_eps": _POSITIVE,
  "model.tie_embeddings": _BOOL,
  "loss.keep_clean_bos": _BOOL,
  "loss.desired_set_size": _int(1),
  "loss.max_set_size": _int(0),
  "loss.eos_last": _BOOL,
  "loss.block_size": _int(1),
  "loss.antithetic": _BOOL,
  "loss.sampling_eps": _num(0, 1, lo_open=True, hi_open=True),
  "loss.ar_first_answer_token": _BOOL,
  "tokenizer.kind": ranges.Choice(tokenizers.KINDS),
  "tokenizer.vocab_size": _int(1),
  "tokenizer.lowercase": ranges.Choice((None, True, False)),
  "tokenizer.control_tokens_in_text": _BOOL,
  "data.read_threads": _int(0),
  "data.prefetch": _int(0),
  "data.task_operands": _int(1),
  "data.task_max_operand": _int(1),
  "data.task_train_examples": _int(1),
  "data.task_eval_examples": _int(1),
  "data.task_seed": _int(0),
  "batch_size": ranges.SHARED["batch_size"],
  "grad_accum_steps": _int(1),
  "num_train_steps": _int(0),  # >= 1 on a new workdir (train_and_evaluate)
  "learning_rate": _POSITIVE,
  "warmup_steps": _int(0),
  "lr_schedule": ranges.Choice(("constant", "cosine")),
  "cosine_alpha": _num(0, 1),
  "weight_decay": _num(0),
  "adam_b1": _PROBABILITY,
  "adam_b2": _PROBABILITY,
  "adam_eps": _POSITIVE,
  "grad_clip_norm": _num(0),
  "ema_decay": _PROBABILITY,
  "eval_every_steps": _int(1),
  "num_eval_steps": _int(1, also=(-1,)),
  "eval_batch_size": _int(1),
  "log_every_steps": _int(1),
  "checkpoint_every_steps": _int(1),
  "keep_checkpoints": _int(1),
  "num_eval_samples": _int(0),
  "eval_params": ranges.Choice(("ema", "raw")),
  "divergence_factor": _num(1, lo_open=True, also=(0,)),
  "divergence_ceiling": _num(0),
  "divergence_patience": _int(1),
  "divergence_window": _int(1),
  "accept_missing_config": _BOOL,
  "mesh.data": _int(1, also=(-1,)),
  "mesh.fsdp": _int(1, also=(-1,)),
  "mesh.tensor": _int(1, also=(-1,)),
}
# The `rl` section of an RL run (launch/rl.py; `setdiff_jax.rl.config` documents each field and
# holds the defaults). Only RL runs have these fields; `check_field_ranges` checks them with the
# others.
RL_FIELD_RANGES = {
  "rl.step_cost": _num(0),
  "rl.group_size": _int(2),
  "rl.prompts_per_step": _int(1),
  "rl.inner_updates": _int(1),
  "rl.clip_eps": _POSITIVE,
  "rl.kl_beta": _num(0),
  "rl.adv_eps": _POSITIVE,
  "rl.score_chunk": _int(0),
  "rl.temperature": ranges.SHARED["temperature"],
  "rl.top_p": ranges.SHARED["top_p"],
  "rl.repetition_penalty": ranges.SHARED["repetition_penalty"],
  "rl.policy": ranges.Choice(tuple(policies.POLICIES)),
  "rl.window": ranges.SHARED["window"].with_also(0),  # 0: the default
  "rl.continuous_slots": _int(0),
  "rl.num_steps": _int(0),
  "rl.max_new_tokens": ranges.SHARED["max_new_tokens"].with_also(0),  # 0: the default
}
# Free-form fields (paths, names, rules), checked where they are used; the choice fields of the
# data config (source, preprocess, ...) are checked by `pipeline.validate_data_config`; the RL
# run's SFT workdir, reward and policy parameter by `setdiff_jax.rl.config.validate`.
FREE_FIELDS = (
  "init_from",
  "init_from_hf",
  "sharding_rules",
  "model.remat",
  "tokenizer.vocab_path",
  "tokenizer.merges_path",
)
RL_FREE_FIELDS = ("rl.init_from", "rl.reward", "rl.policy_arg")


def check_field_ranges(config: ml_collections.ConfigDict):
  """Raises ValueError for the first field of `FIELD_RANGES` outside its allowed values; fields
  a config does not have (an older config.json) are skipped."""
  for name, allowed in {**FIELD_RANGES, **RL_FIELD_RANGES}.items():
    node = config
    for part in name.split("."):
      node = node.get(part, _MISSING) if hasattr(node, "get") else _MISSING
      if node is _MISSING:
        break
    if node is _MISSING:
      continue
    if name.startswith("model.") and node == 0 and config.get("init_from_hf"):
      continue  # 0 = the Hugging Face checkpoint's value (resolved before training)
    if not allowed.ok(node):
      raise ValueError(
        f"invalid config: {name}={node!r} is out of range; allowed: "
        f"{allowed.describe()} (set --config.{name})"
      )


_MISSING = object()


def validate_config(config: ml_collections.ConfigDict, num_devices: Optional[int] = None):
  """Raises ValueError naming the conflicting fields, before anything is built or compiled:
  first every field against `FIELD_RANGES`, then the rules between fields."""

  def check(ok, msg):
    if not ok:
      raise ValueError(f"invalid config: {msg}")

  check_field_ranges(config)
  objectives.get(config.objective).validate(config, check)
  if models.backbone_name(config.model) == "dit":  # the DiT's own shape rules (head split, rotary)
    try:
      models.backbone_config(config.model.to_dict(), vocab_size=1)
    except ValueError as e:
      check(False, f"model.{e}")
  _validate_layers(config, check)
  check(
    config.batch_size % config.grad_accum_steps == 0,
    f"batch_size={config.batch_size} is not divisible by grad_accum_steps={config.grad_accum_steps}",
  )
  if num_devices is not None:
    mesh_sizes = sharding.mesh_shape(config.mesh, num_devices)
    divisor = mesh_sizes[0] * mesh_sizes[1]
    micro = config.batch_size // config.grad_accum_steps
    check(
      micro % divisor == 0,
      f"micro-batch batch_size/grad_accum_steps={micro} must be divisible by the "
      f"data x fsdp mesh size {divisor}",
    )
    check(
      config.eval_batch_size % divisor == 0,
      f"eval_batch_size={config.eval_batch_size} must be divisible by the data x fsdp mesh "
      f"size {divisor}",
    )
  pipeline.validate_data_config(config.data)
  tokenizers.validate_tokenizer_config(config.tokenizer)


def _validate_layers(config, check):
  """model.remat must name a policy; model.scan_layers must be a bool, with >= 1 layer."""
  model_cfg = config.model
  try:
    layer_stack.normalize_remat(model_cfg.get("remat", "none"))
  except ValueError as e:
    check(False, str(e))
  scan = model_cfg.get("scan_layers", False)
  check(isinstance(scan, bool), f"model.scan_layers={scan!r} must be True or False")
  layers = int(model_cfg.get("num_layers", 1))
  # With init_from_hf, num_layers 0 means all of the checkpoint's (resolved before training).
  check(
    not scan or layers >= 1 or (layers == 0 and config.get("init_from_hf")),
    f"model.scan_layers=True needs model.num_layers >= 1 (got {layers})",
  )


def build_tokenizer(
  config, workdir: Optional[str], *, allow_training: bool = True, save: bool = True
):
  """The run's tokenizer (loaded from WORKDIR/tokenizer/; else built, and saved there if
  `save`: the trainer saves it only after its data is validated)."""
  train_texts = None
  if allow_training:
    train_texts = lambda: sources.tokenizer_training_texts(config.data, max_docs=200_000)
  if workdir is None or jax.process_count() == 1:
    return tokenizers.get_tokenizer(config.tokenizer, workdir, train_texts=train_texts, save=save)
  # Several processes share the workdir: process 0 trains (or loads) and saves it at once (the
  # others read it from there; `save` cannot defer it), the others wait for it (bounded:
  # `sharding.agree`), check that they see the very files process 0 has (a workdir that is not
  # shared by every host, or a stale copy, would give another vocabulary) and read it; never
  # trained twice. Every process ends with the same error when one of them does not.
  me = jax.process_index()
  tok, failed = None, None
  if me == 0:
    try:
      tok = tokenizers.get_tokenizer(config.tokenizer, workdir, train_texts=train_texts)
    except Exception as e:  # noqa: BLE001 - the others must not wait for a tokenizer in vain
      failed = e
  saved = sharding.agree(
    "tokenizer saved",
    "!" + str(failed) if failed else tokenizers.fingerprint(workdir) if me == 0 else "",
  )[0]
  if failed is not None:
    raise failed
  if saved.startswith("!"):
    raise ValueError(f"process 0 could not build the tokenizer: {saved[1:]}")
  problem = ""
  if me != 0:
    seen = tokenizers.fingerprint(workdir)
    if seen != saved:
      where = paths.join(workdir, tokenizers.TOKENIZER_SUBDIR)
      problem = (
        f"process {me} of {jax.process_count()} does not see the tokenizer process 0 "
        f"saved in {where} ({'nothing there' if not seen else 'other files there'}): "
        "every process of a run needs the same --workdir on storage they all share "
        "(e.g. gs://bucket/run or a shared file system)"
      )
  problems = [p for p in sharding.agree("tokenizer read", problem) if p]
  if problems:
    raise ValueError(problems[0])
  if tok is None:
    tok = tokenizers.get_tokenizer(config.tokenizer, workdir, train_texts=None)
  return tok


def model_and_objective(config, tokenizer) -> Tuple[models.BackboneConfig, losses.ObjectiveConfig]:
  """Backbone and objective configs; the vocabulary and special ids come from the tokenizer."""
  vocab = int(config.model.vocab_size) or tokenizer.vocab_size
  if vocab < tokenizer.vocab_size:
    raise ValueError(
      f"model.vocab_size={vocab} is smaller than the tokenizer's "
      f"{tokenizer.vocab_size}; set model.vocab_size=0 to take it from the tokenizer"
    )
  model_cfg = models.backbone_config(config.model.to_dict(), vocab)
  loss = config.loss.to_dict()
  loss["max_set_size"] = loss.get("max_set_size") or None
  obj = losses.ObjectiveConfig.from_config(
    {
      **loss,
      "name": config.objective,
      "mask_token_id": tokenizer.mask_id,
      "pad_token_id": tokenizer.pad_id,
      "eos_token_id": tokenizer.eos_id,
    }
  )
  return model_cfg, obj
