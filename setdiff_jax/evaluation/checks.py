"""The checks `launch/evaluate.py` runs before any evaluation: the options (explicit values are
checked, never replaced by defaults), decoding options the run's sampler has no use for, the
fields of an --accuracy_data file, the owner of an --output file. Each raises one ValueError
naming the flag and the fix."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional, Sequence

from setdiff_jax import decoders, decoding, paths
from setdiff_jax.data import text_files
from setdiff_jax.sampling import policies


def check_pair_fields(path: str, prompt_field: str, answer_field: str):
  """ValueError naming the first --accuracy_data record without the run's prompt or answer field
  (the run's data.prompt_field / answer_field, fixed at training: evaluate.py cannot change them,
  so the fix is in the file). Lines that are not JSON objects are left to `pairs.jsonl_pairs`."""
  for file in text_files.parse_paths(path):
    try:
      _check_file_pair_fields(file, prompt_field, answer_field)
    except UnicodeDecodeError as e:  # a caller that skipped the flag's file check
      raise ValueError(f"--accuracy_data={text_files.not_utf8(file, e)}") from e


def _check_file_pair_fields(file: str, prompt_field: str, answer_field: str):
  with text_files.open_text(file, "accuracy_data") as f:
    for lineno, line in enumerate(f, 1):
      try:
        record = json.loads(line) if line.strip() else None
      except ValueError:
        return
      if not isinstance(record, dict):
        continue
      missing = [k for k in (prompt_field, answer_field) if k not in record]
      if missing:
        raise ValueError(
          f"{file}:{lineno}: record has no field {missing[0]!r} (fields: {sorted(record)}); "
          f"--accuracy_data records hold this run's fields {prompt_field!r} and "
          f"{answer_field!r} (its data.prompt_field / data.answer_field): rename them in the file"
        )


def check_options(opts, seq_len: int):
  """`opts` (a `run.EvalOptions`): explicit values are checked, never replaced by defaults (None
  means the default)."""
  decoding.check_sampling_flags(seq_len, window=opts.window, max_new_tokens=opts.max_new_tokens)
  for name in ("thresholds", "batch_sizes", "infill_settings", "infill_thresholds", "policy_args"):
    if getattr(opts, name) is not None and not len(getattr(opts, name)):  # never the defaults
      raise ValueError(f"--{name} is empty: give at least one value, or leave it out")
  for name in ("num_orders", "batch_size", "infill_batch_size", "repeats", "num_samples"):
    if getattr(opts, name) < 1:
      raise ValueError(f"--{name}={getattr(opts, name)} must be >= 1")
  for name in ("max_rows", "num_infill", "num_examples"):
    if getattr(opts, name) is not None and getattr(opts, name) < 1:
      all_of = " or -1 (all that fit)" if name == "num_infill" else ""
      raise ValueError(f"--{name}={getattr(opts, name)} must be >= 1{all_of}")
  if opts.speed_examples < 0:
    raise ValueError(f"--speed_examples={opts.speed_examples} must be >= 0 (0: no batch-1 timing)")
  if any(int(b) < 1 for b in opts.batch_sizes):
    raise ValueError(f"--batch_sizes={list(opts.batch_sizes)}: each must be >= 1")


def check_method_options(state, evals: Sequence[str], opts):
  """ValueError for an explicit decoding option the run's sampler has no use for (tau of AR,
  block alignment of SetDLM, ...); the defaults suit every method."""
  decode = set(evals) & {"speed", "samples", "accuracy"}
  given = {
    "policy": decode and opts.policy != policies.DEFAULT,
    "policy_args": decode and tuple(opts.policy_args) != (None,),
    "thresholds": decode and any(t is not None for t in opts.thresholds or ()),
    "infill_thresholds": "infill" in evals and any(t is not None for t in opts.infill_thresholds),
  }
  decoding.check_method_flags(
    decoders.get(state.objective_config.name),
    window=opts.window,
    policy_flags=[name for name, on in given.items() if on],
    align_to_blocks="accuracy" in evals and opts.align_to_blocks is not None,
  )


def check_owner(record: Dict[str, Any], path: str, workdir: str, output: Optional[str]):
  """ValueError when --output holds another run's results: its top level and history keys belong
  to one run (a run directory that moved keeps its own WORKDIR/eval_results.json)."""
  owner = record.get("workdir")
  if output is not None and owner and owner != paths.resolve(workdir):
    raise ValueError(
      f"--output={output} holds the results of another run ({owner}); give each run its own "
      f"file, e.g. --output={os.path.join(os.path.dirname(output) or '.', 'OTHER_RUN.json')}"
    )


__all__ = ["check_pair_fields", "check_options", "check_method_options", "check_owner"]
