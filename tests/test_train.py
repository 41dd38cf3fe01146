"""The training loop end to end: train_and_evaluate, resume, sharding, validation, NaN, SIGTERM.

Everything is tiny (1 layer x 32 wide, L=32, batch 8-16, a 384-token BPE) so the module runs in a
few minutes on 2 CPU cores with the 8 emulated devices of conftest.py. Most runs train on the
embedded corpus's small validation split (tokenized in 0.2 s instead of 5 s for the train split)
and start from a tokenizer trained once per module and copied into the workdir; the first test
runs the full path (train split, tokenizer trained at first run).
"""

import glob
import json
import os
import signal
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds

from configs import default
from helpers import TINY_VOCAB as VOCAB, assert_trees_close, new_workdir, set_fields
from setdiff_jax import errors, objectives, sharding, train, train_step
from setdiff_jax.workdir import checkpoints as checkpointing
from setdiff_jax.config import edge
from setdiff_jax.config import run as run_config
from setdiff_jax.workdir import load as workdir_lib  # noqa: E402
from setdiff_jax.data import tokenizers  # noqa: E402
from setdiff_jax.models.dit import DiT  # noqa: E402

ADALN = {"setdlm": False, "ar": False, "mdlm": True, "bd3lm": True}


@pytest.fixture(scope="module", autouse=True)
def _fast_compile(compile_cache):
  """Fewer XLA passes and a module-private compilation cache (conftest.compile_cache)."""


def tiny_config(objective="setdlm", **overrides):
  c = default.get_config()
  c.objective = objective
  c.seq_len = 32
  c.model.hidden_size = 32
  c.model.num_layers = 1
  c.model.num_heads = 2
  c.model.cond_dim = 32
  c.model.adaln = ADALN[objective]
  c.model.dropout = 0.0
  c.tokenizer.vocab_size = VOCAB
  c.data.train_split = "validation"  # small and quick to tokenize; the eval split is the same
  c.batch_size = 8
  c.eval_batch_size = 8
  c.num_train_steps = 3
  c.learning_rate = 1e-3
  c.warmup_steps = 1
  c.ema_decay = 0.9
  c.eval_every_steps = 1000  # eval only at the end
  c.num_eval_steps = 2
  c.log_every_steps = 1
  c.checkpoint_every_steps = 1000  # save only at the end
  c.num_eval_samples = 0
  return set_fields(c, overrides)


def read_metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def checkpoint_steps(workdir):
  d = checkpointing.checkpoint_dir(workdir)
  if not os.path.isdir(d):
    return []
  return sorted(int(s) for s in os.listdir(d) if s.isdigit())


def restore_state(workdir, step=None):
  """The full TrainState of a workdir's (latest) checkpoint, as numpy."""
  cfg = run_config.from_config_dict(checkpointing.load_config(workdir))
  tok = tokenizers.Tokenizer.load(os.path.join(workdir, tokenizers.TOKENIZER_SUBDIR))
  model_cfg, _ = run_config.model_and_objective(cfg, tok)
  abstract = jax.eval_shape(
    lambda: train_step.create_train_state(cfg.optimization, model_cfg, jax.random.key(0))
  )
  manager = checkpointing.make_manager(workdir, with_data=False)
  state = checkpointing.restore(manager, abstract, step=step)
  manager.close()
  return jax.device_get(state)


