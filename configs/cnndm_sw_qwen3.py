"""SetDLM on CNN/DailyMail with a randomly initialised Qwen3 (SPEC §3.10, §5: `cnndm-setdlm`).

  python launch/train.py --config=configs/cnndm_sw_qwen3.py --workdir=$WORKDIR \
      --config.tokenizer.vocab_path=/data/Qwen3-0.6B-Base/tokenizer.json \
      --config.data.paths=/data/cnndm_train.jsonl --config.data.eval_paths=/data/cnndm_val.jsonl

The Qwen3-0.6B-Base architecture with hidden 256, MLP 768 and 28 layers, randomly initialised
(16 query / 8 KV heads, head_dim 128, theta 1e6, tied head, V=151936), the Qwen3-0.6B-Base
tokenizer; L=768, S=4 (S_max=8), global batch 128, lr 3e-4 with 1000 warm-up steps then constant,
AdamW b2=0.98, wd 1e-5, EMA 0.9999, bf16, 500k steps max. Each jsonl `text` is
BOS + article + EOS + "Summary: " + highlights (one example per row, right-padded).
"""

from configs import default


def cnndm_base(objective: str):
  c = default.get_config()
  c.objective = objective
  c.seq_len = 768
  c.model.backbone = "qwen3"
  c.model.vocab_size = 151936  # Qwen3 embedding rows (the tokenizer has 151669)
  c.model.hidden_size = 256
  c.model.num_layers = 28
  c.model.num_heads = 16
  c.model.num_kv_heads = 8
  c.model.head_dim = 128  # Qwen3-0.6B's, independent of hidden_size
  c.model.intermediate_size = 768
  c.model.rope_base = 1_000_000.0
  c.model.rms_norm_eps = 1e-6
  c.model.tie_embeddings = True
  c.model.dropout = 0.0
  c.model.dtype = "bfloat16"
  c.model.attention = "xla"  # TPU; "cudnn" on GPU, "dense" on CPU
  c.model.remat = "none"
  c.tokenizer.kind = "qwen3"
  c.tokenizer.vocab_path = ""  # REQUIRED: Qwen3-0.6B-Base tokenizer.json (or its directory)
  c.data.source = "jsonl"
  c.data.jsonl_field = "text"
  c.data.preprocess = "pad"
  c.loss.keep_clean_bos = False
  c.loss.desired_set_size = 4
  c.loss.max_set_size = 0
  c.batch_size = 128
  c.eval_batch_size = 32
  c.num_train_steps = 500_000
  c.learning_rate = 3e-4
  c.warmup_steps = 1000
  c.lr_schedule = "constant"
  c.adam_b2 = 0.98
  c.weight_decay = 1e-5
  c.grad_clip_norm = 1.0
  c.ema_decay = 0.9999
  c.eval_params = "ema"
  c.eval_every_steps = 5000
  c.num_eval_steps = 50
  c.checkpoint_every_steps = 5000
  c.log_every_steps = 100
  return c


def get_config():
  return cnndm_base("setdlm")
