"""The GRPO loop: from an SFT workdir, sample, reward, score exactly, update (launch/rl.py).

  result = grpo.train_rl(config, workdir)        # config: configs/rl_*.py (`rl.config`)

Each step t:
  1. P prompts drawn from the task's train split (disjoint from its test problems) with the
     rollout RNG, each repeated G times;
  2. G completions per prompt with the method's own sampler in RL mode (temperature only, a commit
     policy that reads the step's distributions, never the sampled tokens), jitted and placed on
     the parameters' mesh like every decode (`sampling.placement`);
  3. rewards by name (`rl.rewards`), group advantages (`rl.objective`);
  4. pi_old = the exact scorer's per-token log-probabilities (`rl.scoring`) under the sampling
     parameters (never the sampler's own numbers), and with rl.kl_beta > 0 the frozen SFT
     reference's hidden states [B, L, D] (its head and the KL run rl.score_chunk positions at a
     time inside the update: no [B, L, V] array);
  5. rl.inner_updates optimiser updates of the clipped objective (+ beta * exact KL) on that batch
     (the optimiser chain of training, `train_step.make_optimizer`; its schedule counts updates).
State and checkpoints: `RLState` (step, params, ema_params = params, Adam state, rollout RNG) in
WORKDIR/checkpoints/<step> through `workdir.checkpoints` (checksums, fallback past damaged steps),
so a resumed run repeats exactly the steps the uninterrupted one would have run (bitwise: the
prompts and samples come from the saved RNG, the updates from the saved optimizer state).
Metrics (WORKDIR/metrics.jsonl, every log_every_steps, the values of that step): rl/reward_mean,
rl/reward_std, rl/accuracy (exact match of the sampled completions), rl/kept_tokens_per_call,
rl/tokens_per_step, rl/steps_mean, rl/zero_adv_fraction (groups with equal rewards), rl/loss,
rl/clip_fraction, rl/ratio_mean (means over the inner updates), rl/kl (the same mean of the exact
KL to the SFT reference; only with rl.kl_beta > 0: without a reference no KL is computed, and the
key is left out rather than logged as a 0 that reads as "no drift"), rl/grad_norm, rl/lr,
rl/sampler_logprob_gap (max |sampler's log-prob - scorer's| over the committed tokens: the
sampler's dtype drift, never used by the update), and
the timing ones rl/rollout_tokens_per_sec (kept tokens / sampling seconds, the first step's
compile included), rl/compiled_programs (sampler programs compiled since this run started, plus
the scorer's, the reference's and the update's) and rl/step_seconds.
Methods: those with an exact scorer (`scoring.supported()`: setdlm, ar, bd3lm).

Prompts: the train pairs as the SFT run encoded them (its `data.overflow`: `skip` drops the pairs
longer than seq_len, `truncate_prompt` keeps their prompts' last tokens). N (rl.max_new_tokens;
0: seq_len - the longest prompt) is the same for every row: when it cannot hold a prompt's
reference answer (+ EOS) the run still starts (a shorter answer may earn the reward), with one
warning line saying how many of the train prompts that is.
The KL reference (rl.kl_beta > 0) is the SFT run's checkpoint at rl.init_step, read again on every
resume: a resume after the SFT run rotated that step out (its keep_checkpoints) is refused, naming
the ways out.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, Optional

from absl import logging
import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from setdiff_jax import decoding, paths, sharding, train_step, trainer
from setdiff_jax.data import tokenizers
from setdiff_jax.evaluation import accuracy
from setdiff_jax.rl import config as rl_config
from setdiff_jax.rl import objective, prompts, rewards, scoring, sft_start
from setdiff_jax.sampling import compiles, placement
from setdiff_jax.workdir import checkpoints as checkpointing
from setdiff_jax.workdir import data_files
from setdiff_jax.config import edge
from setdiff_jax.config import run as run_config
from setdiff_jax.config.run import RunConfig
from setdiff_jax.config.sections import Optimization
from setdiff_jax.workdir.tokenizer import build_tokenizer
from setdiff_jax.workdir import load as workdir_lib
from setdiff_jax.workdir import lock as workdir_lock
from setdiff_jax.workdir.metrics import MetricWriter
from setdiff_jax.workdir.divergence import DivergenceGuard, logged_losses

TIMING_METRICS = ("rl/rollout_tokens_per_sec", "rl/compiled_programs", "rl/step_seconds")


class RLState(flax.struct.PyTreeNode):
  step: jax.Array  # int32 []: RL steps done
  params: Any
  ema_params: Any  # the same arrays as params (what launch/sample.py reads by default)
  opt_state: Any
  rng: jax.Array  # uint32 key data of the rollout RNG (split once per step)


def _rng(state: RLState) -> jax.Array:
  """The rollout key, uncommitted (a restored one sits on one device; the sampler runs on the
  parameters' mesh)."""
  return jax.random.wrap_key_data(jnp.asarray(np.asarray(state.rng)))


def _optimization(cfg: RunConfig) -> Optimization:
  """The run's optimisation with the schedule counted in optimiser updates (mu per RL step)."""
  opt, mu = cfg.optimization, cfg.rl.inner_updates
  return dataclasses.replace(
    opt, num_train_steps=opt.num_train_steps * mu, warmup_steps=opt.warmup_steps * mu
  )


def make_functions(run: RunConfig, method: str, model, optimizer, sampler_cfg):
  """Pure (score, ref_features, update) functions of an RL run (jitted by the caller); the
  scorer replays the distributions `sampler_cfg` drew from (temperature, M suppressed, BD3LM
  blocks) and applies the head rl.score_chunk positions at a time (`scoring.head_scores`)."""
  r = run.rl
  beta, clip = float(r.kl_beta), float(r.clip_eps)
  chunk = int(r.score_chunk) or None
  kw = dict(
    mask_token_id=sampler_cfg.mask_token_id,
    block_size=sampler_cfg.block_size,
    max_steps=sampler_cfg.max_new_tokens,
  )
  head_kw = dict(
    temperature=float(sampler_cfg.temperature),
    mask_token_id=sampler_cfg.mask_token_id,
    chunk=chunk,
  )

  def score(params, rollout):
    return scoring.token_logprobs(
      method, model, params, rollout, temperature=head_kw["temperature"], chunk=chunk, **kw
    )

  def ref_features(params, rollout):
    return scoring.token_features(method, model, params, rollout, **kw)

  def loss_fn(params, rollout, adv, old_logp, ref_feats, ref_params):
    feats = scoring.token_features(method, model, params, rollout, **kw)
    logp, kl = scoring.head_scores(
      model, params, feats, rollout, ref_params=ref_params, ref_feats=ref_feats, **head_kw
    )
    return objective.grpo_loss(
      logp, old_logp, adv, rollout.generated, clip_eps=clip, beta=beta, kl=kl
    )

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def update(params, opt_state, rollout, adv, old_logp, ref_feats, ref_params):
    (loss, m), grads = grad_fn(params, rollout, adv, old_logp, ref_feats, ref_params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, dict(m, loss=loss, grad_norm=optax.tree.norm(grads))

  return score, ref_features, update


def train_rl(
  config: ml_collections.ConfigDict, workdir: str, *, max_steps: Optional[int] = None
) -> Dict[str, float]:
  """Runs (or resumes) an RL run into WORKDIR; returns the last logged metrics and "step".

  `max_steps`: run at most this many steps in this call (then save and return), e.g. a job
  split over time slots; the result is the same as one uninterrupted call. An int >= 1 (None: up
  to num_train_steps); anything else is refused before anything is written.
  """
  if max_steps is not None and (
    isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)) or max_steps < 1
  ):
    raise ValueError(
      f"max_steps={max_steps!r} must be an int >= 1 (RL steps to run in this call; None: up to "
      "num_train_steps)"
    )
  rl_config.validate(config)
  workdir_lock.check_workdir_path(workdir)
  if paths.resolve(workdir).rstrip("/") == paths.resolve(config.rl.init_from).rstrip("/"):
    raise ValueError(
      f"--workdir={workdir} is the run's own --config.rl.init_from: the RL run would write into "
      "the SFT run it starts from; pass a new --workdir (init_from is the SFT workdir)"
    )
  resume = bool(workdir_lock.saved_steps(workdir))
  sft = rl_config.load_sft_config(config.rl.init_from, resume=resume)
  run = rl_config.run_config_for(config, sft)
  if resume:  # named as the SFT run's change, before the resume check's wording
    sft_start.check_same_sft_config(run, workdir)
  recorded = sft_start.recorded_init_step(workdir)
  if not int(run.rl.init_step):  # a resume reloads the SFT step its first start recorded
    run.rl.init_step = recorded
  sft_start.check_init_step(run.rl, workdir, recorded)  # before the workdir (and its lock) exists
  sizes = sharding.mesh_shape(run.mesh, jax.device_count())
  rows = int(run.rl.prompts_per_step) * int(run.rl.group_size)
  if rows % (sizes[0] * sizes[1]):
    raise ValueError(
      f"invalid config: rl.prompts_per_step x rl.group_size = {rows} rows must be "
      f"divisible by the data x fsdp mesh size {sizes[0] * sizes[1]}"
    )
  edge.from_config_dict(run, jax.device_count())
  setup = _setup(
    run_config.from_config_dict(run)
  )  # reads the SFT run only: a refused setting leaves no RL workdir behind
  if resume:  # the ids its checkpoints were trained with
    sft_start.check_same_tokenizer(run.rl, setup[0], workdir)
  return trainer.locked(
    run, workdir, lambda run, workdir: _train_rl(run, workdir, setup, max_steps)
  )


