"""Training (SFT): `train_and_evaluate`, the step function and hooks every method of the registry
shares, run by `setdiff_jax.trainer` (the loop SFT and GRPO share).

The step is the jitted one of `train_step.py` (TrainState, optimizer, sharded setup); the hooks log
the mean loss, steps/s, tokens/s and ETA, evaluate with `evaluation.likelihood.evaluate` (the same
bound and rows as `launch/evaluate.py --eval=likelihood`) and write sample texts. The trainer
resumes from WORKDIR/checkpoints, guards against NaN and divergence, saves checkpoints (with the
data iterator's state) and saves then stops on SIGTERM / Ctrl-C.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Dict

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from setdiff_jax import decoding, models, objectives, paths, sharding, trainer
from setdiff_jax.config import edge
from setdiff_jax.config import run as run_config
from setdiff_jax.config.run import RunConfig
from setdiff_jax.config.sections import Evaluation, Loss
from setdiff_jax.train_step import create_sharded_state, jit_train_step, make_optimizer
from setdiff_jax.workdir.divergence import DivergenceGuard, logged_losses
from setdiff_jax.workdir import metrics as metrics_lib
from setdiff_jax.workdir.metrics import MetricWriter
from setdiff_jax.workdir import checkpoints as checkpointing
from setdiff_jax.workdir import data_files
from setdiff_jax.evaluation import likelihood
from setdiff_jax.interop import pretrained
from setdiff_jax.workdir import load as workdir_lib
from setdiff_jax.workdir import lock as workdir_lock
from setdiff_jax.workdir.tokenizer import build_tokenizer, check_same_ids
from setdiff_jax.data import data_flags, pipeline, text_files, tokenizers


# --------------------------------------------------------------------------------- loop
def _pauses_ahead(cfg: RunConfig, step_done: int, num_steps: int, pauses) -> float:
  """Seconds the evals and saves still to come take (each as long as the latest one); those of
  `step_done` itself count (the log line comes before them)."""
  total = 0.0
  cadence = (
    ("eval", cfg.evaluation.eval_every_steps),
    ("save", cfg.checkpoints.checkpoint_every_steps),
  )
  for kind, every in cadence:
    if pauses[kind]:
      ahead = num_steps // every - (step_done - 1) // every + (num_steps % every != 0)
      total += max(ahead, 0) * pauses[kind][-1]  # the latest: the first one also compiles
  return total


def schedule_warning(opt) -> str:
  """The learning-rate schedule a run will not follow ('' when it will): warmup longer than the
  run is legal (a run extended later) but rarely meant, and said nowhere else."""
  if opt.warmup_steps <= opt.num_train_steps:
    return ""
  return (
    f"warmup_steps={opt.warmup_steps} > num_train_steps={opt.num_train_steps}: the learning "
    f"rate never reaches learning_rate={opt.learning_rate:g} (it ends at "
    f"{100.0 * opt.num_train_steps / opt.warmup_steps:.0f}% of it) and its decay never starts; "
    "set --config.warmup_steps below num_train_steps for the configured schedule"
  )


class _Progress:
  """The training log: mean loss, steps/s, tokens/s and ETA over the steps since the last line,
  the time of compilation, evaluations and saves left out (`pause`)."""

  def __init__(self, cfg: RunConfig, writer: MetricWriter, last: Dict[str, float]):
    self.cfg, self.writer, self.last = cfg, writer, last
    self.num_steps = cfg.optimization.num_train_steps
    self.pauses = {"eval": [], "save": []}  # seconds of each: not training time, but ETA
    self._reset()

  def _reset(self):
    self.losses, self.tokens, self.steps, self.t0 = [], 0.0, 0, time.time()

  def pause(self, kind: str, seconds: float):
    if kind in self.pauses:
      self.pauses[kind].append(seconds)
    self.t0 += seconds  # the next steps/s excludes the pause

  def log(self, step_done: int, host: Dict[str, float]):
    self.losses.append(host["loss"])
    self.tokens += host["clean_tokens"]
    self.steps += 1
    self.host = host
    if step_done % self.cfg.evaluation.log_every_steps == 0 or step_done == self.num_steps:
      self._write(step_done)

  def flush(self, step_done: int):
    """A stop after `step_done`: the steps since the last row get their (shorter) row."""
    if self.steps:
      self._write(step_done)

  def _write(self, step_done: int):
    host = self.host
    elapsed = max(time.time() - self.t0, 1e-9)
    steps_per_s = self.steps / elapsed
    values = {
      "train/loss": float(np.mean(self.losses)),
      "train/grad_norm": host["grad_norm"],
      "train/lr": host["lr"],
      "train/steps_per_sec": steps_per_s,
      "train/tokens_per_sec": self.tokens / elapsed,
    }
    self.writer.scalars(step_done, values)
    eta = (self.num_steps - step_done) / max(steps_per_s, 1e-9) + _pauses_ahead(
      self.cfg, step_done, self.num_steps, self.pauses
    )
    logging.info(
      "step %d/%d  loss %.4f  %.2f steps/s  %.0f tokens/s  ETA %s",
      step_done,
      self.num_steps,
      values["train/loss"],
      steps_per_s,
      values["train/tokens_per_sec"],
      time.strftime("%H:%M:%S", time.gmtime(eta)),
    )
    self.last.update(values)
    self._reset()


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> Dict[str, float]:
  """Trains (resuming from WORKDIR/checkpoints if present) and evaluates; returns last metrics.

  Holds WORKDIR's lock throughout (one trainer per workdir) and refuses, before anything is
  written, a resume whose config changes a field the checkpoints depend on.
  """
  if "model" not in config:  # an RL config (its model is the SFT run's) or a half-written one
    raise ValueError(
      "invalid config: it has no model section; "
      + (
        "it is an RL config: run it with launch/rl.py (--config.rl.init_from=SFT_WORKDIR)"
        if "rl" in config
        else "build it on configs/default.py's get_config() (see configs/tiny_sw.py)"
      )
    )
  if config.get("init_from_hf"):  # model fields 0 -> the HF checkpoint's (a resume: WORKDIR's)
    config = pretrained.resolve_run_config(config, workdir)
  edge.from_config_dict(config, jax.device_count())  # every check, before the workdir is touched
  data_flags.check_fields(config.data, pipeline.default_data_config())  # no setting left unread
  objectives.check_loss_fields(config, dataclasses.asdict(Loss()))  # nor a loss setting
  run_config.check_tokenizer_fields(config)  # nor a tokenizer setting
  return trainer.locked(config, workdir, _train_and_evaluate)


def warn_shared_eval_files(data) -> list:
  """Warns (and returns them) when data.eval_paths names a file data.paths also trains on: the
  eval NLL / PPL (and an accuracy eval of its pairs) would be measured on training data."""
  if data.get("source") not in ("text", "jsonl", "pairs_jsonl"):
    return []
  train_files = {paths.resolve(p) for p in text_files.parse_paths(data.get("paths"))}
  shared = [
    p for p in text_files.parse_paths(data.get("eval_paths")) if paths.resolve(p) in train_files
  ]
  if shared:
    logging.warning(
      "data.eval_paths %s also in data.paths: the eval numbers are measured on training data; "
      "hold out an eval file",
      ", ".join(shared),
    )
  return shared


JSON_SUFFIXES = (".jsonl", ".json")


def warn_json_read_as_text(data) -> list:
  """Warns (and returns them) when data.source=text names a .jsonl / .json file (also compressed):
  every line would be trained on as text, braces and field names included."""
  if data.get("source") != "text":
    return []
  named = text_files.parse_paths(data.get("paths")) + text_files.parse_paths(data.get("eval_paths"))
  found = [p for p in named if text_files.content_name(p).lower().endswith(JSON_SUFFIXES)]
  if found:
    logging.warning(
      "data.source=text reads %s as plain text (each line, braces and field names included); "
      "for JSON lines set --config.data.source=jsonl (and data.jsonl_field)",
      ", ".join(found),
    )
  return found


def _initialise(cfg: RunConfig, model_cfg, state_shardings):
  """The state of a run without checkpoints: its own init, or parameters from `init_from` /
  `init_from_hf` (EMA = a copy of them)."""
  init_from, init_from_hf = cfg.checkpoints.init_from, cfg.checkpoints.init_from_hf

  def initialise(state):
    if init_from:
      params = workdir_lib.load_params(init_from, state.params)
      logging.info("initialised parameters from %s", init_from)
      return state.replace(params=params, ema_params=jax.tree_util.tree_map(jnp.copy, params))
    if init_from_hf:  # tensor by tensor, straight into the state's shardings
      params = pretrained.load_params_sharded(init_from_hf, model_cfg, state_shardings.params)
      ema = jax.device_put(jax.tree_util.tree_map(jnp.copy, params), state_shardings.ema_params)
      logging.info(
        "initialised %d layers from the Hugging Face checkpoint %s",
        model_cfg.num_layers,
        init_from_hf,
      )
      return state.replace(params=params, ema_params=ema)
    return state

  return initialise


def _evaluator(cfg: RunConfig, model, obj_cfg, tokenizer, eval_rows, writer, last, batch_sharding):
  """The eval hook: the likelihood bound on the run's eval rows (`likelihood.eval_rows`, the
  first `evaluation.max_rows`), logged and written, then `num_eval_samples` sample texts."""
  eval_tokens, eval_attention, eval_context = eval_rows
  settings: Evaluation = cfg.evaluation

  def run_eval(step_done: int, state):
    params = state.ema_params if settings.eval_params == "ema" else state.params
    values = likelihood.evaluate(
      model,
      params,
      obj_cfg,
      eval_tokens,
      eval_attention,
      batch_size=settings.eval_batch_size,
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
    if settings.num_eval_samples <= 0:
      return
    samples = decoding.generate_text(
      model,
      params,
      tokenizer,
      obj_cfg,
      cfg.seq_len,
      settings.num_eval_samples,
      jax.random.fold_in(jax.random.key(cfg.seed), step_done),
    )
    for i, text in enumerate(samples):
      logging.info("sample %d at step %d: %s", i, step_done, text)
    writer.texts(step_done, "samples", samples)

  return run_eval


def _logged_eval(workdir: str, step: int) -> Dict[str, float]:
  """The `eval/*` values metrics.jsonl holds for `step` (none if it was never evaluated)."""
  values = {}
  for row in metrics_lib.rows(workdir):
    if row["step"] == step:
      values.update({k: v for k, v in row.items() if k.startswith("eval/")})
  return values


def _check_trained_vocab_size(cfg: RunConfig, tokenizer, workdir: str, new: bool):
  """Where the run trains its tokenizer: a new one smaller than tokenizer.vocab_size (a corpus
  too small for that many tokens; the model gets the tokenizer's size) is said in a warning; one
  found in the workdir before any checkpoint (a first attempt's, or copied in) of another size
  is refused. A resume's tokenizer/ is the one its checkpoints were trained with, whatever its
  size (the resume check compares tokenizer.*)."""
  want = int(cfg.tokenizer.get("vocab_size", 0) or 0)
  if cfg.tokenizer.kind != "trained" or not want or tokenizer.vocab_size == want:
    return
  if new:
    logging.warning(
      "the tokenizer trained on the data has %d tokens, fewer than tokenizer.vocab_size=%d "
      "(the corpus holds no more): the model's vocabulary is %d",
      tokenizer.vocab_size,
      want,
      tokenizer.vocab_size,
    )
  else:
    raise ValueError(
      f"{workdir}/tokenizer/ holds a {tokenizer.vocab_size}-token tokenizer (an earlier attempt's, "
      f"or copied in) but tokenizer.vocab_size={want}: delete that folder to train one with "
      f"these settings, or set --config.tokenizer.vocab_size={tokenizer.vocab_size}"
    )


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> Dict[str, float]:
  """The run of `config` (its local paths made absolute; it is written as config.json)."""
  is_main = jax.process_index() == 0
  cfg = run_config.from_config_dict(config)
  opt = cfg.optimization
  # A tokenizer built here (first run) is written only once the data has been validated below,
  # so a run that fails on its data leaves no derived state for the corrected rerun to reuse.
  new_tokenizer = not tokenizers.saved_in(workdir)
  resuming = bool(workdir_lock.saved_steps(workdir))  # never a new tokenizer for old checkpoints
  data_prints = data_files.check(cfg.data, workdir, resuming)  # an edited file refuses a resume
  tokenizer = build_tokenizer(cfg, workdir, save=False, allow_training=not resuming)
  if cfg.checkpoints.init_from and not resuming:  # its parameters must mean the same ids
    check_same_ids(tokenizer, cfg.checkpoints.init_from, "--config.init_from")
  warn_shared_eval_files(cfg.data)
  warn_json_read_as_text(cfg.data)
  if not resuming:
    _check_trained_vocab_size(cfg, tokenizer, workdir, new=new_tokenizer)
  model_cfg, obj_cfg = run_config.model_and_objective(cfg, tokenizer)
  model = models.build(model_cfg)
  optimizer = make_optimizer(opt)
  mesh = sharding.make_mesh(cfg.mesh.sizes())
  logging.info("mesh %s; model %s; objective %s", dict(mesh.shape), model_cfg, obj_cfg)
  if warning := schedule_warning(opt):
    logging.warning(warning)

  train_iter = iter(
    pipeline.make_dataset(
      cfg.data,
      tokenizer,
      split="train",
      seq_len=cfg.seq_len,
      global_batch_size=opt.batch_size,
      seed=cfg.seed,
      process_index=jax.process_index(),
      process_count=jax.process_count(),
      shuffle=True,
      num_epochs=None,
      drop_remainder=True,
    )
  )

  # built once per run
  eval_rows = likelihood.eval_rows(cfg, tokenizer, max_rows=cfg.evaluation.max_rows)

  # The state is created directly in its shardings (FSDP / tensor-parallel rules): never
  # materialised whole on one device.
  state, state_shardings = create_sharded_state(cfg, model_cfg, mesh)
  manager = checkpointing.make_manager(workdir, keep=cfg.checkpoints.keep_checkpoints)
  state = trainer.restore(manager, state, train_iter, _initialise(cfg, model_cfg, state_shardings))
  if new_tokenizer and not tokenizers.saved_in(workdir):  # the data are validated (datasets
    tokenizers.save_in(tokenizer, workdir)  # and eval rows built); 1 process
  finished = int(state.step) >= opt.num_train_steps  # nothing to train (the loop says so)
  # Only now: a failed restore must leave the config of the checkpoints in place, and so must a
  # resume with nothing to train (e.g. a smaller num_train_steps than the saved step's).
  if is_main and not finished:
    checkpointing.save_config(config, workdir)
    data_files.save(workdir, data_prints)

  batch_sharding = sharding.batch_sharding(mesh)
  train_step = jit_train_step(opt, model, obj_cfg, mesh, state_shardings, optimizer)
  start_step = int(state.step)
  writer = MetricWriter(workdir, is_main, start_step=start_step)
  step_rng = jax.random.fold_in(jax.random.key(cfg.seed), 1)
  last: Dict[str, float] = {}
  if finished:  # the final evaluation ran in the invocation that trained: its row says it
    last.update(_logged_eval(workdir, start_step))
  progress = _Progress(cfg, writer, last)

  def step(state, i: int):
    del i  # the step's randomness folds in state.step
    batch = sharding.global_batch(next(train_iter), mesh)
    return train_step(state, batch, step_rng)

  evaluate = _evaluator(cfg, model, obj_cfg, tokenizer, eval_rows, writer, last, batch_sharding)
  hooks = trainer.Hooks(
    step=step,
    log=progress.log,
    flush_log=progress.flush,
    evaluate=evaluate,
    on_pause=progress.pause,
  )
  schedule = trainer.Schedule(
    start=start_step,
    stop=opt.num_train_steps,
    total=opt.num_train_steps,
    save_every=cfg.checkpoints.checkpoint_every_steps,
    eval_every=cfg.evaluation.eval_every_steps,
  )
  if start_step and schedule.eval_at(start_step):  # a stop at an eval step, its eval unwritten
    logged = metrics_lib.logged_at(workdir, start_step, "eval/nll")
    missing = sharding.agree("eval_first", "1" if not logged else "0")[0] == "1"  # process 0's
    schedule = dataclasses.replace(schedule, eval_first=missing)
  guard = DivergenceGuard(cfg.divergence, logged_losses(workdir, start_step) if start_step else ())
  state, _ = trainer.run(
    state, hooks, schedule, manager=manager, writer=writer, guard=guard, data_iterator=train_iter
  )
  last["step"] = int(state.step)
  return last
