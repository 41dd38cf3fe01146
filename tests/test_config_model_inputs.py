"""Config, backbone-config and loss entry points called from Python (a notebook, a script) with
bad input: one ValueError (or TypeError) naming the problem and the fix, never a silent default
nor a raw error from deep inside (a reshape, a division by zero)."""

import importlib
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import pytest

from configs import default
from conftest import REPO_ROOT
from helpers import random_params
from setdiff_jax import models, objectives
from setdiff_jax.config import edge
from setdiff_jax.config import run as run_config
from setdiff_jax.diffusion.losses import ObjectiveConfig
from setdiff_jax.models.dit import DiTConfig
from setdiff_jax.models.qwen3 import Qwen3Config


# ----------------------------------------------------------------------------- unknown fields
def test_misspelt_fields_are_refused_naming_the_closest_field():
  """configs/default.get_config() is unlocked: a typo made in Python used to be ignored (the
  default kept); both conversions, from a ConfigDict and from a dict, now refuse it."""
  c = default.get_config()
  c.model.num_head = 8
  c.loss.desired_set_sise = 16
  c.seqlen = 512
  with pytest.raises(ValueError) as e:
    edge.from_config_dict(c, 1)
  msg = str(e.value)
  assert msg.startswith("invalid config: unknown fields ")
  for typo, meant in (
    ("model.num_head", "model.num_heads"),
    ("loss.desired_set_sise", "loss.desired_set_size"),
    ("seqlen", "seq_len"),
  ):
    assert f"{typo} (did you mean {meant}?)" in msg, msg
  assert "rename it to a valid field or drop it" in msg
  saved = json.loads(default.get_config().to_json())
  saved["modle"] = {"hidden_size": 64}  # a misspelt section is named once, not each field
  with pytest.raises(ValueError, match=r"unknown field modle \(did you mean model\?\): "):
    run_config.from_config_dict(saved)


def _shipped_configs():
  """(name, ConfigDict) of every configs/*.py get_config(), with its variants."""
  variants = {
    "compare.py": [("ar",), ("mdlm",), ("bd3lm4",), ("setdlm4",)],
    "reasoning_common.py": [(o,) for o in objectives.NAMES],
  }
  for name in sorted(os.listdir(REPO_ROOT / "configs")):
    if not name.endswith(".py") or name.startswith("_"):
      continue
    module = importlib.import_module(f"configs.{name[:-3]}")
    extra = [("cpu",)] if name.startswith("lm1b_") else []
    for args in variants.get(name, [()]) + extra:
      yield f"{name}{args}", module.get_config(*args)


def test_every_shipped_config_converts():
  """Every field the shipped configs set is a run-config field, the RL launcher's optional `rl`
  section included (merged into a run config as rl/config.run_config_for does)."""
  seen = 0
  for name, config in _shipped_configs():
    run_config.check_known_fields(config)
    if "model" not in config:  # configs/rl_arithmetic.py: the RL launcher's partial config
      merged = run_config.default_config()
      merged.rl = config.rl
      config = merged
    if config.model.hidden_size == 0:  # the Qwen3 fine-tunes: sizes from the HF checkpoint
      config.init_from_hf = "/qwen3"
    cfg = run_config.from_config_dict(config, check_data=False)  # data paths: the user's
    assert cfg.seq_len == config.seq_len, name
    seen += 1
  assert seen >= 20


def test_free_form_sections_are_not_checked_field_by_field():
  """`interop` (what import_checkpoint records: ids, paths) holds no settings: any content
  converts, as does the optional `rl` section and a config.json's dict."""
  c = default.get_config()
  c.rl = run_config.rl_defaults()
  c.interop = ml_collections.ConfigDict(
    {"source": "/ckpt", "special_ids": {"mask": 3, "eos": 2}, "step": None, "anything": 1}
  )
  cfg = edge.from_config_dict(c, 1)
  assert cfg.rl is not None
  assert run_config.from_config_dict(json.loads(c.to_json())) == run_config.from_config_dict(c)


# ----------------------------------------------------------------------------- backbone configs
DIT = dict(vocab_size=40, hidden_size=32, num_layers=2, num_heads=2)


