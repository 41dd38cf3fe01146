"""Training: TrainState, pure train/eval steps, and `train_and_evaluate(config, workdir)`.

One loop serves all four objectives (setdlm, ar, mdlm, bd3lm); they differ only in the loss
(`objectives.py`). The step is jitted once with shardings on a device mesh (batch over
data x fsdp, state replicated), so the same code runs on 1 CPU, 8 emulated devices, a GPU or a
TPU slice; the state is donated.
"""
from __future__ import annotations

import functools
import json
import math
import os
import signal
import time
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

from absl import logging
import flax
import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from setdiff_jax import checkpointing, objectives, sharding
from setdiff_jax.data import pipeline, sources, tokenizers
from setdiff_jax.model import DiT, DiTConfig

EVAL_SEED = 1  # one fixed order / t draw per eval sequence, as the reference (seed 1)


# --------------------------------------------------------------------------------- config
def validate_config(config: ml_collections.ConfigDict, num_devices: Optional[int] = None):
  """Raises ValueError naming the conflicting fields, before anything is built or compiled."""
  def check(ok, msg):
    if not ok:
      raise ValueError(f"invalid config: {msg}")

  check(config.objective in objectives.OBJECTIVES,
        f"objective={config.objective!r}; expected one of {objectives.OBJECTIVES}")
  check(config.seq_len >= 4, f"seq_len={config.seq_len} is too short")
  loss = config.loss
  if config.objective == "setdlm":
    s_max = loss.max_set_size or 2 * loss.desired_set_size
    check(s_max <= config.seq_len,
          f"objective=setdlm with desired_set_size={loss.desired_set_size} needs "
          f"max_set_size (= {s_max}, 0 means 2S) <= seq_len={config.seq_len}")
    check(1 <= loss.desired_set_size <= s_max,
          f"loss.desired_set_size={loss.desired_set_size} must be in [1, max_set_size={s_max}]")
  if config.objective == "bd3lm":
    check(config.seq_len % loss.block_size == 0,
          f"objective=bd3lm needs loss.block_size={loss.block_size} to divide seq_len={config.seq_len}")
    check(config.model.adaln, "objective=bd3lm uses the adaLN DiT (set model.adaln=True), as the "
          "reference's LM1B baseline")
  if config.objective == "mdlm":
    check(config.model.adaln, "objective=mdlm uses the adaLN DiT (set model.adaln=True)")
  if config.objective in ("setdlm", "ar"):
    check(not config.model.adaln, f"objective={config.objective} uses the DiT without adaLN "
          "(set model.adaln=False)")
  check(config.model.hidden_size % config.model.num_heads == 0,
        f"model.hidden_size={config.model.hidden_size} is not divisible by "
        f"model.num_heads={config.model.num_heads}")
  check(config.grad_accum_steps >= 1, "grad_accum_steps must be >= 1")
  check(config.batch_size % config.grad_accum_steps == 0,
        f"batch_size={config.batch_size} is not divisible by grad_accum_steps={config.grad_accum_steps}")
  check(config.lr_schedule in ("constant", "cosine"),
        f"lr_schedule={config.lr_schedule!r}; expected constant or cosine")
  check(0.0 <= config.ema_decay < 1.0, f"ema_decay={config.ema_decay} must be in [0, 1)")
  check(config.eval_params in ("ema", "raw"), f"eval_params={config.eval_params!r}; ema or raw")
  check(config.num_train_steps >= 0, "num_train_steps must be >= 0")
  for field in ("eval_every_steps", "checkpoint_every_steps", "log_every_steps"):
    check(config[field] >= 1, f"{field} must be >= 1")
  if num_devices is not None:
    mesh_sizes = sharding.mesh_shape(config.mesh, num_devices)
    divisor = mesh_sizes[0] * mesh_sizes[1]
    micro = config.batch_size // config.grad_accum_steps
    check(micro % divisor == 0,
          f"micro-batch batch_size/grad_accum_steps={micro} must be divisible by the "
          f"data x fsdp mesh size {divisor}")
    check(config.eval_batch_size % divisor == 0,
          f"eval_batch_size={config.eval_batch_size} must be divisible by the data x fsdp mesh "
          f"size {divisor}")
  pipeline.validate_data_config(config.data)
  tokenizers.validate_tokenizer_config(config.tokenizer)


