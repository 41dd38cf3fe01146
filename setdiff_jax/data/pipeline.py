"""grain input pipelines: text source -> tokens -> fixed-shape batches.

Usage::

  ds = make_dataset(cfg.data, tokenizer, split="train", seq_len=128,
                    global_batch_size=512, seed=0,
                    process_index=jax.process_index(),
                    process_count=jax.process_count())
  it = iter(ds)              # grain DatasetIterator
  batch = next(it)           # {'tokens': int32 [local_batch, seq_len],
                             #  'attention_mask': int32 [local_batch, seq_len]}
  state = it.get_state()     # JSON-able dict; it.set_state(state) resumes exactly

Every batch has the same shape [global_batch_size // process_count, seq_len]:
train batches drop the remainder; eval (drop_remainder=False) pads the last batch
with empty rows (tokens = pad id, attention_mask = 0), so jit never recompiles.

Preprocessing (``data_cfg.preprocess``):

- ``wrap``: documents are concatenated and cut into rows; attention all ones.
  ``wrap_style='row'`` (default) is the reference "wrapped" LM1B format of the
  MDLM/BD3LM pipeline (SPEC §5): the stream is ``doc EOS doc EOS ...`` and each
  row is ``[BOS] + next seq_len-2 stream tokens + [EOS]``, so every row starts
  with BOS (what ``keep_clean_bos`` assumes). ``wrap_style='doc'``: the stream
  is ``BOS doc EOS BOS doc EOS ...`` cut into rows of exactly seq_len (rows may
  start mid-document). A final partial row is dropped.
- ``pad``: one document per row, ``[BOS] + doc + [EOS]`` (a document longer than a
  row is handled by ``data.overlong``: ``cut`` truncates it to seq_len, keeping no EOS
  since it did not end there; ``wrap`` continues it on further rows, each starting
  with BOS; ``skip`` drops it; ``error`` refuses; every mode counts and logs them),
  right-padded with the pad id; attention_mask is 1 on real tokens.

How each case runs (all in this process, no grain worker processes):

- pad, any source: docs -> shuffle -> repeat -> this process's texts of each
  global batch -> tokenize (encode_batch) and pad. Lazy: only the texts of this
  process's rows are read.
- wrap, in-memory sources (embedded, text, jsonl): the whole split is tokenized
  once (seconds for the 4 MB embedded corpus) and cut into rows, as the
  reference's pre-wrapped .dat files; then rows -> shuffle -> repeat -> this
  process's rows of each global batch.
- wrap, tfds (lm1b, 30M sentences): lazy. docs -> shuffle -> repeat ->
  groups of 256 texts -> tokenize into one stream piece ->
  grain ConcatThenSplitIterDataset -> add row specials -> global batch -> this
  process's rows. Rows of one batch are consecutive pieces of the stream (LM1B
  sentences are short, so neighbouring rows share at most one sentence). Every
  process tokenizes the global stream here (the rows of a batch depend on all the
  documents before them); the cost is the tokenizer's, small next to a step.

One global data order: the shuffled, repeated sequence of examples (documents,
rows or pairs) depends only on `seed`, never on the number of processes. Global
batch s is its elements s*G .. s*G+G-1 (G = global_batch_size); process p of P
takes rows p*G/P .. (p+1)*G/P-1 of it (`process_rows`), so the P local batches of
a step, concatenated in process order, are the 1-process batch, and the same run
on 1, 2 or 4 hosts sees the same data. (Before this, each process shuffled its
strided share of the documents: multi-process runs read other batches; 1-process
runs are unchanged, bit for bit, checkpoints included.) Shuffling is an exact
per-epoch permutation (grain index_shuffle), reseeded each epoch, from `seed`.

Checkpointing: the iterator state is a small JSON-able dict, the same on every
process (the global position), saved beside the train state (`data/iterator_state.py`).
"""

from __future__ import annotations

import dataclasses

import grain
import ml_collections
import numpy as np
from grain.experimental import ConcatThenSplitIterDataset

from setdiff_jax.data import data_flags, pairs, sources
from setdiff_jax.data.global_order import process_rows
from setdiff_jax.data.rows import (
  OVERLONG_RULES,
  add_row_specials,
  chunk_len,
  fit_documents,
  pad_rows,
  token_stream,
  wrap_rows,
)

SOURCES = ("embedded", "tfds", "text", "jsonl") + pairs.PAIR_SOURCES
PREPROCESS = ("wrap", "pad")
WRAP_STYLES = ("row", "doc")
IN_MEMORY_SOURCES = ("embedded", "text", "jsonl")
# Texts tokenized together in the lazy wrap pipeline (one encode_batch call).
DOCS_PER_GROUP = 256


