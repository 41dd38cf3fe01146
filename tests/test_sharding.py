"""Scaling out (issue 7): FSDP / tensor-parallel sharding on 8 emulated CPU devices.

  * one sharded training step (data=8, fsdp=8, data=2 x fsdp=2 x tensor=2) equals the
    single-device step, and every parameter / EMA / Adam-moment leaf is laid out as the rules say;
  * a run saved on one mesh, restored on another and continued equals the uninterrupted run;
  * `load_inference_state` restores a sharded checkpoint replicated or sharded, and the sampler
    gives the same (greedy) tokens on both;
  * readable errors for a mesh that does not fit the devices and for an indivisible dimension.

The model is tiny (1 layer x 32 wide, L=32, vocabulary 384) so that every sharded dimension
divides by 2 and 8; the module takes well under a minute of compute on 2 CPU cores plus compile
time, which the module-scoped fast-compile settings and compilation cache keep small.
"""

import json
import os
import shutil

import jax
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from configs import default  # the repository root is on sys.path (pytest.ini `pythonpath`)
from helpers import TINY_VOCAB as VOCAB, assert_trees_close, new_workdir, set_fields  # noqa: E402
from setdiff_jax import decoding, sharding, train, train_step  # noqa: E402
from setdiff_jax.workdir import checkpoints as checkpointing
from setdiff_jax.config import run as run_config
from setdiff_jax.workdir import load as workdir_lib  # noqa: E402
from setdiff_jax.data import tokenizers  # noqa: E402
from setdiff_jax.models.dit import DiT  # noqa: E402

MESHES = {
  "data8": {"data": 8, "fsdp": 1, "tensor": 1},
  "fsdp8": {"data": 1, "fsdp": 8, "tensor": 1},
  "d2f2t2": {"data": 2, "fsdp": 2, "tensor": 2},
}


@pytest.fixture(scope="module", autouse=True)
def _fast_compile(compile_cache):
  """Fewer XLA passes and a module-private compilation cache (conftest.compile_cache)."""


def tiny_config(objective="setdlm", mesh="data8", **overrides):
  c = default.get_config()
  c.objective = objective
  c.seq_len = 32
  c.model.vocab_size = VOCAB
  c.model.hidden_size = 32
  c.model.num_layers = 1
  c.model.num_heads = 2
  c.model.cond_dim = 32
  c.model.adaln = objective in ("mdlm", "bd3lm")
  c.model.dropout = 0.1  # on: the sharded step must draw the same dropout masks
  c.tokenizer.vocab_size = VOCAB
  c.data.train_split = "validation"  # small and quick to tokenize
  c.batch_size = 16
  c.eval_batch_size = 8
  c.num_train_steps = 2
  c.learning_rate = 1e-3
  c.warmup_steps = 2
  c.ema_decay = 0.9
  c.eval_every_steps = 1000
  c.num_eval_steps = 1
  c.log_every_steps = 1
  c.checkpoint_every_steps = 1000
  c.num_eval_samples = 0
  c.mesh = dict(MESHES[mesh])
  return set_fields(c, overrides)


def adam_state(opt_state):
  """The ScaleByAdamState inside the optax chain's state tuple."""
  found = [s for s in opt_state if hasattr(s, "mu") and hasattr(s, "nu")]
  assert len(found) == 1
  return found[0]