def check_workdir(workdir, config, steps):
  """The documented workdir layout after a run of `steps` steps that evaluated at the end."""
  assert steps in checkpoint_steps(workdir)
  ckpt = os.path.join(workdir, "checkpoints", str(steps))
  assert os.path.isdir(os.path.join(ckpt, "state")) and os.path.isdir(os.path.join(ckpt, "data"))
  rows = read_metrics(workdir)
  train_rows = [r for r in rows if "train/loss" in r]
  eval_rows = [r for r in rows if "eval/nll" in r]
  assert [r["step"] for r in train_rows] == list(range(1, steps + 1))  # log_every_steps=1
  assert all(np.isfinite(r["train/loss"]) and r["train/loss"] > 0 for r in train_rows)
  for key in ("train/grad_norm", "train/lr", "train/steps_per_sec", "train/tokens_per_sec"):
    assert key in train_rows[-1]
  assert eval_rows and eval_rows[-1]["step"] == steps
  last = eval_rows[-1]
  assert np.isfinite(last["eval/nll"]) and last["eval/nll"] > 0
  np.testing.assert_allclose(last["eval/ppl"], np.exp(last["eval/nll"]), rtol=1e-5)
  assert glob.glob(os.path.join(workdir, "tensorboard", "events.out.tfevents.*"))
  saved = checkpointing.load_config(workdir)
  assert saved.objective == config.objective and saved.seq_len == config.seq_len
  assert saved.model.to_dict() == config.model.to_dict()
  tok = tokenizers.Tokenizer.load(os.path.join(workdir, tokenizers.TOKENIZER_SUBDIR))
  assert tok.vocab_size <= VOCAB
  return rows


# ------------------------------------------------------------------------- end to end
def test_train_and_evaluate_embedded(tmp_path):
  """The full path: train split of the embedded corpus, tokenizer trained at first run."""
  config = tiny_config("setdlm", **{"data.train_split": "train", "model.dropout": 0.1})
  workdir = str(tmp_path / "run")
  result = train.train_and_evaluate(config, workdir)
  assert result["step"] == 3
  for key in ("train/loss", "eval/nll", "eval/ppl", "eval/bpd"):
    assert np.isfinite(result[key]), key
  check_workdir(workdir, config, 3)
  state = workdir_lib.load_inference_state(workdir)
  assert state.step == 3 and state.tokenizer.vocab_size == state.model_config.vocab_size
  assert state.objective_config.name == "setdlm"


def test_train_and_evaluate_tfds_lm1b_mock(tmp_path):
  """lm1b through tfds.data_source under mock_data (nothing is downloaded)."""
  config = tiny_config(
    "ar",
    **{
      "data.source": "tfds",
      "data.tfds_name": "lm1b",
      "data.train_split": "train",
      "data.eval_split": "test",
    },
  )
  workdir = str(tmp_path / "run")
  with tfds.testing.mock_data(num_examples=200):
    result = train.train_and_evaluate(config, workdir)
  assert result["step"] == 3 and np.isfinite(result["eval/nll"])
  check_workdir(workdir, config, 3)


@pytest.mark.parametrize("objective", ["ar", "mdlm", "bd3lm"])  # setdlm: the tests above
def test_each_objective_trains(tmp_path, tokenizer_dir, objective):
  config = tiny_config(objective, num_train_steps=2, **{"model.dropout": 0.1})
  workdir = new_workdir(tmp_path, "run", tokenizer_dir)
  result = train.train_and_evaluate(config, workdir)
  assert result["step"] == 2 and np.isfinite(result["train/loss"])
  assert np.isfinite(result["eval/nll"]) and result["eval/nll"] > 0
  assert checkpoint_steps(workdir) == [2]


# ------------------------------------------------------------------------- resume
N = 3  # the interrupted run's length; the full run has 2N steps


def resume_config(num_train_steps):
  # Dropout on and the stochastic setdlm orders: exact resumption needs the per-step rng and
  # the data iterator restored as well as the parameters and optimizer state.
  return tiny_config(
    "setdlm", num_train_steps=num_train_steps, warmup_steps=2, **{"model.dropout": 0.1}
  )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tokenizer_dir):
  """A fresh 2N-step run (the reference for the resume tests, and init_from's source)."""
  workdir = new_workdir(tmp_path_factory.mktemp("fresh"), "run", tokenizer_dir)
  train.train_and_evaluate(resume_config(2 * N), workdir)
  return workdir