def default_data_config() -> ml_collections.ConfigDict:
  """Data config with defaults: the embedded Jane Austen corpus, wrapped."""
  cfg = ml_collections.ConfigDict()
  # 'embedded' (Jane Austen corpus shipped in the package) | 'tfds' (a prepared
  # array_record TFDS dataset) | 'text' (plain text files) | 'jsonl'.
  cfg.source = "embedded"
  # tfds: dataset name and the data_dir it was prepared in (None: tfds default,
  # ~/tensorflow_datasets). Never downloads; prepare LM1B with launch/prepare_lm1b.py (from the
  # released text files, no TensorFlow) or `tfds build lm1b --file_format=array_record` (TF).
  cfg.tfds_name = "lm1b"
  cfg.tfds_data_dir = ml_collections.FieldReference(None, field_type=str)
  # Split names for 'embedded' ('train' | 'validation') and 'tfds' (lm1b:
  # 'train' | 'test'; slices like 'train[:1%]' work).
  cfg.train_split = "train"
  cfg.eval_split = "validation"
  # text/jsonl: comma-separated file paths (or a list) for train and eval.
  cfg.paths = ""
  cfg.eval_paths = ""
  # text: one document per 'paragraph' (blank-line separated) or per 'line'.
  cfg.text_unit = "paragraph"
  # jsonl: the string field holding each record's text.
  cfg.jsonl_field = "text"
  # 'wrap' (concatenate and cut, attention all ones) | 'pad' (one document per
  # row, right-padded).
  cfg.preprocess = "wrap"
  # pad only: a document longer than a row ([BOS] doc [EOS] > seq_len) is 'cut' to the row
  # (the tail is lost) | 'wrap'ped onto further rows ([BOS] + the next piece) | 'skip'ped |
  # an 'error'. All count such documents and log the count (preprocess='wrap' never cuts;
  # prompt/answer pairs have data.overflow).
  cfg.overlong = "cut"
  # wrap only: 'row' = each row [BOS] stream [EOS], stream = doc EOS doc EOS ...
  # (reference LM1B format) | 'doc' = stream BOS doc EOS BOS doc EOS ... cut
  # into rows of exactly seq_len.
  cfg.wrap_style = "row"
  # ---- prompt/answer pairs (data.source = pairs_jsonl | gsm8k | arithmetic; see
  # setdiff_jax/data/pairs.py). Rows: [BOS] prompt answer [EOS] pad, context_mask = 1 on
  # BOS + prompt; needs preprocess='pad'. gsm8k reads TFDS (data.tfds_data_dir, splits
  # data.train_split / data.eval_split, e.g. 'train' / 'test').
  # pairs_jsonl: the string fields holding the prompt and the answer.
  cfg.prompt_field = "prompt"
  cfg.answer_field = "answer"
  # 'plain' | 'gsm8k' (the reference instruction + question) | 'gsm8k_chat' (that, in the chat
  # template; the context ends after '<|im_start|>assistant\n').
  cfg.prompt_style = "plain"
  # A row longer than seq_len: 'error' | 'skip' (dropped, counted in the log) |
  # 'truncate_prompt' (the prompt's last tokens are kept, counted in the log).
  cfg.overflow = "error"
  # After the answer's EOS: 'none' (pads, never attended or targets; the reference) | 'eos'
  # (EOS tokens up to seq_len, attended targets for every method; the likelihood bound still
  # scores the answer and its first EOS only). Prompt/answer sources only.
  cfg.pad_targets = "none"
  # arithmetic / chain (data/tasks.py): operands per problem, their maximum (1..max), examples
  # per split (eval and validation: task_eval_examples each), seed. The chain recipe
  # (benchmarks/speed_accuracy.py) sets 4 operands up to 99.
  cfg.task_operands = 3
  cfg.task_max_operand = 9
  cfg.task_train_examples = 20000
  cfg.task_eval_examples = 200
  cfg.task_seed = 0
  # Threads reading/tokenizing ahead of the consumer and elements they buffer.
  cfg.read_threads = 2
  cfg.prefetch = 4
  return cfg


