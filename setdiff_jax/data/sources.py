"""Text sources. Each returns a random-access sequence of document strings.

- ``embedded_corpus(split)``: the six Jane Austen novels shipped in
  ``setdiff_jax/data/corpus/`` (the default, works offline with no files).
- ``tfds_texts(name, split, ...)``: a TFDS dataset such as ``lm1b`` read through
  ``tfds.data_source`` (array_record, random access, no TensorFlow needed to read,
  never downloads).
- ``text_file_texts(paths, unit)`` and ``jsonl_texts(paths, field)``: your own files.

``load_texts(data_cfg, split, process_index, process_count)`` picks one of them
from a data config (see ``pipeline.default_data_config``).
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import lzma
import re
from typing import Iterator, Sequence

from setdiff_jax.data import pairs
from setdiff_jax.data.text_files import parse_paths, read_text

EMBEDDED_FILE = "austen-novels.txt.xz"
EMBEDDED_SPLITS = ("train", "validation")

# Embedded split rule: chapters are numbered 0, 1, 2, ... in file order over all
# six novels (269 chapters); chapter c is held out for validation iff
# c % VALIDATION_EVERY == VALIDATION_OFFSET (13 whole chapters, about 5%).
# Holding out whole chapters keeps validation text unseen in context, not just
# unseen as single paragraphs.
VALIDATION_EVERY = 20
VALIDATION_OFFSET = 10

# Resulting sizes (asserted in tests/test_data.py):
EMBEDDED_NUM_CHAPTERS = 269
EMBEDDED_SIZES = {"train": 9570, "validation": 449}  # documents (paragraphs)
EMBEDDED_CHARS = {"train": 3_812_499, "validation": 181_494}

# "CHAPTER I", "CHAPTER 27", "Chapter 1": the three heading styles in the file.
_CHAPTER_RE = re.compile(r"^chapter\s+([ivxlc]+|\d+)\.?$", re.IGNORECASE)
_VOLUME_RE = re.compile(r"^volume\s+[ivxlc]+\.?$", re.IGNORECASE)
_BLANK_LINE_RE = re.compile(r"\n[ \t\r\f\v]*\n")


def _paragraphs(text: str) -> Iterator[str]:
  """Blank-line separated paragraphs, inner line breaks joined with spaces.

  Joining undoes the hard wrapping of the source files; runs of whitespace
  become one space.
  """
  for block in _BLANK_LINE_RE.split(text):
    para = " ".join(block.split())
    if para:
      yield para


@functools.lru_cache(maxsize=1)
def _embedded_chapters() -> tuple[tuple[str, ...], ...]:
  """The embedded corpus as chapters of paragraphs (headings dropped)."""
  data = (importlib.resources.files(__package__) / "corpus" / EMBEDDED_FILE).read_bytes()
  text = lzma.decompress(data).decode("utf-8")
  chapters: list[list[str]] = []
  for para in _paragraphs(text):
    if _CHAPTER_RE.match(para):
      chapters.append([])  # a heading starts a chapter and is not a document
    elif chapters and not _VOLUME_RE.match(para):
      # Paragraphs before the first heading (Emma's title page) are dropped;
      # other title/end matter ("FINIS", "By Jane Austen", ...) stays with the
      # chapter it follows: rare and harmless.
      chapters[-1].append(para)
  return tuple(tuple(c) for c in chapters)


def embedded_split_of_chapter(chapter_index: int) -> str:
  """'validation' or 'train' for the chapter with this file-order index."""
  held_out = chapter_index % VALIDATION_EVERY == VALIDATION_OFFSET
  return "validation" if held_out else "train"


def embedded_corpus(split: str = "train") -> list[str]:
  """Documents (paragraphs) of the embedded Jane Austen corpus.

  Args:
    split: 'train' (9,570 paragraphs, 3.81M characters, 256 chapters) or
      'validation' (449 paragraphs, 0.18M characters, 13 chapters: those whose
      file-order index c satisfies c % 20 == 10, from all six novels).
      Deterministic; the two splits share no chapter.
  Returns:
    list of str, in file order.
  """
  if split not in EMBEDDED_SPLITS:
    raise ValueError(f"embedded corpus split {split!r}; expected one of {EMBEDDED_SPLITS}")
  return [
    p
    for c, paras in enumerate(_embedded_chapters())
    if embedded_split_of_chapter(c) == split
    for p in paras
  ]


class TfdsTexts(Sequence):
  """Random-access strings of one text feature of a `tfds.data_source`.

  Holds the records `process_index, process_index + process_count, ...` only,
  so each process reads a disjoint shard.
  """

  def __init__(self, source, field: str, process_index: int = 0, process_count: int = 1):
    self._source = source
    self._field = field
    self._indices = range(process_index, len(source), process_count)

  def __len__(self) -> int:
    return len(self._indices)

  def __getitem__(self, i):
    if isinstance(i, slice):
      return [self[j] for j in range(*i.indices(len(self)))]
    value = self._source[self._indices[i]][self._field]
    # Decoded without TensorFlow, tfds Text features come back as bytes.
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def tfds_texts(
  name: str,
  split: str,
  data_dir: str | None = None,
  process_index: int = 0,
  process_count: int = 1,
  field: str = "text",
) -> TfdsTexts:
  """Texts of a prepared TFDS dataset (e.g. 'lm1b'), this process's shard.

  Uses `tfds.data_source` with download=False: the data must already be prepared
  in array_record format (LM1B: `launch/prepare_lm1b.py` from the released text files, or
  `tfds build lm1b --data_dir=DIR --file_format=array_record`, which needs TensorFlow).
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  try:
    source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  except Exception as e:  # tfds raises several types for "not prepared"
    if name == "lm1b":
      how = (
        "build it once without TensorFlow from the released text files (1.8 GB download: "
        "README, LM1B): python launch/prepare_lm1b.py --text_dir=UNPACKED_ARCHIVE --data_dir=DIR; "
        "or with TFDS's own lm1b builder, which needs TensorFlow (not installed by this package; "
        "README, LM1B) and downloads the archive itself"
      )
    else:
      how = (
        f"prepare it once with: tfds build {name} --data_dir=DIR --file_format=array_record "
        "(building may need TensorFlow and a download; reading does not)"
      )
    raise FileNotFoundError(
      f"TFDS dataset {name!r} split {split!r} is not prepared as array_record "
      f"under data_dir={data_dir!r} (set data.tfds_data_dir); {how}. "
      f"tfds said: {type(e).__name__}: {e}"
    ) from e
  return TfdsTexts(source, field, process_index, process_count)