def _setup(run: RunConfig):
  """(tokenizer, model_cfg, obj_cfg, mesh, prompt pool, encoded prompts, sampler_cfg) from the
  SFT run and the RL settings, every setting checked; writes nothing."""
  sft_dir = run.rl.init_from
  tokenizer = build_tokenizer(run, sft_dir, allow_training=False, save=False)
  model_cfg, obj_cfg = run_config.model_and_objective(run, tokenizer)
  if obj_cfg.name not in scoring.supported():
    raise ValueError(
      f"invalid config: rl.init_from={sft_dir!r} trained objective="
      f"{obj_cfg.name!r}; exact trajectory scoring supports "
      f"{', '.join(scoring.supported())}"
    )
  mesh = sharding.make_mesh(run.mesh.sizes())
  pool, encoded, answer_lens = prompts.encoded_pool(run, tokenizer)
  if not encoded:
    raise ValueError(
      f"invalid config: no train pair of rl.init_from={sft_dir!r} fits seq_len={run.seq_len} "
      f"(data.overflow={run.data.get('overflow', 'error')}): RL has no prompt to draw"
    )
  longest = max(len(p) for p in encoded)
  n = int(run.rl.max_new_tokens) or int(run.seq_len) - longest
  if n < 1 or longest + n > int(run.seq_len):
    raise ValueError(
      f"invalid config: rl.max_new_tokens={run.rl.max_new_tokens}: the longest "
      f"train prompt has {longest} tokens and seq_len={run.seq_len}; N must be in "
      f"[1, {int(run.seq_len) - longest}] (0 = the most that fits)"
    )
  r = run.rl
  sampler_cfg = decoding.sampler_config_for(
    obj_cfg,
    tokenizer,
    int(run.seq_len),
    greedy=False,
    temperature=float(r.temperature),
    top_p=1.0,
    repetition_penalty=1.0,
    policy=r.policy,
    policy_arg=r.policy_arg,
    window=int(r.window) or None,
    num_steps=int(r.num_steps) or None,
    max_new_tokens=n,
    rollout_stats=True,  # the rollouts' cache order (scoring) and log-probs (the gap metric)
  )
  rl_config.check_step_budget(obj_cfg.name, sampler_cfg.window, r.num_steps, n, rl=r)
  scoring.check_exact(obj_cfg.name, sampler_cfg)  # the RL mode: the rollouts' likelihood is exact
  if int(r.continuous_slots) and decoding.continuous_for(obj_cfg.name, sampler_cfg) is None:
    raise ValueError(
      f"invalid config: rl.continuous_slots={r.continuous_slots}: continuous batching covers the "
      f"set sampler and AR, not {obj_cfg.name!r}; set --config.rl.continuous_slots=0"
    )
  prompts.warn_short_n(run, n, longest, answer_lens)  # last: a refused setting is the only line
  return tokenizer, model_cfg, obj_cfg, mesh, pool, encoded, sampler_cfg