def validate_data_config(cfg):
  """Raises ValueError with a readable message for a bad data config."""

  def check(ok, msg):
    if not ok:
      raise ValueError(msg)

  check(cfg.source in SOURCES, f"data.source={cfg.source!r}; expected one of {SOURCES}")
  data_flags.check_fields(cfg)  # a path field the source would ignore
  check(
    cfg.preprocess in PREPROCESS,
    f"data.preprocess={cfg.preprocess!r}; expected one of {PREPROCESS}",
  )
  check(
    cfg.get("overlong", "cut") in OVERLONG_RULES,
    f"data.overlong={cfg.get('overlong')!r}; expected one of {OVERLONG_RULES}",
  )
  style = cfg.get("wrap_style", "row")
  check(style in WRAP_STYLES, f"data.wrap_style={style!r}; expected one of {WRAP_STYLES}")
  if cfg.source == "embedded":
    for field in ("train_split", "eval_split"):
      check(
        cfg[field] in sources.EMBEDDED_SPLITS,
        f"data.{field}={cfg[field]!r}: the embedded corpus has splits {sources.EMBEDDED_SPLITS}; "
        f"set --config.data.{field}={'train' if field == 'train_split' else 'validation'}"
        " (the LM1B configs' :cpu variant sets both)",
      )
  if cfg.source == "tfds":
    check(bool(cfg.get("tfds_name")), "data.source=tfds needs data.tfds_name")
    for field in ("train_split", "eval_split"):
      check(bool(cfg.get(field)), f"data.source=tfds needs data.{field}")
  if cfg.source in ("text", "jsonl"):
    check(
      bool(sources.parse_paths(cfg.get("paths"))),
      f"data.source={cfg.source} needs data.paths (comma-separated files)",
    )
  if cfg.source == "text":
    unit = cfg.get("text_unit", "paragraph")
    check(unit in ("paragraph", "line"), f"data.text_unit={unit!r}; expected 'paragraph' or 'line'")
  if cfg.source == "jsonl":
    check(bool(cfg.get("jsonl_field")), "data.source=jsonl needs data.jsonl_field")
  if cfg.source in pairs.PAIR_SOURCES:
    check(
      cfg.preprocess == "pad",
      f"data.source={cfg.source} builds one prompt/answer pair "
      f"per row: set data.preprocess=pad (got {cfg.preprocess!r})",
    )
    check(
      cfg.get("overflow", "error") in pairs.OVERFLOW_RULES,
      f"data.overflow={cfg.get('overflow')!r}; expected one of {pairs.OVERFLOW_RULES}",
    )
    check(
      cfg.get("prompt_style", "plain") in pairs.PROMPT_STYLES,
      f"data.prompt_style={cfg.get('prompt_style')!r}; expected one of {pairs.PROMPT_STYLES}",
    )
    check(
      cfg.get("pad_targets", "none") in pairs.PAD_TARGETS,
      f"data.pad_targets={cfg.get('pad_targets')!r}; expected one of {pairs.PAD_TARGETS}",
    )
    if cfg.source == "pairs_jsonl":
      check(
        bool(sources.parse_paths(cfg.get("paths"))),
        "data.source=pairs_jsonl needs data.paths (comma-separated files)",
      )
  else:
    check(
      cfg.get("pad_targets", "none") == "none",
      f"data.pad_targets={cfg.get('pad_targets')!r} applies to prompt/answer sources "
      f"{pairs.PAIR_SOURCES} only (data.source={cfg.source!r}); leave it 'none'",
    )
  check(cfg.get("read_threads", 0) >= 0, "data.read_threads must be >= 0")
  check(cfg.get("prefetch", 0) >= 0, "data.prefetch must be >= 0")


# ---------------------------------------------------------------------------
# Row builders (numpy, no grain): shapes and special-token placement live here.


def _fill_batch(
  batch: dict[str, np.ndarray], batch_size: int, pad_id: int
) -> dict[str, np.ndarray]:
  """Pads a short (last eval) batch with empty rows: tokens=pad, mask=0."""
  n = batch["tokens"].shape[0]
  if n == batch_size:
    return batch
  extra = batch_size - n
  return {
    "tokens": np.concatenate(
      [batch["tokens"], np.full((extra,) + batch["tokens"].shape[1:], pad_id, np.int32)]
    ),
    "attention_mask": np.concatenate(
      [batch["attention_mask"], np.zeros((extra,) + batch["attention_mask"].shape[1:], np.int32)]
    ),
  }


# ---------------------------------------------------------------------------
# grain pipelines.


def _order(
  ds: grain.MapDataset, shuffle: bool, seed: int, num_epochs: int | None
) -> grain.MapDataset:
  """Shuffle (a fresh permutation each epoch) then repeat (None: forever)."""
  if shuffle:
    ds = ds.shuffle(seed=seed)
  return ds.repeat(num_epochs)


def _stack_rows(rows: list, seq_len: int) -> np.ndarray:
  """A list of int32 [seq_len] rows -> int32 [len(rows), seq_len] (also for none)."""
  return np.stack(rows) if rows else np.zeros((0, seq_len), np.int32)


