"""Prompt/answer pairs and their padded rows with a context mask (conditional training).

Sources (`data.source`):
  pairs_jsonl  JSON lines with a prompt and an answer string field (`data.prompt_field`,
               `data.answer_field`); files in `data.paths` / `data.eval_paths`.
  gsm8k        TFDS `gsm8k` through the real builder, never downloading (`download=False`,
               `data.tfds_data_dir`); prepare it once with
               `tfds build gsm8k --data_dir=DIR --file_format=array_record`.
  arithmetic   the procedural multi-step arithmetic task of `data/tasks.py` (no files).

Row layout (`pad`, one pair per row):

  tokens          [BOS] prompt answer [EOS] pad ...        int32 [L]
  attention_mask   1     1 ... 1  1 ... 1   1    0 ...
  context_mask     1     1 ... 1  0 ... 0   0    0 ...     (never a target, never masked)

`data.pad_targets` says what fills the row after the answer's EOS:
  none  pads, never attended and never targets (above; the reference).
  eos   EOS tokens up to L, attended and targets like the answer (the recipe that trains
        MDLM-style models on conditional data: the model learns where the answer ends instead of
        reading leftover masks as "the answer is longer"):
          tokens          [BOS] prompt answer [EOS] [EOS] ... [EOS]
          attention_mask   1 ...                              1
          context_mask     1 ... 1  0 ...                     0
        The likelihood bound still scores the answer and its first EOS only
        (`evaluation/likelihood.bound_data_config` builds its rows in the `none` layout).

The prompt and the answer are encoded separately, so the boundary is a token boundary and a
decoder given [BOS] + encode(prompt) sees exactly the training context. `data.prompt_style`
formats the prompt first (`plain`, or the GSM8K reference prompt with or without the chat
template; see `format_prompt`).

Rows that do not fit L follow `data.overflow`, never silently: `error` (default) raises naming
the example; `skip` drops it; `truncate_prompt` keeps the last tokens of the prompt (BOS kept).
Both `skip` and `truncate_prompt` log how many examples they touched. An answer that does not fit
even with a one-token prompt is always an error (or skipped under `skip`).
"""

from __future__ import annotations

import json
from typing import List, Optional, Sequence, Tuple

from absl import logging
import grain
import numpy as np

from setdiff_jax.data import global_order
from setdiff_jax.data import tasks
from setdiff_jax.data import text_files
from setdiff_jax.data.records import Pair

PAIR_SOURCES = ("pairs_jsonl", "gsm8k", "arithmetic", "chain")
TASK_SOURCES = ("arithmetic", "chain")  # procedural: they also have a validation split
OVERFLOW_RULES = ("error", "skip", "truncate_prompt")
PROMPT_STYLES = ("plain", "gsm8k", "gsm8k_chat")
PAD_TARGETS = ("none", "eos")

# The reference GSM8K prompt (SPEC §6.4) and the Qwen chat wrapping of the user turn; the
# context ends after "<|im_start|>assistant\n" (SPEC §5).
GSM8K_INSTRUCTION = "Please reason step by step, and put your final answer within $\\boxed{}$. "
CHAT_TEMPLATE = "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"


def format_prompt(prompt: str, style: str = "plain") -> str:
  """plain: unchanged; gsm8k: the reference instruction + question; gsm8k_chat: that, in the
  chat template."""
  if style not in PROMPT_STYLES:
    raise ValueError(f"data.prompt_style={style!r}; expected one of {PROMPT_STYLES}")
  if style == "plain":
    return prompt
  text = GSM8K_INSTRUCTION + prompt
  return CHAT_TEMPLATE.format(prompt=text) if style == "gsm8k_chat" else text


# ----------------------------------------------------------------------------- sources
def _check_pair(prompt, answer, where: str, prompt_field: str, answer_field: str) -> Pair:
  for name, value in ((prompt_field, prompt), (answer_field, answer)):
    if not isinstance(value, str):
      raise ValueError(f"{where}: field {name!r} is {type(value).__name__}, not a string")
  if not answer.strip():
    raise ValueError(
      f"{where}: field {answer_field!r} is empty; every example needs an answer "
      "to train on (remove the line or fill it in)"
    )
  return Pair(prompt, answer, where)


