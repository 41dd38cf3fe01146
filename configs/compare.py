"""The method comparison of benchmarks/compare_methods.py: one recipe, six objectives.

Run one of them on its own:
  python launch/train.py --config=configs/compare.py:setdlm4 --workdir=/tmp/compare_setdlm4
Methods (the part after the colon): ar | mdlm | bd3lm4 | setdlm2 | setdlm4 | setdlm8
(`bd3lm<S>` and `setdlm<S>` take any S that divides / fits seq_len).

Every method gets the same backbone (2 layers x 128, 4 heads, MLP 512), context L = 128 (every
Story Cloze story fits with the 2k BPE), data (the embedded Jane Austen corpus, wrapped rows),
batch, steps, optimizer and seed; only the objective (and the constant-sigma adaLN that the
MDLM/BD3LM baselines use, SPEC §1.6, kept small with cond_dim = 32) differs. On 2 CPU cores one
run takes 3-7 minutes (two-stream SetDLM/BD3LM steps cost about twice an AR step).
"""

import re

from configs import default

METHODS = ("ar", "mdlm", "bd3lm4", "setdlm2", "setdlm4", "setdlm8")


def parse_method(method: str):
  """'setdlm4' -> ('setdlm', 4); 'ar' -> ('ar', None)."""
  m = re.fullmatch(r"(ar|mdlm|bd3lm|setdlm)(\d*)", method)
  if not m:
    raise ValueError(f"unknown method {method!r}; expected one of {METHODS} (any S)")
  name, s = m.group(1), m.group(2)
  if name in ("bd3lm", "setdlm") and not s:
    raise ValueError(f"method {method!r} needs its set/block size, e.g. {name}4")
  if name in ("ar", "mdlm") and s:
    raise ValueError(f"method {method!r}: {name} takes no size")
  return name, int(s) if s else None


def get_config(method: str = "setdlm4"):
  name, s = parse_method(method)
  c = default.get_config()
  c.objective = name
  c.seed = 0
  c.seq_len = 128
  c.model.hidden_size = 128
  c.model.num_layers = 2
  c.model.num_heads = 4
  c.model.mlp_ratio = 4
  c.model.cond_dim = 32
  c.model.dropout = 0.0
  c.model.adaln = name in ("mdlm", "bd3lm")
  c.tokenizer.vocab_size = 2048
  if name == "setdlm":
    c.loss.desired_set_size = s
  if name == "bd3lm":
    c.loss.block_size = s
  c.batch_size = 16
  c.num_train_steps = 700
  c.learning_rate = 1e-3
  c.warmup_steps = 50
  c.lr_schedule = "cosine"
  c.cosine_alpha = 0.1
  c.ema_decay = 0.0
  c.eval_params = "raw"
  c.eval_every_steps = c.num_train_steps  # the benchmark runs its own evaluation afterwards
  c.num_eval_steps = 4
  c.eval_batch_size = 16
  c.log_every_steps = 50
  c.checkpoint_every_steps = c.num_train_steps
  c.keep_checkpoints = 1
  c.num_eval_samples = 0
  return c
