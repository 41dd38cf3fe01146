"""Reading data files and sampling them for the tokenizer: the one check of a data file (training
fields and evaluate's flags alike), byte-order marks, the tokenizer's document sample, and
tokenizer training on whitespace-free text."""

import json
import re

import pytest

from setdiff_jax.data import bpe, data_flags
from setdiff_jax.data import pipeline as P
from setdiff_jax.data import sources as S
from setdiff_jax.data import tokenizers as T


def _text_cfg(paths, **kw):
  cfg = P.default_data_config()
  cfg.source, cfg.text_unit, cfg.paths = "text", "line", paths
  for k, v in kw.items():
    cfg[k] = v
  return cfg


# ----------------------------------------------------------------------------- tokenizer sample
def test_tokenizer_sample_is_spread_over_the_whole_split(tmp_path):
  """The probe: a stride of n // max_docs (1 below 2 * max_docs) cut at max_docs took the first
  max_docs documents, so the last files of data.paths never reached the tokenizer."""
  a, b = tmp_path / "a.txt", tmp_path / "b.txt"
  a.write_text("".join(f"a{i}\n" for i in range(6)))
  b.write_text("".join(f"b{i}\n" for i in range(4)))
  cfg = _text_cfg(f"{a},{b}")  # 10 documents: a0..a5 b0..b3
  # i * 10 // 4 for i < 4: indices 0, 2, 5, 7 (the old code: 0, 2, 4, 6, all of a.txt)
  assert list(S.tokenizer_training_texts(cfg, max_docs=4)) == ["a0", "a2", "a5", "b1"]
  # i * 10 // 6: 0, 1, 3, 5, 6, 8 (the old code: the first six, a0..a5)
  assert list(S.tokenizer_training_texts(cfg, max_docs=6)) == ["a0", "a1", "a3", "a5", "b0", "b2"]
  every = [f"a{i}" for i in range(6)] + [f"b{i}" for i in range(4)]
  for max_docs in (None, 0, 10, 200_000):  # at most max_docs documents: all, in order
    assert list(S.tokenizer_training_texts(cfg, max_docs=max_docs)) == every


# ----------------------------------------------------------------------------- long words
def test_words_longer_than_the_limit_are_cut_for_the_trainer_only():
  """One 1 MB whitespace-free line trained for minutes (quadratic in the word's length) with no
  log line: such words are cut into MAX_TRAINING_WORD-character pieces; other text is as is."""
  limit = bpe.MAX_TRAINING_WORD
  long = "q" * (2 * limit + 90)
  text = f"ab {long} cd"  # pre-tokens: 'ab' (0, 2), ' qqq...' (2, 2 + len + 1), ' cd'
  pieces, cut = bpe.cut_long_words(["plain text", text, " " * (limit + 1), " " * limit])
  first = 2 + limit  # the word ' qqq...' starts at 2 (its space included)
  assert pieces == [
    "plain text",
    text[:first],
    text[first : first + limit],
    text[first + limit :],
    " " * limit,  # a whitespace word of limit + 1 characters, cut
    " ",
    " " * limit,  # limit characters: whole
  ]
  assert cut == 2 and "".join(pieces[1:4]) == text
  docs = S.embedded_corpus("train")
  assert bpe.cut_long_words(docs) == (docs, 0)  # the embedded corpus: its tokenizer is unchanged


def test_tokenizer_training_is_logged_with_what_it_reads(monkeypatch):
  lines = []
  monkeypatch.setattr(bpe.logging, "info", lambda fmt, *args: lines.append(fmt % args))
  word = "".join(chr(ord("a") + (i * 7) % 26) for i in range(1000))
  tok = T.train_tokenizer(["some words here", word], 300)
  assert lines == [
    "training a 300-token byte-level BPE tokenizer: 2 documents, 1015 characters; words longer "
    f"than {bpe.MAX_TRAINING_WORD} characters (unspaced text), cut into {bpe.MAX_TRAINING_WORD}"
    "-character pieces for it: 1"
  ]
  assert tok.decode(tok.encode(word)) == word  # still byte-level: every text round-trips


# ----------------------------------------------------------------------------- the file check
UNUSABLE = {
  "NUL bytes": (b"the quick brown fox\x00jumps\n", "is binary (it holds NUL bytes), not text"),
  "empty": (b"", "is empty (nothing but whitespace)"),
  "whitespace": (b" \n\n\t\n", "is empty (nothing but whitespace)"),
}


@pytest.mark.parametrize("kind", sorted(UNUSABLE))
@pytest.mark.parametrize("source", ["text", "jsonl", "pairs_jsonl"])
def test_a_file_evaluate_refuses_is_refused_by_training_too(tmp_path, kind, source):
  """The probe: a file with NUL bytes (or empty, among other files) was read as training
  data.paths / data.eval_paths but refused as launch/evaluate.py --eval_paths; one check now."""
  content, why = UNUSABLE[kind]
  good = tmp_path / "good.txt"
  record = {"text": "a document", "prompt": "1+1", "answer": "2"}
  good.write_text(json.dumps(record) + "\n" if source != "text" else "a document\n")
  bad = tmp_path / "bad.txt"
  bad.write_bytes(content)
  cfg = P.default_data_config()
  cfg.source = source
  for field in ("paths", "eval_paths"):
    cfg[field] = f"{good},{bad}"
    split = "train" if field == "paths" else "eval"
    with pytest.raises(
      ValueError, match="^" + re.escape(f"data file {bad} (data.{field}) {why}")
    ) as e:
      S.load_texts(cfg, split)
    assert f"drop it from data.{field}" in str(e.value) or "pass a text file" in str(e.value)
    cfg[field] = str(good)
  with pytest.raises(ValueError, match="^" + re.escape(f"--eval_paths={bad} {why}")):
    data_flags.apply_overrides(cfg, {"eval_paths": ("--eval_paths", f"{good},{bad}")})
  data_flags.apply_overrides(cfg, {"eval_paths": ("--eval_paths", str(good))})  # accepted


def test_a_nul_byte_past_the_first_mib_is_refused_by_the_flag_check(tmp_path):
  """evaluate's check read the first MiB only; the readers read the whole file."""
  path = tmp_path / "late.txt"
  path.write_bytes(b"word " * 300_000 + b"\x00")
  with pytest.raises(ValueError, match=f"^--eval_paths={path} is binary"):
    data_flags.check_text_file(str(path), "--eval_paths")


# ----------------------------------------------------------------------------- byte-order marks
def test_a_byte_order_mark_inside_a_file_is_dropped(tmp_path):
  """`cat a.txt b.txt` where b.txt starts with a BOM: U+FEFF stayed in a document (text) or was a
  JSON error (jsonl); only the one at byte 0 was dropped."""
  p = tmp_path / "joined.txt"
  p.write_bytes(b"\xef\xbb\xbffirst para\n\n\xef\xbb\xbfsecond para\n")
  assert S.text_file_texts(str(p), "paragraph") == ["first para", "second para"]
  assert S.text_file_texts(str(p), "line") == ["first para", "second para"]
  j = tmp_path / "joined.jsonl"
  j.write_bytes(b'{"text": "one"}\n\xef\xbb\xbf{"text": "two"}\n')
  assert S.jsonl_texts(str(j)) == ["one", "two"]