def _fresh_state(run: RunConfig, model_cfg, mesh):
  """(RLState at step 0 in the run's shardings, the TrainState shardings); the rollout key lives
  replicated on the mesh: every process holds it and saves it (orbax saves global arrays only)."""
  init, shardings = train_step.create_sharded_state(run, model_cfg, mesh)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  key = np.asarray(jax.random.key_data(jax.random.key(int(run.seed))))
  state = RLState(
    step=init.step,
    params=init.params,
    ema_params=init.params,
    opt_state=init.opt_state,
    rng=jax.device_put(key, replicated),
  )
  return state, shardings


def _train_rl(
  config: ml_collections.ConfigDict, workdir: str, setup, max_steps: Optional[int]
) -> Dict[str, float]:
  """The RL run of `config` (the merged run config; written as config.json); returns the last
  logged metrics, "step" and "checkpoint"."""
  is_main = jax.process_index() == 0
  run = run_config.from_config_dict(config)
  # the prompts are drawn by index into the SFT run's files: an edited one refuses a resume
  data_prints = data_files.check(run.data, workdir, bool(workdir_lock.saved_steps(workdir)))
  tokenizer, model_cfg, obj_cfg, mesh, pool, encoded, sampler_cfg = setup
  method = obj_cfg.name
  model = workdir_lib.inference_model(model_cfg, dtype=None)  # the run's dtype; CPU-safe attention
  opt = _optimization(run)
  optimizer = train_step.make_optimizer(opt)
  r = run.rl

  state, shardings = _fresh_state(run, model_cfg, mesh)
  manager = checkpointing.make_manager(
    workdir, keep=run.checkpoints.keep_checkpoints, with_data=False
  )
  state, ref_params, config.rl.init_step, fingerprint = sft_start.restore_from_sft(
    r, state, manager, workdir
  )
  if is_main:
    first_start = not workdir_lock.saved_steps(workdir)  # no RL checkpoint yet
    if first_start or not tokenizers.saved_in(workdir):
      tokenizers.save_in(tokenizer, workdir)  # no checkpoint yet: an earlier attempt's is stale
    checkpointing.save_config(config, workdir)
    data_files.save(workdir, data_prints)
    if first_start:  # which SFT parameters the run starts from
      sft_start.record_reference(workdir, r.init_from, config.rl.init_step, fingerprint)

  step = _rl_step(
    run,
    method,
    model,
    tokenizer,
    pool,
    encoded,
    sampler_cfg,
    mesh,
    shardings,
    functions=make_functions(run, method, model, optimizer, sampler_cfg),
    ref_params=ref_params,
    schedule=train_step.learning_rate_schedule(opt),
  )
  start = int(state.step)
  writer = MetricWriter(workdir, is_main, start_step=start)
  num_steps = run.optimization.num_train_steps
  schedule = trainer.Schedule(
    start=start,
    stop=num_steps if max_steps is None else min(num_steps, start + int(max_steps)),
    total=num_steps,
    save_every=run.checkpoints.checkpoint_every_steps,
  )
  last: Dict[str, float] = {}

  def log(done: int, values: Dict[str, float]):
    if done % run.evaluation.log_every_steps and done != schedule.stop:
      return
    writer.scalars(done, values)
    last.clear()
    last.update(values)
    logging.info(
      "RL step %d/%d  reward %.3f  accuracy %.3f  kept tok/call %.2f  clip %.3f",
      done,
      num_steps,
      values["rl/reward_mean"],
      values["rl/accuracy"],
      values["rl/kept_tokens_per_call"],
      values["rl/clip_fraction"],
    )

  hooks = trainer.Hooks(
    step=step,
    log=log,
    to_save=lambda state: state.replace(ema_params=state.params),
    monitor="rl/loss",
    name="RL",
    unit="RL step",
    lag=False,  # the metrics are host values already (rewards need the sampled texts)
  )
  guard = DivergenceGuard(run.divergence, logged_losses(workdir, start, "rl/loss") if start else ())
  state, saved = trainer.run(state, hooks, schedule, manager=manager, writer=writer, guard=guard)
  last["step"] = int(state.step)
  if saved is not None:
    last["checkpoint"] = saved
  return last