def _check_nonempty(n: int, what: str):
  if n == 0:
    raise ValueError(f"no data: {what}")


def _check_arguments(
  data_cfg, split: str, seq_len: int, global_batch_size: int, process_index: int, process_count: int
):
  """Raises ValueError for a split, process or length `make_dataset` cannot serve."""
  if split not in ("train", "eval"):
    raise ValueError(f"split={split!r}; expected 'train' or 'eval'")
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(f"bad process_index={process_index} / process_count={process_count}")
  if global_batch_size % process_count:
    raise ValueError(
      f"global_batch_size={global_batch_size} is not divisible by process_count={process_count}"
    )
  style = data_cfg.get("wrap_style", "row")
  min_len = 3 if (data_cfg.preprocess == "wrap" and style == "row") else 2
  if seq_len < min_len:
    raise ValueError(f"seq_len={seq_len} is too short (need >= {min_len})")


@dataclasses.dataclass(frozen=True)
class _BatchPlan:
  """How examples (documents or rows) become this process's batches: one global order from
  `seed`, global batches of `global_batch_size`, this process's `batch_size` rows of each."""

  global_batch_size: int
  process_index: int
  process_count: int
  shuffle: bool
  seed: int
  num_epochs: int | None
  drop_remainder: bool
  pad_id: int

  @property
  def batch_size(self) -> int:
    return self.global_batch_size // self.process_count

  def order(self, ds: grain.MapDataset) -> grain.MapDataset:
    """The one global order: shuffled per epoch, repeated."""
    return _order(ds, self.shuffle, self.seed, self.num_epochs)

  def local_batches(self, ds: grain.MapDataset) -> grain.MapDataset:
    """Ordered examples -> this process's examples of each global batch (lists)."""
    return process_rows(
      ds,
      global_batch_size=self.global_batch_size,
      process_index=self.process_index,
      process_count=self.process_count,
      drop_remainder=self.drop_remainder,
    )

  def local_rows(self, rows: np.ndarray) -> np.ndarray:
    """A global batch's rows [global_batch_size, L] -> this process's [batch_size, L]."""
    first = self.process_index * self.batch_size
    return rows[first : first + self.batch_size]

  def fill(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A short (last eval) batch filled to `batch_size` with empty rows."""
    return _fill_batch(batch, self.batch_size, self.pad_id)


def _padded_documents(data_cfg, tok, split: str, seq_len: int, plan: _BatchPlan):
  """pad: one [BOS] doc [EOS] pad row per document (over-long ones per data.overlong)."""
  docs = sources.load_texts(data_cfg, split)
  _check_nonempty(len(docs), f"{data_cfg.source} {split} has no documents")
  # Tokenized once up front (the texts are in memory already), so over-long documents are
  # counted, logged and handled (data.overlong) before any row is built.
  ids, _ = fit_documents(
    [np.asarray(d, np.int32) for d in tok.encode_batch(docs)],
    seq_len,
    data_cfg.get("overlong", "cut"),
    what=f"{data_cfg.source} {split} documents",
  )
  _check_nonempty(
    len(ids),
    f"{data_cfg.source} {split}: every document was skipped "
    f"(data.overlong=skip, seq_len={seq_len})",
  )
  # This process's documents of each global batch (one order, whatever the process count).
  ds = plan.local_batches(plan.order(grain.MapDataset.source(ids)))
  return ds.map(
    lambda rows: plan.fill(pad_rows(list(rows), seq_len, tok.bos_id, tok.eos_id, tok.pad_id))
  )


def _wrapped_in_memory(data_cfg, tok, split: str, seq_len: int, style: str, plan: _BatchPlan):
  """wrap, in-memory sources: the whole split tokenized once and cut into rows; every process
  builds the same rows, then takes its rows of each global batch."""
  docs = sources.load_texts(data_cfg, split)
  rows = wrap_rows(tok.encode_batch(docs), seq_len, tok.bos_id, tok.eos_id, style)
  _check_nonempty(
    len(rows), f"{data_cfg.source} {split} has fewer tokens than one row of seq_len={seq_len}"
  )
  ds = plan.local_batches(plan.order(grain.MapDataset.source(rows)))
  return ds.map(lambda r: _stack_rows(r, seq_len)).map(
    lambda t: plan.fill({"tokens": t, "attention_mask": np.ones_like(t)})
  )


def _wrapped_lazily(
  data_cfg, tok, split: str, seq_len: int, style: str, plan: _BatchPlan, read_options
) -> grain.IterDataset:
  """wrap, tfds: tokenize groups of documents into stream pieces and let grain's
  concat-then-split cut rows, carrying the remainder between pieces."""
  docs = sources.load_texts(data_cfg, split)
  _check_nonempty(len(docs), f"{data_cfg.source} {split} has no documents")
  chunk = chunk_len(seq_len, style)
  ds = plan.order(grain.MapDataset.source(docs))
  ds = ds.batch(DOCS_PER_GROUP, drop_remainder=False, batch_fn=list)
  ds = ds.map(
    lambda texts: {"tokens": token_stream(tok.encode_batch(texts), style, tok.bos_id, tok.eos_id)}
  )
  ds = ConcatThenSplitIterDataset(ds.to_iter_dataset(read_options), length_struct={"tokens": chunk})
  # The last row of a finite stream is zero-padded (segment id 0): drop it.
  ds = ds.filter(lambda x: bool(np.all(x["tokens_segment_ids"] > 0)))
  ds = ds.map(
    lambda x: add_row_specials(x["tokens"][None].astype(np.int32), style, tok.bos_id, tok.eos_id)[0]
  )
  ds = ds.batch(plan.global_batch_size, drop_remainder=plan.drop_remainder)  # the global batch
  return ds.map(
    lambda t: plan.fill(
      {"tokens": plan.local_rows(t), "attention_mask": np.ones_like(plan.local_rows(t))}
    )
  )


def make_dataset(
  data_cfg,
  tokenizer,
  *,
  split: str,
  seq_len: int,
  global_batch_size: int,
  seed: int,
  process_index: int = 0,
  process_count: int = 1,
  shuffle: bool = True,
  num_epochs: int | None = None,
  drop_remainder: bool | None = None,
) -> grain.IterDataset:
  """The batched input pipeline of one process (see the module docstring).

  Args:
    data_cfg: a data ConfigDict (`default_data_config`).
    tokenizer: a `setdiff_jax.data.tokenizers.Tokenizer`.
    split: 'train' (data_cfg.train_split / paths) or 'eval' (eval_split /
      eval_paths).
    seq_len: row length L.
    global_batch_size: rows per step over all processes; must be divisible by
      process_count.
    seed: shuffling seed, 0 <= seed < 2**32 (the same on every process: it fixes the
      one global order the processes share).
    process_index, process_count: this process and the number of processes
      (jax.process_index(), jax.process_count()).
    shuffle: shuffle documents (pad / lazy wrap) or rows (pre-wrapped).
    num_epochs: passes over the data; None repeats forever.
    drop_remainder: drop a last short batch (default: True for 'train'); if
      False the last batch is filled with empty rows instead.
  Returns:
    a grain IterDataset; `iter()` of it yields dicts with 'tokens' and
    'attention_mask', int32 [global_batch_size // process_count, seq_len].
  """
  validate_data_config(data_cfg)
  _check_arguments(data_cfg, split, seq_len, global_batch_size, process_index, process_count)
  if drop_remainder is None:
    drop_remainder = split == "train"
  read_options = grain.ReadOptions(
    num_threads=int(data_cfg.get("read_threads", 2)),
    prefetch_buffer_size=int(data_cfg.get("prefetch", 4)),
  )
  if data_cfg.source in pairs.PAIR_SOURCES:  # [BOS] prompt answer [EOS] pad, with context_mask
    return pairs.make_pair_dataset(
      data_cfg,
      tokenizer,
      split=split,
      seq_len=seq_len,
      batch_size=global_batch_size // process_count,
      seed=seed,
      process_index=process_index,
      process_count=process_count,
      shuffle=shuffle,
      num_epochs=num_epochs,
      drop_remainder=drop_remainder,
      read_options=read_options,
    )
  plan = _BatchPlan(
    global_batch_size=global_batch_size,
    process_index=process_index,
    process_count=process_count,
    shuffle=shuffle,
    seed=seed,
    num_epochs=num_epochs,
    drop_remainder=drop_remainder,
    pad_id=tokenizer.pad_id,
  )
  if data_cfg.preprocess == "pad":
    return _padded_documents(data_cfg, tokenizer, split, seq_len, plan).to_iter_dataset(
      read_options
    )
  style = data_cfg.get("wrap_style", "row")
  if data_cfg.source in IN_MEMORY_SOURCES:
    ds = _wrapped_in_memory(data_cfg, tokenizer, split, seq_len, style, plan)
    return ds.to_iter_dataset(read_options)
  return _wrapped_lazily(data_cfg, tokenizer, split, seq_len, style, plan, read_options)
