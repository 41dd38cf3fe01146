"""`model.scan_layers` and `model.remat` policies (issue 13): the scanned backbone is the unrolled
one with its layer parameters stacked, for every path that reads them.

Each test compares against the unrolled model (the reference every other test checks) on the same
parameters moved through `layer_names.stack_layers`, so a wrong stacking order, a wrong carry,
a cache fed to the wrong layer or a policy that changes the math fails here.
"""

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import default
from helpers import TINY_VOCAB, assert_trees_close, new_workdir, set_fields
from setdiff_jax import models, objectives, sharding
from setdiff_jax import layer_names
from setdiff_jax.models import layer_stack
from setdiff_jax.diffusion import losses
from setdiff_jax.config import edge
from setdiff_jax.workdir import load as workdir_lib
from setdiff_jax.interop import export_checkpoint, import_checkpoint, name_map
from setdiff_jax.models.dit import DiT, DiTConfig
from setdiff_jax.models.qwen3 import Qwen3Config
from setdiff_jax.sampling import CommitPolicy, SamplerConfig, set_generate

pytestmark = pytest.mark.usefixtures("fast_compile")

V = 64
IDS = dict(mask_token_id=3, pad_token_id=0, eos_token_id=2)
DIT = DiTConfig(vocab_size=V, hidden_size=32, num_layers=3, num_heads=2, cond_dim=16, dropout=0.0)
QWEN = Qwen3Config(
  vocab_size=V,
  hidden_size=32,
  num_layers=3,
  num_heads=4,
  num_kv_heads=2,
  head_dim=8,
  intermediate_size=48,
  tie_embeddings=False,
)


def random_params(cfg, seed=0):
  """Random per-layer parameters of any backbone, drawn in NumPy (`helpers.random_params` for
  the DiT; a zero-initialised head would make every logit 0)."""
  rng = np.random.default_rng(seed)

  def leaf(path, a):
    name = str(getattr(path[-1], "key", path[-1]))
    if name == "scale":
      return jnp.asarray(1 + 0.1 * rng.normal(size=a.shape), jnp.float32)
    if name == "kernel":
      return jnp.asarray(rng.normal(size=a.shape) / np.sqrt(a.shape[0]), jnp.float32)
    return jnp.asarray(0.3 * rng.normal(size=a.shape), jnp.float32)

  return jax.tree_util.tree_map_with_path(leaf, models.param_shapes(cfg))


def scanned(cfg, **kw):
  return dataclasses.replace(cfg, scan_layers=True, **kw)


def rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def assert_trees_rel(a, b, tol):
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree_util.tree_leaves(b)):
    assert rel(x, y) < tol, (jax.tree_util.keystr(path), rel(x, y))


def inputs(seq=8, batch=2, seed=0):
  rng = np.random.default_rng(seed)
  tokens = jnp.asarray(rng.integers(4, V, (batch, seq)), jnp.int32)
  positions = jnp.asarray(np.stack([rng.permutation(seq) for _ in range(batch)]), jnp.int32)
  mask = jnp.asarray(np.tril(np.ones((seq, seq), bool))[None].repeat(batch, 0))
  return tokens, positions, mask


# ----------------------------------------------------------------------------- names
def test_stack_unstack_roundtrip_and_errors():
  p = random_params(dataclasses.replace(DIT, adaln=True))
  s = layer_names.stack_layers(p)
  assert set(s) == {"embed", "blocks", "final_norm", "head", "sigma_map", "final_adaln"}
  assert s["blocks"]["attn_qkv"]["kernel"].shape == (3, 32, 96)
  np.testing.assert_array_equal(s["blocks"]["mlp_in"]["bias"][2], p["blocks_2"]["mlp_in"]["bias"])
  assert layer_names.is_scanned(s) and not layer_names.is_scanned(p)
  assert_trees_close(layer_names.unstack_layers(s), p, atol=0)
  assert layer_names.to_layout(p, False) is p and layer_names.to_layout(s, True) is s
  # numpy in, numpy out (the PyTorch side never needs jax)
  npp = jax.tree_util.tree_map(np.asarray, p)
  assert isinstance(layer_names.stack_layers(npp)["blocks"]["norm1"]["scale"], np.ndarray)
  # the scanned model's own tree is exactly the stacked one
  shapes = models.param_shapes(scanned(dataclasses.replace(DIT, adaln=True)))
  assert jax.tree_util.tree_structure(shapes) == jax.tree_util.tree_structure(s)
  assert all(
    a.shape == b.shape
    for a, b in zip(jax.tree_util.tree_leaves(shapes), jax.tree_util.tree_leaves(s))
  )
  with pytest.raises(ValueError, match="not 0..1"):
    layer_names.stack_layers({"blocks_0": {"a": np.ones(2)}, "blocks_2": {"a": np.ones(2)}})
  with pytest.raises(ValueError, match="structure"):
    layer_names.stack_layers({"blocks_0": {"a": np.ones(2)}, "blocks_1": {"b": np.ones(2)}})