def assert_same_run(workdir, reference):
  assert checkpoint_steps(workdir)[-1] == checkpoint_steps(reference)[-1] == 2 * N
  a, b = restore_state(workdir), restore_state(reference)
  assert int(a.step) == int(b.step) == 2 * N
  assert_trees_close(a.params, b.params, atol=1e-6)
  assert_trees_close(a.ema_params, b.ema_params, atol=1e-6)
  assert_trees_close(a.opt_state, b.opt_state, atol=1e-6)
  raw = workdir_lib.load_inference_state(workdir, use_ema=False)
  assert_trees_close(raw.params, b.params, atol=1e-6)
  # The resumed steps saw the same batches and rngs: same losses step by step.
  loss = lambda w: {r["step"]: r["train/loss"] for r in read_metrics(w) if "train/loss" in r}
  got, want = loss(workdir), loss(reference)
  for step in range(1, 2 * N + 1):
    np.testing.assert_allclose(got[step], want[step], rtol=1e-5, err_msg=f"step {step}")


def test_training_eval_equals_evaluate_likelihood(tmp_path, uninterrupted):
  """metrics.jsonl's eval/nll is launch/evaluate.py --eval=likelihood on the same rows and seed."""
  from setdiff_jax.evaluation import run

  config = resume_config(2 * N)
  logged = [r for r in read_metrics(uninterrupted) if "eval/nll" in r][-1]
  assert logged["step"] == 2 * N
  rows = config.num_eval_steps * config.eval_batch_size
  for batch_size in (config.eval_batch_size, 5):  # the bound does not depend on the batching
    opts = run.EvalOptions(num_orders=1, max_rows=rows, batch_size=batch_size)
    record = run.evaluate_workdir(
      uninterrupted, ["likelihood"], opts, log=None, output=str(tmp_path / f"eval{batch_size}.json")
    )
    lik = record["likelihood"]
    assert lik["num_sequences"] == rows and lik["num_tokens"] == logged["eval/num_tokens"]
    assert lik["nll"] == pytest.approx(logged["eval/nll"], rel=1e-6, abs=0)


@pytest.mark.parametrize("pad_targets", ["none", pytest.param("eos", marks=pytest.mark.slow)])
def test_prompt_answer_eval_is_answer_nll_and_equals_evaluate(tmp_path, tokenizer_dir, pad_targets):
  """A prompt/answer run: metrics.jsonl's eval/nll counts the answer tokens (and their EOS) only,
  never the prompt (nor an EOS tail, pad_targets=eos), and equals launch/evaluate.py's value."""
  from setdiff_jax.evaluation import likelihood, run

  config = tiny_config(
    "bd3lm",
    num_train_steps=2,
    seq_len=48,
    **{
      "loss.block_size": 4,
      "data.source": "arithmetic",
      "data.train_split": "train",  # the default: a task source reads no split names
      "data.preprocess": "pad",
      "data.task_train_examples": 64,
      "data.task_eval_examples": 16,
      "data.overflow": "skip",
      "data.pad_targets": pad_targets,
    },
  )
  workdir = new_workdir(tmp_path, "run", tokenizer_dir)
  train.train_and_evaluate(config, workdir)
  logged = [r for r in read_metrics(workdir) if "eval/nll" in r][-1]
  ema = config.eval_params == "ema"  # the parameters the in-training eval used
  state = workdir_lib.load_inference_state(workdir, use_ema=ema)
  tokens, att, ctx = likelihood.eval_rows(state.config, state.tokenizer, max_rows=16)
  answer = att.astype(bool) & ~ctx.astype(bool)
  assert ctx.any() and logged["eval/num_tokens"] == answer.sum()  # BOS is context
  last = (answer.cumsum(-1) == answer.sum(-1, keepdims=True)) & answer
  assert last.sum() == len(tokens) and np.all(
    tokens[last] == state.tokenizer.eos_id
  )  # each row's last scored token is its first EOS
  record = run.evaluate_workdir(
    workdir,
    ["likelihood"],
    run.EvalOptions(num_orders=1, max_rows=16),
    use_ema=ema,
    log=None,
    output=str(tmp_path / "eval.json"),
  )
  lik = record["likelihood"]
  assert lik["num_tokens"] == logged["eval/num_tokens"]
  assert lik["nll"] == pytest.approx(logged["eval/nll"], rel=1e-6, abs=0)


