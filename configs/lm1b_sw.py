"""SetDLM on LM1B with the reference recipe (SPEC §3.1, §5): the `lm1b-setdlm-smax8` setting.

Prepare LM1B once as TFDS array_record (reading needs no TensorFlow): from the released text
files (the 1.8 GB archive from statmt.org, unpacked), with no TensorFlow,
  python launch/prepare_lm1b.py --text_dir=1-billion-word-language-modeling-benchmark-r13output \
      --data_dir=$TFDS_DIR
or with TFDS's own builder in an environment with TensorFlow (README, "LM1B").
Run (every host of a pod runs the same command):
  python launch/train.py --config=configs/lm1b_sw.py --workdir=$WORKDIR \
      --config.data.tfds_data_dir=$TFDS_DIR [--config.loss.desired_set_size=8]
CPU smoke run of this exact model (no data to prepare; `:cpu` works for every lm1b_* config):
  python launch/train.py --config=configs/lm1b_sw.py:cpu --workdir=runs/lm1b_cpu

12 x 768 DiT (131,912,250 parameters), L=128, bert-base-uncased WordPiece, S=4 (S_max=8),
global batch 512, AdamW 3e-4 with 2500 warm-up steps then constant, EMA 0.9999, bf16 compute,
1M steps; eval (likelihood bound on lm1b test) and checkpoints every 10k steps.
"""

from configs import default
from setdiff_jax.data import tokenizers


VARIANTS = ("", "cpu")


def lm1b_base(objective: str, variant: str = ""):
  """The shared LM1B recipe; the objective-specific configs change a few fields. `variant`
  (`--config=configs/lm1b_*.py:VARIANT`): "" the recipe, "cpu" the same model as a CPU smoke run
  (see `cpu_smoke`)."""
  if variant not in VARIANTS:
    raise ValueError(
      f"config variant {variant!r}: the LM1B configs have {VARIANTS[1:]} "
      f"(e.g. --config=configs/lm1b_sw.py:cpu) or none"
    )
  c = default.get_config()
  c.objective = objective
  c.seq_len = 128
  c.model.hidden_size = 768
  c.model.num_layers = 12
  c.model.num_heads = 12
  c.model.dropout = 0.1
  c.model.dtype = "bfloat16"  # amp_bf16: fp32 params, bf16 matmuls, fp32 LayerNorm/softmax
  c.model.attention = "dense"  # on GPU: "cudnn"; on TPU: "xla"
  c.tokenizer.kind = "wordpiece"
  # bert-base-uncased, shipped with the package (override: --config.tokenizer.vocab_path=...)
  c.tokenizer.vocab_path = tokenizers.packaged_vocab("bert-base-uncased/vocab.txt")
  c.tokenizer.lowercase = True
  c.data.source = "tfds"
  c.data.tfds_name = "lm1b"
  c.data.train_split = "train"
  c.data.eval_split = "test"
  c.data.preprocess = "wrap"  # the reference's lm1b_*_bs128_wrapped data
  c.loss.keep_clean_bos = True
  c.batch_size = 512
  c.eval_batch_size = 16
  c.num_train_steps = 1_000_000
  c.learning_rate = 3e-4
  c.warmup_steps = 2500
  c.lr_schedule = "constant"
  c.weight_decay = 0.0
  c.grad_clip_norm = 1.0
  c.ema_decay = 0.9999
  c.eval_params = "ema"
  c.eval_every_steps = 10_000
  c.num_eval_steps = -1  # the whole test split
  c.checkpoint_every_steps = 10_000
  c.log_every_steps = 100
  c.keep_checkpoints = 3
  return cpu_smoke(c) if variant == "cpu" else c


def cpu_smoke(c):
  """The recipe's model, tokenizer, objective and preprocessing, run briefly on CPU: the
  embedded corpus with its own splits (LM1B's are 'train' / 'test'), batch 8, fp32 compute
  (XLA:CPU has no fast bf16), 10 steps with the warm-up cut to them, one eval of 2 batches and
  a checkpoint at the end, EMA off (10 steps of a 0.9999 EMA would stay at the init)."""
  c.data.source = "embedded"
  c.data.train_split = "train"
  c.data.eval_split = "validation"
  c.model.dtype = "float32"
  c.batch_size = 8
  c.eval_batch_size = 8
  c.num_train_steps = 10
  c.warmup_steps = 10
  c.ema_decay = 0.0
  c.eval_every_steps = 10
  c.num_eval_steps = 2
  c.num_eval_samples = 0
  c.checkpoint_every_steps = 10
  c.log_every_steps = 2
  c.keep_checkpoints = 1
  return c


def get_config(variant: str = ""):
  c = lm1b_base("setdlm", variant)
  c.loss.desired_set_size = 4  # S; released as smax8 (S_max = 2S)
  c.loss.max_set_size = 0  # 0 = 2S
  return c