def test_abstract_trees_keep_shardings():
  mesh = sharding.make_mesh({"data": 1, "fsdp": 2, "tensor": 2}, devices=jax.devices()[:4])
  abstract = models.param_shapes(DIT)
  sh = sharding.state_shardings(abstract, mesh)
  tree = jax.tree_util.tree_map(
    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, sh
  )
  stacked = layer_names.stack_layers(tree)
  leaf = stacked["blocks"]["attn_qkv"]["kernel"]
  assert leaf.shape == (3, 32, 96) and tuple(leaf.sharding.spec) == (None, "fsdp", "tensor")
  # ... which is what the sharding rules give the scanned model's own tree
  want = sharding.state_shardings(models.param_shapes(scanned(DIT)), mesh)
  assert want["blocks"]["attn_qkv"]["kernel"].spec == leaf.sharding.spec
  assert want["blocks"]["mlp_out"]["bias"].spec == jax.sharding.PartitionSpec(None, "fsdp")
  assert want["blocks"]["norm1"]["scale"].spec == jax.sharding.PartitionSpec()
  back = layer_names.unstack_layers(stacked)["blocks_1"]["attn_qkv"]["kernel"]
  assert back.shape == (32, 96) and back.sharding.spec == sh["blocks_1"]["attn_qkv"]["kernel"].spec


# ----------------------------------------------------------------------------- forward / grads
@pytest.mark.parametrize("cfg", [DIT, QWEN], ids=["dit", "qwen3"])  # adaLN: the objective test
def test_scanned_equals_unrolled_logits_grads_and_cache(cfg):
  p = random_params(cfg)
  sp = layer_names.stack_layers(p)
  tokens, positions, mask = inputs()
  t2, p2, m2 = tokens[:, :2], positions[:, :2] + 8, jnp.ones((2, 2, 10), bool)

  def run(c, params):
    module = models.build(c)

    def loss(q):
      logits, kv = module.apply({"params": q}, tokens, positions, mask, return_kv=True)
      w = jnp.sin(jnp.arange(logits.size, dtype=jnp.float32)).reshape(logits.shape)
      return jnp.sum(w * logits) + sum(jnp.sum(k**2) - jnp.sum(v) for k, v in kv), (logits, kv)

    (l, (logits, kv)), g = jax.value_and_grad(loss, has_aux=True)(params)
    # one cached step: layer i must read layer i's cache (a reversed cache changes the logits)
    step = module.apply({"params": params}, t2, p2, m2, kv_cache=kv)
    wrong = module.apply({"params": params}, t2, p2, m2, kv_cache=kv[::-1])
    return l, logits, kv, g, step, wrong

  la, a, kva, ga, ca, _ = jax.jit(run, static_argnums=0)(cfg, p)
  lb, b, kvb, gb, cb, wrong = jax.jit(run, static_argnums=0)(scanned(cfg), sp)
  assert rel(b, a) < 1e-6 and rel(lb, la) < 1e-6
  assert len(kvb) == cfg.num_layers
  for (ka, va), (kb, vb) in zip(kva, kvb):
    assert rel(kb, ka) < 1e-6 and rel(vb, va) < 1e-6
  assert_trees_rel(gb, layer_names.stack_layers(ga), 1e-5)
  assert_trees_rel(layer_names.unstack_layers(gb), ga, 1e-5)
  assert rel(cb, ca) < 1e-6 and rel(wrong, ca) > 1e-3


def test_return_hidden_fused_head_path():
  p = random_params(DIT)
  sp = layer_names.stack_layers(p)
  tokens, positions, mask = inputs()
  hidden = jax.jit(
    lambda c, q: DiT(c).apply(
      {"params": q}, tokens, positions, mask, head_start=3, return_hidden=True
    ),
    static_argnums=0,
  )
  ha, hb = hidden(DIT, p), hidden(scanned(DIT), sp)
  assert ha.shape == hb.shape == (2, 5, 32) and rel(hb, ha) < 1e-6
  assert DiT.output_head(sp)[0] is sp["head"]["kernel"]