def random_batch(tok, batch_size, seq_len, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(5, tok.vocab_size, (batch_size, seq_len)).astype(np.int32)
  tokens[:, 0] = tok.bos_id
  mask = np.ones((batch_size, seq_len), np.int32)
  for i in range(0, batch_size, 3):  # some rows padded at the end
    n = seq_len - 1 - (i % 7)
    tokens[i, n:] = tok.pad_id
    mask[i, n:] = 0
  return {"tokens": tokens, "attention_mask": mask}


# ------------------------------------------------------------------------- expected layouts
def expected_specs(mesh_cfg, adaln):
  """Hand-written PartitionSpecs of a few leaves under DEFAULT_RULES (size-1 axes dropped)."""
  f = "fsdp" if mesh_cfg["fsdp"] > 1 else None
  t = "tensor" if mesh_cfg["tensor"] > 1 else None
  specs = {
    ("embed", "embedding"): P(t, None),  # (vocab, embed_lookup): whole over fsdp
    ("blocks_0", "attn_qkv", "kernel"): P(f, t),  # (embed, qkv)
    ("blocks_0", "attn_out", "kernel"): P(t, f),  # (heads, embed)
    ("blocks_0", "mlp_in", "kernel"): P(f, t),  # (embed, mlp)
    ("blocks_0", "mlp_in", "bias"): P(t),  # (mlp,)
    ("blocks_0", "mlp_out", "kernel"): P(t, f),  # (mlp, embed)
    ("blocks_0", "mlp_out", "bias"): P(f),  # (embed,)
    ("head", "kernel"): P(f, t),  # (embed, vocab)
    ("head", "bias"): P(t),  # (vocab,)
    ("blocks_0", "norm1", "scale"): P(),  # not in the table: replicated
  }
  if adaln:
    specs[("blocks_0", "adaln", "kernel")] = P(None, f)  # (cond, modulation)
    specs[("sigma_map", "dense0", "kernel")] = P()
  return specs


def get(tree, names):
  for n in names:
    tree = tree[n]
  return tree


def check_layout(params, mesh, mesh_cfg, adaln, what):
  """Spec and per-device shard shapes of a few leaves; all leaves on all devices."""
  for names, spec in expected_specs(mesh_cfg, adaln).items():
    leaf = get(params, names)
    got = leaf.sharding.spec
    # Trailing Nones are equivalent; compare padded to the leaf's rank.
    pad = lambda s: tuple(s) + (None,) * (leaf.ndim - len(s))
    assert pad(got) == pad(spec), f"{what} {'/'.join(names)}: spec {got}, expected {spec}"
    want_shape = tuple(d // (mesh.shape[a] if a else 1) for d, a in zip(leaf.shape, pad(spec)))
    shards = leaf.addressable_shards
    assert len(shards) == mesh.size, f"{what} {'/'.join(names)}"
    assert {s.data.shape for s in shards} == {want_shape}, (
      f"{what} {'/'.join(names)}: shard shapes {[s.data.shape for s in shards]}, "
      f"expected {want_shape}"
    )
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    assert len(leaf.sharding.device_set) == mesh.size, jax.tree_util.keystr(path)


def test_rules_give_the_documented_specs():
  """The table itself: blocks_0/mlp_in/kernel is (fsdp, tensor), adaLN (None, fsdp), ..."""
  mesh = sharding.make_mesh(MESHES["d2f2t2"])
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  assert sharding.logical_to_spec(("embed", "mlp"), sharding.DEFAULT_RULES, mesh) == P(
    "fsdp", "tensor"
  )
  assert sharding.logical_to_spec(("cond", "modulation"), sharding.DEFAULT_RULES, mesh) == P(
    None, "fsdp"
  )
  # The embedding table is split by vocabulary only: a table sharded over fsdp on the model
  # dimension would give the looked-up activations that sharding instead of the batch's.
  assert sharding.logical_to_spec(
    sharding.PARAM_LOGICAL_AXES[("embed", "embedding")], sharding.DEFAULT_RULES, mesh
  ) == P("tensor", None)
  # Size-1 mesh axes shard nothing and are dropped from specs.
  fsdp8 = sharding.make_mesh(MESHES["fsdp8"])
  assert sharding.logical_to_spec(("embed", "mlp"), sharding.DEFAULT_RULES, fsdp8) == P(
    "fsdp", None
  )
  # -1 takes the remaining devices.
  assert sharding.mesh_shape({"data": 2, "fsdp": -1, "tensor": 2}, 8) == (2, 2, 2)
  # Rules from a config: a custom list, or the defaults when empty.
  c = tiny_config()
  assert sharding.rules_from_config(c) == sharding.DEFAULT_RULES
  c.sharding_rules = (("embed", None), ("mlp", "tensor"))
  assert sharding.rules_from_config(c) == (("embed", None), ("mlp", "tensor"))


# ------------------------------------------------------------------------- one sharded step
def step_and_state(tok, objective):
  """Step and init of `objective`; warm-up off (lr > 0 at step 0) and a random head (the model
  zero-initialises it, which would leave every other gradient of the first step at zero)."""
  config = tiny_config(objective, warmup_steps=0)
  cfg = run_config.from_config_dict(config)
  model_cfg, obj_cfg = run_config.model_and_objective(cfg, tok)
  optimizer = train_step.make_optimizer(cfg.optimization)
  step = train_step.make_train_step(cfg.optimization, DiT(model_cfg), obj_cfg, optimizer)

  def init(rng):
    state = train_step.create_train_state(cfg.optimization, model_cfg, rng)
    head = dict(state.params["head"])
    head["kernel"] = 0.05 * jax.random.normal(jax.random.fold_in(rng, 1), head["kernel"].shape)
    params = dict(state.params, head=head)
    return state.replace(
      params=params,
      ema_params=jax.tree_util.tree_map(lambda x: x, params),
      opt_state=optimizer.init(params),
    )

  return config, step, init


def sharded_step(step, init, batch, mesh_cfg, devices=None):
  """The loop's recipe: state created in its shardings by a jitted init, step jitted with
  in/out shardings, batch from process-local rows. Returns (state, metrics) on device."""
  mesh = sharding.make_mesh(mesh_cfg, devices)
  rng = jax.random.key(0)
  shardings = sharding.state_shardings(jax.eval_shape(init, rng), mesh)
  state = jax.jit(init, out_shardings=shardings)(rng)
  data = sharding.batch_sharding(mesh)
  fn = jax.jit(step, in_shardings=(shardings, data, None), out_shardings=(shardings, None))
  new_state, metrics = fn(state, sharding.global_batch(batch, mesh), jax.random.key(7))
  return mesh, state, new_state, metrics


@pytest.fixture(scope="module")
def single_device_steps(tok):
  """The reference: the same step on a 1-device mesh, per objective (computed lazily)."""
  cache = {}

  def get_ref(objective):
    if objective not in cache:
      _, step, init = step_and_state(tok, objective)
      batch = random_batch(tok, 16, 32)
      _, state0, state1, metrics = sharded_step(
        step, init, batch, {"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1]
      )
      cache[objective] = (jax.device_get(state0), jax.device_get(state1), jax.device_get(metrics))
    return cache[objective]

  return get_ref


@pytest.mark.parametrize(
  "objective, mesh_name",
  [
    ("setdlm", "data8"),
    pytest.param("setdlm", "fsdp8", marks=pytest.mark.slow),
    ("setdlm", "d2f2t2"),
    pytest.param("mdlm", "d2f2t2", marks=pytest.mark.slow),  # the adaLN layers and sigma map
  ],
)
def test_sharded_step_equals_single_device(tok, single_device_steps, objective, mesh_name):
  assert jax.device_count() == 8
  config, step, init = step_and_state(tok, objective)
  batch = random_batch(tok, 16, 32)
  mesh_cfg = MESHES[mesh_name]
  mesh, state0, state1, metrics = sharded_step(step, init, batch, mesh_cfg)
  ref0, ref1, ref_metrics = single_device_steps(objective)
  adaln = config.model.adaln

  # Created sharded (not gathered): the jitted init laid every leaf out by the rules, and the
  # step kept that layout for the parameters, the EMA and both Adam moments.
  for name, state in (("init", state0), ("step", state1)):
    check_layout(state.params, mesh, mesh_cfg, adaln, f"{name} params")
    check_layout(state.ema_params, mesh, mesh_cfg, adaln, f"{name} ema")
    adam = adam_state(state.opt_state)
    check_layout(adam.mu, mesh, mesh_cfg, adaln, f"{name} adam mu")
    check_layout(adam.nu, mesh, mesh_cfg, adaln, f"{name} adam nu")
  assert state1.step.sharding.is_fully_replicated

  # Same initialisation and the same step as on one device.
  assert_trees_close(jax.device_get(state0), ref0, atol=0)
  host = jax.device_get(metrics)
  for key in ("loss", "nll_sum", "num_tokens", "grad_norm", "clean_tokens"):
    np.testing.assert_allclose(host[key], ref_metrics[key], rtol=1e-5, atol=1e-5, err_msg=key)
  new = jax.device_get(state1)
  assert int(new.step) == 1
  assert_trees_close(new.params, ref1.params, atol=1e-5)
  assert_trees_close(new.ema_params, ref1.ema_params, atol=1e-5)
  assert_trees_close(new.opt_state, ref1.opt_state, atol=1e-5)
  # Not vacuous: sharded matrices moved (with adaLN the zero-initialised gates keep the block's
  # own matrices still at the first step, but not the modulation).
  moved = ("adaln", "kernel") if adaln else ("mlp_in", "kernel")
  assert not np.allclose(
    get(new.params["blocks_0"], moved), get(jax.device_get(state0).params["blocks_0"], moved)
  )


def compiled_temp_bytes(step, init, mesh_cfg, batch_size=16, seq_len=32):
  """Per-device temporaries of the compiled step (XLA's buffer assignment), nothing run."""
  mesh = sharding.make_mesh(mesh_cfg)
  abstract = jax.eval_shape(init, jax.random.key(0))
  shardings = sharding.state_shardings(abstract, mesh)
  data = sharding.batch_sharding(mesh)
  state = jax.tree_util.tree_map(
    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
  )
  batch = {
    k: jax.ShapeDtypeStruct((batch_size, seq_len), np.int32, sharding=data)
    for k in ("tokens", "attention_mask")
  }
  fn = jax.jit(step, in_shardings=(shardings, data, None), out_shardings=(shardings, None))
  return fn.lower(state, batch, jax.random.key(7)).compile().memory_analysis().temp_size_in_bytes


def test_fsdp_keeps_activations_batch_sharded(tok):
  """FSDP shards weights, not the batch's activations: its per-device temporaries stay those of
  data parallelism (plus gathered weights). Regression: with the embedding table's model dimension
  sharded over fsdp, XLA gave the looked-up activations that sharding and every device held the
  whole batch's activations (3x the temporaries here, growing with the batch)."""
  _, step, init = step_and_state(tok, "setdlm")
  data8 = compiled_temp_bytes(step, init, MESHES["data8"], batch_size=64)
  fsdp8 = compiled_temp_bytes(step, init, MESHES["fsdp8"], batch_size=64)
  assert fsdp8 <= 1.25 * data8, (fsdp8, data8)


# ------------------------------------------------------------------------- change of mesh
N = 2  # steps before the restart; the full run has 2N


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tokenizer_dir):
  """fsdp=8 for N steps (a copy of it kept at step N), continued on data=2 x fsdp=2 x tensor=2
  to 2N; and the uninterrupted 2N-step run on data=8."""
  base = tmp_path_factory.mktemp("runs")
  reference = new_workdir(base, "reference", tokenizer_dir)
  train.train_and_evaluate(tiny_config(mesh="data8", num_train_steps=2 * N), reference)
  moved = new_workdir(base, "moved", tokenizer_dir)
  first = train.train_and_evaluate(tiny_config(mesh="fsdp8", num_train_steps=N), moved)
  assert first["step"] == N
  at_n = os.path.join(str(base), "fsdp8_at_n")
  shutil.copytree(moved, at_n)
  second = train.train_and_evaluate(tiny_config(mesh="d2f2t2", num_train_steps=2 * N), moved)
  assert second["step"] == 2 * N
  return {"reference": reference, "moved": moved, "fsdp8_at_n": at_n}


def restore_full(workdir, mesh_cfg=None):
  """The whole TrainState of the latest checkpoint, restored onto `mesh_cfg` (default: 1
  device), as numpy."""
  cfg = run_config.from_config_dict(checkpointing.load_config(workdir))
  tok = tokenizers.Tokenizer.load(os.path.join(workdir, tokenizers.TOKENIZER_SUBDIR))
  model_cfg, _ = run_config.model_and_objective(cfg, tok)
  abstract = jax.eval_shape(
    lambda: train_step.create_train_state(cfg.optimization, model_cfg, jax.random.key(0))
  )
  manager = checkpointing.make_manager(workdir, with_data=False)
  state = checkpointing.restore(manager, abstract)
  manager.close()
  return jax.device_get(state)


def train_losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


@pytest.mark.slow  # the `runs` pipeline: three training runs on three meshes
def test_restore_on_another_mesh_continues_exactly(runs):
  a, b = restore_full(runs["moved"]), restore_full(runs["reference"])
  assert int(a.step) == int(b.step) == 2 * N
  assert_trees_close(a.params, b.params, atol=1e-5)
  assert_trees_close(a.ema_params, b.ema_params, atol=1e-5)
  assert_trees_close(a.opt_state, b.opt_state, atol=1e-5)
  got, want = train_losses(runs["moved"]), train_losses(runs["reference"])
  assert sorted(got) == sorted(want) == list(range(1, 2 * N + 1))
  for step in want:
    np.testing.assert_allclose(got[step], want[step], rtol=1e-5, err_msg=f"step {step}")
  # The saved config records the mesh of the last run.
  assert dict(checkpointing.load_config(runs["moved"]).mesh) == MESHES["d2f2t2"]


@pytest.mark.slow  # shares the `runs` pipeline (three training runs)
def test_load_inference_state_on_any_mesh(runs):
  workdir = runs["fsdp8_at_n"]  # saved from fsdp=8
  assert dict(checkpointing.load_config(workdir).mesh) == MESHES["fsdp8"]
  replicated = workdir_lib.load_inference_state(workdir)  # default: data=-1, replicated
  mesh_cfg = MESHES["d2f2t2"]
  sharded = workdir_lib.load_inference_state(workdir, mesh_config=mesh_cfg)
  fsdp = workdir_lib.load_inference_state(workdir, mesh_config={"data": 1, "fsdp": -1})
  assert replicated.step == sharded.step == fsdp.step == N
  for path, leaf in jax.tree_util.tree_flatten_with_path(replicated.params)[0]:
    assert leaf.sharding.is_fully_replicated, jax.tree_util.keystr(path)
  check_layout(sharded.params, sharding.make_mesh(mesh_cfg), mesh_cfg, False, "restored")
  check_layout(
    fsdp.params, sharding.make_mesh(MESHES["fsdp8"]), MESHES["fsdp8"], False, "restored fsdp"
  )
  ref = jax.device_get(replicated.params)
  assert_trees_close(jax.device_get(sharded.params), ref, atol=0)
  assert_trees_close(jax.device_get(fsdp.params), ref, atol=0)
  # EMA by default; the raw parameters on request; both are the saved ones.
  saved = restore_full(workdir)
  assert_trees_close(ref, saved.ema_params, atol=0)
  raw = workdir_lib.load_inference_state(workdir, use_ema=False, mesh_config=mesh_cfg)
  assert_trees_close(jax.device_get(raw.params), saved.params, atol=0)


@pytest.mark.slow  # shares the `runs` pipeline (three training runs)
def test_sampling_on_sharded_params_gives_the_same_tokens(runs):
  from setdiff_jax import sampling

  workdir = runs["moved"]  # trained 2N steps across two meshes
  replicated = workdir_lib.load_inference_state(workdir)
  sharded = workdir_lib.load_inference_state(workdir, mesh_config=MESHES["d2f2t2"])
  assert not sharded.params["blocks_0"]["mlp_in"]["kernel"].sharding.is_fully_replicated
  model = workdir_lib.inference_model(replicated.model_config)
  seq_len = int(replicated.config.seq_len)

  def generate(state):
    return decoding.generate_text(
      model,
      state.params,
      state.tokenizer,
      state.objective_config,
      seq_len,
      2,
      jax.random.key(3),
      prompt="It is a truth",
      greedy=True,
      max_new_tokens=8,
    )

  texts = generate(replicated)
  assert texts == generate(sharded)
  assert len(texts) == 2 and all(t for t in texts)
  # Infilling on sharded parameters as well (the set sampler's other mode).
  cfg = decoding.sampler_config_for(
    replicated.objective_config, replicated.tokenizer, seq_len, greedy=True
  )
  template = sampling.parse_infill("She was [GAP:4] and happy.")
  canvas, _ = template.canvas(replicated.tokenizer, cfg.mask_token_id)
  a = sampling.set_infill(model, replicated.params, [canvas], cfg)
  b = sampling.set_infill(model, sharded.params, [canvas], cfg)
  np.testing.assert_array_equal(a.canvas, b.canvas)
  assert cfg.mask_token_id not in a.sequences[0]


# ------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
  "mesh_cfg, match",
  [
    ({"data": 2, "fsdp": 2, "tensor": 1}, r"config\.mesh .* needs 4 devices but 8"),
    ({"data": 3, "fsdp": -1, "tensor": 1}, r"config\.mesh .* not divisible"),
    ({"data": -1, "fsdp": -1, "tensor": 1}, r"config\.mesh: at most one axis may be -1"),
    ({"data": 0, "fsdp": 8, "tensor": 1}, r"config\.mesh sizes must be positive"),
  ],
)
def test_mesh_that_does_not_fit_the_devices(tmp_path, mesh_cfg, match):
  with pytest.raises(ValueError, match=match):
    sharding.make_mesh(mesh_cfg)
  # the run config's field ranges name a field out of range first
  match = {r"config\.mesh sizes must be positive": r"mesh\.data=0 is out of range"}.get(
    match, match
  )
  config = tiny_config()
  config.mesh = mesh_cfg
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=match):
    train.train_and_evaluate(config, str(workdir))
  assert not workdir.exists()  # raised by edge.from_config_dict before anything was written