def test_resume_reproduces_uninterrupted_run(tmp_path, tokenizer_dir, uninterrupted):
  workdir = new_workdir(tmp_path, "run", tokenizer_dir)
  first = train.train_and_evaluate(resume_config(N), workdir)
  assert first["step"] == N and checkpoint_steps(workdir) == [N]
  second = train.train_and_evaluate(resume_config(2 * N), workdir)
  assert second["step"] == 2 * N
  assert_same_run(workdir, uninterrupted)
  # Nothing left to do: a third run returns at once without a new checkpoint.
  assert train.train_and_evaluate(resume_config(2 * N), workdir)["step"] == 2 * N
  assert checkpoint_steps(workdir)[-1] == 2 * N


def test_sigterm_saves_and_exits_then_resumes(tmp_path, tokenizer_dir, uninterrupted, monkeypatch):
  """SIGTERM during step N: a checkpoint at N, a clean return, and the rerun finishes exactly."""
  if threading.current_thread() is not threading.main_thread():
    pytest.skip("signal handlers can only be installed from the main thread")
  calls = {"n": 0}
  real_global_batch = sharding.global_batch

  def global_batch(local, mesh):
    calls["n"] += 1
    if calls["n"] == N:  # the batch of step N (1-based): the signal arrives while it runs
      os.kill(os.getpid(), signal.SIGTERM)
    return real_global_batch(local, mesh)

  # Should the loop not install its handler, this one records the signal (instead of the
  # default action killing the test session).
  leaked = []

  def fallback(*args):
    leaked.append(args)

  outer = signal.signal(signal.SIGTERM, fallback)
  try:
    monkeypatch.setattr(sharding, "global_batch", global_batch)
    workdir = new_workdir(tmp_path, "run", tokenizer_dir)
    with pytest.raises(errors.StoppedBySignal) as stopped:  # saved, then a distinct exit
      train.train_and_evaluate(resume_config(2 * N), workdir)
    after = signal.getsignal(signal.SIGTERM)
  finally:
    signal.signal(signal.SIGTERM, outer)
  assert calls["n"] >= N and not leaked, "the loop did not handle SIGTERM itself"
  assert after is fallback  # and it put the previous handler back
  assert stopped.value.exit_code == 143 and f"SIGTERM at step {N}/{2 * N}" in str(stopped.value)
  assert checkpoint_steps(workdir) == [N]
  assert max(r["step"] for r in read_metrics(workdir)) == N
  monkeypatch.setattr(sharding, "global_batch", real_global_batch)
  assert train.train_and_evaluate(resume_config(2 * N), workdir)["step"] == 2 * N
  assert_same_run(workdir, uninterrupted)


def _sigterm_during_batch(n, monkeypatch):
  """SIGTERM while the batch of step `n` (1-based) is fetched: the signal lands in that step."""
  calls = {"n": 0}
  real = sharding.global_batch

  def global_batch(local, mesh):
    calls["n"] += 1
    if calls["n"] == n:
      os.kill(os.getpid(), signal.SIGTERM)
    return real(local, mesh)

  monkeypatch.setattr(sharding, "global_batch", global_batch)
  return lambda: monkeypatch.setattr(sharding, "global_batch", real)


