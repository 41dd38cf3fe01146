"""Prompt/answer data: the procedural task, JSONL and TFDS gsm8k sources, the pair row layout,
the overflow rules and the bad-input errors."""

import json
import logging

import numpy as np
import pytest

from setdiff_jax.data import pairs, pipeline, tasks, tokenizers


@pytest.fixture(scope="module")
def tok():
  texts = [p.prompt + p.answer for p in tasks.arithmetic_pairs("train", 300, seed=0)]
  return tokenizers.train_tokenizer(texts + ["What is the answer? It is"], 280)


def test_arithmetic_deterministic_disjoint_and_correct():
  a = tasks.arithmetic_pairs("train", 500, seed=3)
  assert a == tasks.arithmetic_pairs("train", 500, seed=3)
  assert a != tasks.arithmetic_pairs("train", 500, seed=4)
  test = tasks.arithmetic_pairs("test", 150, seed=3)
  test_other_seed = tasks.arithmetic_pairs("test", 150, seed=9)
  train_big = {p.prompt for p in tasks.arithmetic_pairs("train", 5000, seed=11)}
  assert len({p.prompt for p in test}) == 150  # distinct test problems
  assert not train_big & ({p.prompt for p in test} | {p.prompt for p in test_other_seed})
  for p in a[:50] + test[:50]:
    expr = p.prompt.strip()
    lines = p.answer.split("\n")
    assert lines[-1] == f"#### {eval(expr)}"  # the answer line is the value of the chain
    assert len(lines) == 3 and lines[0].startswith(expr[:3])
    for line in lines[:-1]:  # every step is right and never negative
      lhs, rhs = line.split("=")
      assert eval(lhs) == int(rhs) >= 0


def test_chain_deterministic_disjoint_splits_and_correct():
  a = tasks.chain_pairs("train", 400, seed=3)
  assert a == tasks.chain_pairs("train", 400, seed=3) and a != tasks.chain_pairs("train", 400, 4)
  test = tasks.chain_pairs("test", 300, seed=3)
  val = tasks.chain_pairs("validation", 300, seed=3)
  assert test == tasks.chain_pairs("test", 300, seed=3)
  sets = {
    name: {p.prompt for p in ps}
    for name, ps in (
      ("train", tasks.chain_pairs("train", 3000, seed=11)),
      ("test", test),
      ("val", val),
      ("test9", tasks.chain_pairs("test", 300, seed=9)),
      ("val9", tasks.chain_pairs("validation", 300, seed=9)),
    )
  }
  assert len(sets["test"]) == 300 and len(sets["val"]) == 300  # distinct problems
  assert not sets["train"] & (sets["test"] | sets["val"] | sets["test9"] | sets["val9"])
  assert not (sets["test"] | sets["test9"]) & (sets["val"] | sets["val9"])
  for p in a[:50] + test[:50] + val[:50]:
    expr = p.prompt.strip()
    nums = [int(x) for x in expr.replace("-", "+").split("+")]
    assert len(nums) == 4 and all(1 <= x <= 99 for x in nums)
    lines = p.answer.split("\n")
    assert lines[-1] == f"#### {eval(expr)}" and len(lines) == 4
    ops = [c for c in expr if c in "+-"]
    value = nums[0]
    for op, x, line in zip(ops, nums[1:], lines):  # running values, nothing restated
      value = value + x if op == "+" else value - x
      assert int(line) == value >= 0
  # two-digit operands: most problems carry or borrow somewhere
  assert np.mean([any(len(l) > 2 for l in p.answer.split("\n")[:-1]) for p in a]) > 0.3


def test_arithmetic_validation_is_disjoint_from_test():
  test = {p.prompt for p in tasks.arithmetic_pairs("test", 150, seed=2)}
  val = tasks.arithmetic_pairs("validation", 40, seed=2, num_test=150)
  assert len({p.prompt for p in val}) == 40 and not test & {p.prompt for p in val}
  assert all(tasks.is_test_problem(p.prompt.strip()) for p in val)  # held out from training


def test_load_pairs_validation_split():
  cfg = pipeline.default_data_config()
  cfg.source, cfg.task_operands, cfg.task_max_operand = "chain", 4, 99
  cfg.task_eval_examples = 20
  val = pairs.load_pairs(cfg, "validation")
  assert val == tasks.chain_pairs("validation", 20, 0)
  assert pairs.load_pairs(cfg, "eval") == tasks.chain_pairs("test", 20, 0)
  cfg.source = "pairs_jsonl"
  with pytest.raises(ValueError, match="no validation split"):
    pairs.load_pairs(cfg, "validation")


def test_arithmetic_too_many_test_problems():
  with pytest.raises(ValueError, match="distinct test problems"):
    tasks.arithmetic_pairs("test", 500, num_operands=2, max_operand=3)


