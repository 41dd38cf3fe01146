"""BD3LM baseline on CNN/DailyMail with a random-init Qwen3 (`cnndm-bd3lm-s4`; SPEC §5).

  python launch/train.py --config=configs/cnndm_bd3lm_qwen3.py --workdir=$WORKDIR \
      --config.tokenizer.vocab_path=/data/Qwen3-0.6B-Base/tokenizer.json \
      --config.data.paths=/data/cnndm_train.jsonl --config.data.eval_paths=/data/cnndm_val.jsonl \
      [--config.loss.block_size=8]
"""

from configs import cnndm_sw_qwen3


def get_config():
  c = cnndm_sw_qwen3.cnndm_base("bd3lm")
  c.loss.block_size = 4  # must divide seq_len = 768
  return c
