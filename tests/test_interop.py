"""Interop with the official PyTorch / HF layout (issue 6; SPEC §3.9, §9).

Tiny models only (d=32, 2 layers, L=12). Tests that need torch skip cleanly without it.
Reproduce the measured errors: `python -m pytest tests/test_interop.py -k parity -s`.
"""

import json
import argparse
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from setdiff_jax.diffusion import masks
from setdiff_jax.diffusion import losses
from setdiff_jax import models
from setdiff_jax.models import dit as model_lib
from setdiff_jax.interop import name_map
from setdiff_jax.interop import weight_files
from setdiff_jax.interop import export_checkpoint, import_checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
L, V, D, LAYERS, HEADS = 12, 64, 32, 2, 4
SPECIAL = {"bos_id": 2, "eos_id": 3, "pad_id": 0, "mask_id": 4}
TOL = 1e-5


def run_config(objective="setdlm", adaln=False, **loss):
  from setdiff_jax.config.run import default_config

  c = default_config()
  c.objective = objective
  c.seq_len = L
  c.model.vocab_size = V
  c.model.hidden_size = D
  c.model.num_layers = LAYERS
  c.model.num_heads = HEADS
  c.model.cond_dim = 16
  c.model.adaln = adaln
  c.loss.desired_set_size = 2
  for k, v in loss.items():
    c.loss[k] = v
  return c


def perturbed_params(config, seed=0):
  """Random float32 parameters with the exact `init_params` structure (shapes from eval_shape, so
  nothing compiles); every leaf non-zero, unlike a fresh init whose head is zero."""
  cfg = model_lib.DiTConfig.from_config(config.model)
  rng = np.random.default_rng(seed)

  def leaf(path, s):
    if path[-1] == "scale":
      return (1.0 + 0.2 * rng.standard_normal(s.shape)).astype(np.float32)
    std = 1.0 / np.sqrt(s.shape[0]) if len(s.shape) == 2 else 0.2
    return (std * rng.standard_normal(s.shape)).astype(np.float32)

  flat = name_map.flatten(models.param_shapes(cfg))
  return name_map.unflatten({p: leaf(p, s) for p, s in flat.items()})


@pytest.fixture(scope="module")
def setdlm():
  config = run_config()
  return config, perturbed_params(config)


@pytest.fixture(scope="module")
def exported(setdlm, tmp_path_factory):
  config, params = setdlm
  out = str(tmp_path_factory.mktemp("export") / "setdlm")
  export_checkpoint(config, params, out, special_ids=SPECIAL)
  return out


def leaves_equal(a, b):
  fa, fb = name_map.flatten(a), name_map.flatten(b)
  assert fa.keys() == fb.keys()
  for k in fa:
    x, y = np.asarray(fa[k]), np.asarray(fb[k])
    assert x.dtype == y.dtype and x.shape == y.shape, k
    assert np.array_equal(x, y), k


# ----------------------------------------------------------------------------- no torch needed
@pytest.mark.parametrize("adaln", [False, True])
def test_name_map_covers_model_exactly(adaln):
  cfg = model_lib.DiTConfig(
    vocab_size=V,
    hidden_size=D,
    num_layers=3,
    num_heads=HEADS,
    cond_dim=16,
    adaln=adaln,
    mlp_ratio=2,
  )
  want = {p: tuple(s.shape) for p, s in name_map.flatten(models.param_shapes(cfg)).items()}
  rows = name_map.expand(name_map.Dims(V, D, 3, 2, 16, adaln))
  got = {r.flax_path: r.flax_shape for r in rows}
  assert got == want
  assert len({r.torch_key for r in rows}) == len(rows)