def two_stream_batch(seq=8, batch=2, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(4, V, (batch, seq)).astype(np.int32)
  tokens[:, 0] = 1
  attention = np.ones((batch, seq), np.int32)
  attention[0, seq - 3 :] = 0
  tokens[0, seq - 3 :] = IDS["pad_token_id"]
  return {"tokens": jnp.asarray(tokens), "attention_mask": jnp.asarray(attention)}


SMALL = dataclasses.replace(DIT, hidden_size=16, num_layers=2, cond_dim=8)


@pytest.mark.slow  # the default tier keeps the logits / grads / cache equality above
def test_every_objective_scanned_equals_unrolled():
  """Each method's training loss (fused head, train=True), dropout 0, scanned = unrolled; with
  dropout the scanned loss is finite and differs from the deterministic one (dropout applies)."""
  batch, rng = two_stream_batch(), jax.random.key(3)

  @functools.partial(jax.jit, static_argnums=(0, 1))
  def loss(name, c, q):
    obj = losses.ObjectiveConfig(name=name, **IDS, desired_set_size=2, block_size=4)
    return objectives.get(name).loss(obj, DiT(c), q, batch, rng, train=True)[0]

  for name in objectives.NAMES:
    cfg = dataclasses.replace(SMALL, adaln=objectives.get(name).adaln)
    p = random_params(cfg)
    la, lb = loss(name, cfg, p), loss(name, scanned(cfg), layer_names.stack_layers(p))
    assert rel(lb, la) < 1e-6, name
  dropped = loss(name, scanned(cfg, dropout=0.3), layer_names.stack_layers(p))
  assert np.isfinite(float(dropped)) and abs(float(dropped) - float(lb)) > 1e-4


# ----------------------------------------------------------------------------- remat
@pytest.mark.slow  # the default tier keeps the logits / grads / cache equality above
def test_every_remat_policy_matches_no_remat():
  """Same loss and grads for every policy, unrolled and scanned, with dropout on (the
  recomputation must redraw the same bits); bf16 compute with fp32 params and grads too."""
  tokens, positions, mask = inputs()
  w = jnp.sin(jnp.arange(2 * 8 * V, dtype=jnp.float32)).reshape(2, 8, V)
  rngs = {"dropout": jax.random.key(5)}

  def grads(c, q):
    f = lambda q: jnp.sum(
      w * DiT(c).apply({"params": q}, tokens, positions, mask, deterministic=False, rngs=rngs)
    )
    return jax.value_and_grad(f)(q)

  @functools.partial(jax.jit, static_argnums=(0, 1, 2))
  def some_policies(scan, dtype, policies, q):  # one compile per layout / dtype
    base = dataclasses.replace(SMALL, dropout=0.1, scan_layers=scan, dtype=dtype)
    return [grads(dataclasses.replace(base, remat=r), q) for r in policies]

  p = random_params(SMALL)
  # every policy scanned; unrolled and bf16 a subset (same code path, fewer compiles)
  runs = (
    (True, "float32", layer_stack.REMAT_POLICIES, 1e-6),
    (False, "float32", ("none", "full"), 1e-6),
    (True, "bfloat16", ("none", "dots_saveable"), 1e-2),
  )
  for scan, dtype, policies, tol in runs:
    out = some_policies(scan, dtype, policies, layer_names.to_layout(p, scan))
    (ref_loss, ref_grads), rest = out[0], out[1:]
    assert all(g.dtype == jnp.float32 for g in jax.tree_util.tree_leaves(ref_grads))
    for policy, (loss, g) in zip(policies[1:], rest):
      assert rel(loss, ref_loss) < tol, (policy, scan, dtype)
      assert_trees_rel(g, ref_grads, 10 * tol)


def test_remat_policies_change_what_is_saved():
  """Not vacuous: the policies differ in what the backward keeps (jax's saved residuals)."""
  tokens, positions, mask = inputs()
  p = layer_names.stack_layers(random_params(SMALL))

  def residual_bytes(r):  # what jax.vjp keeps for the backward pass (params included)
    c = scanned(SMALL, remat=r)
    f = lambda q: jnp.sum(DiT(c).apply({"params": q}, tokens, positions, mask))
    vjp = jax.eval_shape(lambda q: jax.vjp(f, q)[1], p)  # shapes only: nothing runs
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(vjp) if hasattr(x, "shape"))

  sizes = {r: residual_bytes(r) for r in ("none", "full", "save_attention_out")}
  assert sizes["full"] < sizes["save_attention_out"] < sizes["none"], sizes