@pytest.mark.parametrize(
  "cls, base, field, value, allowed",
  [
    (DiTConfig, DIT, "dropout", -0.5, "[0, 1)"),
    (DiTConfig, DIT, "dropout", 1.5, "[0, 1)"),  # would drop every residual branch
    (DiTConfig, DIT, "dropout", 1.0, "[0, 1)"),
    (DiTConfig, DIT, "num_layers", -1, "[0, inf)"),  # built no block at all
    (DiTConfig, DIT, "vocab_size", -1, "[0, inf)"),
    (DiTConfig, DIT, "num_heads", 0, "[1, inf)"),  # ZeroDivisionError
    (DiTConfig, DIT, "hidden_size", -32, "[1, inf)"),
    (DiTConfig, DIT, "cond_dim", 0, "[1, inf)"),
    (DiTConfig, DIT, "mlp_ratio", 0, "(0, inf)"),
    (DiTConfig, DIT, "rope_base", 0.0, "(0, inf)"),
    (Qwen3Config, dict(vocab_size=40), "num_kv_heads", 0, "[1, inf)"),  # ZeroDivisionError
    (Qwen3Config, dict(vocab_size=40), "num_heads", 0, "[1, inf)"),
    (Qwen3Config, dict(vocab_size=40), "head_dim", 0, "[1, inf)"),
    (Qwen3Config, dict(vocab_size=40), "intermediate_size", 0, "[1, inf)"),
    (Qwen3Config, dict(vocab_size=40), "rms_norm_eps", 0.0, "(0, inf)"),
    (Qwen3Config, dict(vocab_size=40), "dropout", 1.5, "[0, 1)"),
    (Qwen3Config, dict(vocab_size=40), "num_layers", -1, "[0, inf)"),
  ],
)
def test_backbone_configs_check_their_ranges(cls, base, field, value, allowed):
  with pytest.raises(ValueError) as e:
    cls(**{**base, field: value})
  assert str(e.value).startswith(f"{field}={value!r} is out of range for {cls.__name__}; ")
  assert allowed in str(e.value)


def test_a_model_of_an_unresolved_vocabulary_is_not_built():
  """vocab_size 0 (a run config's "the tokenizer's") may sit in a config until it is resolved
  (the parity check builds one, then replaces it); building a model of it failed with an
  IndexError inside jnp.take."""
  cfg = DiTConfig(**{**DIT, "vocab_size": 0})
  with pytest.raises(ValueError, match="vocab_size=0: a model needs its vocabulary size"):
    models.build(cfg)
  with pytest.raises(ValueError, match="vocab_size=0"):
    models.build(Qwen3Config(vocab_size=0))


def test_backbone_configs_accept_the_range_edges():
  assert DiTConfig(**DIT, dropout=0.0).dropout == 0.0
  assert DiTConfig(**{**DIT, "num_layers": 0}).num_layers == 0  # embedding + head only
  assert Qwen3Config(vocab_size=40, num_kv_heads=1, dropout=0.5).num_kv_heads == 1


# ----------------------------------------------------------------------------- losses
def _loss(name, tokens, *, adaln=False, **fields):
  cfg = DiTConfig(**DIT, dropout=0.0, adaln=adaln, cond_dim=16)
  obj = ObjectiveConfig(name=name, mask_token_id=39, pad_token_id=0, eos_token_id=1, **fields)
  batch = {"tokens": jnp.asarray(tokens, jnp.int32)}
  return objectives.compute_loss(
    obj, models.build(cfg), random_params(cfg), batch, jax.random.key(0), train=True
  )


def test_bd3lm_loss_refuses_rows_that_are_no_whole_number_of_blocks():
  """L=6 with blocks of 4 failed as a raw reshape TypeError inside the loss."""
  with pytest.raises(ValueError, match=r"objective=bd3lm needs block_size=4 .* row length 6; pad"):
    _loss("bd3lm", [[2, 3, 4, 5, 6, 7]], adaln=True, block_size=4)
  with pytest.raises(ValueError, match=r"block_size=0 to be >= 1"):
    _loss("bd3lm", [[2, 3, 4, 5]], adaln=True, block_size=0)
  loss, _ = _loss("bd3lm", [[2, 3, 4, 5, 6, 7, 8, 9]], adaln=True, block_size=4)
  assert jnp.isfinite(loss)


def test_ar_loss_refuses_rows_of_one_token():
  """Length-1 rows failed with ZeroDivisionError in models/fused_head.py."""
  with pytest.raises(ValueError, match=r"objective=ar needs rows of at least 2 tokens.*length 1"):
    _loss("ar", [[2], [3]])
  with pytest.raises(ValueError, match=r"\[batch, length\] token ids, got shape \(4,\)"):
    _loss("ar", [2, 3, 4, 5])
  loss, _ = _loss("ar", [[2, 3], [3, 4]])
  assert jnp.isfinite(loss)


# ----------------------------------------------------------------------------- the edge's input
def test_edge_from_config_dict_takes_a_dict_as_the_run_level_does():
  """A config.json's dict: the run level converted it, the edge failed with AttributeError
  ('dict' object has no attribute 'model') in the method's rules."""
  saved = json.loads(default.get_config().to_json())
  assert edge.from_config_dict(saved, 1) == edge.from_config_dict(ml_collections.ConfigDict(saved))
  assert edge.from_config_dict(saved) == run_config.from_config_dict(saved)
  for bad in (42, ["model"], None):
    with pytest.raises(TypeError, match=r"ConfigDict or a dict .*not "):
      edge.from_config_dict(bad)
    with pytest.raises(TypeError, match=r"ConfigDict or a dict .*not "):
      run_config.from_config_dict(bad)
