"""SetDLM on OpenWebText with the reference recipe (SPEC §3.1, §5): `owt-setdlm-smax8`.

OpenWebText is not in TFDS: give it as JSONL (a "text" field) or plain-text files:
  python launch/train.py --config=configs/owt_sw.py --workdir=$WORKDIR \
      --config.data.paths=/data/owt/train.jsonl --config.data.eval_paths=/data/owt/valid.jsonl

12 x 768 DiT, L=1024, GPT-2 BPE + an added mask token (V = 50258), S=4 (S_max=8), global batch
512, AdamW 3e-4 with 2500 warm-up steps then constant, EMA 0.9999, bf16. The reference trained
for up to 1M steps and released the 300k-step checkpoints. Documents are concatenated with EOS
between them and cut into 1024-token rows; the first token of each row is treated as the clean
BOS (keep_clean_bos; `data.wrap_style=doc`), and since pad = EOS for GPT-2, EOS targets do not
count in eval (SPEC §8.9).
"""

from configs import lm1b_sw
from setdiff_jax.data import tokenizers


def get_config():
  c = lm1b_sw.lm1b_base("setdlm")
  c.seq_len = 1024
  c.tokenizer.kind = "gpt2"
  # GPT-2 BPE, shipped with the package (override: --config.tokenizer.{vocab,merges}_path=...)
  c.tokenizer.vocab_path = tokenizers.packaged_vocab("gpt2/vocab.json")
  c.tokenizer.merges_path = tokenizers.packaged_vocab("gpt2/merges.txt")
  c.data.source = "jsonl"
  c.data.eval_split = "validation"  # the default: files, not the LM1B base's TFDS split, are read
  c.data.jsonl_field = "text"
  c.data.paths = ""  # required: training JSONL file(s), comma separated
  c.data.eval_paths = ""  # required: validation JSONL file(s)
  c.data.preprocess = "wrap"
  # doc EOS doc EOS ... cut into rows of exactly L (rows start mid-document; the first token kept
  # clean): the reference's `..._bs1024_wrapped_specialFalse.dat`, no BOS / EOS added per row.
  c.data.wrap_style = "doc"
  c.loss.desired_set_size = 4
  c.model.remat = "full"  # L=1024 two-stream activations are large
  c.eval_batch_size = 16
  c.num_eval_steps = 100
  return c