def test_a_sigterm_at_an_eval_step_loses_no_eval_and_no_loss(tmp_path, tokenizer_dir, monkeypatch):
  """Probe round 10: SIGTERM in an eval step saved and stopped without its evaluation, and the
  resume started after it (at the final step: "nothing to do", no eval at all); the losses of
  the steps since the last log row were in no row. Now: the checkpoint, then the step's
  evaluation, a row for the pending steps; a resume whose entry evaluation is missing (a kill
  during it) evaluates first. Every step's loss in exactly one row, every eval step once."""
  if threading.current_thread() is not threading.main_thread():
    pytest.skip("signal handlers can only be installed from the main thread")
  config = tiny_config("setdlm", num_train_steps=4, eval_every_steps=3, log_every_steps=2)
  workdir = new_workdir(tmp_path, "run", tokenizer_dir)
  restore = _sigterm_during_batch(3, monkeypatch)
  with pytest.raises(errors.StoppedBySignal, match="SIGTERM at step 3/4"):
    train.train_and_evaluate(config, workdir)
  restore()
  rows = read_metrics(workdir)
  assert [r["step"] for r in rows if "train/loss" in r] == [2, 3]  # 3: the steps since row 2
  assert [r["step"] for r in rows if "eval/nll" in r] == [3]
  # A kill during that evaluation would have left no row: the resume evaluates step 3 first.
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows if "eval/nll" not in r)
  assert train.train_and_evaluate(config, workdir)["step"] == 4
  rows = read_metrics(workdir)
  assert [r["step"] for r in rows if "train/loss" in r] == [2, 3, 4]
  assert [r["step"] for r in rows if "eval/nll" in r] == [3, 4]
  final = [r for r in read_metrics(workdir) if r["step"] == 4 and "eval/nll" in r][0]
  again = train.train_and_evaluate(config, workdir)  # done: nothing evaluated again ...
  assert again["step"] == 4 and [r["step"] for r in read_metrics(workdir) if "eval/nll" in r] == [
    3,
    4,
  ]
  assert again["eval/ppl"] == final["eval/ppl"]  # ... and "done:" says the final step's PPL
  # A rerun with fewer steps has nothing to train: config.json stays the checkpoints' own.
  saved = open(os.path.join(workdir, "config.json"), "rb").read()
  config.num_train_steps = 2
  assert train.train_and_evaluate(config, workdir)["step"] == 4
  assert open(os.path.join(workdir, "config.json"), "rb").read() == saved


def test_init_from_starts_from_those_parameters(tmp_path, uninterrupted):
  # Same tokenizer as the source (fine-tuning keeps the vocabulary); the warm-up's lr at step 0
  # is 0, so the one step keeps the parameters and the checkpoint shows what the run started from.
  workdir = new_workdir(
    tmp_path, "finetune", os.path.join(uninterrupted, tokenizers.TOKENIZER_SUBDIR)
  )
  config = resume_config(1)
  config.init_from = uninterrupted
  config.warmup_steps = 1  # learning_rate must be > 0 (issue 23); lr(step 0) = 0 all the same
  assert train.train_and_evaluate(config, workdir)["step"] == 1
  assert checkpoint_steps(workdir) == [1]  # a new run: step 0 -> 1, not 2N -> 2N + 1
  got, source = restore_state(workdir), restore_state(uninterrupted)
  assert int(got.step) == 1
  assert_trees_close(got.params, source.params, atol=0)
  assert_trees_close(got.ema_params, source.params, atol=1e-6)  # EMA restarts from the params
  # Not vacuous: the source was trained away from the seed's initialisation.
  init = train_step.create_train_state(
    run_config.from_config_dict(config).optimization,
    model_config_of(uninterrupted),
    jax.random.key(0),
  )
  assert not np.allclose(init.params["head"]["kernel"], source.params["head"]["kernel"])


def model_config_of(workdir):
  cfg = run_config.from_config_dict(checkpointing.load_config(workdir))
  tok = tokenizers.Tokenizer.load(os.path.join(workdir, tokenizers.TOKENIZER_SUBDIR))
  return run_config.model_and_objective(cfg, tok)[0]


# ------------------------------------------------------------------------- NaN guard
def test_nan_loss_stops_without_checkpointing_the_bad_state(tmp_path, tokenizer_dir):
  # lr 1e30 after a good first step: the parameters explode and the step-2 loss is not finite.
  config = tiny_config(
    "ar",
    num_train_steps=4,
    checkpoint_every_steps=1,
    warmup_steps=0,
    learning_rate=1e30,
    grad_clip_norm=0.0,
  )
  workdir = new_workdir(tmp_path, "run", tokenizer_dir)
  with pytest.raises(FloatingPointError, match="non-finite training metrics at step 2") as e:
    train.train_and_evaluate(config, workdir)
  # The state of step 2 was never saved; step 1's (its loss is step 2's: non-finite, exploded
  # parameters) is set aside, not offered to a resume as intact (probe round 10).
  assert checkpoint_steps(workdir) == []
  assert os.path.isdir(os.path.join(checkpointing.checkpoint_dir(workdir), "1.diverged"))
  assert "no healthy checkpoint was saved; step(s) [1], saved before their loss" in str(e.value)
  assert [r["step"] for r in read_metrics(workdir)] == [1]


