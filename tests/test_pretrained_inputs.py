"""Bad or unusual inputs to `init_from_hf` (`interop/pretrained.py`): each is refused with one line
naming the problem and the fix, or handled as transformers handles it; never a silent wrong run.

The tiny Qwen3 directories are written with numpy and safetensors from the name map (no torch,
no download): config.json, model.safetensors and a word-level tokenizer.json.
"""

import json
import logging
import os
import shutil

import numpy as np
import pytest

from setdiff_jax.interop import pretrained, qwen3_map

pytestmark = pytest.mark.usefixtures("fast_compile")

V, D, F, H, KV, DH, LAYERS = 80, 32, 48, 4, 2, 16, 2


def write_tokenizer(path, num_ids=V):
  """<|endoftext|> = 0 (BOS = EOS = PAD), <|fim_middle|> = 1 (MASK), [UNK], words: `num_ids` ids."""
  import tokenizers as hf
  from tokenizers import models as tm, pre_tokenizers

  specials = ["<|endoftext|>", "<|fim_middle|>"]
  words = [f"w{i}" for i in range(num_ids - 3)]
  tok = hf.Tokenizer(
    tm.WordLevel({t: i for i, t in enumerate(specials + ["[UNK]"] + words)}, "[UNK]")
  )
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tok.add_special_tokens(specials)
  tok.save(os.path.join(path, "tokenizer.json"))


def hf_config(tie=True, **extra):
  return {
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
    "vocab_size": V,
    "hidden_size": D,
    "intermediate_size": F,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": H,
    "num_key_value_heads": KV,
    "head_dim": DH,
    "hidden_act": "silu",
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "tie_word_embeddings": tie,
    "attention_bias": False,
    "use_sliding_window": False,
    **extra,
  }


def make_dir(path, *, config=None, tokenizer_ids=V, bad=None):
  """A tiny random Qwen3 directory; `bad`: {hf key: value} written into that tensor's first entry."""
  config = config or hf_config()
  os.makedirs(path, exist_ok=True)
  dims = qwen3_map.Dims(V, D, LAYERS, H, KV, DH, F, bool(config.get("tie_word_embeddings")))
  rng = np.random.default_rng(0)
  state = {
    r.hf_key: (rng.standard_normal(r.hf_shape) / np.sqrt(r.hf_shape[-1])).astype(np.float32)
    for r in qwen3_map.expand(dims)
  }
  for key, value in (bad or {}).items():
    state[key].flat[0] = value
  from safetensors.numpy import save_file

  save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  if tokenizer_ids:
    write_tokenizer(path, tokenizer_ids)
  return str(path)


def run_config(path, **model):
  from configs import tiny_qwen3

  c = tiny_qwen3.get_config()
  c.init_from_hf = str(path)
  for k, v in model.items():
    c.model[k] = v
  return c


