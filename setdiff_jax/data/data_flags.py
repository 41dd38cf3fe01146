"""Which data source reads which data-path field, and the checks of a data file given by a flag.

Every data-path field (`data.paths`, `data.eval_paths`, `data.tfds_data_dir`) is read by some
sources only; set on another source it would be silently ignored, so it is refused instead
(training: `check_fields`, from `pipeline.validate_data_config`; evaluation: `apply_overrides`,
for `launch/evaluate.py --eval_paths / --tfds_data_dir`). A file named by a flag is checked
before anything is computed (`check_text_file`): missing, a directory, or refused by the data
readers' own check (not UTF-8, NUL bytes, empty) is one error naming the flag and the file.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Tuple

from setdiff_jax.data import text_files
from setdiff_jax.data.pairs import PAIR_SOURCES, TASK_SOURCES

# field -> the data sources that read it
READERS: Dict[str, Tuple[str, ...]] = {
  "paths": ("text", "jsonl", "pairs_jsonl"),
  "eval_paths": ("text", "jsonl", "pairs_jsonl"),
  "tfds_data_dir": ("tfds", "gsm8k"),
}
# setting field -> the data sources that read it: set away from its default on another source it
# would be ignored, yet recorded in config.json (and, structural, block a resume), so refused.
SETTING_READERS: Dict[str, Tuple[str, ...]] = {
  "tfds_name": ("tfds",),
  "train_split": ("embedded", "tfds", "gsm8k"),
  "eval_split": ("embedded", "tfds", "gsm8k"),
  "text_unit": ("text",),
  "jsonl_field": ("jsonl",),
  "prompt_field": ("pairs_jsonl",),
  "answer_field": ("pairs_jsonl",),
  "prompt_style": PAIR_SOURCES,
  "overflow": PAIR_SOURCES,
  "task_operands": TASK_SOURCES,
  "task_max_operand": TASK_SOURCES,
  "task_train_examples": TASK_SOURCES,
  "task_eval_examples": TASK_SOURCES,
  "task_seed": TASK_SOURCES,
}
# setting field -> (whether a data config reads it, the configs that do): fields read under one
# `data.preprocess` only, refused like SETTING_READERS' where the run would ignore them.
PREPROCESS_READERS: Dict[str, Tuple[Callable[[Any], bool], str]] = {
  "overlong": (
    lambda d: d.get("preprocess") == "pad" and d.get("source") not in PAIR_SOURCES,
    "data.preprocess=pad on a document source (prompt/answer sources follow data.overflow)",
  ),
  "wrap_style": (lambda d: d.get("preprocess") == "wrap", "data.preprocess=wrap"),
}


def _given(value) -> bool:
  return bool(text_files.parse_paths(value)) if value is not None else False


def _not_read(source: str, field: str, name: str) -> str:
  readers = ", ".join(READERS[field])
  what = {
    "embedded": "the embedded corpus",
    "arithmetic": "a procedural task (no files)",
    "chain": "a procedural task (no files)",
  }.get(source, f"data.source={source}")
  return (
    f"{name} is not read by this run: data.source={source} reads {what}; {name} applies "
    f"to data.source {readers} only: drop it"
  )


def check_fields(data_cfg, defaults=None):
  """Refuses a data-path field set on a source that does not read it, and a setting field
  (`SETTING_READERS`, `PREPROCESS_READERS`) moved off its default (`defaults`, the data config's
  defaults) where it is not read."""
  source = data_cfg.get("source")
  for field, readers in READERS.items():
    if source not in readers and _given(data_cfg.get(field)):
      raise ValueError(_not_read(source, field, f"data.{field}"))
  if defaults is None:
    return
  for field, rule in unread_settings(data_cfg):
    if field in data_cfg and data_cfg.get(field) != defaults.get(field):
      where = f"data.source={source}" + (
        f" with data.preprocess={data_cfg.get('preprocess')}" if field in PREPROCESS_READERS else ""
      )
      raise ValueError(
        f"data.{field}={data_cfg.get(field)!r} is not read by {where}; it applies to {rule} only: "
        f"drop it (the default is {defaults.get(field)!r})"
      )


def unread_settings(data_cfg) -> List[Tuple[str, str]]:
  """(field, the configs that read it) of each setting field (`SETTING_READERS`,
  `PREPROCESS_READERS`) that the rows of `data_cfg` (a dict or ConfigDict) never read."""
  source = data_cfg.get("source")
  out = [
    (field, f"data.source {', '.join(readers)}")
    for field, readers in SETTING_READERS.items()
    if source not in readers
  ]
  return out + [(f, rule) for f, (reads, rule) in PREPROCESS_READERS.items() if not reads(data_cfg)]


def check_text_file(path: str, flag: str):
  """Raises ValueError (naming `flag` and the file) unless `path` is a text file the data readers
  accept (`text_files.read_text`: UTF-8, no NUL bytes, not empty; .gz / .xz / .bz2 decompressed),
  read whole; remote paths are left to their reader."""
  if "://" in path:
    return
  if os.path.isdir(path):
    raise ValueError(f"{flag}={path} is a directory; it takes files (comma-separated): list them")
  if not os.path.isfile(path):
    raise ValueError(f"{flag}={path}: no such file; pass an existing file")
  text_files.read_text(path, flag.lstrip("-"), flag)  # the data readers' own check


def apply_overrides(data_cfg, overrides: Dict[str, Tuple[str, str]]):
  """Sets data fields from flags, {field: (flag, value)}, refusing a flag the run's data source
  does not read and, for file lists, a file that is not usable text."""
  source = data_cfg.get("source")
  for field, (flag, value) in overrides.items():
    if source not in READERS[field]:
      raise ValueError(_not_read(source, field, flag))
    if field in ("paths", "eval_paths"):
      files = text_files.parse_paths(value)
      if not files:
        raise ValueError(f"{flag} is empty; pass one or more files (comma-separated)")
      for path in files:
        check_text_file(path, flag)
    data_cfg[field] = value


__all__ = [
  "READERS",
  "SETTING_READERS",
  "PREPROCESS_READERS",
  "check_fields",
  "unread_settings",
  "check_text_file",
  "apply_overrides",
]
