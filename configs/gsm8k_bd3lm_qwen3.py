"""BD3LM baseline fine-tuned from Qwen3-1.7B-Base on GSM8K (`gsm8k-bd3lm-s4`; SPEC §5).

  python launch/train.py --config=configs/gsm8k_bd3lm_qwen3.py --workdir=$WORKDIR \
      --config.init_from_hf=/data/Qwen3-1.7B-Base --config.data.paths=/data/gsm8k_train.jsonl \
      --config.data.eval_paths=/data/gsm8k_test.jsonl [--config.loss.block_size=8]

The same recipe as configs/gsm8k_sw_qwen3.py with block diffusion (block S=4, no adaLN: the
Qwen3 backbone has no time conditioning, as in the reference).
"""

from configs import gsm8k_sw_qwen3


def get_config():
  c = gsm8k_sw_qwen3.qwen3_base("bd3lm")
  c.loss.block_size = 4  # must divide seq_len = 1024
  c.loss.antithetic = False
  return c
