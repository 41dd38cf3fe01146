"""AR baseline on CNN/DailyMail with a random-init Qwen3 (`cnndm-ar`; SPEC §5).

  python launch/train.py --config=configs/cnndm_ar_qwen3.py --workdir=$WORKDIR \
      --config.tokenizer.vocab_path=/data/Qwen3-0.6B-Base/tokenizer.json \
      --config.data.paths=/data/cnndm_train.jsonl --config.data.eval_paths=/data/cnndm_val.jsonl
"""

from configs import cnndm_sw_qwen3


def get_config():
  return cnndm_sw_qwen3.cnndm_base("ar")