def text_file_texts(paths, unit: str = "paragraph", field: str = "paths") -> list[str]:
  """Documents of plain-text files (.gz/.xz/.bz2 are decompressed).

  Args:
    paths: list of paths or comma-separated string.
    unit: 'paragraph' (blank-line separated, inner line breaks become spaces)
      or 'line' (one document per non-empty line).
    field: config field named in the error for a missing file.
  """
  if unit not in ("paragraph", "line"):
    raise ValueError(f"data.text_unit={unit!r}; expected 'paragraph' or 'line'")
  docs = []
  for path in parse_paths(paths):
    text = read_text(path, field)
    if unit == "line":  # read_text's newlines are "\n" (universal newlines)
      docs.extend(s for line in text.split("\n") if (s := line.strip()))
    else:
      docs.extend(_paragraphs(text))
  return docs


def jsonl_texts(paths, text_field: str = "text", field: str = "paths") -> list[str]:
  """Documents of JSON-lines files: the string `text_field` of each record."""
  docs = []
  for path in parse_paths(paths):
    for lineno, line in enumerate(read_text(path, field).split("\n"), 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from e
      if not isinstance(record, dict) or text_field not in record:
        raise ValueError(
          f"{path}:{lineno}: record has no field {text_field!r} (set data.jsonl_field)"
        )
      text = record[text_field]
      if not isinstance(text, str):
        raise ValueError(
          f"{path}:{lineno}: field {text_field!r} is {type(text).__name__}, not a string"
        )
      if text.strip():
        docs.append(text)
  return docs


def load_texts(
  data_cfg, split: str, process_index: int = 0, process_count: int = 1
) -> Sequence[str]:
  """Documents of `split` ('train' or 'eval') of the configured source,
  strided-sharded: this process gets documents process_index::process_count.
  """
  if split not in ("train", "eval"):
    raise ValueError(f"split={split!r}; expected 'train' or 'eval'")
  source = data_cfg.source
  if source in pairs.PAIR_SOURCES:  # prompt + answer texts (tokenizer training)
    return pairs.pair_texts(data_cfg, split)[process_index::process_count]
  if source == "tfds":
    name = data_cfg.train_split if split == "train" else data_cfg.eval_split
    return tfds_texts(
      data_cfg.tfds_name, name, data_cfg.get("tfds_data_dir"), process_index, process_count
    )
  if source == "embedded":
    name = data_cfg.train_split if split == "train" else data_cfg.eval_split
    docs = embedded_corpus(name)
  elif source in ("text", "jsonl"):
    field = "paths" if split == "train" else "eval_paths"
    paths = parse_paths(data_cfg.get(field))
    if not paths:
      raise ValueError(
        f"data.source={source} with split={split!r} needs "
        f"data.{field} (a comma-separated list of files)"
      )
    if source == "text":
      docs = text_file_texts(paths, data_cfg.get("text_unit", "paragraph"), field)
    else:
      docs = jsonl_texts(paths, data_cfg.get("jsonl_field", "text"), field)
  else:
    raise ValueError(f"data.source={source!r}; expected one of 'embedded', 'tfds', 'text', 'jsonl'")
  return docs[process_index::process_count]


def tokenizer_training_texts(data_cfg, max_docs: int | None = None) -> Iterator[str]:
  """Training-split documents (all of them, not a shard) to train a tokenizer.

  `max_docs` caps the count with evenly spaced documents over the whole split (use it for big
  TFDS sources such as lm1b, 30M sentences); a split of at most `max_docs` documents is used
  whole.
  """
  docs = load_texts(data_cfg, "train")
  n = len(docs)
  count = n if not max_docs or n <= max_docs else max_docs
  # i * n // count: spread over all n documents (a fixed stride n // count, cut at `count`, left
  # the last files of a split between count and 2 * count documents out); every index when
  # count == n, so small sources keep their tokenizer.
  for i in range(count):
    yield docs[i * n // count]
