"""An RL run's configuration: the launcher's defaults, its checks, and the run config it builds
from the SFT workdir it starts from.

  config = rl_config.default_config()           # configs/rl_*.py start from this
  rl_config.validate(config)                    # one error line per bad field, before anything
  run = rl_config.run_config_for(config, sft)   # the SFT run's config.json + this run's fields
  rl_config.check_step_budget(method, w, t, n)  # once N is known: T steps can make N tokens

The launcher config holds only what an RL run chooses: the `rl` section, the optimiser, steps,
logging / checkpoint cadence, seed and mesh. Model, objective, tokenizer and data (the task whose
train split gives the prompts) come from the SFT workdir's config.json; the merged config is the
RL workdir's config.json, so launch/sample.py and launch/evaluate.py read an RL workdir as any
other run (its checkpoints hold `params`, and `ema_params` = the same parameters).
"""

from __future__ import annotations

import copy

import ml_collections

from setdiff_jax import decoders, decoding, objectives, paths
from setdiff_jax.data import pairs
from setdiff_jax.sampling import policies
from setdiff_jax.workdir import checkpoints as checkpointing
from setdiff_jax.config import edge
from setdiff_jax.config import run as run_config

# Top-level fields of the launcher config copied over the SFT run's (everything else is the SFT
# run's own: model, objective, tokenizer, data, loss).
OWN_FIELDS = (
  "seed",
  "num_train_steps",
  "learning_rate",
  "warmup_steps",
  "lr_schedule",
  "cosine_alpha",
  "weight_decay",
  "adam_b1",
  "adam_b2",
  "adam_eps",
  "grad_clip_norm",
  "log_every_steps",
  "checkpoint_every_steps",
  "keep_checkpoints",
  "divergence_factor",
  "divergence_ceiling",
  "divergence_patience",
  "divergence_window",
  "mesh",
  "sharding_rules",
)


def default_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0  # rollout RNG (saved in every checkpoint) and prompt draws
  c.num_train_steps = 200  # RL steps (each: sample, score, rl.inner_updates updates)
  # ---- optimiser (the same chain as training: clip -> Adam -> decay -> lr; a fresh state)
  c.learning_rate = 1e-5
  c.warmup_steps = 0
  c.lr_schedule = "constant"  # constant | cosine (after warm-up)
  c.cosine_alpha = 0.0
  c.weight_decay = 0.0
  c.adam_b1 = 0.9
  c.adam_b2 = 0.999
  c.adam_eps = 1e-8
  c.grad_clip_norm = 1.0  # 0 disables
  # ---- logging and checkpoints (WORKDIR/metrics.jsonl, WORKDIR/checkpoints/<step>)
  c.log_every_steps = 1
  c.checkpoint_every_steps = 50
  c.keep_checkpoints = 2
  # The divergence guard (as in training) watches rl/loss: checkpoints wait while it is above
  # divergence_factor x the median of the last divergence_window values (taken as >= 1) or above
  # divergence_ceiling; divergence_patience such steps in a row stop the run, the newest
  # checkpoint whose loss was seen healthy kept. 0 and 0 turn it off.
  c.divergence_factor = 10.0
  c.divergence_ceiling = 0.0
  c.divergence_patience = 3
  c.divergence_window = 50
  c.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1})
  c.sharding_rules = ()

  # The rl section: every field, its default, range and comment in `config/sections.RL`.
  c.rl = run_config.rl_defaults()
  return c


def _fail(msg: str):
  raise ValueError(f"invalid config: {msg}")


def validate(config: ml_collections.ConfigDict):
  """The launcher config's own checks (ranges, reward, sampler mode), before any file is read."""
  from setdiff_jax.rl import rewards  # the reward registry (same package)

  if "rl" not in config:  # e.g. configs/tiny_sw.py given to launch/rl.py
    raise ValueError(
      "invalid config: it has no rl section, so it is not an RL config (a training config goes "
      "to launch/train.py); launch/rl.py takes one such as configs/rl_arithmetic.py with "
      "--config.rl.init_from=SFT_WORKDIR"
    )
  run_config.check_field_ranges(config)
  edge.check_choices(config)
  r = config.rl
  rewards.get(r.reward)
  policies.get(r.policy, "--config.rl.policy")
  if policies.token_dependent(r.policy):
    exact = ", ".join(n for n in policies.POLICIES if not policies.token_dependent(n))
    _fail(
      f"rl.policy={r.policy!r} ranks candidates by the probability of the sampled token, so "
      f"which positions commit depends on samples that are then discarded and the trajectory "
      f"likelihood is not exact; use a policy that reads the distributions only: {exact}"
    )
  policies.check_arg(r.policy, r.policy_arg, "--config.rl.policy_arg", "--config.rl.policy")
  if float(r.top_p) != 1.0:
    _fail(
      f"rl.top_p={r.top_p}: RL samples with temperature only (the scorer's likelihood is "
      f"that of softmax(z / temperature)); set --config.rl.top_p=1.0"
    )
  if float(r.repetition_penalty) != 1.0:
    _fail(
      f"rl.repetition_penalty={r.repetition_penalty}: RL samples with temperature only (no "
      f"logits processors); set --config.rl.repetition_penalty=1.0"
    )
  if not r.init_from:
    _fail(
      "rl.init_from is empty: set --config.rl.init_from=SFT_WORKDIR (a launch/train.py run on "
      "a prompt/answer task)"
    )