def test_nan_from_objective_stops_at_first_step(tmp_path, tokenizer_dir, monkeypatch):
  method = objectives.get("ar")
  real = method.loss

  def poisoned(cfg, model, params, batch, rng, *, train):
    loss, metrics = real(cfg, model, params, batch, rng, train=train)
    return loss * jnp.nan, dict(metrics, loss=loss * jnp.nan)

  monkeypatch.setattr(method, "loss", poisoned)
  config = tiny_config("ar", num_train_steps=2, checkpoint_every_steps=1)
  workdir = new_workdir(tmp_path, "run", tokenizer_dir)
  with pytest.raises(FloatingPointError, match="step 1"):
    train.train_and_evaluate(config, workdir)
  assert checkpoint_steps(workdir) == []


# ------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
  "objective, overrides, field",
  [
    ("bd3lm", {"loss.block_size": 5}, "block_size"),
    ("setdlm", {"loss.max_set_size": 64}, "max_set_size"),
    ("setdlm", {"batch_size": 12}, "batch_size"),  # 12 rows on 8 devices
    ("setdlm", {"batch_size": 16, "grad_accum_steps": 4}, "grad_accum_steps"),  # micro-batch 4
    ("setdlm", {"eval_batch_size": 4}, "eval_batch_size"),
    ("mdlm", {"model.adaln": False}, "adaln"),
    ("ar", {"model.adaln": True}, "adaln"),
    ("setdlm", {"objective": "gpt"}, "objective"),
    ("setdlm", {"model.num_heads": 3}, "num_heads"),
    ("setdlm", {"lr_schedule": "linear"}, "lr_schedule"),
    ("setdlm", {"data.source": "hf"}, "data.source"),
    ("setdlm", {"mesh.data": 3}, "mesh"),
  ],
)
def test_config_validation_errors(tmp_path, objective, overrides, field, monkeypatch):
  compiled = []
  monkeypatch.setattr(jax, "jit", lambda *a, **k: compiled.append(a) or pytest.fail("jit"))
  config = set_fields(tiny_config(objective), overrides)
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=field):
    train.train_and_evaluate(config, str(workdir))
  assert not workdir.exists() and not compiled  # raised before anything was written or built


def test_valid_configs_pass_validation():
  for objective in objectives.NAMES:
    edge.from_config_dict(tiny_config(objective), num_devices=8)
  edge.from_config_dict(tiny_config("setdlm", batch_size=16, grad_accum_steps=2), num_devices=8)
  edge.from_config_dict(tiny_config("setdlm", batch_size=12), num_devices=4)


# ------------------------------------------------------------------------- sharded step
def random_batch(tok, batch_size, seq_len, seed=0, with_order=False):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(5, tok.vocab_size, (batch_size, seq_len)).astype(np.int32)
  tokens[:, 0] = tok.bos_id
  mask = np.ones((batch_size, seq_len), np.int32)
  for i in range(0, batch_size, 3):  # some rows padded at the end
    n = seq_len - 1 - (i % 7)
    tokens[i, n:] = tok.pad_id
    mask[i, n:] = 0
  batch = {"tokens": tokens, "attention_mask": mask}
  if with_order:  # a fixed SetDLM order makes the objective deterministic
    order = np.stack(
      [np.concatenate([[0], 1 + rng.permutation(seq_len - 1)]) for _ in range(batch_size)]
    ).astype(np.int32)
    batch["order"] = order
  return batch


def step_setup(tok, objective, **overrides):
  cfg = run_config.from_config_dict(tiny_config(objective, warmup_steps=0, **overrides))
  model_cfg, obj_cfg = run_config.model_and_objective(cfg, tok)
  opt = cfg.optimization
  step = train_step.make_train_step(opt, DiT(model_cfg), obj_cfg, train_step.make_optimizer(opt))
  state = train_step.create_train_state(opt, model_cfg, jax.random.key(0))
  return step, state


