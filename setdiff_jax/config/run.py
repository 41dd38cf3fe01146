"""The typed run config: its sections (`sections.py`) put together, the rules between them, the
package defaults as a ConfigDict, and what a config builds (the backbone and objective configs).

  config = run.default_config()                 # configs/default.py starts from this ConfigDict
  cfg = run.from_config_dict(config)            # typed, every field and rule checked
  model_cfg, obj_cfg = run.model_and_objective(cfg, tokenizer)

Users keep writing ml_collections configs (`--config=configs/x.py --config.a.b=...`) and every
workdir keeps its ConfigDict as config.json; the typed config is built from either at the edge
(`config/edge.py` adds the rules of the method registry). Fields an older config.json lacks take
their defaults. This layer knows no method and no sampler, so the workdir layer can use it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Mapping, Optional, Tuple

import ml_collections

from setdiff_jax import cli, models, sharding
from setdiff_jax.config import fields
from setdiff_jax.config.fields import Section, integer, setting
from setdiff_jax.config.sections import (
  DATA_RANGES,
  RL,
  SECTIONS,
  Checkpoints,
  Divergence,
  Evaluation,
  Loss,
  Mesh,
  Model,
  Optimization,
)
from setdiff_jax.data import pipeline, tokenizers
from setdiff_jax.diffusion import losses


@dataclasses.dataclass(frozen=True)
class Basics(Section):
  """The two top-level fields every part reads."""

  seed: int = setting(0, fields.SHARED["seed"])  # parameter init, data order, per-step rng
  seq_len: int = setting(128, integer(4))  # L: tokens per training row


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """A run's whole config, typed. `data` and `tokenizer` stay the data layer's ConfigDicts (that
  layer owns their fields; `from_config_dict` has `pipeline.validate_data_config` /
  `tokenizers.validate_tokenizer_config` check them). `rl` is None outside RL runs."""

  basics: Basics
  model: Model
  loss: Loss
  optimization: Optimization
  evaluation: Evaluation
  checkpoints: Checkpoints
  divergence: Divergence
  mesh: Mesh
  data: ml_collections.ConfigDict
  tokenizer: ml_collections.ConfigDict
  rl: Optional[RL] = None

  @property
  def seed(self) -> int:
    return self.basics.seed

  @property
  def seq_len(self) -> int:
    return self.basics.seq_len

  @property
  def objective(self) -> str:
    return self.loss.objective

  def __post_init__(self):
    _check_model_against_run(self)
    opt = self.optimization
    if opt.batch_size % opt.grad_accum_steps:
      _fail(
        f"batch_size={opt.batch_size} is not divisible by grad_accum_steps={opt.grad_accum_steps}"
      )

  def check_mesh(self, num_devices: int):
    """The batches split over the data x fsdp axes of a mesh of `num_devices` devices."""
    data, fsdp, _ = sharding.mesh_shape(self.mesh.sizes(), num_devices)
    divisor = data * fsdp
    micro = self.optimization.micro_batch_size
    if micro % divisor:
      _fail(
        f"micro-batch batch_size/grad_accum_steps={micro} must be divisible by the "
        f"data x fsdp mesh size {divisor}"
      )
    if self.evaluation.eval_batch_size % divisor:
      _fail(
        f"eval_batch_size={self.evaluation.eval_batch_size} must be divisible by the data x "
        f"fsdp mesh size {divisor}"
      )


def _fail(msg: str):
  raise ValueError(f"invalid config: {msg}")


def _check_model_against_run(run: RunConfig):
  """model.* = 0 only with init_from_hf; the DiT's shape rules (head split, rotary); scan_layers
  needs >= 1 layer."""
  model, from_hf = run.model, bool(run.checkpoints.init_from_hf)
  if not from_hf:
    for f in dataclasses.fields(Model):
      value, allowed = getattr(model, f.name), f.metadata.get("allowed")
      if allowed is not None and not allowed.ok(value):
        if value == 0 and model.backbone != "dit":  # a config that expects its sizes from HF
          _fail(
            f"{Model.key(f)}=0 takes the init_from_hf checkpoint's value, but init_from_hf is "
            "not set: set --config.init_from_hf=<local Hugging Face checkpoint folder>, or "
            f"--config.{Model.key(f)} to {allowed.describe()}"
          )
        raise fields.out_of_range(Model.key(f), value, allowed)
  if model.backbone == "dit":
    try:
      models.backbone_config(dataclasses.asdict(model), vocab_size=1)
    except ValueError as e:
      _fail(f"model.{e}")
  if model.scan_layers and model.num_layers < 1 and not (model.num_layers == 0 and from_hf):
    _fail(f"model.scan_layers=True needs model.num_layers >= 1 (got {model.num_layers})")


def _check_data_ranges(config):
  for key, allowed in DATA_RANGES.items():
    value = fields.lookup(config, key)
    if value is not fields.MISSING and not allowed.ok(value):
      raise fields.out_of_range(key, value, allowed)


def check_field_ranges(config):
  """The ranges of the fields `config` has (a partial config, e.g. an RL launcher's: fields it
  lacks are not checked)."""
  _check_data_ranges(config)
  for cls in (Basics, *SECTIONS, RL):
    cls.from_config_dict(config)


def from_config_dict(config, *, check_data: bool = True) -> RunConfig:
  """The typed run config of a ConfigDict (or the dict of a config.json): every field against
  its range, then the rules between sections (not the method's: `config/edge.py`) and, with
  `check_data`, the data layer's rules for the data and tokenizer sections (off for programs that
  only need shapes: they read no data). ValueError with one line naming the field and the fix."""
  config = as_config_dict(config)
  check_known_fields(config)
  _check_data_ranges(config)
  basics = Basics.from_config_dict(config)
  sections = [cls.from_config_dict(config) for cls in SECTIONS]
  rl = RL.from_config_dict(config) if "rl" in config else None
  run = RunConfig(
    basics,
    *sections,
    data=_section_dict(config, "data", pipeline.default_data_config),
    tokenizer=_section_dict(config, "tokenizer", tokenizers.default_tokenizer_config),
    rl=rl,
  )
  if check_data:
    pipeline.validate_data_config(run.data)
    tokenizers.validate_tokenizer_config(run.tokenizer)
  return run


def check_tokenizer_fields(config) -> None:
  """ValueError for tokenizer.vocab_size set away from its default on a tokenizer the run does
  not train (its vocabulary file fixes the size): it would be ignored, yet recorded."""
  tok = config.get("tokenizer") or {}
  default = default_config().tokenizer.vocab_size
  kind, size = tok.get("kind", "trained"), tok.get("vocab_size", default)
  if kind != "trained" and size != default:
    raise ValueError(
      f"tokenizer.vocab_size={size!r} is not read by tokenizer.kind={kind} (its vocabulary file "
      "gives the size); it applies to tokenizer.kind=trained only: drop it, or where the --config "
      f"file sets it, set --config.tokenizer.vocab_size={default} (its default)"
    )


def as_config_dict(config) -> ml_collections.ConfigDict:
  """`config` as a ConfigDict: a ConfigDict as is, a mapping (a config.json's dict) converted;
  anything else is a TypeError naming what to pass."""
  if isinstance(config, ml_collections.ConfigDict):
    return config
  if isinstance(config, Mapping):
    return ml_collections.ConfigDict(dict(config))
  raise TypeError(
    f"a run config is an ml_collections.ConfigDict or a dict (e.g. configs/default.py's "
    f"get_config(), or a workdir's config.json), not {type(config).__name__}"
  )


# Sections whose contents are records, not settings: `interop` is what
# `interop.import_checkpoint` adds (source path, special ids, ...); no field of it is read as one.
FREE_SECTIONS = ("interop",)


@functools.lru_cache(maxsize=1)
def known_field_names() -> Tuple[str, ...]:
  """Every dotted field name a run config may have: the defaults', the optional `rl` section's
  and the free-form sections (whose contents are not checked)."""
  config = default_config()
  config.rl = rl_defaults()
  return tuple(cli.config_field_names(config)) + FREE_SECTIONS


def _unknown_fields(config, known, prefix=""):
  for key in config.keys():
    name, child = f"{prefix}{key}", config[key]
    if name not in known:
      yield name
    elif name not in FREE_SECTIONS and isinstance(child, ml_collections.ConfigDict):
      yield from _unknown_fields(child, known, name + ".")


def check_known_fields(config):
  """ValueError naming each field of `config` the run config does not have, with the closest
  valid names: a misspelt field (model.num_head) would otherwise be ignored and its default used
  (the launchers' lock_config catches it on the command line, not in a config built in Python)."""
  known = known_field_names()
  unknown = list(_unknown_fields(config, known))
  if not unknown:
    return
  parts = []
  for name in unknown:
    close = cli.closest_fields(name, known, n=1)
    parts.append(f"{name} (did you mean {close[0]}?)" if close else name)
  _fail(
    f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(parts)}: the run config has no "
    "such field and would ignore it; rename it to a valid field or drop it"
  )


def _section_dict(config, name: str, default) -> ml_collections.ConfigDict:
  """The `data` / `tokenizer` section: its defaults, with every field the config gives over them
  (a config.json written without some field reads that field's default, as the typed sections do)."""
  found = config.get(name)
  merged = default().to_dict()
  if found is not None:
    merged.update(found.to_dict() if hasattr(found, "to_dict") else dict(found))
  return ml_collections.ConfigDict(copy.deepcopy(merged))


# ----------------------------------------------------------------------------- defaults
def _write(config: ml_collections.ConfigDict, section: Section):
  """The fields of `section` into `config` at their ConfigDict keys."""
  for f in dataclasses.fields(section):
    *parents, leaf = type(section).key(f).split(".")
    node = config
    for p in parents:
      if p not in node:
        node[p] = ml_collections.ConfigDict()
      node = node[p]
    value = getattr(section, f.name)
    node[leaf] = (
      ml_collections.config_dict.placeholder(f.metadata["none_type"]) if value is None else value
    )


def default_config() -> ml_collections.ConfigDict:
  """The base run config; every config in configs/ starts from it (configs/default.py). The
  fields, their defaults and comments are the sections' (`config/sections.py`)."""
  c = ml_collections.ConfigDict()
  _write(c, Basics())
  for cls in SECTIONS:
    _write(c, cls())
  c.tokenizer = tokenizers.default_tokenizer_config()  # kind=trained: BPE trained at first run
  c.tokenizer.vocab_size = 4096
  c.data = pipeline.default_data_config()  # the embedded Jane Austen corpus, wrapped
  return c


def rl_defaults() -> ml_collections.ConfigDict:
  """The `rl` section's defaults as a ConfigDict (`setdiff_jax.rl.config.default_config`)."""
  c = ml_collections.ConfigDict()
  _write(c, RL())
  return c.rl


# ----------------------------------------------------------------------------- what it builds
def model_and_objective(
  run: RunConfig, tokenizer
) -> Tuple[models.BackboneConfig, losses.ObjectiveConfig]:
  """Backbone and objective configs; the vocabulary and special ids come from the tokenizer."""
  vocab = int(run.model.vocab_size) or tokenizer.vocab_size
  if vocab < tokenizer.vocab_size:
    raise ValueError(
      f"model.vocab_size={vocab} is smaller than the tokenizer's "
      f"{tokenizer.vocab_size}; set model.vocab_size=0 to take it from the tokenizer"
    )
  model_cfg = models.backbone_config(dataclasses.asdict(run.model), vocab)
  loss = dataclasses.asdict(run.loss)
  name = loss.pop("objective")
  obj = losses.ObjectiveConfig.from_config(
    {
      **loss,
      "max_set_size": loss["max_set_size"] or None,
      "name": name,
      "mask_token_id": tokenizer.mask_id,
      "pad_token_id": tokenizer.pad_id,
      "eos_token_id": tokenizer.eos_id,
    }
  )
  return model_cfg, obj


__all__ = [
  "Basics",
  "RunConfig",
  "from_config_dict",
  "as_config_dict",
  "check_tokenizer_fields",
  "check_known_fields",
  "known_field_names",
  "check_field_ranges",
  "default_config",
  "rl_defaults",
  "model_and_objective",
]
