"""Training: `train_and_evaluate`, the loop that every method of the registry shares.

The loop resumes from WORKDIR/checkpoints, runs the jitted step of `train_step.py` (TrainState,
optimizer, sharded setup) with metrics pulled one step behind, guards against NaN and divergence,
evaluates with `evaluation.likelihood.evaluate` (the same bound and rows as `launch/evaluate.py
--eval=likelihood`), writes metrics with `workdir.metrics.MetricWriter`, saves checkpoints, and
saves then stops on SIGTERM / Ctrl-C (`workdir.preemption`).
"""

from __future__ import annotations

import time
from typing import Dict, Optional

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from setdiff_jax import decoding, errors, models, paths, sharding
from setdiff_jax.train_step import create_sharded_state, jit_train_step, make_optimizer
from setdiff_jax.workdir import fallback, stopping
from setdiff_jax.workdir.divergence import DivergenceGuard, logged_losses
from setdiff_jax.workdir.metrics import MetricWriter
from setdiff_jax.workdir.preemption import Preemption
from setdiff_jax.workdir import checkpoints as checkpointing
from setdiff_jax.evaluation import likelihood
from setdiff_jax.interop import pretrained
from setdiff_jax.workdir import config as run_config
from setdiff_jax.workdir import lock as workdir_lock
from setdiff_jax.workdir import load as workdir_lib
from setdiff_jax.data import pipeline, tokenizers


# --------------------------------------------------------------------------------- loop
def _check_finite(step: int, metrics: Dict[str, float]):
  bad = {k: v for k, v in metrics.items() if not np.isfinite(v)}
  if bad:
    raise FloatingPointError(
      f"non-finite training metrics at step {step}: {bad}. Training stopped; the last saved "
      f"checkpoint is intact. Try a lower learning_rate, grad_clip_norm > 0, or model.dtype="
      f"float32."
    )


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

  train_iter = iter(
    pipeline.make_dataset(
      config.data,
      tokenizer,
      split="train",
      seq_len=config.seq_len,
      global_batch_size=config.batch_size,
      seed=config.seed,
      process_index=jax.process_index(),
      process_count=jax.process_count(),
      shuffle=True,
      num_epochs=None,
      drop_remainder=True,
    )
  )

  # The eval rows, built once per run.
  eval_tokens, eval_attention, eval_context = likelihood.eval_rows_for(config, tokenizer)

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
      params = pretrained.load_params_sharded(
        config.init_from_hf, model_cfg, state_shardings.params
      )
      ema = jax.device_put(jax.tree_util.tree_map(jnp.copy, params), state_shardings.ema_params)
      state = state.replace(params=params, ema_params=ema)
      logging.info(
        "initialised %d layers from the Hugging Face checkpoint %s",
        model_cfg.num_layers,
        config.init_from_hf,
      )
  except BaseException:
    checkpointing.close(manager)  # before the error propagates: no orbax noise at exit
    raise
  if new_tokenizer and not tokenizers.saved_in(workdir):  # the data are validated (datasets
    tokenizers.save_in(tokenizer, workdir)  # and eval rows built); 1 process
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
    """Says what is kept; the saved steps after the newest healthy one are set aside once the
    stop is agreed (`stop.on_error`, on every process)."""
    suspect = [s for s in saved["steps"] if saved["healthy"] is None or s > saved["healthy"]]
    stop.on_error = lambda: fallback.set_aside(  # the error line says so
      manager, [(s, "diverged") for s in suspect], suffix=".diverged", log=False, sync=True
    )
    kept = (
      f"checkpoint step {saved['healthy']} (the newest whose loss was seen healthy) is intact"
      if saved["healthy"]
      else "no healthy checkpoint was saved"
    )
    moved = (
      f"; step(s) {suspect}, saved before their loss was seen, were moved to "
      f"checkpoints/<step>.diverged"
      if suspect
      else ""
    )
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
      values = {
        "train/loss": float(np.mean(window["loss"])),
        "train/grad_norm": host["grad_norm"],
        "train/lr": host["lr"],
        "train/steps_per_sec": steps_per_s,
        "train/tokens_per_sec": window["tokens"] / elapsed,
      }
      writer.scalars(step_done, values)
      eta = (num_steps - step_done) / max(steps_per_s, 1e-9) + _pauses_ahead(
        config, step_done, num_steps, pauses
      )
      logging.info(
        "step %d/%d  loss %.4f  %.2f steps/s  %.0f tokens/s  ETA %s",
        step_done,
        num_steps,
        values["train/loss"],
        steps_per_s,
        values["train/tokens_per_sec"],
        time.strftime("%H:%M:%S", time.gmtime(eta)),
      )
      last.update(values)
      window.update(loss=[], tokens=0.0, t0=time.time(), steps=0)

  def run_eval(step_done: int):
    params = state.ema_params if config.eval_params == "ema" else state.params
    values = likelihood.evaluate(
      model,
      params,
      obj_cfg,
      eval_tokens,
      eval_attention,
      batch_size=config.eval_batch_size,
      batch_sharding=batch_sharding,
      context_mask=eval_context,
    )
    writer.scalars(step_done, values)
    logging.info(
      "eval at step %d: nll %.4f  ppl %.2f  bpd %.4f",
      step_done,
      values["eval/nll"],
      values["eval/ppl"],
      values["eval/bpd"],
    )
    last.update(values)
    if config.num_eval_samples <= 0:
      return
    samples = decoding.generate_text(
      model,
      params,
      tokenizer,
      obj_cfg,
      config.seq_len,
      config.num_eval_samples,
      jax.random.fold_in(jax.random.key(config.seed), step_done),
    )
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
    with Preemption() as preemption:
      # Every stop decision is agreed across processes (stopping.py): the loop acts on `agree`.
      stop = stopping.StopAgreement(preemption)
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
          stop.check(flush, *pending)
        pending = (step + 1, metrics)
        step_done = step + 1
        need_save = step_done % config.checkpoint_every_steps == 0 or step_done == num_steps
        need_eval = step_done % config.eval_every_steps == 0 or step_done == num_steps
        signalled = stop.agree()
        if need_save or need_eval or signalled:
          stop.check(flush, *pending)  # never save or evaluate a state whose loss was not checked
          pending = None
          stop.agree()
        if signalled:  # save first: the grace period after SIGTERM is short
          save(step_done)
          kept = (
            f"checkpoint {manager.directory}/{step_done} saved"
            if saved["steps"] and saved["steps"][-1] == step_done
            else f"no checkpoint saved at this step (last: {saved['steps'][-1:] or 'none'})"
          )
          stopped = errors.StoppedBySignal(
            f"{signalled} at step {step_done}/{num_steps}; {kept}. Run the same "
            "command again to resume",
            preemption.signum,
          )
          break
        for kind, needed, fn in (("eval", need_eval, run_eval), ("save", need_save, save)):
          if needed:
            t_pause = time.time()
            fn(step_done)
            pauses[kind].append(time.time() - t_pause)
            window["t0"] += pauses[kind][-1]  # the next steps/s excludes the pause
      if pending is not None:
        stop.check(flush, *pending)
        stop.agree()
    if start_step >= num_steps and num_steps > 0:
      logging.info("nothing to do: checkpoint step %d >= num_train_steps %d", start_step, num_steps)
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