def test_remat_names_and_old_bools():
  assert layer_stack.normalize_remat(False) == "none"
  assert layer_stack.normalize_remat(True) == "full"
  assert layer_stack.normalize_remat("True") == "full"  # --config.model.remat=True on a str field
  assert DiTConfig(remat=True).remat == "full" and DiTConfig(remat=True) == DiTConfig(remat="full")
  assert Qwen3Config(remat=False).remat == "none"
  with pytest.raises(ValueError, match="dots_saveable"):
    DiTConfig(remat="dots")


def test_config_layer_errors():
  c = default.get_config()
  edge.from_config_dict(set_fields(c, {"model.scan_layers": True, "model.remat": "full"}))
  with pytest.raises(ValueError, match="model.remat='everything'"):
    edge.from_config_dict(set_fields(default.get_config(), {"model.remat": "everything"}))
  c = default.get_config()
  c.model.num_layers = 0
  c.model.scan_layers = True
  with pytest.raises(ValueError, match=r"model\.scan_layers=True needs num_layers >= 1"):
    edge.from_config_dict(c)
  # resuming with the other layout is refused (the checkpoint tree differs); remat may change
  from setdiff_jax.workdir import lock as workdir_lock

  a = default.get_config()
  b = set_fields(default.get_config(), {"model.scan_layers": True, "model.remat": "full"})
  assert [f for f, _, _ in workdir_lock.structural_changes(a.to_dict(), b)] == ["model.scan_layers"]
  # an old run's config.json (remat: false, no scan_layers) still builds its model
  old = default.get_config().to_dict()
  old["model"]["remat"] = False
  del old["model"]["scan_layers"]
  assert models.backbone_config(old["model"], V).remat == "none"


# ----------------------------------------------------------------------------- decoding
def test_cached_set_decoding_same_tokens():
  cfg = SMALL
  p = random_params(cfg)
  p = dict(p, head={"kernel": p["head"]["kernel"] * 8, "bias": p["head"]["bias"]})  # peaked
  sp = layer_names.stack_layers(p)
  scfg = SamplerConfig(
    window=3,
    policy=CommitPolicy("threshold", 0.5),
    mask_token_id=3,
    eos_token_id=2,
    pad_token_id=0,
    bos_token_id=1,
    max_new_tokens=6,
    stop_at_eos=False,
    max_length=12,
  )
  prompts = [[1, 10, 11, 12], [1, 20]]
  a = set_generate(DiT(cfg), p, prompts, scfg)
  b = set_generate(DiT(scanned(cfg)), sp, prompts, scfg)
  np.testing.assert_array_equal(np.asarray(a.canvas), np.asarray(b.canvas))
  np.testing.assert_array_equal(np.asarray(a.commit_step), np.asarray(b.commit_step))
  assert len(set(np.asarray(a.canvas)[0, 4:10].tolist())) > 1  # not a constant sequence


# ----------------------------------------------------------------------------- interop
def run_cfg(scan, backbone="dit"):
  c = default.get_config()
  c.seq_len = 16
  model = {
    "hidden_size": 32,
    "num_layers": 3,
    "num_heads": 2,
    "vocab_size": V,
    "scan_layers": scan,
    "backbone": backbone,
  }
  if backbone == "qwen3":
    model.update(
      num_heads=4,
      num_kv_heads=2,
      head_dim=8,
      intermediate_size=48,
      tie_embeddings=False,
      rope_base=1e6,
    )
  return set_fields(c, {f"model.{k}": v for k, v in model.items()})


@pytest.mark.parametrize("backbone", ["dit", "qwen3"])
def test_export_of_scanned_equals_unrolled_and_reimports_stacked(tmp_path, backbone):
  from setdiff_jax.interop import weight_files

  p = random_params(DIT if backbone == "dit" else QWEN)
  ids = {"bos_id": 1, "eos_id": 2, "pad_id": 0, "mask_id": 3}
  a = export_checkpoint(run_cfg(False, backbone), p, str(tmp_path / "a"), special_ids=ids)
  b = export_checkpoint(
    run_cfg(True, backbone), layer_names.stack_layers(p), str(tmp_path / "b"), special_ids=ids
  )
  sa, sb = weight_files.read_state_dict(a), weight_files.read_state_dict(b)
  assert sorted(sa) == sorted(sb) and any(".2." in k for k in sa)  # per-layer PyTorch names
  for k in sa:
    np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)
  config, back = import_checkpoint(b)  # the run config says scan_layers: stacked params back
  assert config.model.scan_layers and layer_names.is_scanned(back)
  assert_trees_close(back, layer_names.stack_layers(p), atol=0)
  _, back_a = import_checkpoint(a)
  assert not layer_names.is_scanned(back_a)
  if backbone == "dit":  # the PyTorch reference reads a scanned tree through the name map
    torch_ref = pytest.importorskip("setdiff_jax.testing.torch_reference")
    pytest.importorskip("torch")
    tokens, positions, mask = inputs()
    want = DiT(DIT).apply({"params": p}, tokens, positions, mask)
    got = torch_ref.forward_logits(
      run_cfg(True),
      layer_names.stack_layers(p),
      np.asarray(tokens),
      np.asarray(positions),
      np.asarray(mask),
    )
    assert rel(got, want) < 1e-5
    assert name_map.dims_from_params(layer_names.stack_layers(p)).num_layers == 3