def build_tokenizer(config, workdir: Optional[str], *, allow_training: bool = True):
  """The run's tokenizer (saved in / loaded from WORKDIR/tokenizer/)."""
  train_texts = None
  if allow_training:
    train_texts = lambda: sources.tokenizer_training_texts(config.data, max_docs=200_000)
  return tokenizers.get_tokenizer(config.tokenizer, workdir, train_texts=train_texts)


def model_and_objective(config, tokenizer) -> Tuple[DiTConfig, objectives.ObjectiveConfig]:
  """Backbone and objective configs; the vocabulary and special ids come from the tokenizer."""
  vocab = int(config.model.vocab_size) or tokenizer.vocab_size
  if vocab < tokenizer.vocab_size:
    raise ValueError(f"model.vocab_size={vocab} is smaller than the tokenizer's "
                     f"{tokenizer.vocab_size}; set model.vocab_size=0 to take it from the tokenizer")
  model_cfg = DiTConfig.from_config({**config.model.to_dict(), "vocab_size": vocab})
  loss = config.loss.to_dict()
  loss["max_set_size"] = loss.get("max_set_size") or None
  obj = objectives.ObjectiveConfig.from_config({
      **loss, "name": config.objective, "mask_token_id": tokenizer.mask_id,
      "pad_token_id": tokenizer.pad_id, "eos_token_id": tokenizer.eos_id})
  obj.validate(config.seq_len)
  return model_cfg, obj


# --------------------------------------------------------------------------------- state
class TrainState(flax.struct.PyTreeNode):
  step: jax.Array
  params: Any
  ema_params: Any
  opt_state: Any


def learning_rate_schedule(config) -> optax.Schedule:
  """Linear warm-up from 0, then constant or cosine to cosine_alpha * peak (SPEC §5)."""
  peak, warmup = config.learning_rate, config.warmup_steps
  warm = optax.linear_schedule(0.0, peak, max(warmup, 1))
  if config.lr_schedule == "constant":
    after = optax.constant_schedule(peak)
  else:
    after = optax.cosine_decay_schedule(peak, max(config.num_train_steps - warmup, 1),
                                        alpha=config.cosine_alpha)
  return optax.join_schedules([warm, after], [warmup])


def make_optimizer(config) -> optax.GradientTransformation:
  """Clip -> Adam -> decoupled weight decay scaled by lr/peak (Composer DecoupledAdamW) -> lr."""
  schedule = learning_rate_schedule(config)
  parts = []
  if config.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(config.grad_clip_norm))
  parts.append(optax.scale_by_adam(b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps))
  if config.weight_decay > 0:
    parts.append(optax.add_decayed_weights(config.weight_decay / config.learning_rate))
  parts.append(optax.scale_by_learning_rate(schedule))
  return optax.chain(*parts)


def init_model_params(model_cfg: DiTConfig, rng, seq_len: int):
  model = DiT(model_cfg)
  tokens = jnp.zeros((1, seq_len), jnp.int32)
  positions = jnp.arange(seq_len, dtype=jnp.int32)[None]
  return model.init(rng, tokens, positions, jnp.ones((1, seq_len, seq_len), bool))["params"]


def create_train_state(config, model_cfg: DiTConfig, rng) -> TrainState:
  params = init_model_params(model_cfg, rng, 8)
  opt_state = make_optimizer(config).init(params)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    ema_params=jax.tree_util.tree_map(jnp.copy, params), opt_state=opt_state)


