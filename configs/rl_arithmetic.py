"""GRPO on the procedural arithmetic task from a reasoning SFT run (configs/reasoning_sw.py).

Run:  python launch/train.py --config=configs/reasoning_sw.py --workdir=/tmp/reasoning_sw
      python launch/rl.py --config=configs/rl_arithmetic.py --workdir=/tmp/rl_arith \
          --config.rl.init_from=/tmp/reasoning_sw
Then: python launch/evaluate.py --workdir=/tmp/rl_arith --eval=accuracy

Model, tokenizer and task come from the SFT workdir; every field here is documented in
setdiff_jax/rl/config.py. 8 prompts x 8 completions per step, one update per batch, lr 1e-5,
exact match reward, temperature 1, the pmax commit policy (the n_i highest max-probabilities per
step, tau off);
`--config.rl.step_cost=0.01 --config.rl.policy=entropy_bound` lets RL trade steps for reward.
"""

from setdiff_jax.rl import config as rl_config


def get_config():
  c = rl_config.default_config()
  c.num_train_steps = 200
  c.learning_rate = 1e-5
  c.rl.prompts_per_step = 8
  c.rl.group_size = 8
  c.rl.inner_updates = 1
  c.rl.reward = "exact_match"
  c.rl.temperature = 1.0
  c.rl.policy = "pmax"
  c.checkpoint_every_steps = 50
  c.log_every_steps = 1
  return c