def test_pair_rows_layout(tok):
  p, a = [tok.bos_id, 10, 11], [12, 13, tok.eos_id]
  rows = pairs.pair_rows([(p, a)], 8, tok.pad_id)
  np.testing.assert_array_equal(rows["tokens"][0], p + a + [tok.pad_id] * 2)
  np.testing.assert_array_equal(rows["attention_mask"][0], [1] * 6 + [0, 0])
  np.testing.assert_array_equal(rows["context_mask"][0], [1] * 3 + [0] * 5)


def test_encode_pairs_and_overflow_rules(tok, caplog):
  short = pairs.Pair("1+2\n", "1+2=3\n#### 3", "short")
  long = pairs.Pair("9+9+9+9+9+9+9+9+9+9\n", "#### 90", "data.jsonl:7")
  ((p, a),) = pairs.encode_pairs(tok, [short], 32)[0]
  assert p == [tok.bos_id] + tok.encode("1+2\n") and a == tok.encode("1+2=3\n#### 3") + [tok.eos_id]
  n_long = 1 + len(tok.encode(long.prompt)) + len(tok.encode(long.answer)) + 1
  seq_len = n_long - 4
  with pytest.raises(ValueError, match=r"data.jsonl:7: prompt .* > seq_len=.*truncate_prompt"):
    pairs.encode_pairs(tok, [short, long], seq_len)
  with caplog.at_level(logging.WARNING):
    kept, stats = pairs.encode_pairs(tok, [short, long], seq_len, overflow="skip")
  assert stats == {"kept": 1, "skipped": 1, "truncated": 0, "kept_indices": [0]} and len(kept) == 1
  kept, stats = pairs.encode_pairs(tok, [long, short, long, short], seq_len, overflow="skip")
  assert stats["kept_indices"] == [1, 3] and kept == pairs.encode_pairs(tok, [short, short], 32)[0]
  assert "1 skipped" in caplog.text
  kept, stats = pairs.encode_pairs(tok, [short, long], seq_len, overflow="truncate_prompt")
  assert stats["truncated"] == 1
  p, a = kept[1]
  assert len(p) + len(a) == seq_len and p[0] == tok.bos_id
  assert p[1:] == tok.encode(long.prompt)[-(len(p) - 1) :]  # the prompt's last tokens
  with pytest.raises(ValueError, match="the answer alone does not fit"):
    pairs.encode_pairs(tok, [long], len(tok.encode(long.answer)) + 2, overflow="truncate_prompt")


def _write(path, records):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
  return str(path)


def test_jsonl_pairs_and_errors(tmp_path):
  good = _write(
    tmp_path / "good.jsonl",
    [{"q": "1+1\n", "a": "#### 2"}, "", {"q": "2+2\n", "a": "#### 4", "x": 1}],
  )
  got = pairs.jsonl_pairs(good, "q", "a")
  assert [(p.prompt, p.answer, p.where) for p in got] == [
    ("1+1\n", "#### 2", f"{good}:1"),
    ("2+2\n", "#### 4", f"{good}:3"),
  ]
  missing = _write(tmp_path / "missing.jsonl", [{"q": "1", "a": "2"}, {"question": "x", "a": "3"}])
  with pytest.raises(
    ValueError, match=r"missing.jsonl:2: record has no field 'q'.*data.prompt_field"
  ):
    pairs.jsonl_pairs(missing, "q", "a")
  empty = _write(tmp_path / "empty.jsonl", [{"q": "1", "a": "  "}])
  with pytest.raises(ValueError, match=r"empty.jsonl:1: field 'a' is empty"):
    pairs.jsonl_pairs(empty, "q", "a")
  bad = _write(tmp_path / "bad.jsonl", [{"q": 3, "a": "x"}])
  with pytest.raises(ValueError, match=r"bad.jsonl:1: field 'q' is int"):
    pairs.jsonl_pairs(bad, "q", "a")
  with pytest.raises(FileNotFoundError, match="data.paths"):
    pairs.jsonl_pairs(str(tmp_path / "nope.jsonl"))


def _cfg(**kw):
  cfg = pipeline.default_data_config()
  cfg.preprocess = "pad"
  for k, v in kw.items():
    cfg[k] = v
  return cfg


def test_jsonl_pairs_not_utf8_names_the_file(tmp_path):
  """A Latin-1 pairs file: the text / jsonl sources' one line (file, byte, iconv), not the codec's
  bare message."""
  f = tmp_path / "latin1.jsonl"
  f.write_bytes('{"prompt": "caf\u00e9", "answer": "#### 1"}\n'.encode("latin-1"))
  with pytest.raises(
    ValueError, match=rf"^{f}: not UTF-8 text \(line 1, byte 15: .*iconv -f latin1"
  ):
    pairs.jsonl_pairs(str(f))