def load_sft_config(init_from: str, resume: bool = False) -> ml_collections.ConfigDict:
  """The SFT workdir's config.json, after checking it has a checkpoint (one error line else). A
  resume needs its config.json (and tokenizer/) only: its parameters are the RL checkpoint's,
  and a KL reference step is checked by `sft_start.check_init_step`."""
  workdir = paths.resolve(init_from)
  if resume and not paths.isfile(paths.join(workdir, checkpointing.CONFIG_FILE)):
    raise FileNotFoundError(
      f"rl.init_from={init_from!r} is gone (no config.json there): this RL run resumes from its "
      "own checkpoints but reads the SFT run's config.json and tokenizer/ (and, with "
      "rl.kl_beta > 0, its checkpoint of rl.init_step). Restore that folder from a backup; an "
      "SFT run trained again is another model (a resume refuses it)"
    )
  if resume:
    return checkpointing.load_config(workdir)
  steps = [
    s
    for s in (
      paths.listdir(checkpointing.checkpoint_dir(workdir))
      if paths.isdir(checkpointing.checkpoint_dir(workdir))
      else []
    )
    if s.isdigit()
  ]
  if not steps:
    raise FileNotFoundError(
      f"rl.init_from={init_from!r} has no SFT checkpoint (no "
      f"{checkpointing.CHECKPOINT_DIR}/<step> folder): train one first with "
      f"python launch/train.py --config=configs/reasoning_sw.py "
      f"--workdir={init_from}"
    )
  return checkpointing.load_config(workdir)


def run_config_for(
  config: ml_collections.ConfigDict, sft: ml_collections.ConfigDict
) -> ml_collections.ConfigDict:
  """The RL run's config: the SFT run's, with this run's `OWN_FIELDS` and `rl` section, raw
  parameters evaluated (`ema_decay` 0, `eval_params` raw), `init_from` = the SFT workdir."""
  run = copy.deepcopy(sft)
  source = str(run.data.get("source", ""))
  if source not in pairs.PAIR_SOURCES:
    _fail(
      f"rl.init_from={config.rl.init_from!r} trained on data.source={source!r}; RL needs a "
      f"prompt/answer run (data.source in {pairs.PAIR_SOURCES}) whose train split gives "
      f"the prompts"
    )
  objectives.get(run.objective)
  r = config.rl
  policy_flags = {
    "policy": r.policy != run_config.rl_defaults().policy,
    "policy_arg": r.policy_arg is not None,
    # A step budget T is a commit-policy setting too: the sampler without one (AR: one token a
    # step, N steps) has no use for it either, while every sampler with one reads it.
    "num_steps": int(r.num_steps or 0) != 0,
  }
  try:  # a setting of the set sampler on an AR run would be dropped: kept tok/call stays 1
    decoding.check_method_flags(
      decoders.get(run.objective),
      window=int(r.window) or None,
      policy_flags=[name for name, given in policy_flags.items() if given],
      prefix="rl.",
    )
  except ValueError as e:
    _fail(f"{e} (the rl.init_from run's method)")
  window, seq_len = int(config.rl.window), int(run.seq_len)
  if window > seq_len:  # the launchers' --window check (decoding.check_sampling_flags)
    _fail(
      f"rl.window={window} must be in [1, seq_len={seq_len}] (W <= L, the seq_len of the "
      f"rl.init_from run; 0 = its set size S)"
    )
  with run.unlocked():
    for name in OWN_FIELDS:
      run[name] = copy.deepcopy(config[name])
    run.rl = copy.deepcopy(config.rl)
    run.rl.init_from = paths.resolve(config.rl.init_from)
    run.init_from = run.rl.init_from
    run.init_from_hf = ""
    run.ema_decay = 0.0
    run.eval_params = "raw"
    run.grad_accum_steps = 1
    # RL runs no likelihood eval; the SFT run's eval batch need not split over this mesh.
    run.eval_batch_size = int(config.rl.prompts_per_step) * int(config.rl.group_size)
  return run


def check_step_budget(method: str, window: int, num_steps: int, n: int, *, rl=None):
  """Refuses an rl.num_steps T with which no rollout can generate its N new tokens.

  The set sampler (SetDLM, the methods whose decoder `uses_window`) runs min(T, N) steps and
  commits at most W tokens a step (the active masks of its window [f, f + W), SPEC §4.2), so
  T * W < N always ends with masks left, which compaction silently drops: every rollout is cut
  short. T * W >= N can finish (every schedule count n_i <= ceil(N / T) <= W). T = 0 means N
  steps. AR ignores T (`run_config_for` refuses it there); BD3LM runs min(T, G) steps per block,
  whose counts sum to G: both finish. `window` is the sampler's W (rl.window, or the run's S when
  0); `rl` (the run's rl section) names where W and N came from when they were left 0.
  """
  t, w, n = int(num_steps or 0), int(window), int(n)
  if not t or not decoders.get(method).uses_window or t * w >= n:
    return
  w_from = " (rl.window=0: the run's set size S)" if rl is not None and not int(rl.window) else ""
  n_from = (
    " (rl.max_new_tokens=0: seq_len - the longest train prompt)"
    if rl is not None and not int(rl.max_new_tokens)
    else ""
  )
  _fail(
    f"rl.num_steps={t} with window W={w}{w_from}: the set sampler commits at most W tokens a "
    f"step, so {t} steps generate at most {t * w} of the N={n}{n_from} new tokens and every "
    f"rollout is cut short; set --config.rl.num_steps >= {-(-n // w)} (ceil(N / W); 0 = N steps)"
  )


__all__ = [
  "default_config",
  "validate",
  "load_sft_config",
  "run_config_for",
  "check_step_budget",
  "OWN_FIELDS",
]