# --------------------------------------------------------------------------------- steps
def make_train_step(config, model: DiT, obj_cfg: objectives.ObjectiveConfig,
                    optimizer: optax.GradientTransformation) -> Callable:
  """Pure step(state, batch, base_rng) -> (state, metrics); rng = fold_in(base_rng, step)."""
  accum = int(config.grad_accum_steps)
  ema_decay = float(config.ema_decay)
  schedule = learning_rate_schedule(config)

  def loss_fn(params, batch, rng):
    return objectives.compute_loss(obj_cfg, model, params, batch, rng, train=True)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def step(state: TrainState, batch, base_rng):
    rng = jax.random.fold_in(base_rng, state.step)
    if accum == 1:
      (loss, metrics), grads = grad_fn(state.params, batch, rng)
    else:
      # Micro-batch a takes rows a, a + accum, ... so every device keeps an equal share.
      micro = jax.tree_util.tree_map(
          lambda x: x.reshape((x.shape[0] // accum, accum) + x.shape[1:]).swapaxes(0, 1), batch)

      def body(carry, xs):
        mb, i = xs
        (l, m), g = grad_fn(state.params, mb, jax.random.fold_in(rng, i))
        return jax.tree_util.tree_map(jnp.add, carry, (g, m)), l

      zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)
      zero_metrics = jax.tree_util.tree_map(
          jnp.zeros_like, jax.eval_shape(lambda: loss_fn(state.params, jax.tree_util.tree_map(
              lambda x: x[0], micro), rng)[1]))
      (grads, metrics), losses = jax.lax.scan(body, (zeros, zero_metrics),
                                              (micro, jnp.arange(accum)))
      grads = jax.tree_util.tree_map(lambda g: g / accum, grads)
      loss = jnp.mean(losses)
      metrics = dict(metrics, loss=loss)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    ema = jax.tree_util.tree_map(lambda e, p: ema_decay * e + (1.0 - ema_decay) * p,
                                 state.ema_params, params)
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads), lr=schedule(state.step),
                   clean_tokens=jnp.sum(batch["attention_mask"]).astype(jnp.float32))
    return TrainState(step=state.step + 1, params=params, ema_params=ema,
                      opt_state=opt_state), metrics

  return step


def make_eval_step(model: DiT, obj_cfg: objectives.ObjectiveConfig) -> Callable:
  """Pure eval(params, batch, rng) -> summed metrics (likelihood bound, dropout off)."""
  def step(params, batch, rng):
    _, metrics = objectives.compute_loss(obj_cfg, model, params, batch, rng, train=False)
    return metrics
  return step


def summarize_eval(totals: Dict[str, float], prefix: str = "eval") -> Dict[str, float]:
  """Dataset-level NLL (nats/token), PPL, BPD from summed nll and token counts."""
  nll = totals["nll_sum"] / max(totals["num_tokens"], 1.0)
  return {f"{prefix}/nll": nll, f"{prefix}/ppl": float(math.exp(min(nll, 700.0))),
          f"{prefix}/bpd": nll / math.log(2.0),
          f"{prefix}/loss": totals["loss_sum"] / max(totals["num_batches"], 1),
          f"{prefix}/num_tokens": totals["num_tokens"]}


# --------------------------------------------------------------------------------- writers
class MetricWriter:
  """TensorBoard events (tensorboardX) + WORKDIR/metrics.jsonl; no-op off process 0."""

  def __init__(self, workdir: str, enabled: bool):
    self.enabled = enabled
    self._tb = None
    self._jsonl = None
    if enabled:
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
      self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")

  def scalars(self, step: int, values: Dict[str, float]):
    if not self.enabled:
      return
    for k, v in values.items():
      self._tb.add_scalar(k, float(v), step)
    self._jsonl.write(json.dumps({"step": int(step), **{k: float(v) for k, v in values.items()}})
                      + "\n")
    self._jsonl.flush()
    self._tb.flush()

  def texts(self, step: int, tag: str, texts):
    if not self.enabled:
      return
    for i, t in enumerate(texts):
      self._tb.add_text(f"{tag}/{i}", t, step)
    self._tb.flush()

  def close(self):
    if self.enabled:
      self._tb.close()
      self._jsonl.close()


