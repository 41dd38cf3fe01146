"""Tiny SetDLM (S=4, sliding window) on the embedded Jane Austen corpus: the CPU demo.

Run:  python launch/train.py --config=configs/tiny_sw.py --workdir=/tmp/setdiff_tiny
Then: python launch/sample.py --workdir=/tmp/setdiff_tiny

Trains a ~1M-parameter model (2 layers x 128, L=64, a 2k BPE vocabulary trained at first run) for
a few minutes on 2 CPU cores; the validation NLL falls clearly. Re-running resumes.
"""

from configs import default


def get_config():
  c = default.get_config()
  c.seq_len = 64
  c.model.hidden_size = 128
  c.model.num_layers = 2
  c.model.num_heads = 4
  c.model.dropout = 0.0
  c.tokenizer.vocab_size = 2048
  c.loss.desired_set_size = 4
  c.batch_size = 32
  c.num_train_steps = 600
  c.learning_rate = 1e-3
  c.warmup_steps = 50
  c.lr_schedule = "cosine"
  c.cosine_alpha = 0.1
  c.ema_decay = 0.0
  c.eval_params = "raw"
  c.eval_every_steps = 200
  c.num_eval_steps = 10
  c.eval_batch_size = 32
  c.log_every_steps = 25
  c.checkpoint_every_steps = 200
  c.num_eval_samples = 2
  return c