@pytest.mark.parametrize("suffix", ["", ".gz", ".xz"])
def test_a_bad_byte_deep_in_a_file_is_named_by_its_line_and_file_byte(tmp_path, suffix):
  """Probe round 11: the byte was counted from the start of the reader's 8 KB chunk (7123 for a
  byte at 130003) and no line was named. A multi-byte character across the scan's chunks is
  whole; a file that ends inside a character is named at that character."""
  import gzip
  import lzma

  from setdiff_jax.data import sources, text_files

  body = ("caf\u00e9 ok\n\n" * 10000).encode("utf-8")
  data = body + b"caf\xe9 latin-1\n"
  path = tmp_path / f"big.txt{suffix}"
  path.write_bytes({"": bytes, ".gz": gzip.compress, ".xz": lzma.compress}[suffix](data))
  assert text_files.first_bad_utf8(str(path), chunk_bytes=7) == (len(body) + 3, 20001)
  for unit in ("paragraph", "line"):
    with pytest.raises(ValueError, match=rf"\(line 20001, byte {len(body) + 3}: invalid"):
      sources.text_file_texts(str(path), unit)
  cut = tmp_path / "cut.txt"
  cut.write_bytes(body + "\u00e9".encode("utf-8")[:1])
  assert text_files.first_bad_utf8(str(cut), chunk_bytes=5) == (len(body), 20001)
  assert text_files.first_bad_utf8(str(tmp_path / "none.txt")) is None


def test_pipeline_batches_of_pairs(tok, tmp_path):
  cfg = _cfg(source="arithmetic", task_train_examples=40, task_eval_examples=10)
  it = iter(pipeline.make_dataset(cfg, tok, split="train", seq_len=32, global_batch_size=8, seed=0))
  batch = next(it)
  assert set(batch) == {"tokens", "attention_mask", "context_mask"}
  assert batch["tokens"].shape == batch["context_mask"].shape == (8, 32)
  ctx, att = batch["context_mask"].astype(bool), batch["attention_mask"].astype(bool)
  assert np.all(ctx <= att) and np.all(batch["tokens"][:, 0] == tok.bos_id)
  assert np.all(ctx.sum(1) >= 2) and np.all((att & ~ctx).sum(1) >= 3)
  last = att.sum(1) - 1
  assert np.all(batch["tokens"][np.arange(8), last] == tok.eos_id)
  ev = list(
    pipeline.make_dataset(
      cfg,
      tok,
      split="eval",
      seq_len=32,
      global_batch_size=4,
      seed=0,
      shuffle=False,
      num_epochs=1,
      drop_remainder=False,
    )
  )
  assert len(ev) == 3 and ev[-1]["attention_mask"][2:].sum() == 0  # 10 rows, the last 2 empty
  with pytest.raises(ValueError, match="preprocess=pad"):
    pipeline.make_dataset(
      _cfg(source="arithmetic", preprocess="wrap"),
      tok,
      split="train",
      seq_len=32,
      global_batch_size=8,
      seed=0,
    )
  long = _write(
    tmp_path / "long.jsonl", [{"prompt": "1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1\n", "answer": "#### 16"}]
  )
  with pytest.raises(ValueError, match=r"long.jsonl:1: prompt"):
    pipeline.make_dataset(
      _cfg(source="pairs_jsonl", paths=long),
      tok,
      split="train",
      seq_len=16,
      global_batch_size=1,
      seed=0,
    )


def test_gsm8k_through_tfds_builder(tok, tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  rows = [
    {
      "question": b"Tom has 3 apples and buys 4. How many?",
      "answer": b"3+4=7\n#### 7",
      "annotation": b"",
      "short_answer": b"7",
    }
  ] * 3

  def source(self, split, **kwargs):
    assert self.name == "gsm8k"
    return rows

  with tfds.testing.mock_data(as_data_source_fn=source):
    got = pairs.gsm8k_pairs("test", str(tmp_path))
    via_cfg = pairs.load_pairs(
      _cfg(source="gsm8k", eval_split="test", tfds_data_dir=str(tmp_path)), "eval"
    )
  ((p, a),) = pairs.encode_pairs(tok, got[:1], 128, prompt_style="gsm8k")[0]
  assert via_cfg == got and len(got) == 3
  assert got[0] == pairs.Pair(
    "Tom has 3 apples and buys 4. How many?", "3+4=7\n#### 7", "gsm8k test #0"
  )
  assert tok.decode(p).startswith("Please reason step by step")
  with pytest.raises(
    FileNotFoundError, match=r"gsm8k split 'test' is not prepared.*tfds build gsm8k"
  ):
    pairs.gsm8k_pairs("test", str(tmp_path / "empty"))


def test_accuracy_data_not_utf8_past_the_sniff_is_one_line(tmp_path):
  """Probe round 11: a bad byte past the first MiB (which the flag's check reads) escaped the
  field check as a bare UnicodeDecodeError, with no file and a wrong position."""
  from setdiff_jax.evaluation import checks

  f = tmp_path / "acc.jsonl"
  good = '{"prompt": "a", "answer": "#### 1"}\n'.encode()
  f.write_bytes(good * 2 + b'{"prompt": "caf\xe9", "answer": "#### 2"}\n')
  with pytest.raises(ValueError, match=rf"^--accuracy_data={f}: not UTF-8 text \(line 3, byte "):
    checks.check_pair_fields(str(f), "prompt", "answer")