@pytest.mark.parametrize(
  "overrides, match",
  [
    # hidden 36 (heads 2, head dim 18): the model dimension does not split over fsdp=8.
    (
      {"model.hidden_size": 36, "model.cond_dim": 36, "mesh": "fsdp8"},
      r"parameter \.params\['\w+'\].* of shape \(\d+, \d+\) cannot be sharded: "
      r"dimension 36 is not divisible by mesh axis 'fsdp' of size 8",
    ),
    # vocabulary 385 does not split over tensor=2 (embedding rows and the head's columns).
    (
      {"model.vocab_size": 385, "mesh": "d2f2t2"},
      r"parameter \.params\['(embed|head)'\].* of shape \(\d+(, \d+)?\) .* 385 is not divisible by mesh axis "
      r"'tensor' of size 2",
    ),
  ],
)
def test_indivisible_dimension_names_the_parameter(tmp_path, tokenizer_dir, overrides, match):
  config = tiny_config(**overrides)
  workdir = new_workdir(tmp_path, "run", tokenizer_dir)
  with pytest.raises(ValueError, match=match) as info:
    train.train_and_evaluate(config, workdir)
  assert "config.mesh" in str(info.value)  # and says what to change
  assert not os.path.isdir(checkpointing.checkpoint_dir(workdir))


def test_bad_sharding_rules_name_the_field():
  config = tiny_config()
  config.sharding_rules = (("embed", "model"),)
  with pytest.raises(ValueError, match=r"sharding_rules: 'embed' -> 'model' is not a mesh axis"):
    sharding.rules_from_config(config)


def test_custom_rules_change_the_layout(tok):
  """config.sharding_rules replaces the defaults: e.g. pure tensor parallelism of the MLP."""
  config, _, init = step_and_state(tok, "setdlm")
  mesh = sharding.make_mesh(MESHES["d2f2t2"])
  rules = sharding.rules_from_config(set_fields(config, {"sharding_rules": (("mlp", "tensor"),)}))
  shardings = sharding.state_shardings(jax.eval_shape(init, jax.random.key(0)), mesh, rules)
  blocks = shardings.params["blocks_0"]
  assert tuple(blocks["mlp_in"]["kernel"].spec) == (None, "tensor")
  assert tuple(blocks["mlp_out"]["kernel"].spec) == ("tensor", None)
  assert tuple(blocks["attn_qkv"]["kernel"].spec) == (None, None)
