"""Base configuration; every other config starts from this one and changes a few fields.

Run:  python launch/train.py --config=configs/default.py --workdir=/tmp/setdiff_default
      (a small SetDLM on the embedded Jane Austen corpus; prefer configs/tiny_sw.py for a demo)

Any field can be overridden on the command line, e.g. `--config.loss.desired_set_size=8`.
"""
import ml_collections

from setdiff_jax.data import pipeline, tokenizers


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()

  # ---- what is trained
  c.objective = "setdlm"          # setdlm | ar | mdlm | bd3lm (SPEC §1.4, §1.6)
  c.seed = 0                      # parameter init, data order, per-step rng (fold_in(step))
  c.seq_len = 128                 # L: tokens per training row

  # ---- backbone (SPEC §3); sizes here are small, the lm1b_* configs use 12 x 768
  c.model = ml_collections.ConfigDict()
  c.model.vocab_size = 0          # 0 = take it from the tokenizer; else must equal it
  c.model.hidden_size = 256       # D
  c.model.num_layers = 4
  c.model.num_heads = 4           # head dim = D / heads (even, for rotary)
  c.model.mlp_ratio = 4           # MLP width = mlp_ratio * D
  c.model.cond_dim = 128          # adaLN conditioning width (adaLN models only)
  c.model.adaln = False           # True for the MDLM/BD3LM baselines (constant sigma = 0)
  c.model.dropout = 0.1           # residual-branch dropout
  c.model.dtype = "float32"       # compute dtype: float32 | bfloat16 (params stay fp32)
  c.model.attention = "dense"     # dense | xla | cudnn (see setdiff_jax/attention.py)
  c.model.remat = False           # rematerialise blocks to save activation memory

  # ---- objective details (SPEC §1)
  c.loss = ml_collections.ConfigDict()
  c.loss.keep_clean_bos = True    # position 0 first in order, never masked, excluded from eval NLL
  c.loss.desired_set_size = 4     # SetDLM S (release name smax = 2S)
  c.loss.max_set_size = 0         # SetDLM S_max; 0 = 2S (the released setting)
  c.loss.eos_last = False         # SetDLM: order target EOS after the other targets (training)
  c.loss.block_size = 4           # BD3LM block size S (must divide seq_len)
  c.loss.antithetic = False       # MDLM/BD3LM: antithetic t sampling in training
  c.loss.sampling_eps = 1e-3      # MDLM/BD3LM: t = (1 - eps) u + eps

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
  c.num_eval_steps = 20           # validation batches per eval (-1 = the whole split)
  c.eval_batch_size = 32
  c.log_every_steps = 50
  c.checkpoint_every_steps = 500
  c.keep_checkpoints = 3          # keep the last N
  c.num_eval_samples = 2          # samples decoded and logged at each eval (0 disables)
  c.eval_params = "ema"           # evaluate and sample with the "ema" or the "raw" parameters
  c.init_from = ""                # path of a checkpoint to load parameters from (fine-tuning)

  # ---- device mesh (batch sharded over data x fsdp; see setdiff_jax/sharding.py)
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1                # -1 = all remaining devices
  c.mesh.fsdp = 1
  c.mesh.tensor = 1
  # Logical axis -> mesh axis rules for parameters, e.g. (("embed", "fsdp"), ("mlp", "tensor"));
  # () = setdiff_jax.sharding.DEFAULT_RULES (FSDP over the model dim, TP over heads/MLP/vocab).
  c.sharding_rules = ()
  return c
