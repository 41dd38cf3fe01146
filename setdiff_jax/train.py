"""Training: TrainState, the pure train step, sharded setup, and `train_and_evaluate`.

One loop serves every method of the registry (`setdiff_jax.methods`); they differ only in what
their entry owns (loss, order / noise draw, sampler). Setup is two functions used by the loop, the
benchmarks and the tests alike:

  state, shardings = create_sharded_state(config, model_cfg, mesh)   # born in its shardings
  step_fn = jit_train_step(config, model, obj_cfg, mesh, shardings)  # donated state

Parameters, EMA and optimizer state are sharded by the logical-axis rules of `sharding.py` (FSDP
over the model dimension, tensor parallelism over heads / MLP / vocabulary; replicated on a
data-only mesh), the batch over data x fsdp, so the same code runs on 1 CPU, 8 emulated devices,
a GPU or a TPU slice. The eval is the likelihood code of `setdiff_jax.evaluation.likelihood`, the same as
`launch/evaluate.py --eval=likelihood`.
"""
from __future__ import annotations

import functools
import json
import os
import signal
import time
from typing import Any, Callable, Dict, Optional, Tuple

from absl import logging
import flax
import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from setdiff_jax import decoding, errors, methods, models, paths, sharding
from setdiff_jax.workdir import fallback
from setdiff_jax.workdir.divergence import DivergenceGuard, logged_losses
from setdiff_jax.workdir import checkpoints as checkpointing
from setdiff_jax.evaluation import likelihood
from setdiff_jax.diffusion import losses
from setdiff_jax.interop import pretrained
from setdiff_jax.workdir import config as run_config
from setdiff_jax.workdir import lock as workdir_lock
from setdiff_jax.workdir import load as workdir_lib
from setdiff_jax.data import pipeline, tokenizers
from setdiff_jax.models import Backbone, BackboneConfig

EVAL_SEED = likelihood.DEFAULT_SEED  # one fixed order / t draw per eval sequence (seed 1)


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


def create_train_state(config, model_cfg: BackboneConfig, rng) -> TrainState:
  params = models.init_params(model_cfg, rng)
  opt_state = make_optimizer(config).init(params)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    ema_params=jax.tree_util.tree_map(jnp.copy, params), opt_state=opt_state)


# --------------------------------------------------------------------------------- steps
def make_train_step(config, model: Backbone, obj_cfg: losses.ObjectiveConfig,
                    optimizer: optax.GradientTransformation) -> Callable:
  """Pure step(state, batch, base_rng) -> (state, metrics); rng = fold_in(base_rng, step)."""
  accum = int(config.grad_accum_steps)
  ema_decay = float(config.ema_decay)
  schedule = learning_rate_schedule(config)

  method = methods.get(obj_cfg.name)

  def loss_fn(params, batch, rng):
    return method.loss(obj_cfg, model, params, batch, rng, train=True)

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
      (grads, metrics), micro_losses = jax.lax.scan(body, (zeros, zero_metrics),
                                              (micro, jnp.arange(accum)))
      grads = jax.tree_util.tree_map(lambda g: g / accum, grads)
      loss = jnp.mean(micro_losses)
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


def create_sharded_state(config, model_cfg: BackboneConfig, mesh) -> Tuple[TrainState, Any]:
  """The initial TrainState created directly in its shardings (never whole on one device).

  Returns (state, state_shardings); shardings follow the config's logical-axis rules.
  """
  init_rng = jax.random.key(config.seed)
  init_fn = functools.partial(create_train_state, config, model_cfg)
  shardings = sharding.state_shardings(jax.eval_shape(init_fn, init_rng), mesh,
                                       sharding.rules_from_config(config))
  return jax.jit(init_fn, out_shardings=shardings)(init_rng), shardings


def jit_train_step(config, model: Backbone, obj_cfg: losses.ObjectiveConfig, mesh,
                   state_shardings, optimizer: Optional[optax.GradientTransformation] = None):
  """`make_train_step` jitted with the state's and the batch's shardings, state donated.

  Call as step(state, batch, base_rng) -> (state, metrics); batches from `sharding.global_batch`.
  """
  step = make_train_step(config, model, obj_cfg, optimizer or make_optimizer(config))
  return jax.jit(step, in_shardings=(state_shardings, sharding.batch_sharding(mesh), None),
                 out_shardings=(state_shardings, None), donate_argnums=(0,))


