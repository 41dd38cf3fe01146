"""The typed run config (issue 34): sections built from the ConfigDict at the edge, each checking
its own fields, and an existing workdir's config.json still loading, training and sampling.

tests/data/config_fe4013d.json is the config.json written by commit fe4013d (the last before the
typed config) for `launch/train.py --config=configs/tiny_sw.py` with d=32, 1 layer, V=300, L=32,
batch 4, 2 steps.
"""

import dataclasses
import json

import jax
import ml_collections
import pytest

from configs import default, tiny_sw
from conftest import REPO_ROOT
from setdiff_jax import decoding, objectives, train
from setdiff_jax.config import edge, fields, sections
from setdiff_jax.config import run as run_config
from setdiff_jax.workdir import checkpoints as checkpointing
from setdiff_jax.workdir import load as workdir_lib

OLD_CONFIG = REPO_ROOT / "tests" / "data" / "config_fe4013d.json"


def flat(node, prefix=""):
  out = {}
  for k, v in node.items():
    out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
  return out


def typed_values(cfg: run_config.RunConfig) -> dict:
  """{ConfigDict key: value} of every section field of `cfg` (the way config.json names them)."""
  out = {}
  for section in (cfg.basics, cfg.model, cfg.loss, cfg.optimization, cfg.evaluation):
    out.update(
      {type(section).key(f): getattr(section, f.name) for f in dataclasses.fields(section)}
    )
  for section in (cfg.checkpoints, cfg.divergence, cfg.mesh):
    out.update(
      {type(section).key(f): getattr(section, f.name) for f in dataclasses.fields(section)}
    )
  return out


def test_old_config_json_loads_into_the_typed_config():
  saved = json.loads(OLD_CONFIG.read_text())
  cfg = edge.from_config_dict(ml_collections.ConfigDict(saved), num_devices=1)
  values = flat(saved)
  typed = typed_values(cfg)
  # every field the old code wrote is a typed field with the same value (or a data section's)
  assert {k for k in values if not k.startswith(("data.", "tokenizer."))} == set(typed)
  for key, value in typed.items():
    assert value == (tuple(values[key]) if key == "sharding_rules" else values[key]), key
  assert cfg.data.to_dict() == saved["data"] and cfg.tokenizer.to_dict() == saved["tokenizer"]
  # the dict of a config.json builds the same typed config as its ConfigDict
  assert run_config.from_config_dict(saved) == run_config.from_config_dict(
    ml_collections.ConfigDict(saved)
  )


def test_older_config_json_without_newer_fields_takes_the_defaults():
  """A config.json of an older version lacks fields added since (divergence_*, model.scan_layers,
  model.backbone, ...): the typed config takes their defaults, an old `remat: false` is 'none'."""
  saved = json.loads(OLD_CONFIG.read_text())
  for key in ("divergence_factor", "divergence_window", "accept_missing_config"):
    del saved[key]
  for key in ("scan_layers", "backbone", "head_vocab_chunk"):
    del saved["model"][key]
  saved["model"]["remat"] = False
  cfg = run_config.from_config_dict(saved)
  assert cfg.divergence == sections.Divergence(patience=saved["divergence_patience"])
  assert (cfg.model.scan_layers, cfg.model.backbone, cfg.model.remat) == (False, "dit", "none")
  assert cfg.model.head_vocab_chunk == sections.Model().head_vocab_chunk


def test_a_partial_data_or_tokenizer_section_takes_the_defaults():
  """A config.json whose data section names only its source (hand-written, or cut) read as a
  traceback (AttributeError: 'preprocess') in every launcher; like the typed sections, the
  missing fields take their defaults and the given ones are kept."""
  from setdiff_jax.data import pipeline, tokenizers

  saved = json.loads(OLD_CONFIG.read_text())
  saved["data"] = {"source": "embedded", "eval_split": "validation"}
  saved["tokenizer"] = {"kind": "trained", "vocab_size": 300}
  cfg = run_config.from_config_dict(saved)
  want_data = dict(pipeline.default_data_config().to_dict(), **saved["data"])
  want_tok = dict(tokenizers.default_tokenizer_config().to_dict(), **saved["tokenizer"])
  assert cfg.data.to_dict() == want_data and cfg.tokenizer.to_dict() == want_tok
  assert cfg.data.preprocess == pipeline.default_data_config().preprocess