# ----------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_train_scanned_then_sample_and_init_from_unrolled(tmp_path, tokenizer_dir):
  from setdiff_jax import train
  from setdiff_jax.decoding import generate_text

  c = default.get_config()
  set_fields(
    c,
    {
      "seq_len": 32,
      "model.hidden_size": 32,
      "model.num_layers": 2,
      "model.num_heads": 2,
      "model.dropout": 0.1,
      "model.scan_layers": True,
      "model.remat": "dots_saveable",
      "tokenizer.vocab_size": TINY_VOCAB,
      "data.train_split": "validation",
      "batch_size": 8,
      "eval_batch_size": 8,
      "num_train_steps": 3,
      "warmup_steps": 1,
      "eval_every_steps": 1000,
      "num_eval_steps": 1,
      "log_every_steps": 1,
      "checkpoint_every_steps": 1000,
      "num_eval_samples": 0,
      "learning_rate": 1e-3,
    },
  )
  workdir = new_workdir(tmp_path, "scan", tokenizer_dir)
  assert train.train_and_evaluate(c, workdir)["step"] == 3
  state = workdir_lib.load_inference_state(workdir)
  assert state.model_config.scan_layers and layer_names.is_scanned(state.params)
  model = workdir_lib.inference_model(state.model_config)
  texts = generate_text(
    model,
    state.params,
    state.tokenizer,
    state.objective_config,
    32,
    2,
    jax.random.key(0),
    prompt="It is a truth",
    max_new_tokens=6,
  )
  assert len(texts) == 2 and all(t.startswith("It is a truth") for t in texts)
  # init_from across layouts: an unrolled run starts from the scanned run's parameters
  like = models.init_params(
    dataclasses.replace(state.model_config, scan_layers=False), jax.random.key(1)
  )
  got = workdir_lib.load_params(workdir, like, use_ema=True)
  assert_trees_close(got, layer_names.unstack_layers(state.params), atol=0)


def test_pretrained_sharded_loading_into_a_scanned_tree(tmp_path):
  """init_from_hf with scan_layers: each stacked [num_layers, ...] array is read slice by slice
  into its sharding, its layers coming from different safetensors shards."""
  import json
  from safetensors.numpy import save_file
  from setdiff_jax.interop import pretrained
  from setdiff_jax.interop import export_qwen3_hf
  from setdiff_jax.interop import weight_files

  p = jax.tree_util.tree_map(np.asarray, random_params(QWEN))
  d = export_qwen3_hf(run_cfg(False, "qwen3"), p, str(tmp_path / "hf"))
  state = weight_files.read_state_dict(d)
  os.remove(os.path.join(d, weight_files.SAFETENSORS_FILE))
  layer1 = {k for k in state if ".layers.1." in k}
  shard_of = {k: "model-0000%d-of-00002.safetensors" % (1 if k in layer1 else 2) for k in state}
  for name in set(shard_of.values()):
    save_file({k: state[k] for k in state if shard_of[k] == name}, os.path.join(d, name))
  with open(os.path.join(d, pretrained.INDEX_FILE), "w") as f:
    json.dump({"metadata": {}, "weight_map": shard_of}, f)
  cfg = scanned(QWEN)
  mesh = sharding.make_mesh({"data": 1, "fsdp": 4, "tensor": 2}, devices=jax.devices()[:8])
  shardings = sharding.state_shardings(models.param_shapes(cfg), mesh)
  loaded = pretrained.load_params_sharded(d, cfg, shardings)
  q = loaded["layers"]["q_proj"]["kernel"]
  assert q.shape == (3, 32, 32) and q.sharding.spec == jax.sharding.PartitionSpec(
    None, "fsdp", "tensor"
  )
  assert_trees_close(jax.device_get(loaded), layer_names.stack_layers(p), atol=0)