# --------------------------------------------------------------------------------- writers
class MetricWriter:
  """TensorBoard events (tensorboardX) + WORKDIR/metrics.jsonl; no-op off process 0.

  metrics.jsonl goes through `setdiff_jax.paths` (object stores included); TensorBoard events
  are written for local workdirs only (an object-store workdir keeps metrics.jsonl)."""

  def __init__(self, workdir: str, enabled: bool):
    self.enabled = enabled
    self._tb = None
    self._jsonl = None
    if enabled:
      if not paths.is_remote(workdir):
        from tensorboardX import SummaryWriter
        self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
      self._jsonl = paths.AppendFile(paths.join(workdir, "metrics.jsonl"))

  def scalars(self, step: int, values: Dict[str, float]):
    if not self.enabled:
      return
    for k, v in values.items():
      if self._tb is not None:
        self._tb.add_scalar(k, float(v), step)
    self._jsonl.write(json.dumps({"step": int(step), **{k: float(v) for k, v in values.items()}})
                      + "\n")
    self._jsonl.flush()
    if self._tb is not None:
      self._tb.flush()

  def texts(self, step: int, tag: str, texts):
    if not self.enabled or self._tb is None:
      return
    for i, t in enumerate(texts):
      self._tb.add_text(f"{tag}/{i}", t, step)
    self._tb.flush()

  def close(self):
    if self.enabled:
      if self._tb is not None:
        self._tb.close()
      self._jsonl.close()


class _Preemption:
  """Records SIGTERM and a first SIGINT (Ctrl-C) so the loop saves a checkpoint and stops; a
  second SIGINT aborts at once (exit status 130; checkpoints saved before are intact)."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.requested = False
    self.signum: Optional[int] = None
    self._previous = {}

  def __enter__(self):
    for sig in self.SIGNALS:
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread
        pass
    return self

  @property
  def name(self) -> str:
    return signal.Signals(self.signum).name if self.signum else "a signal"

  def _handle(self, signum, frame):
    del frame
    if self.requested and signum == signal.SIGINT:
      os.write(2, b"aborted: second SIGINT; checkpoints saved before are intact (the one being "
                  b"written, if any, is not used)\n")
      os._exit(128 + signal.SIGINT)
    logging.warning("%s received: saving a checkpoint, then exiting%s.",
                    signal.Signals(signum).name,
                    " (Ctrl-C again aborts at once)" if signum == signal.SIGINT else "")
    self.requested = True
    self.signum = signum

  def __exit__(self, *exc):
    for sig, previous in self._previous.items():
      if previous is not None:
        signal.signal(sig, previous)


# --------------------------------------------------------------------------------- loop
def _check_finite(step: int, metrics: Dict[str, float]):
  bad = {k: v for k, v in metrics.items() if not np.isfinite(v)}
  if bad:
    raise FloatingPointError(
        f"non-finite training metrics at step {step}: {bad}. Training stopped; the last saved "
        f"checkpoint is intact. Try a lower learning_rate, grad_clip_norm > 0, or model.dtype="
        f"float32.")


def evaluate(model: Backbone, params, obj_cfg: losses.ObjectiveConfig, tokens: np.ndarray,
             attention_mask: np.ndarray, *, batch_size: int, batch_sharding=None,
             context_mask: Optional[np.ndarray] = None) -> Dict[str, float]:
  """The likelihood bound of `setdiff_jax.evaluation.likelihood` (per-row keys, seed EVAL_SEED) on given rows.

  Same function, rows and seed as `launch/evaluate.py --eval=likelihood --max_rows=N`, so the two
  agree exactly for the same checkpoint. Prompt tokens (`context_mask`) are never targets: a
  prompt/answer run's eval/nll is an answer-token NLL. Returns eval/{nll, ppl, bpd, num_tokens}.
  """
  nll, count = likelihood.sequence_nlls(model, params, obj_cfg, tokens, attention_mask,
                                        seed=EVAL_SEED, batch_size=batch_size,
                                        sharding=batch_sharding, context_mask=context_mask)
  tokens_total = float(np.sum(count))
  values = {f"eval/{k}": v for k, v in likelihood.per_token(float(np.sum(nll[0])),
                                                             tokens_total).items()}
  values["eval/num_tokens"] = tokens_total
  return values


def eval_rows_for(config, tokenizer) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The rows the in-training eval uses: the first num_eval_steps x eval_batch_size rows of the
  eval split in split order (all of them for num_eval_steps = -1), as (tokens, attention_mask,
  context_mask) (`likelihood.eval_rows`)."""
  max_rows = None if config.num_eval_steps < 0 else config.num_eval_steps * config.eval_batch_size
  return likelihood.eval_rows(config, tokenizer, max_rows=max_rows)