@pytest.mark.slow
def test_old_config_json_trains_and_samples(tmp_path):
  """The old config.json as the config of a new run (its batches made to split over the test's 8
  devices): it trains (2 steps, an eval, a checkpoint), then its workdir samples (~40 s)."""
  config = ml_collections.ConfigDict(json.loads(OLD_CONFIG.read_text()))
  config.batch_size = config.eval_batch_size = 8  # split over the 8 emulated devices
  config.num_eval_samples = 0  # sampled below, from the saved workdir
  workdir = str(tmp_path / "run")
  out = train.train_and_evaluate(config, workdir)
  assert out["step"] == 2 and out["eval/nll"] > 0
  assert checkpointing.load_config(workdir).to_dict() == config.to_dict()
  state = workdir_lib.load_inference_state(workdir)
  model = workdir_lib.inference_model(state.model_config)
  texts = decoding.generate_text(
    model, state.params, state.tokenizer, state.objective_config, 32, 2, jax.random.key(0)
  )
  assert len(texts) == 2 and all(isinstance(t, str) for t in texts)


def test_default_config_is_the_sections_defaults():
  """The ConfigDict users override holds every section field with its default and type; the
  typed config of the defaults is the sections' defaults."""
  c = default.get_config()
  cfg = edge.from_config_dict(c, num_devices=1)
  assert cfg.model == sections.Model() and cfg.loss == sections.Loss()
  assert cfg.optimization == sections.Optimization() and cfg.mesh == sections.Mesh()
  assert cfg.objective == objectives.DEFAULT
  for key, value in typed_values(cfg).items():
    stored = fields.lookup(c, key)
    assert stored == value and type(stored) is type(value), key
  with pytest.raises(dataclasses.FrozenInstanceError):
    cfg.model.hidden_size = 8  # type: ignore[misc]


def test_a_section_checks_its_own_fields():
  with pytest.raises(ValueError) as e:
    sections.Optimization(learning_rate=-1.0)
  assert str(e.value) == (
    "invalid config: learning_rate=-1.0 is out of range; allowed: a number in (0, inf) "
    "(set --config.learning_rate)"
  )
  with pytest.raises(ValueError, match=r"divergence_factor=0\.5 .*\(1, inf\) or 0"):
    sections.Divergence(factor=0.5)
  with pytest.raises(ValueError, match=r"rl\.group_size=1 .*\[2, inf\).*--config\.rl\.group_size"):
    sections.RL(group_size=1)
  with pytest.raises(ValueError, match=r"mesh\.tensor=0 .*or -1"):
    sections.Mesh(tensor=0)
  with pytest.raises(ValueError, match="model.remat='everything'"):
    sections.Model(remat="everything")
  assert sections.Model(remat=True).remat == "full"  # an old config's bool
  assert sections.Mesh(rules=[["mlp", "tensor"]]).rules == (("mlp", "tensor"),)


def test_model_zeros_only_with_init_from_hf():
  """model.* = 0 means "the checkpoint's value" with init_from_hf; otherwise its range applies."""
  c = tiny_sw.get_config()
  c.model.num_heads = 0
  with pytest.raises(ValueError, match=r"model\.num_heads=0 is out of range.*\[1, inf\)"):
    run_config.from_config_dict(c)
  c.model.backbone, c.init_from_hf = "qwen3", "/qwen3"
  assert run_config.from_config_dict(c).model.num_heads == 0


def test_the_edge_adds_the_registries_rules():
  c = tiny_sw.get_config()
  c.objective = "diffusion"
  with pytest.raises(ValueError, match=r"objective='diffusion' is out of range; allowed: one of"):
    edge.from_config_dict(c)
  c = tiny_sw.get_config()
  c.model.adaln = True  # SetDLM trains the DiT without adaLN (the method's own rule)
  run_config.from_config_dict(c)  # below the registry: not checked
  with pytest.raises(ValueError, match=r"objective=setdlm uses the DiT without adaLN"):
    edge.from_config_dict(c)
  c = tiny_sw.get_config()
  c.batch_size = 6
  with pytest.raises(ValueError, match="divisible by the data x fsdp mesh size 4"):
    edge.from_config_dict(c, num_devices=4)


def test_every_shipped_config_builds_its_typed_config():
  import importlib
  import os

  for name in sorted(os.listdir(REPO_ROOT / "configs")):
    if not name.endswith(".py") or name in ("__init__.py", "compare.py", "reasoning_common.py"):
      continue
    config = importlib.import_module(f"configs.{name[:-3]}").get_config()
    if name.startswith("rl_"):  # an RL launcher config: its own fields, checked by rl/config.py
      run_config.check_field_ranges(config)
      continue
    if config.model.hidden_size == 0:  # the Qwen3 recipes: model fields from init_from_hf
      config.init_from_hf = "/qwen3"
    cfg = run_config.from_config_dict(config, check_data=False)  # no data files here
    edge.check_choices(config)
    objectives.get(cfg.objective).validate(config, lambda ok, msg: None if ok else pytest.fail(msg))