def run_step(step, state, batch, mesh):
  """One step jitted with the loop's shardings on `mesh` (not donated: state is reused)."""
  rep, data = sharding.replicated(mesh), sharding.batch_sharding(mesh)
  fn = jax.jit(step, in_shardings=(rep, data, None), out_shardings=(rep, None))
  placed = jax.device_put(batch, data)
  assert len(placed["tokens"].sharding.device_set) == mesh.size
  new_state, metrics = fn(jax.device_put(state, rep), placed, jax.random.key(7))
  return jax.device_get(new_state), jax.device_get(metrics)


def mesh_of(n):
  return sharding.make_mesh({"data": n, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:n])


def assert_same_step(a, b, atol=1e-5):
  (state_a, m_a), (state_b, m_b) = a, b
  for key in ("loss", "nll_sum", "num_tokens", "grad_norm", "clean_tokens"):
    np.testing.assert_allclose(m_a[key], m_b[key], rtol=1e-5, atol=atol, err_msg=key)
  assert int(state_a.step) == int(state_b.step) == 1
  assert_trees_close(state_a.params, state_b.params, atol=atol)
  assert_trees_close(state_a.ema_params, state_b.ema_params, atol=atol)


@pytest.mark.parametrize("objective", ["setdlm", pytest.param("mdlm", marks=pytest.mark.slow)])
def test_step_on_8_devices_equals_1_device(tok, objective):
  """Sampled orders / t / masks and dropout come from fold_in(rng, step): device-independent."""
  assert jax.device_count() == 8
  step, state = step_setup(tok, objective, **{"model.dropout": 0.1})
  batch = random_batch(tok, 16, 32)
  one, eight = run_step(step, state, batch, mesh_of(1)), run_step(step, state, batch, mesh_of(8))
  assert_same_step(one, eight)
  # The step did something: parameters moved.
  assert not np.allclose(one[0].params["head"]["kernel"], state.params["head"]["kernel"])


def test_ema_follows_the_parameters_by_hand(tok):
  """Two steps with ema_decay 0.9: ema_1 = 0.9 p_0 + 0.1 p_1, ema_2 = 0.9 ema_1 + 0.1 p_2 (the
  EMA of the parameters after each update, starting from the initial ones)."""
  step, state = step_setup(tok, "ar", ema_decay=0.9)
  mesh = mesh_of(1)
  batch = random_batch(tok, 8, 32)
  p0 = state.params
  s1, _ = run_step(step, state, batch, mesh)
  s2, _ = run_step(step, s1, random_batch(tok, 8, 32, seed=1), mesh)
  by_hand = lambda e, p: 0.9 * np.asarray(e) + 0.1 * np.asarray(p)  # noqa: E731
  ema1 = jax.tree_util.tree_map(by_hand, p0, s1.params)
  assert_trees_close(s1.ema_params, ema1, atol=1e-6)
  assert_trees_close(s2.ema_params, jax.tree_util.tree_map(by_hand, ema1, s2.params), atol=1e-6)
  assert not np.allclose(s2.ema_params["head"]["kernel"], s2.params["head"]["kernel"])


@pytest.mark.parametrize("objective", ["ar", "setdlm"])
def test_grad_accumulation_equals_full_batch(tok, objective):
  """With a deterministic loss (ar, or setdlm with a given order; dropout 0), the mean of the
  gradients of 2 equal micro-batches is the full-batch gradient, and the loss their mean."""
  batch = random_batch(tok, 16, 32, with_order=objective == "setdlm")
  mesh = mesh_of(8)
  full_step, state = step_setup(tok, objective, batch_size=16)
  accum_step, _ = step_setup(tok, objective, batch_size=16, grad_accum_steps=2)
  assert_same_step(
    run_step(full_step, state, batch, mesh), run_step(accum_step, state, batch, mesh)
  )