# ----------------------------------------------------------------------------- finding 1
@pytest.mark.parametrize(
  "rope",
  [
    {"rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 4.0}},  # legacy key
    {  # a default rope_parameters beside a non-default rope_scaling (transformers applies yarn)
      "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    },
    {"rope_parameters": {"rope_theta": 1e4, "rope_type": "linear", "factor": 2.0}},
  ],
)
def test_rope_scaling_is_refused_not_dropped(rope):
  raw = hf_config(**rope)
  if "rope_theta" in rope:
    raw.pop("rope_parameters")
  with pytest.raises(ValueError, match=r"RoPE scaling rope_(scaling|parameters)\.(rope_)?type="):
    pretrained.model_fields(raw, "x/config.json")


# ----------------------------------------------------------------------------- finding 2
def test_init_from_hf_refuses_another_tokenizer_kind(tmp_path):
  c = run_config(make_dir(tmp_path / "hf"))
  c.tokenizer.kind, c.tokenizer.vocab_size = "trained", 512
  with pytest.raises(ValueError, match=r"needs the checkpoint's tokenizer.*tokenizer.kind=qwen3"):
    pretrained.resolve_run_config(c)


# ----------------------------------------------------------------------------- finding 3
def test_explicit_eps_and_tie_must_agree_with_the_checkpoint(tmp_path):
  untied = make_dir(tmp_path / "untied", config=hf_config(tie=False, rms_norm_eps=1e-5))
  r = pretrained.resolve_run_config(run_config(untied))  # defaults: the checkpoint's values
  assert (r.model.rms_norm_eps, r.model.tie_embeddings) == (1e-5, False)
  assert (
    pretrained.resolve_run_config(run_config(untied, rms_norm_eps=0.0)).model.rms_norm_eps == 1e-5
  )
  with pytest.raises(ValueError, match=r"model.rms_norm_eps=0.0001 but .* has 1e-05; set "):
    pretrained.resolve_run_config(run_config(untied, rms_norm_eps=1e-4))
  tied = make_dir(tmp_path / "tied")
  with pytest.raises(ValueError, match=r"model.tie_embeddings=False but .* tie_embeddings=True"):
    pretrained.resolve_run_config(run_config(tied, tie_embeddings=False))


# ----------------------------------------------------------------------------- finding 4
def test_missing_rope_theta_is_transformers_default(tmp_path, caplog):
  raw = hf_config()
  raw.pop("rope_parameters")
  path = make_dir(tmp_path / "hf", config=raw)
  with caplog.at_level(logging.WARNING, logger=pretrained.__name__):
    r = pretrained.resolve_run_config(run_config(path))
  assert r.model.rope_base == pretrained.HF_DEFAULT_THETA == 10000.0
  assert "has no rope_theta: using 10000.0" in caplog.text
  try:
    import transformers
  except ImportError:
    return
  hf_cfg = transformers.Qwen3Config.from_pretrained(path)
  theta = (getattr(hf_cfg, "rope_parameters", None) or {}).get("rope_theta")
  assert (theta or hf_cfg.rope_theta) == r.model.rope_base


# ----------------------------------------------------------------------------- finding 11
@pytest.mark.parametrize(
  "key,value,what",
  [
    ("model.layers.1.self_attn.q_proj.weight", np.nan, "1 NaN and 0 Inf"),  # transposed
    ("model.norm.weight", np.inf, "0 NaN and 1 Inf"),
  ],
)
def test_sharded_load_names_a_non_finite_tensor(tmp_path, key, value, what):
  from setdiff_jax import models, sharding

  path = make_dir(tmp_path / "hf", bad={key: value})
  cfg = models.backbone_config(pretrained.resolve_run_config(run_config(path)).model.to_dict())
  mesh = sharding.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
  shardings = sharding.state_shardings(models.param_shapes(cfg), mesh)
  file = os.path.join(path, "model.safetensors")
  with pytest.raises(ValueError, match=rf"^{file}: tensor '{key}' holds {what} values"):
    pretrained.load_params_sharded(path, cfg, shardings)


def test_sharded_load_refuses_a_head_that_tie_word_embeddings_would_drop(tmp_path, monkeypatch):
  """Probe 17b: a directory whose config.json says tie_word_embeddings=true while its lm_head.weight
  differs from the embedding trained with the embedding as its head, the trained head dropped
  without a word (the sharded load never read lm_head); import_checkpoint refused it. A head
  equal to the embedding (a tied model saved with both) loads."""
  from safetensors.numpy import load_file, save_file

  from setdiff_jax import models, sharding

  path = make_dir(tmp_path / "hf", config=hf_config(tie=False))
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf_config(tie=True), f)
  cfg = models.backbone_config(pretrained.resolve_run_config(run_config(path)).model.to_dict())
  mesh = sharding.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
  shardings = sharding.state_shardings(models.param_shapes(cfg), mesh)
  with pytest.raises(ValueError, match=f"^{path}: tie_word_embeddings=true but lm_head.weight"):
    pretrained.load_params_sharded(path, cfg, shardings)
  file = os.path.join(path, "model.safetensors")
  state = load_file(file)
  state["lm_head.weight"] = state["model.embed_tokens.weight"].copy()
  save_file(state, file, metadata={"format": "pt"})
  loaded = pretrained.load_params_sharded(path, cfg, shardings)
  assert "lm_head" not in loaded
  np.testing.assert_array_equal(loaded["embed"]["embedding"], state["model.embed_tokens.weight"])
  # compared in blocks of rows: a difference in the last, partial block is found too
  state["lm_head.weight"][-1, -1] += 1.0
  save_file(state, file, metadata={"format": "pt"})
  monkeypatch.setattr(pretrained._check_tied_in_files, "__defaults__", (7,))  # 80 = 11 * 7 + 3
  with pytest.raises(ValueError, match="lm_head.weight differs from model.embed_tokens.weight"):
    pretrained.load_params_sharded(path, cfg, shardings)


# ----------------------------------------------------------------------------- finding 12
def test_resume_needs_no_base_directory(tmp_path):
  from setdiff_jax import errors
  from setdiff_jax.workdir import lock

  path = make_dir(tmp_path / "hf", config=hf_config(tie=False, rms_norm_eps=1e-5))
  first = pretrained.resolve_run_config(run_config(path, num_layers=1))
  workdir = tmp_path / "run"
  os.makedirs(workdir / "checkpoints" / "1")  # what training leaves: config.json + checkpoints
  (workdir / "config.json").write_text(lock.absolute_paths(first).to_json_best_effort())

  moved = shutil.move(path, tmp_path / "moved")
  again = pretrained.resolve_run_config(run_config(moved), str(workdir))  # num_layers 0 this time
  lock.check_resume(lock.absolute_paths(again), str(workdir))  # nothing structural changed
  assert again.model.to_dict() == first.model.to_dict()
  assert again.tokenizer.vocab_path == os.path.abspath(first.tokenizer.vocab_path)
  shutil.rmtree(moved)
  gone = pretrained.resolve_run_config(run_config(moved), str(workdir))
  assert gone.model.to_dict() == first.model.to_dict()
  # A changed explicit setting is still refused (by the structural check).
  changed = pretrained.resolve_run_config(run_config(moved, num_layers=2), str(workdir))
  with pytest.raises(errors.ConfigMismatchError, match=r"model.num_layers: 1 -> 2"):
    lock.check_resume(lock.absolute_paths(changed), str(workdir))


# ----------------------------------------------------------------------------- finding 16
def test_missing_tokenizer_messages_read_correctly(tmp_path):
  from setdiff_jax.data import tokenizers

  path = make_dir(tmp_path / "hf", tokenizer_ids=0)
  with pytest.raises(FileNotFoundError) as e:
    tokenizers.qwen3_tokenizer(path)
  assert str(e.value) == (
    f"tokenizer file not found: {os.path.join(path, 'tokenizer.json')!r} (set "
    "--config.tokenizer.vocab_path to a Qwen3 tokenizer.json or the directory holding it)"
  )
  with pytest.raises(ValueError, match=r"has no tokenizer.json .* --config.tokenizer.vocab_path="):
    pretrained.resolve_run_config(run_config(path))


def test_tokenizer_with_more_ids_than_embedding_rows(tmp_path):
  path = make_dir(tmp_path / "hf", tokenizer_ids=V + 10)
  with pytest.raises(ValueError) as e:
    pretrained.resolve_run_config(run_config(path))
  assert f"has {V + 10} ids but {path}/config.json has vocab_size={V}" in str(e.value)
  assert "tokenizer.vocab_path" in str(e.value) and "model.vocab_size=0" not in str(e.value)
  assert "\n" not in str(e.value)
