"""Fine-tune a tiny local Hugging Face Qwen3 into a SetDLM on CPU (minutes on 2 cores).

Make a tiny random Qwen3 directory with transformers (README, "Walkthrough: a tiny local Qwen3
into a SetDLM on CPU"; or use any local Qwen3 checkout whose tokenizer has <|endoftext|> and
<|fim_middle|>), then:
  python launch/train.py --config=configs/tiny_qwen3.py --workdir=/tmp/tiny_qwen3 \
      --config.init_from_hf=/tmp/tiny_qwen3_hf \
      --config.data.paths=train.txt --config.data.eval_paths=eval.txt
  python launch/sample.py --workdir=/tmp/tiny_qwen3
  python launch/export.py --workdir=/tmp/tiny_qwen3 --out=/tmp/tiny_qwen3_setdlm

The architecture and tokenizer come from the directory (model fields = 0); L=32, S=2, batch 8,
lr 1e-4 cosine to 0.5x, fp32, one text file line per row (right-padded; a longer line follows
data.overlong: cut by default, --config.data.overlong=wrap continues it on further rows).
"""

from configs import gsm8k_sw_qwen3


def get_config():
  c = gsm8k_sw_qwen3.qwen3_base("setdlm")
  c.seq_len = 32
  c.model.dtype = "float32"
  c.model.attention = "dense"
  c.model.remat = "none"
  c.data.source = "text"
  c.data.prompt_field, c.data.prompt_style = "prompt", "plain"  # the defaults: no pairs here
  c.data.text_unit = "line"
  c.data.preprocess = "pad"
  c.loss.desired_set_size = 2
  c.batch_size = 8
  c.eval_batch_size = 8
  c.num_train_steps = 200
  c.learning_rate = 1e-4
  c.warmup_steps = 10
  c.ema_decay = 0.0
  c.eval_params = "raw"
  c.eval_every_steps = 100
  c.num_eval_steps = 2
  c.checkpoint_every_steps = 100
  c.log_every_steps = 10
  c.num_eval_samples = 1
  c.mesh.data = -1
  c.mesh.fsdp = 1
  return c