def _pauses_ahead(config, step_done: int, num_steps: int, pauses) -> float:
  """Seconds the evals and saves still to come take (each as long as the latest one); those of
  `step_done` itself count (the log line comes before them)."""
  total = 0.0
  for kind, every in (("eval", config.eval_every_steps), ("save", config.checkpoint_every_steps)):
    if pauses[kind]:
      ahead = num_steps // every - (step_done - 1) // every + (num_steps % every != 0)
      total += max(ahead, 0) * pauses[kind][-1]  # the latest: the first one also compiles
  return total


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> Dict[str, float]:
  """Trains (resuming from WORKDIR/checkpoints if present) and evaluates; returns last metrics.

  Holds WORKDIR's lock throughout (one trainer per workdir) and refuses, before anything is
  written, a resume whose config changes a field the checkpoints depend on.
  """
  if config.get("init_from_hf"):  # model fields 0 -> the HF checkpoint's (before validation)
    config = pretrained.resolve_run_config(config)
  run_config.validate_config(config, jax.device_count())
  workdir = paths.resolve(workdir)
  workdir_lock.check_new_workdir(config, workdir)
  if jax.process_index() == 0:
    paths.makedirs(workdir)
  with workdir_lock.WorkdirLock(workdir, jax.process_index()):
    config = workdir_lock.absolute_paths(config)
    workdir_lock.check_resume(config, workdir)
    return _train_and_evaluate(config, workdir)


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> Dict[str, float]:
  is_main = jax.process_index() == 0
  # A tokenizer built here (first run) is written only once the data has been validated below,
  # so a run that fails on its data leaves no derived state for the corrected rerun to reuse.
  new_tokenizer = not tokenizers.saved_in(workdir)
  tokenizer = run_config.build_tokenizer(config, workdir, save=False)
  model_cfg, obj_cfg = run_config.model_and_objective(config, tokenizer)
  model = models.build(model_cfg)
  optimizer = make_optimizer(config)
  mesh = sharding.make_mesh(config.mesh)
  logging.info("mesh %s; model %s; objective %s", dict(mesh.shape), model_cfg, obj_cfg)

  train_iter = iter(pipeline.make_dataset(
      config.data, tokenizer, split="train", seq_len=config.seq_len,
      global_batch_size=config.batch_size, seed=config.seed, process_index=jax.process_index(),
      process_count=jax.process_count(), shuffle=True, num_epochs=None, drop_remainder=True))

  eval_tokens, eval_attention, eval_context = eval_rows_for(config, tokenizer)  # once per run

  # The state is created directly in its shardings (FSDP / tensor-parallel rules): never
  # materialised whole on one device.
  state, state_shardings = create_sharded_state(config, model_cfg, mesh)
  manager = checkpointing.make_manager(workdir, keep=config.keep_checkpoints)
  try:
    restored, _, damaged = fallback.restore_with_fallback(manager, state, train_iter)
    fallback.set_aside(manager, damaged)  # so those steps can be saved again
    if restored is not None:
      state = restored
      logging.info("resumed from %s at step %d", manager.directory, int(state.step))
    elif config.init_from:
      params = workdir_lib.load_params(config.init_from, state.params)
      state = state.replace(params=params, ema_params=jax.tree_util.tree_map(jnp.copy, params))
      logging.info("initialised parameters from %s", config.init_from)
    elif config.get("init_from_hf"):  # tensor by tensor, straight into the state's shardings
      params = pretrained.load_params_sharded(config.init_from_hf, model_cfg,
                                              state_shardings.params)
      ema = jax.device_put(jax.tree_util.tree_map(jnp.copy, params), state_shardings.ema_params)
      state = state.replace(params=params, ema_params=ema)
      logging.info("initialised %d layers from the Hugging Face checkpoint %s",
                   model_cfg.num_layers, config.init_from_hf)
  except BaseException:
    checkpointing.close(manager)  # before the error propagates: no orbax noise at exit
    raise
  if new_tokenizer and not tokenizers.saved_in(workdir):  # the data are validated (datasets
    tokenizers.save_in(tokenizer, workdir)               # and eval rows built); 1 process
  if is_main:  # only now: a failed restore must leave the config of the checkpoints in place
    checkpointing.save_config(config, workdir)

  batch_sharding = sharding.batch_sharding(mesh)
  train_step = jit_train_step(config, model, obj_cfg, mesh, state_shardings, optimizer)
  writer = MetricWriter(workdir, is_main)
  step_rng = jax.random.fold_in(jax.random.key(config.seed), 1)

  start_step = int(state.step)
  num_steps = int(config.num_train_steps)
  last: Dict[str, float] = {}
  pending = None  # metrics of the previous step, pulled one step behind
  window = {"loss": [], "tokens": 0.0, "t0": time.time(), "steps": 0}
  pauses = {"eval": [], "save": []}  # seconds of each eval / save: not training time, but ETA
  t_start = time.time()
  compile_time = None

  guard = DivergenceGuard(config, logged_losses(workdir, start_step) if start_step else ())
  # "healthy": the newest saved step whose loss was seen healthy (the loss of step s + 1 is that
  # of the state saved as step s); rotation never deletes it.
  saved = {"steps": [start_step] if start_step else [], "healthy": start_step or None}

  def diverged() -> str:
    """Sets the saved steps after the newest healthy one aside; says what is kept."""
    suspect = [s for s in saved["steps"] if saved["healthy"] is None or s > saved["healthy"]]
    fallback.set_aside(manager, [(s, "diverged") for s in suspect], suffix=".diverged",
                       log=False)  # the error line says so
    kept = (f"checkpoint step {saved['healthy']} (the newest whose loss was seen healthy) is "
            f"intact" if saved["healthy"] else "no healthy checkpoint was saved")
    moved = (f"; step(s) {suspect}, saved before their loss was seen, were moved to "
             f"checkpoints/<step>.diverged" if suspect else "")
    return kept + moved

  def flush(step_done: int, metrics):
    nonlocal last
    host = {k: float(v) for k, v in jax.device_get(metrics).items()}
    _check_finite(step_done, host)
    if guard.check(step_done, host["loss"], diverged) and step_done - 1 in saved["steps"]:
      saved["healthy"] = step_done - 1
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
      eta = (num_steps - step_done) / max(steps_per_s, 1e-9) + _pauses_ahead(
          config, step_done, num_steps, pauses)
      logging.info("step %d/%d  loss %.4f  %.2f steps/s  %.0f tokens/s  ETA %s", step_done,
                   num_steps, values["train/loss"], steps_per_s, values["train/tokens_per_sec"],
                   time.strftime("%H:%M:%S", time.gmtime(eta)))
      last.update(values)
      window.update(loss=[], tokens=0.0, t0=time.time(), steps=0)

  def run_eval(step_done: int):
    params = state.ema_params if config.eval_params == "ema" else state.params
    values = evaluate(model, params, obj_cfg, eval_tokens, eval_attention,
                      batch_size=config.eval_batch_size, batch_sharding=batch_sharding,
                      context_mask=eval_context)
    writer.scalars(step_done, values)
    logging.info("eval at step %d: nll %.4f  ppl %.2f  bpd %.4f", step_done, values["eval/nll"],
                 values["eval/ppl"], values["eval/bpd"])
    last.update(values)
    if config.num_eval_samples <= 0:
      return
    samples = decoding.generate_text(model, params, tokenizer, obj_cfg, config.seq_len,
                                     config.num_eval_samples,
                                     jax.random.fold_in(jax.random.key(config.seed), step_done))
    for i, text in enumerate(samples):
      logging.info("sample %d at step %d: %s", i, step_done, text)
    writer.texts(step_done, "samples", samples)

  def save(step_done: int):
    if guard.should_defer(step_done, final=step_done == num_steps):
      return
    checkpointing.save(manager, step_done, state, train_iter, protect=(saved["healthy"],))
    saved["steps"].append(step_done)
    logging.info("saved checkpoint %s/%d", manager.directory, step_done)

  stopped: Optional[errors.StoppedBySignal] = None
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
          window["t0"] += compile_time  # steps/s (and the ETA) without compilation
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
          kept = (f"checkpoint {manager.directory}/{step_done} saved" if saved["steps"] and
                  saved["steps"][-1] == step_done else
                  f"no checkpoint saved at this step (last: {saved['steps'][-1:] or 'none'})")
          stopped = errors.StoppedBySignal(
              f"{preemption.name} at step {step_done}/{num_steps}; {kept}. Run the same "
              "command again to resume", preemption.signum)
          break
        for kind, needed, fn in (("eval", need_eval, run_eval), ("save", need_save, save)):
          if needed:
            t_pause = time.time()
            fn(step_done)
            pauses[kind].append(time.time() - t_pause)
            window["t0"] += pauses[kind][-1]  # the next steps/s excludes the pause
      if pending is not None:
        flush(*pending)
    if start_step >= num_steps and num_steps > 0:
      logging.info("nothing to do: checkpoint step %d >= num_train_steps %d", start_step,
                   num_steps)
    logging.info("training finished in %.1fs", time.time() - t_start)
  finally:
    try:
      writer.close()
    except OSError as e:  # e.g. the disk is full: do not hide the error that got us here
      logging.warning("closing the metric writer failed: %s", e)
    checkpointing.close(manager)
  if stopped is not None:  # after the cleanup: one `stopped:` line, exit status 128 + signal
    raise stopped
  last["step"] = int(state.step)
  return last