def test_export_layout_without_torch(setdlm, tmp_path, monkeypatch):
  config, params = setdlm
  monkeypatch.setitem(sys.modules, "torch", None)  # any `import torch` now fails
  out = export_checkpoint(config, params, str(tmp_path / "x"), special_ids=SPECIAL)
  assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors"]
  state = weight_files.read_state_dict(out)
  assert all(k.startswith("backbone.") for k in state)
  assert state["backbone.blocks.0.attn_qkv.weight"].shape == (3 * D, D)
  np.testing.assert_array_equal(
    state["backbone.blocks.1.mlp.0.weight"], params["blocks_1"]["mlp_in"]["kernel"].T
  )
  assert state["backbone.output_layer.linear.weight"].shape == (V, D)
  np.testing.assert_array_equal(
    state["backbone.rotary_emb.inv_freq"], name_map.rotary_inv_freq(D // HEADS)
  )
  cfg = json.load(open(os.path.join(out, "config.json")))
  assert cfg["model_type"] == "bd3lm" and cfg["architectures"] == ["SetDLM"]
  assert cfg["length"] == cfg["block_size"] == cfg["eval_block_size"] == L
  assert cfg["keep_clean_bos"] is True
  assert cfg["mask_token_id"] == cfg["tokenization_config"]["mask_token_id"] == 4
  assert cfg["noise_config"]["desired_block_size"] == 2
  assert cfg["noise_config"]["max_block_size"] == 4  # S_max = 2S
  bb = cfg["backbone_config"]
  assert bb["_target_"] == "backbone_dit.DIT"
  assert (bb["hidden_size"], bb["n_heads"], bb["num_layers"], bb["vocab_size"]) == (
    D,
    HEADS,
    LAYERS,
    V,
  )
  gen = json.load(open(os.path.join(out, "generation_config.json")))
  assert gen["mask_token_id"] == 4 and gen["max_window_size"] == 2


def test_roundtrip_bit_exact(setdlm, exported):
  config, params = setdlm
  config2, params2 = import_checkpoint(exported)
  leaves_equal(params, params2)
  assert jax.tree_util.tree_structure(params2) == jax.tree_util.tree_structure(
    models.param_shapes(model_lib.DiTConfig.from_config(config2.model))
  )
  for key in ("objective", "seq_len"):
    assert config2[key] == config[key]
  for key in ("hidden_size", "num_layers", "num_heads", "vocab_size", "adaln", "mlp_ratio"):
    assert config2.model[key] == config.model[key], key
  for key in ("keep_clean_bos", "desired_set_size", "max_set_size", "eos_last"):
    assert config2.loss[key] == config.loss[key], key
  assert config2.interop.special_ids.to_dict() == SPECIAL
  assert config2.tokenizer.to_dict() == config.tokenizer.to_dict()  # from the saved run config


def test_reexport_is_identical(exported, tmp_path):
  config2, params2 = import_checkpoint(exported)
  out = export_checkpoint(
    config2, params2, str(tmp_path / "again"), special_ids=config2.interop.special_ids.to_dict()
  )
  read = lambda d: open(os.path.join(d, "model.safetensors"), "rb").read()
  assert read(out) == read(exported)


@pytest.mark.parametrize("objective", ["mdlm", "bd3lm"])
def test_roundtrip_adaln(objective, tmp_path):
  config = run_config(objective, adaln=True, block_size=4)
  params = perturbed_params(config, seed=3)
  out = export_checkpoint(config, params, str(tmp_path / objective), special_ids=SPECIAL)
  cfg = json.load(open(os.path.join(out, "config.json")))
  assert cfg["architectures"] == [objective.upper()]
  assert cfg["backbone_config"]["adaln"] is True
  assert "backbone.sigma_map.mlp.0.weight" in weight_files.read_state_dict(out)
  config2, params2 = import_checkpoint(out)
  leaves_equal(params, params2)
  assert config2.objective == objective and config2.model.adaln
  if objective == "bd3lm":
    assert config2.loss.block_size == 4 and cfg["block_size"] == 4


def test_export_with_tokenizer(setdlm, tmp_path):
  tokenizers = pytest.importorskip("setdiff_jax.data.tokenizers")
  tok = tokenizers.train_tokenizer(
    ["the cat sat on the mat. " * 20, "a dog ran far away."] * 10, vocab_size=V + 300
  )
  config = run_config()
  config.model.vocab_size = tok.vocab_size
  params = perturbed_params(config)
  out = export_checkpoint(config, params, str(tmp_path / "tok"), tokenizer=tok)
  for f in (
    "tokenizer.json",
    "special_tokens.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
  ):
    assert os.path.isfile(os.path.join(out, f)), f
  cfg = json.load(open(os.path.join(out, "config.json")))
  assert cfg["mask_token_id"] == tok.mask_id and cfg["bos_token_id"] == tok.bos_id
  config2, _ = import_checkpoint(out)
  assert config2.interop.tokenizer_dir == os.path.abspath(out)
  from setdiff_jax.interop import load_tokenizer

  assert load_tokenizer(out).encode("the cat") == tok.encode("the cat")


# ----------------------------------------------------------------------------- import errors
def _copy_with_state(src, dst, edit_state=None, edit_config=None):
  os.makedirs(dst)
  state = weight_files.read_state_dict(src)
  if edit_state:
    edit_state(state)
  weight_files.write_state_dict(state, dst)
  cfg = json.load(open(os.path.join(src, "config.json")))
  if edit_config:
    edit_config(cfg)
  weight_files.write_json(cfg, os.path.join(dst, "config.json"))
  return dst


def test_import_missing_key(exported, tmp_path):
  d = _copy_with_state(
    exported, str(tmp_path / "d"), lambda s: s.pop("backbone.blocks.1.norm2.weight")
  )
  with pytest.raises(name_map.CheckpointMismatchError) as e:
    import_checkpoint(d)
  assert e.value.missing == ["blocks.1.norm2.weight"] and not e.value.unexpected
  assert "blocks.1.norm2.weight" in str(e.value)


def test_import_unexpected_key(exported, tmp_path):
  def add(s):
    s["backbone.blocks.0.attn_qkv.bias"] = np.zeros(3 * D, np.float32)
    s["backbone.blocks.2.norm1.weight"] = np.ones(D, np.float32)

  d = _copy_with_state(exported, str(tmp_path / "d"), add)
  with pytest.raises(name_map.CheckpointMismatchError) as e:
    import_checkpoint(d)
  assert e.value.unexpected == ["blocks.0.attn_qkv.bias", "blocks.2.norm1.weight"]
  assert not e.value.missing


def test_import_wrong_shape(exported, tmp_path):
  def bad(s):
    s["backbone.blocks.0.mlp.0.weight"] = s["backbone.blocks.0.mlp.0.weight"].T.copy()

  d = _copy_with_state(exported, str(tmp_path / "d"), bad)
  with pytest.raises(name_map.CheckpointMismatchError) as e:
    import_checkpoint(d)
  assert e.value.shape_mismatches == [("blocks.0.mlp.0.weight", (D, 4 * D), (4 * D, D))]
  assert "shape mismatch" in str(e.value)


def test_import_smax_equal_length_is_normalised(exported, tmp_path):
  def smax_l(cfg):
    cfg["noise_config"]["max_block_size"] = L
    del cfg["setdiff_jax"]  # an official config: no run config of ours

  d = _copy_with_state(exported, str(tmp_path / "d"), edit_config=smax_l)
  with pytest.warns(UserWarning, match="normalised to S_max=4"):
    config, _ = import_checkpoint(d)
  assert config.loss.desired_set_size == 2 and config.loss.max_set_size == 0  # 0 = 2S
  assert config.interop.stored_max_set_size == L
  # An explicit S_max below L is kept as is.
  d2 = _copy_with_state(
    exported, str(tmp_path / "d2"), edit_config=lambda c: c["noise_config"].update(max_block_size=6)
  )
  config2, _ = import_checkpoint(d2)
  assert config2.loss.max_set_size == 6


def test_import_known_buffers(exported, tmp_path):
  def add(s):
    s["static_attention_mask"] = masks.set_causal_mask(L)

  d = _copy_with_state(exported, str(tmp_path / "d"), add)
  with pytest.warns(UserWarning, match="static_attention_mask"):
    import_checkpoint(d)

  def bad_rotary(s):
    s["backbone.rotary_emb.inv_freq"] = s["backbone.rotary_emb.inv_freq"] * 1.01

  d2 = _copy_with_state(exported, str(tmp_path / "d2"), bad_rotary)
  with pytest.raises(ValueError, match="inv_freq"):
    import_checkpoint(d2)


# ----------------------------------------------------------------------------- parity (torch)
def test_cached_step_mask_matches_masks_module():
  tr = pytest.importorskip("setdiff_jax.testing.torch_reference")
  cache = np.array([[1, 1, 0, 1, 0]], bool)
  pend = np.array([[1, 1, 0]], bool)
  act = np.array([[1, 0, 1]], bool)
  np.testing.assert_array_equal(
    tr.cached_step_mask(cache, pend, act), np.asarray(masks.cached_step_mask(cache, pend, act))
  )
  np.testing.assert_array_equal(tr.set_causal_mask(6), masks.set_causal_mask(6))


def test_parity_two_stream(setdlm, exported):
  pytest.importorskip("torch")
  from setdiff_jax.testing import parity
  from setdiff_jax.testing.torch_reference import forward_logits

  config, params = setdlm
  mcfg = parity.fp32_model_config(config, params)
  batch = parity.two_stream_example(L, V, SPECIAL["mask_id"], SPECIAL["pad_id"], bos_id=2)
  assert not batch["attention_mask"].all()  # one padded row
  obj = losses.ObjectiveConfig(mask_token_id=SPECIAL["mask_id"], pad_token_id=0)
  inp = losses.setdlm_inputs(
    obj, {k: jnp.asarray(v) for k, v in batch.items()}, jnp.asarray(batch["order"])
  )
  args = [np.asarray(inp[k]) for k in ("tokens", "positions", "mask")]
  jl = np.asarray(parity.jax_forward(mcfg, params, *args))
  tl = forward_logits(config, params, *args)
  assert tl.dtype == np.float32 and tl.shape == (2, 2 * L, V)
  assert np.abs(tl).max() > 1.0  # non-trivial logits
  err = parity.rel_err(jl, tl)
  print(f"\ntwo-stream logits max rel err (forward_logits): {err:.3g}")
  assert err <= TOL
  # The same through an exported directory loaded with a strict state-dict load.
  from setdiff_jax.testing.torch_reference import load_reference

  ref = load_reference(exported)
  err_dir = parity.rel_err(jl, ref(*args).detach().numpy())
  print(f"two-stream logits max rel err (exported dir): {err_dir:.3g}")
  assert err_dir <= TOL


def test_parity_report_cached_step_and_loss(setdlm, exported):
  pytest.importorskip("torch")
  from setdiff_jax.testing import parity

  config, params = setdlm
  report = parity.parity_report(config, params, exported)
  print("\nparity report:", report)
  assert report["two_stream"] <= TOL
  assert report["cached_step"] <= TOL
  assert report["loss"] <= TOL
  assert report["roundtrip"] is True


def test_cached_step_equals_uncached_two_stream(setdlm):
  """SPEC §11.6 on the reference: a mask's cached-step logits equal an uncached two-stream forward
  whose clean ranks are the committed tokens (cache then pending) and whose noisy slot is the mask."""
  torch = pytest.importorskip("torch")
  from setdiff_jax.testing import parity, torch_reference

  config, params = setdlm
  ref = torch_reference.model_from_params(config, params)
  ex = parity.cached_step_example(L, V, SPECIAL["mask_id"], seed=1)
  step = parity.torch_cached_step(ref, ex, SPECIAL["mask_id"])
  n_pend = int(ex["pending_valid"].sum())
  committed = np.concatenate([ex["cache_tokens"][0], ex["pending_tokens"][0, :n_pend]])
  committed_pos = np.concatenate([ex["cache_positions"][0], ex["pending_positions"][0, :n_pend]])
  c = len(committed)
  for j in np.flatnonzero(ex["mask_valid"][0]):
    tokens = np.concatenate([committed, [0], committed, [SPECIAL["mask_id"]]])[None]
    pos = np.concatenate([committed_pos, [ex["mask_positions"][0, j]]] * 2)[None]
    # two streams of c + 1 ranks; the clean slot at rank c is never seen by the noisy slot at c
    logits = ref(tokens, pos, torch.from_numpy(torch_reference.set_causal_mask(c + 1))[None])
    np.testing.assert_allclose(
      step[0, ex["pending_tokens"].shape[1] + j],
      logits[0, -1].detach().numpy(),
      rtol=1e-5,
      atol=1e-5,
    )


def test_parity_adaln(tmp_path):
  pytest.importorskip("torch")
  from setdiff_jax.testing import parity
  from setdiff_jax.testing.torch_reference import load_reference

  config = run_config("bd3lm", adaln=True, block_size=4)
  params = perturbed_params(config, seed=5)
  out = export_checkpoint(config, params, str(tmp_path / "bd3lm"), special_ids=SPECIAL)
  mcfg = parity.fp32_model_config(config, params)
  mask = np.asarray(masks.block_causal_mask(L, 4))[None]
  tokens = np.random.default_rng(0).integers(0, V, (1, 2 * L))
  pos = np.tile(np.arange(L), 2)[None]
  jl = np.asarray(parity.jax_forward(mcfg, params, tokens, pos, mask))
  err = parity.rel_err(jl, load_reference(out)(tokens, pos, mask).detach().numpy())
  print(f"\nadaLN (BD3LM) logits max rel err: {err:.3g}")
  assert err <= TOL


def test_bin_format_roundtrip(setdlm, tmp_path):
  pytest.importorskip("torch")
  config, params = setdlm
  out = export_checkpoint(config, params, str(tmp_path / "bin"), special_ids=SPECIAL, fmt="bin")
  assert os.path.isfile(os.path.join(out, "pytorch_model.bin"))
  assert not os.path.exists(os.path.join(out, "model.safetensors"))
  _, params2 = import_checkpoint(out)
  leaves_equal(params, params2)
  # A damaged .bin is one line naming the file (it was a bare "[Errno 22] Invalid argument",
  # EOFError, or torch's advice to unpickle it in full); a pickle of other objects says so.
  torch = pytest.importorskip("torch")
  file = os.path.join(out, "pytorch_model.bin")
  data = open(file, "rb").read()
  for damaged, why in ((data[: len(data) // 2], ""), (b"", "EOFError"), (b"x" * 64, "Unsupported")):
    open(file, "wb").write(damaged)
    with pytest.raises(ValueError, match=f"{file} is truncated or damaged \\({why}") as e:
      import_checkpoint(out)
    assert "weights_only" not in str(e.value)
  torch.save({"w": torch.ones(2), "opt": argparse.Namespace(lr=1.0)}, file)
  with pytest.raises(ValueError, match="pickles Python objects besides tensors .*argparse"):
    import_checkpoint(out)


def test_import_official_style_directory(tmp_path):
  """A checkpoint made entirely on the PyTorch side, in the official layout (pytorch_model.bin,
  `backbone.` keys, static_attention_mask kept, max_block_size = L, no setdiff_jax block)."""
  torch = pytest.importorskip("torch")
  from setdiff_jax.testing import torch_reference
  from setdiff_jax.testing.torch_reference import forward_logits

  torch.manual_seed(0)
  ref = torch_reference.TorchDiT(V, D, LAYERS, HEADS)
  with torch.no_grad():
    for p in ref.parameters():
      p.add_(0.3 * torch.randn_like(p))
  state = {"backbone." + k: v for k, v in ref.state_dict().items()}
  state["static_attention_mask"] = torch.from_numpy(torch_reference.set_causal_mask(L))
  out = tmp_path / "lm1b-setdlm-smax4"
  out.mkdir()
  torch.save(state, out / "pytorch_model.bin")
  ids = {
    "vocab_size": V,
    "mask_token_id": 4,
    "bos_token_id": 3,
    "pad_token_id": 0,
    "eos_token_id": 3,
    "pad_vocab_size_multiple": 1,
  }
  cfg = {
    "model_type": "bd3lm",
    "architectures": ["SetDLM"],
    "length": L,
    "block_size": L,
    "eval_block_size": L,
    "keep_clean_bos": True,
    **ids,
    "tokenization_config": ids,
    "backbone_config": {
      "_target_": "backbone_dit.DIT",
      "length": L,
      "causal_attention": False,
      "adaln": False,
      "hidden_size": D,
      "cond_dim": 128,
      "n_heads": HEADS,
      "num_layers": LAYERS,
      "dropout": 0.1,
      "tie_word_embeddings": True,
      "attn_backend": "sdpa",
      "vocab_size": V,
      "block_size": L,
      "pretrained_model_name_or_path": None,
    },
    "noise_config": {
      "_target_": "noise_schedule_noise_schedules.StaggeredNoise",
      "eps": 1e-3,
      "block_size": L,
      "desired_block_size": 2,
      "max_block_size": L,
      "length": L,
    },
  }
  (out / "config.json").write_text(json.dumps(cfg))
  with pytest.warns(UserWarning) as record:
    config, params = import_checkpoint(str(out))
  msgs = " | ".join(str(w.message) for w in record)
  assert "static_attention_mask" in msgs and "S_max=4" in msgs
  assert config.objective == "setdlm" and config.loss.max_set_size == 0
  assert config.interop.special_ids.to_dict() == {
    "bos_id": 3,
    "eos_id": 3,
    "pad_id": 0,
    "mask_id": 4,
  }
  tokens = np.random.default_rng(0).integers(0, V, (1, 2 * L))
  pos = np.tile(np.random.default_rng(1).permutation(L), 2)[None]
  allowed = masks.set_causal_mask(L)[None]
  want = ref(tokens, pos, allowed).detach().numpy()
  from setdiff_jax.testing import parity

  assert parity.rel_err(forward_logits(config, params, tokens, pos, allowed), want) <= TOL
  jl = np.asarray(
    parity.jax_forward(parity.fp32_model_config(config, params), params, tokens, pos, allowed)
  )
  assert parity.rel_err(jl, want) <= TOL


# ----------------------------------------------------------------------------- launch CLI
def test_export_workdir(setdlm, tmp_path, monkeypatch):
  """launch/export.py's logic against a stand-in for workdir.load_inference_state."""
  from setdiff_jax.workdir import load as workdir_lib
  from setdiff_jax.interop.export import export_workdir

  config, params = setdlm
  calls = {}

  class Tok:
    bos_id, eos_id, pad_id, mask_id, vocab_size = 2, 3, 0, 4, V

    def save(self, d):
      os.makedirs(d, exist_ok=True)
      open(os.path.join(d, "tokenizer.json"), "w").write("{}")

  def fake_load(workdir, step=None, use_ema=True):
    calls.update(workdir=workdir, step=step, use_ema=use_ema)
    return workdir_lib.InferenceState(config, None, None, params, Tok(), 7)

  monkeypatch.setattr(workdir_lib, "load_inference_state", fake_load)
  out, report = export_workdir("WD", str(tmp_path / "o"), use_ema=False, step=7)
  assert calls == {"workdir": "WD", "step": 7, "use_ema": False} and report is None
  cfg = json.load(open(os.path.join(out, "config.json")))
  assert cfg["setdiff_jax"]["step"] == 7 and cfg["setdiff_jax"]["ema"] is False
  assert os.path.isfile(os.path.join(out, "tokenizer.json"))
  _, params2 = import_checkpoint(out)
  leaves_equal(params, params2)

  with pytest.raises(TypeError, match="pass the check itself"):  # the old verify=True
    export_workdir("WD", str(tmp_path / "b"), use_ema=False, verify=True)

  # --verify: launch/export.py hands the testing package's report to the exporter.
  pytest.importorskip("torch")
  from setdiff_jax.testing import verify

  seen = []
  check = lambda c, p, d: seen.append(d) or verify.export_report(c, p, d)
  _, report = export_workdir("WD", str(tmp_path / "v"), use_ema=False, verify=check)
  assert seen == [str(tmp_path / "v")] and set(report) >= {"two_stream", "cached_step", "loss"}
  passed, line = verify.verdict(report)
  assert passed and line.startswith("verify: PASS"), line


def test_export_refuses_any_out_inside_the_workdir(setdlm, tmp_path, monkeypatch):
  """--out anywhere inside the run directory, existing or not (checkpoint retention would delete
  W/checkpoints/20/hf; W/checkpoints/30 would read as a damaged checkpoint), through a relative
  path or a symlink, is refused before anything is restored or written; a sibling whose name
  merely starts with the workdir's (W2 next to W) is exported to."""
  from setdiff_jax.workdir import load as workdir_lib
  from setdiff_jax.interop.export import check_export_dir, export_workdir

  config, params = setdlm
  w = tmp_path / "W"
  (w / "checkpoints" / "10").mkdir(parents=True)
  (w / "config.json").write_text("{}")
  (tmp_path / "link").symlink_to(w)
  before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
  monkeypatch.chdir(tmp_path)
  for out in (
    w / "checkpoints" / "20" / "hf",  # a new folder: retention deletes it later
    w / "checkpoints" / "30",  # a new step folder: later loads call it a damaged checkpoint
    w / "export",  # new, directly under the run
    w / "checkpoints" / "10",  # an existing one
    "W/checkpoints/40",  # relative
    tmp_path / "link" / "hf",  # through a symlink to the workdir
    w / "sub" / ".." / "export",
  ):
    with pytest.raises(ValueError) as e:
      check_export_dir(str(out), str(w), overwrite=True)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"--out={out} is inside the training workdir"), msg
    assert "Export outside the run directory" in msg, msg
  with pytest.raises(ValueError, match="is inside the training workdir"):  # a relative workdir
    check_export_dir(str(w / "checkpoints" / "20" / "hf"), "W")

  def no_load(*a, **k):
    raise AssertionError("refused before anything is restored")

  monkeypatch.setattr(workdir_lib, "load_inference_state", no_load)
  with pytest.raises(ValueError, match="inside the training workdir"):
    export_workdir(str(w), str(w / "checkpoints" / "20" / "hf"))
  assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before

  class Tok:
    bos_id, eos_id, pad_id, mask_id, vocab_size = 2, 3, 0, 4, V

    def save(self, d):
      os.makedirs(d, exist_ok=True)
      open(os.path.join(d, "tokenizer.json"), "w").write("{}")

  monkeypatch.setattr(
    workdir_lib,
    "load_inference_state",
    lambda workdir, step=None, use_ema=True: workdir_lib.InferenceState(
      config, None, None, params, Tok(), 7
    ),
  )
  sibling = tmp_path / "W2"  # its path starts with "<tmp>/W" but it is not inside W
  out, _ = export_workdir(str(w), str(sibling))
  assert os.path.isfile(os.path.join(out, "config.json"))
  leaves_equal(params, import_checkpoint(out)[1])
  check_export_dir(str(tmp_path / "W_export"), str(w))  # the suggested --out is allowed


def test_launch_export_help():
  r = subprocess.run(
    [sys.executable, os.path.join(REPO, "launch", "export.py"), "--help"],
    capture_output=True,
    text=True,
    cwd=REPO,
  )
  assert "--workdir" in r.stdout and "--format" in r.stdout, r.stderr  # absl --help exits 1
