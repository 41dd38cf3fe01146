"""AR baseline fine-tuned from Qwen3-1.7B-Base on GSM8K (`gsm8k-ar`; SPEC §5).

  python launch/train.py --config=configs/gsm8k_ar_qwen3.py --workdir=$WORKDIR \
      --config.init_from_hf=/data/Qwen3-1.7B-Base --config.data.paths=/data/gsm8k_train.jsonl \
      --config.data.eval_paths=/data/gsm8k_test.jsonl

The same recipe as configs/gsm8k_sw_qwen3.py with the shifted next-token loss and causal mask.
"""

from configs import gsm8k_sw_qwen3


def get_config():
  return gsm8k_sw_qwen3.qwen3_base("ar")