class _Preemption:
  """Records SIGTERM so the loop can save a checkpoint and exit cleanly."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def __enter__(self):
    try:
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    except ValueError:  # not the main thread
      self._previous = None
    return self

  def _handle(self, signum, frame):
    del signum, frame
    logging.warning("SIGTERM received: saving a checkpoint, then exiting.")
    self.requested = True

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


# --------------------------------------------------------------------------------- loop
def _check_finite(step: int, metrics: Dict[str, float]):
  bad = {k: v for k, v in metrics.items() if not np.isfinite(v)}
  if bad:
    raise FloatingPointError(
        f"non-finite training metrics at step {step}: {bad}. Training stopped; the last saved "
        f"checkpoint is intact. Try a lower learning_rate, grad_clip_norm > 0, or model.dtype="
        f"float32.")


def _maybe_samples(config, model, params, tokenizer, obj_cfg, rng):
  """A few decoded samples for the log and TensorBoard (empty if the sampler is unavailable)."""
  if config.num_eval_samples <= 0:
    return []
  try:
    from setdiff_jax import sampling
    generate_text = sampling.generate_text
  except (ImportError, AttributeError):
    return []
  return generate_text(model, params, tokenizer, obj_cfg, config.seq_len,
                       config.num_eval_samples, rng)


def evaluate(eval_fn, params, batches: Iterator, mesh, num_steps: int) -> Dict[str, float]:
  """Runs the eval step over `num_steps` batches (-1 = until exhausted) and sums metrics."""
  totals = {"nll_sum": 0.0, "num_tokens": 0.0, "loss_sum": 0.0, "num_batches": 0}
  base = jax.random.key(EVAL_SEED)
  for i, local in enumerate(batches):
    if 0 <= num_steps <= i:
      break
    m = jax.device_get(eval_fn(params, sharding.global_batch(local, mesh),
                               jax.random.fold_in(base, i)))
    totals["nll_sum"] += float(m["nll_sum"])
    totals["num_tokens"] += float(m["num_tokens"])
    totals["loss_sum"] += float(m["loss"])
    totals["num_batches"] += 1
  return totals


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> Dict[str, float]:
  """Trains (resuming from WORKDIR/checkpoints if present) and evaluates; returns last metrics."""
  validate_config(config, jax.device_count())
  workdir = os.path.abspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  is_main = jax.process_index() == 0
  if is_main:
    checkpointing.save_config(config, workdir)

  tokenizer = build_tokenizer(config, workdir)
  model_cfg, obj_cfg = model_and_objective(config, tokenizer)
  model = DiT(model_cfg)
  optimizer = make_optimizer(config)
  mesh = sharding.make_mesh(config.mesh)
  logging.info("mesh %s; model %s; objective %s", dict(mesh.shape), model_cfg, obj_cfg)

  def data(split, batch_size, shuffle, num_epochs):
    return pipeline.make_dataset(
        config.data, tokenizer, split=split, seq_len=config.seq_len,
        global_batch_size=batch_size, seed=config.seed, process_index=jax.process_index(),
        process_count=jax.process_count(), shuffle=shuffle, num_epochs=num_epochs,
        drop_remainder=True)

  train_iter = iter(data("train", config.batch_size, True, None))

  # The state is created directly in its shardings (FSDP / tensor-parallel rules): never
  # materialised whole on one device.
  init_rng = jax.random.key(config.seed)
  init_fn = functools.partial(create_train_state, config, model_cfg)
  state_shardings = sharding.state_shardings(jax.eval_shape(init_fn, init_rng), mesh,
                                             sharding.rules_from_config(config))
  state = jax.jit(init_fn, out_shardings=state_shardings)(init_rng)
  manager = checkpointing.make_manager(workdir, keep=config.keep_checkpoints)
  restored = checkpointing.restore(manager, state, train_iter)
  if restored is not None:
    state = restored
    logging.info("resumed from %s at step %d", manager.directory, int(state.step))
  elif config.init_from:
    params = checkpointing.load_params(config.init_from, state)
    state = state.replace(params=params, ema_params=jax.tree_util.tree_map(jnp.copy, params))
    logging.info("initialised parameters from %s", config.init_from)

  batch_sharding = sharding.batch_sharding(mesh)
  train_step = jax.jit(make_train_step(config, model, obj_cfg, optimizer),
                       in_shardings=(state_shardings, batch_sharding, None),
                       out_shardings=(state_shardings, None), donate_argnums=(0,))
  eval_step = jax.jit(make_eval_step(model, obj_cfg),
                      in_shardings=(state_shardings.params, batch_sharding, None))
  writer = MetricWriter(workdir, is_main)
  step_rng = jax.random.fold_in(jax.random.key(config.seed), 1)

  start_step = int(state.step)
  num_steps = int(config.num_train_steps)
  last: Dict[str, float] = {}
  pending = None  # metrics of the previous step, pulled one step behind
  window = {"loss": [], "tokens": 0.0, "t0": time.time(), "steps": 0}
  t_start = time.time()
  compile_time = None

  def flush(step_done: int, metrics):
    nonlocal last
    host = {k: float(v) for k, v in jax.device_get(metrics).items()}
    _check_finite(step_done, host)
    window["loss"].append(host["loss"])
    window["tokens"] += host["clean_tokens"]
    window["steps"] += 1
    if step_done % config.log_every_steps == 0 or step_done == num_steps:
      elapsed = max(time.time() - window["t0"], 1e-9)
      steps_per_s = window["steps"] / elapsed
      values = {"train/loss": float(np.mean(window["loss"])), "train/grad_norm": host["grad_norm"],
                "train/lr": host["lr"], "train/steps_per_sec": steps_per_s,
                "train/tokens_per_sec": window["tokens"] / elapsed}
      writer.scalars(step_done, values)
      eta = (num_steps - step_done) / max(steps_per_s, 1e-9)
      logging.info("step %d/%d  loss %.4f  %.2f steps/s  %.0f tokens/s  ETA %s", step_done,
                   num_steps, values["train/loss"], steps_per_s, values["train/tokens_per_sec"],
                   time.strftime("%H:%M:%S", time.gmtime(eta)))
      last.update(values)
      window.update(loss=[], tokens=0.0, t0=time.time(), steps=0)

  def run_eval(step_done: int):
    params = state.ema_params if config.eval_params == "ema" else state.params
    batches = iter(data("eval", config.eval_batch_size, False, 1))
    totals = evaluate(eval_step, params, batches, mesh, config.num_eval_steps)
    if totals["num_batches"] == 0:
      logging.warning("eval split has fewer rows than eval_batch_size=%d; no eval", config.eval_batch_size)
      return
    values = summarize_eval(totals)
    writer.scalars(step_done, values)
    logging.info("eval at step %d: nll %.4f  ppl %.2f  bpd %.4f", step_done, values["eval/nll"],
                 values["eval/ppl"], values["eval/bpd"])
    last.update(values)
    samples = _maybe_samples(config, model, params, tokenizer, obj_cfg,
                             jax.random.fold_in(jax.random.key(config.seed), step_done))
    for i, text in enumerate(samples):
      logging.info("sample %d at step %d: %s", i, step_done, text)
    writer.texts(step_done, "samples", samples)

  def save(step_done: int):
    checkpointing.save(manager, step_done, state, train_iter)
    logging.info("saved checkpoint %s/%d", manager.directory, step_done)

  try:
    with _Preemption() as preemption:
      for step in range(start_step, num_steps):
        local = next(train_iter)
        batch = sharding.global_batch(local, mesh)
        t_dispatch = time.time()
        state, metrics = train_step(state, batch, step_rng)
        if compile_time is None:
          jax.block_until_ready(metrics)
          compile_time = time.time() - t_dispatch
          logging.info("first step (compile + run) took %.1fs", compile_time)
        if pending is not None:
          flush(*pending)
        pending = (step + 1, metrics)
        step_done = step + 1
        need_save = step_done % config.checkpoint_every_steps == 0 or step_done == num_steps
        need_eval = step_done % config.eval_every_steps == 0 or step_done == num_steps
        if need_save or need_eval or preemption.requested:
          flush(*pending)  # never save or evaluate a state whose loss was not checked
          pending = None
        if preemption.requested:  # save first: the grace period after SIGTERM is short
          save(step_done)
          logging.warning("stopped by SIGTERM at step %d", step_done)
          break
        if need_eval:
          run_eval(step_done)
        if need_save:
          save(step_done)
      if pending is not None:
        flush(*pending)
    if start_step >= num_steps and num_steps > 0:
      logging.info("nothing to do: checkpoint step %d >= num_train_steps %d", start_step,
                   num_steps)
    logging.info("training finished in %.1fs", time.time() - t_start)
  finally:
    writer.close()
    with checkpointing._quiet_orbax():
      manager.close()
  last["step"] = int(state.step)
  return last
