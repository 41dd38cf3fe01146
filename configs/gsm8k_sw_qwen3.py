"""SetDLM fine-tuned from Qwen3-1.7B-Base on GSM8K: the reference recipe (SPEC §3.10, §5).

Run (a local Hugging Face checkout of Qwen3-1.7B-Base; nothing is downloaded), e.g. on a v5e-8 /
v4-8 TPU slice with FSDP over the 8 chips:
  python launch/train.py --config=configs/gsm8k_sw_qwen3.py --workdir=$WORKDIR \
      --config.init_from_hf=/data/Qwen3-1.7B-Base \
      --config.data.paths=/data/gsm8k_train.jsonl --config.data.eval_paths=/data/gsm8k_test.jsonl

All 28 layers kept; the architecture (2048 wide, 16 query / 8 KV heads, head_dim 128, MLP 6144,
V=151936, theta 1e6, tied head) is read from the directory's config.json (model fields = 0) and
the tokenizer from its tokenizer.json (BOS=EOS=PAD=<|endoftext|>, MASK=<|fim_middle|>).
L=1024, S=4 (S_max=8), lr 1e-5 cosine to 0.5x over 75k steps after 100 warm-up steps,
AdamW b2=0.98, wd 1e-5, clip 1, EMA 0.9999, bf16 compute, remat. Each JSONL row is one GSM8K
pair {"question", "answer"} (the reference trains on Qwen3-32B-distilled answers); the question,
wrapped in the reference prompt and the chat template, is clean context (context_mask = 1) and only
the answer is diffused, one example per row, right-padded.
"""

from configs import default


def qwen3_base(objective: str):
  """The shared GSM8K Qwen3 recipe; the AR / BD3LM configs change a few fields."""
  c = default.get_config()
  c.objective = objective
  c.seq_len = 1024
  c.model.backbone = "qwen3"
  for field in (
    "vocab_size",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "rope_base",
    "num_layers",
  ):
    c.model[field] = 0  # 0 = the init_from_hf checkpoint's value (num_layers: all)
  c.model.dropout = 0.0  # Qwen3 has no residual dropout
  c.model.dtype = "bfloat16"  # amp_bf16: fp32 params, bf16 matmuls, fp32 norms/softmax
  c.model.attention = "xla"  # TPU; "cudnn" on GPU, "dense" on CPU
  c.model.remat = "full"  # 28 x 2048 at L=2048 tokens (two streams) per row
  c.init_from_hf = ""  # REQUIRED: local Qwen3-1.7B-Base directory
  c.tokenizer.kind = "qwen3"  # its tokenizer.json (vocab_path defaults to init_from_hf)
  c.data.source = "pairs_jsonl"  # GSM8K JSONL rows {"question", "answer"} (data/pairs.py)
  c.data.prompt_field = "question"
  c.data.answer_field = "answer"
  c.data.prompt_style = "gsm8k_chat"  # reference prompt in the chat template; context = prompt
  c.data.preprocess = "pad"  # one example per row, right-padded to L
  c.loss.keep_clean_bos = False  # SPEC §5: GSM8K rows start with the prompt, not a BOS
  c.loss.desired_set_size = 4  # S (released smax8); 8 / 16 for smax16 / smax32
  c.loss.max_set_size = 0  # 0 = 2S
  c.batch_size = 16  # the reference script's global batch (released names: 1)
  c.eval_batch_size = 8
  c.num_train_steps = 75_000
  c.learning_rate = 1e-5  # the released run names' peak (the script says 1e-6)
  c.warmup_steps = 100
  c.lr_schedule = "cosine"
  c.cosine_alpha = 0.5  # Composer alpha_f: decay to 0.5 x peak
  c.adam_b1 = 0.9
  c.adam_b2 = 0.98
  c.adam_eps = 1e-8
  c.weight_decay = 1e-5
  c.grad_clip_norm = 1.0
  c.ema_decay = 0.9999
  c.eval_params = "ema"
  c.eval_every_steps = 1000
  c.num_eval_steps = 50
  c.checkpoint_every_steps = 2000
  c.log_every_steps = 50
  c.num_eval_samples = 2
  c.mesh.data = 1
  c.mesh.fsdp = -1  # FSDP over every chip (8 on a v5e-8 / v4-8)
  c.mesh.tensor = 1
  return c


def get_config():
  return qwen3_base("setdlm")
