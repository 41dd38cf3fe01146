"""The shared recipe of the conditional reasoning configs (configs/reasoning_{sw,ar,mdlm,bd3lm}.py).

Not run directly: `python launch/train.py --config=configs/reasoning_sw.py --workdir=DIR` (or
reasoning_ar / reasoning_mdlm / reasoning_bd3lm). Every method gets the same backbone, data,
tokenizer recipe, batch, steps, optimizer and seed; only the objective (and the constant-sigma
adaLN of the MDLM/BD3LM baselines, SPEC §1.6) differs. The task is the procedural multi-step
arithmetic of setdiff_jax/data/tasks.py (3 operands in 1..9, + and -, a worked solution and a
'#### n' answer line); rows are [BOS] prompt answer [EOS] pad with the prompt as context.
"""

from configs import default


def get_config(objective: str):
  c = default.get_config()
  c.objective = objective  # setdlm | ar | mdlm | bd3lm
  c.seed = 0
  c.seq_len = 32  # the longest row is 26 tokens with the 280-token BPE
  c.model.hidden_size = 128
  c.model.num_layers = 2
  c.model.num_heads = 4
  c.model.mlp_ratio = 4
  c.model.cond_dim = 32  # adaLN width (MDLM/BD3LM only)
  c.model.dropout = 0.0
  c.model.adaln = objective in ("mdlm", "bd3lm")
  # SetDLM S=4, S_max=8 (release name smax8); BD3LM block 4; GSM8K recipe: no clean BOS (SPEC §5).
  c.loss.keep_clean_bos = False
  c.loss.desired_set_size = 4
  c.loss.max_set_size = 8 if objective == "setdlm" else 0  # a field only SetDLM reads
  c.loss.block_size = 4
  # A byte-level BPE of 280 ids trained on the task at first run: digits stay single tokens.
  c.tokenizer.vocab_size = 280
  c.data.source = "arithmetic"
  c.data.preprocess = "pad"  # one pair per row, context_mask on BOS + prompt
  c.data.overflow = "error"  # every problem fits L = 32
  c.data.task_operands = 3  # numbers per problem (2 worked steps)
  c.data.task_max_operand = 9  # operands in 1..9
  c.data.task_train_examples = 20000  # drawn with replacement from the ~1.7k training problems
  c.data.task_eval_examples = 200  # distinct test problems (disjoint from training)
  c.batch_size = 32
  c.num_train_steps = 1200
  c.learning_rate = 2e-3
  c.warmup_steps = 100
  c.lr_schedule = "cosine"
  c.cosine_alpha = 0.1
  c.ema_decay = 0.0
  c.eval_params = "raw"
  c.eval_every_steps = 600
  c.num_eval_steps = 4  # likelihood batches per eval (accuracy: launch/evaluate.py)
  c.eval_batch_size = 50
  c.log_every_steps = 50
  c.checkpoint_every_steps = 600
  c.keep_checkpoints = 1
  c.num_eval_samples = 0  # unconditional samples mean nothing here
  return c