def jsonl_pairs(
  paths, prompt_field: str = "prompt", answer_field: str = "answer", field: str = "paths"
) -> List[Pair]:
  """Pairs of JSON-lines files; errors name the file, the line and the missing field."""
  out = []
  for path in text_files.parse_paths(paths):
    out += _jsonl_file_pairs(path, prompt_field, answer_field, field)
  return out


def _jsonl_file_pairs(path: str, prompt_field: str, answer_field: str, field: str) -> List[Pair]:
  out = []
  for lineno, line in enumerate(text_files.read_text(path, field).split("\n"), 1):
    if not line.strip():
      continue
    where = f"{path}:{lineno}"
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{where}: not valid JSON ({e})") from e
    if not isinstance(record, dict):
      raise ValueError(f"{where}: a record must be a JSON object")
    for name, cfg_field in ((prompt_field, "prompt_field"), (answer_field, "answer_field")):
      if name not in record:
        raise ValueError(
          f"{where}: record has no field {name!r} (fields: {sorted(record)}; set data.{cfg_field})"
        )
    out.append(
      _check_pair(record[prompt_field], record[answer_field], where, prompt_field, answer_field)
    )
  return out


def gsm8k_pairs(split: str, data_dir: Optional[str] = None) -> List[Pair]:
  """GSM8K (question, answer) from the prepared TFDS builder; the answer ends with '#### n'."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from tensorflow_datasets.text.gsm8k import gsm8k as _  # noqa: F401  registers the builder

  try:
    source = tfds.data_source("gsm8k", split=split, data_dir=data_dir, download=False)
    n = len(source)
  except Exception as e:  # tfds raises several types for "not prepared"
    raise FileNotFoundError(
      f"TFDS gsm8k split {split!r} is not prepared under data_dir={data_dir!r} (set "
      f"data.tfds_data_dir). This never downloads; prepare it once with: tfds build gsm8k "
      f"--data_dir=DIR --file_format=array_record. tfds said: {type(e).__name__}: {e}"
    ) from e
  text = lambda v: v.decode("utf-8") if isinstance(v, bytes) else str(v)
  return [
    _check_pair(
      text(source[i]["question"]),
      text(source[i]["answer"]),
      f"gsm8k {split} #{i}",
      "question",
      "answer",
    )
    for i in range(n)
  ]


def load_pairs(data_cfg, split: str) -> List[Pair]:
  """All pairs of `split` ('train' | 'eval' | 'validation', the last for the procedural tasks
  only: task_eval_examples problems disjoint from train and eval) of a pair source (prompts not
  yet formatted)."""
  if split not in ("train", "eval", "validation"):
    raise ValueError(f"split={split!r}; expected 'train', 'eval' or 'validation'")
  source = data_cfg.source
  if split == "validation" and source not in TASK_SOURCES:
    raise ValueError(f"data.source={source!r} has no validation split (only {TASK_SOURCES})")
  if source == "pairs_jsonl":
    field = "paths" if split == "train" else "eval_paths"
    paths = text_files.parse_paths(data_cfg.get(field))
    if not paths:
      raise ValueError(f"data.source=pairs_jsonl with split={split!r} needs data.{field}")
    return jsonl_pairs(
      paths, data_cfg.get("prompt_field", "prompt"), data_cfg.get("answer_field", "answer"), field
    )
  if source == "gsm8k":
    name = data_cfg.train_split if split == "train" else data_cfg.eval_split
    return gsm8k_pairs(name, data_cfg.get("tfds_data_dir"))
  if source == "arithmetic":
    n = (
      data_cfg.get("task_train_examples", 20000)
      if split == "train"
      else data_cfg.get("task_eval_examples", 200)
    )
    return tasks.arithmetic_pairs(
      {"eval": "test"}.get(split, split),
      int(n),
      int(data_cfg.get("task_seed", 0)),
      num_operands=int(data_cfg.get("task_operands", 3)),
      max_operand=int(data_cfg.get("task_max_operand", 9)),
      num_test=int(data_cfg.get("task_eval_examples", 200)),
    )
  if source == "chain":
    n = (
      data_cfg.get("task_train_examples", 20000)
      if split == "train"
      else data_cfg.get("task_eval_examples", 200)
    )
    return tasks.chain_pairs(
      {"eval": "test"}.get(split, split),
      int(n),
      int(data_cfg.get("task_seed", 0)),
      num_operands=int(data_cfg.get("task_operands", 4)),
      max_operand=int(data_cfg.get("task_max_operand", 99)),
    )
  raise ValueError(f"data.source={source!r} is not a pair source {PAIR_SOURCES}")


def pair_texts(data_cfg, split: str = "train") -> List[str]:
  """Formatted prompt + answer texts (tokenizer training)."""
  style = data_cfg.get("prompt_style", "plain")
  return [format_prompt(p.prompt, style) + p.answer for p in load_pairs(data_cfg, split)]


# ----------------------------------------------------------------------------- rows
def encode_pairs(
  tokenizer,
  pairs: Sequence[Pair],
  seq_len: int,
  *,
  overflow: str = "error",
  prompt_style: str = "plain",
) -> Tuple[List[Tuple[List[int], List[int]]], dict]:
  """Token ids (prompt with BOS, answer with EOS) that fit `seq_len` under the overflow rule.

  Returns the kept (prompt_ids, answer_ids) and stats: counts {'kept', 'skipped', 'truncated'}
  and 'kept_indices', the kept pairs' positions in `pairs` (what `skip` left, in order).
  """
  if overflow not in OVERFLOW_RULES:
    raise ValueError(f"data.overflow={overflow!r}; expected one of {OVERFLOW_RULES}")
  prompts = tokenizer.encode_batch([format_prompt(p.prompt, prompt_style) for p in pairs])
  answers = tokenizer.encode_batch([p.answer for p in pairs])
  kept, stats = [], {"kept": 0, "skipped": 0, "truncated": 0, "kept_indices": []}
  for index, (pair, p, a) in enumerate(zip(pairs, prompts, answers)):
    p, a = [int(tokenizer.bos_id)] + list(p), list(a) + [int(tokenizer.eos_id)]
    if not a[:-1]:
      raise ValueError(f"{pair.where}: the answer encodes to no tokens")
    if len(p) + len(a) > seq_len:
      room = seq_len - len(a) - 1  # prompt tokens that fit after BOS
      what = (
        f"{pair.where}: prompt ({len(p)} tokens with BOS) + answer ({len(a)} with EOS) "
        f"> seq_len={seq_len}"
      )
      if overflow == "skip":
        stats["skipped"] += 1
        continue
      if overflow == "error" or room < 1:
        hint = (
          "the answer alone does not fit: raise seq_len"
          if room < 1
          else "raise seq_len, or set data.overflow=truncate_prompt (keeps the prompt's last "
          "tokens) or skip"
        )
        raise ValueError(f"{what}; {hint}")
      p = p[:1] + p[len(p) - room :]
      stats["truncated"] += 1
    kept.append((p, a))
    stats["kept_indices"].append(index)
  stats["kept"] = len(kept)
  if stats["skipped"] or stats["truncated"]:
    logging.warning(
      "pairs longer than seq_len=%d: %d skipped, %d prompts truncated to their last "
      "tokens (data.overflow=%s); %d kept",
      seq_len,
      stats["skipped"],
      stats["truncated"],
      overflow,
      len(kept),
    )
  return kept, stats


def pair_rows(
  encoded: Sequence[Tuple[Sequence[int], Sequence[int]]],
  seq_len: int,
  pad_id: int,
  *,
  pad_targets: str = "none",
  eos_id: Optional[int] = None,
) -> dict:
  """[BOS] prompt answer [EOS] pad...; tokens, attention_mask, context_mask int32 [n, L].

  pad_targets='eos': the tail after the answer's EOS is EOS (`eos_id`), attended, not context.
  """
  if pad_targets not in PAD_TARGETS:
    raise ValueError(f"data.pad_targets={pad_targets!r}; expected one of {PAD_TARGETS}")
  if pad_targets == "eos" and eos_id is None:
    raise ValueError("pair_rows(pad_targets='eos') needs eos_id")
  n = len(encoded)
  tokens = np.full((n, seq_len), pad_id, np.int32)
  attn = np.zeros((n, seq_len), np.int32)
  ctx = np.zeros((n, seq_len), np.int32)
  for i, (p, a) in enumerate(encoded):
    row = list(p) + list(a)
    if len(row) > seq_len:
      raise ValueError(f"row {i} has {len(row)} tokens > seq_len={seq_len}")
    tokens[i, : len(row)] = row
    attn[i, : len(row)] = 1
    ctx[i, : len(p)] = 1
    if pad_targets == "eos":
      tokens[i, len(row) :] = eos_id
      attn[i, len(row) :] = 1
  return {"tokens": tokens, "attention_mask": attn, "context_mask": ctx}


def _fill(batch: dict, batch_size: int, pad_id: int) -> dict:
  extra = batch_size - batch["tokens"].shape[0]
  if extra <= 0:
    return batch
  pad = lambda a, v: np.concatenate([a, np.full((extra,) + a.shape[1:], v, a.dtype)])
  return {k: pad(v, pad_id if k == "tokens" else 0) for k, v in batch.items()}


def make_pair_dataset(
  data_cfg,
  tokenizer,
  *,
  split: str,
  seq_len: int,
  batch_size: int,
  seed: int,
  process_index: int,
  process_count: int,
  shuffle: bool,
  num_epochs: Optional[int],
  drop_remainder: bool,
  read_options,
) -> grain.IterDataset:
  """This process's rows of each global batch of pair rows (`pipeline.make_dataset`: one global
  order of the pairs, whatever the number of processes; `batch_size` is the local batch)."""
  if data_cfg.preprocess != "pad":
    raise ValueError(
      f"data.source={data_cfg.source} builds one pair per row: set "
      f"data.preprocess=pad (got {data_cfg.preprocess!r})"
    )
  pairs = load_pairs(data_cfg, split)
  encoded, _ = encode_pairs(
    tokenizer,
    pairs,
    seq_len,
    overflow=data_cfg.get("overflow", "error"),
    prompt_style=data_cfg.get("prompt_style", "plain"),
  )
  rows = pair_rows(
    encoded,
    seq_len,
    tokenizer.pad_id,
    pad_targets=data_cfg.get("pad_targets", "none"),
    eos_id=int(tokenizer.eos_id),
  )
  n = rows["tokens"].shape[0]
  if not n:
    raise ValueError(f"no data: {data_cfg.source} {split} has no pairs")
  ds = grain.MapDataset.source([{k: v[i] for k, v in rows.items()} for i in range(n)])
  if shuffle:
    ds = ds.shuffle(seed=seed)
  ds = global_order.process_rows(
    ds.repeat(num_epochs),
    global_batch_size=batch_size * process_count,
    process_index=process_index,
    process_count=process_count,
    drop_remainder=drop_remainder,
  )
  empty = {k: np.zeros((0, seq_len), v.dtype) for k, v in rows.items()}
  stack = lambda share: (
    {k: np.stack([r[k] for r in share]) for k in rows}
    if share  # noqa
    else dict(empty)
  )
  ds = ds.map(lambda share: _fill(stack(share), batch_size, tokenizer.pad_id))
  return ds.to_iter_dataset(read_options)


__all__ = [
  "PAIR_SOURCES",
  "OVERFLOW_RULES",
  "PROMPT_STYLES",
  "PAD_TARGETS",
  "GSM8K_INSTRUCTION",
  "Pair",
  "format_prompt",
  "jsonl_pairs",
  "gsm8k_pairs",
  "load_pairs",
  "pair_texts",
  "encode_pairs",
  "pair_rows",
  "make_pair_dataset",
]