def _rollout_metrics(out, rollout, reward, correct, adv, group: int, old_logp) -> Dict[str, float]:
  """The rollouts' metrics of a step (module doc): rewards, accuracy, speed, and the sampler's
  own log-probs vs the scorer's pi_old (informative: the updates use pi_old)."""
  kept = sum(len(g) for g in out.generated)
  gap = 0.0
  if out.token_logprob is not None:
    diff = np.abs(np.asarray(out.token_logprob) - placement.to_host(old_logp))
    gap = float(np.max(diff[np.asarray(rollout.generated)], initial=0.0))
  return {
    "rl/reward_mean": float(np.mean(reward)),
    "rl/reward_std": float(np.std(reward)),
    "rl/accuracy": float(np.mean(correct)),
    "rl/kept_tokens_per_call": kept / max(int(np.sum(out.forward_calls)), 1),
    "rl/tokens_per_step": float(out.tokens_per_step),
    "rl/steps_mean": float(np.mean(out.num_steps)),
    "rl/zero_adv_fraction": float(np.mean(np.all(adv.reshape(-1, group) == 0, 1))),
    "rl/sampler_logprob_gap": gap,
  }


def _rl_step(
  run,
  method,
  model,
  tokenizer,
  pool,
  encoded,
  sampler_cfg,
  mesh,
  shardings,
  *,
  functions,
  ref_params,
  schedule,
):
  """The RL step function `step(state, i) -> (state, host metrics)` (`trainer.Hooks.step`):
  rollouts, rewards, pi_old, rl.inner_updates updates of `functions` (`make_functions`, jitted
  here on the mesh); the RL metrics of the module doc."""
  r = run.rl
  group, num_prompts, mu = int(r.group_size), int(r.prompts_per_step), int(r.inner_updates)
  rows_sharding = sharding.batch_sharding(mesh)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  score, ref_fn, update = functions
  score = jax.jit(score, in_shardings=(shardings.params, rows_sharding))
  ref_fn = jax.jit(ref_fn, in_shardings=(shardings.params, rows_sharding))
  update = jax.jit(
    update,
    in_shardings=(
      shardings.params,
      shardings.opt_state,
      rows_sharding,
      rows_sharding,
      rows_sharding,
      rows_sharding,
      shardings.params if ref_params is not None else None,
    ),
    out_shardings=(shardings.params, shardings.opt_state, None),
    donate_argnums=(0, 1),
  )
  programs0 = compiles.compiled_programs()

  def step(state: RLState, i: int):
    t0 = time.time()
    rng, k_prompt, k_sample = jax.random.split(_rng(state), 3)
    draw = np.random.default_rng(np.asarray(jax.random.key_data(k_prompt)).tolist())
    chosen = draw.integers(0, len(pool), num_prompts)
    rows = [int(c) for c in chosen for _ in range(group)]
    prompts = [encoded[c] for c in rows]
    if int(r.continuous_slots):  # rows in input order: every group complete
      out = decoding.continuous_for(method, sampler_cfg)(
        model, state.params, prompts, sampler_cfg, k_sample, slots=int(r.continuous_slots)
      ).result
    else:
      out = decoding.sampler_for(method)(model, state.params, prompts, sampler_cfg, k_sample)
    t_sample = time.time() - t0
    rollout = host = scoring.rollout_from_output(out)
    texts = [tokenizer.decode(g) for g in out.generated]
    refs = [pool[c].answer for c in rows]
    reward = rewards.compute(r.reward, texts, refs, out.num_steps, float(r.step_cost))
    correct = np.array([accuracy.exact_match(t, a, "hash") for t, a in zip(texts, refs)])
    adv_host = np.asarray(objective.group_advantages(reward, group, float(r.adv_eps)))
    rollout = jax.device_put(rollout, rows_sharding)
    adv = jax.device_put(adv_host, rows_sharding)
    old_logp = score(state.params, rollout)
    ref = ref_fn(ref_params, rollout) if ref_params is not None else None
    params, opt_state, inner = state.params, state.opt_state, []
    for _ in range(mu):
      params, opt_state, m = update(params, opt_state, rollout, adv, old_logp, ref, ref_params)
      inner.append(m)
    state = RLState(
      step=state.step + 1,
      params=params,
      ema_params=params,
      opt_state=opt_state,
      rng=jax.device_put(np.asarray(jax.random.key_data(rng)), replicated),
    )
    inner = placement.to_host(inner)  # the same on every process
    inner = {k: float(np.mean([m[k] for m in inner])) for k in inner[0]}
    values = {
      **_rollout_metrics(out, host, reward, correct, adv_host, group, old_logp),
      **{f"rl/{k}": v for k, v in inner.items()},
      "rl/lr": float(schedule(i * mu)),
      "rl/rollout_tokens_per_sec": sum(len(g) for g in out.generated) / max(t_sample, 1e-9),
      "rl/compiled_programs": float(
        compiles.compiled_programs()
        - programs0
        + score._cache_size()
        + update._cache_size()
        + ref_fn._cache_size()
      ),
      "rl/step_seconds": time.time() - t0,
    }
    return state, values

  return step


__all__ = ["RLState", "train_rl", "make_functions", "TIMING_METRICS"]
