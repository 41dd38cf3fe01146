"""Data layer: sources, wrap/pad rows, grain pipelines, sharding, iterator state."""

import glob
import json
import os
import re
import shutil
import tempfile

import numpy as np
import pytest
import tensorflow_datasets as tfds

from setdiff_jax.data import iterator_state
from setdiff_jax.data import pipeline as P
from setdiff_jax.data import sources as S
from setdiff_jax.data import tokenizers as T

BOS, EOS, PAD = 2, 3, 0  # ids of the trained tokenizer


@pytest.fixture(scope="module")
def tok():
  """A small byte-level BPE trained on the embedded validation split (fast)."""
  cfg = T.default_tokenizer_config()
  cfg.vocab_size = 512
  return T.get_tokenizer(cfg, train_texts=S.embedded_corpus("validation"))


def _data_cfg(**kw):
  cfg = P.default_data_config()
  for k, v in kw.items():
    cfg[k] = v
  return cfg


@pytest.fixture()
def numbered_text(tmp_path):
  """A text file of 40 distinct one-paragraph documents 'doc <i> ...'."""
  docs = [f"doc {i} " + "word " * (i % 7) + "end" for i in range(40)]
  path = tmp_path / "docs.txt"
  path.write_text("\n\n".join(docs) + "\n")
  return str(path), docs


def _take(it, n):
  return [next(it) for _ in range(n)]


def _rows(batches):
  return [tuple(r) for b in batches for r in b["tokens"]]


# ---------------------------------------------------------------------------
# Sources.


def test_embedded_corpus_split_sizes_disjoint_deterministic():
  train = S.embedded_corpus("train")
  val = S.embedded_corpus("validation")
  assert len(train) == S.EMBEDDED_SIZES["train"] == 9570
  assert len(val) == S.EMBEDDED_SIZES["validation"] == 449
  assert sum(map(len, train)) == S.EMBEDDED_CHARS["train"]
  assert sum(map(len, val)) == S.EMBEDDED_CHARS["validation"]
  assert len(S._embedded_chapters()) == S.EMBEDDED_NUM_CHAPTERS
  assert S.embedded_corpus("train") == train  # deterministic
  # Whole chapters are held out: c % 20 == 10.
  chapters = S._embedded_chapters()
  held = [c for c in range(len(chapters)) if S.embedded_split_of_chapter(c) == "validation"]
  assert held == list(range(10, 269, 20))
  assert val == [p for c in held for p in chapters[c]]
  # Disjoint (a few short paragraphs such as '"Yes."' recur in the novels).
  repeated = set(train) & set(val)
  assert all(len(p) < 40 for p in repeated), repeated
  assert not any(p.upper().startswith("CHAPTER ") and len(p) < 15 for p in train + val)
  assert val[0].startswith("Mr. Elton must now be left to himself.")
  with pytest.raises(ValueError, match="split"):
    S.embedded_corpus("test")


def test_text_and_jsonl_sources(tmp_path):
  p = tmp_path / "a.txt"
  p.write_text("first line\nwrapped here\n\n  \nsecond para\n")
  assert S.text_file_texts(str(p)) == ["first line wrapped here", "second para"]
  assert S.text_file_texts([str(p)], unit="line") == ["first line", "wrapped here", "second para"]
  j = tmp_path / "b.jsonl"
  j.write_text('{"body": "one"}\n\n{"body": "two", "x": 1}\n')
  assert S.jsonl_texts(f"{j},{j}", text_field="body") == ["one", "two"] * 2
  with pytest.raises(ValueError, match=r"b.jsonl:1: record has no field 'text'"):
    S.jsonl_texts(str(j))


def test_a_byte_order_mark_and_an_upper_case_gz_are_read_as_text(tmp_path):
  """A BOM became text of the first document (text) or a JSON error on line 1 (jsonl); a '.GZ'
  file was read undecompressed and called 'not UTF-8'."""
  import gzip

  p = tmp_path / "bom.txt"
  p.write_bytes("\ufefffirst doc\n\nsecond".encode("utf-8"))
  assert S.text_file_texts(str(p)) == ["first doc", "second"]
  j = tmp_path / "bom.jsonl"
  j.write_bytes('\ufeff{"text": "one"}\n'.encode("utf-8"))
  assert S.jsonl_texts(str(j)) == ["one"]
  g = tmp_path / "upper.GZ"
  g.write_bytes(gzip.compress("zipped doc\n".encode("utf-8")))
  assert S.text_file_texts(str(g)) == ["zipped doc"]


def test_missing_files_raise_clear_errors(tmp_path, tok):
  missing = str(tmp_path / "missing.txt")
  with pytest.raises(FileNotFoundError, match="missing.txt.*data.paths"):
    S.text_file_texts(missing)
  cfg = _data_cfg(source="jsonl", paths=str(tmp_path / "x.jsonl"), eval_paths=missing)
  with pytest.raises(FileNotFoundError, match="missing.txt.*data.eval_paths"):
    P.make_dataset(cfg, tok, split="eval", seq_len=8, global_batch_size=2, seed=0)
  cfg = _data_cfg(source="text", paths=missing)
  with pytest.raises(ValueError, match="needs data.eval_paths"):
    P.make_dataset(cfg, tok, split="eval", seq_len=8, global_batch_size=2, seed=0)
  # tfds without prepared data: a clear error, and no download attempt.
  with pytest.raises(
    FileNotFoundError, match="without TensorFlow.*launch/prepare_lm1b.py.*needs TensorFlow"
  ):
    S.tfds_texts("lm1b", "train", data_dir=str(tmp_path / "tfds"))


def test_validate_data_config():
  P.validate_data_config(P.default_data_config())
  for kw, msg in [
    (dict(source="hf"), "data.source"),
    (dict(preprocess="pack"), "data.preprocess"),
    (dict(wrap_style="x"), "data.wrap_style"),
    (dict(eval_split="test"), "embedded corpus has splits"),
    (dict(source="text"), "needs data.paths"),
    (dict(source="tfds", tfds_name=""), "needs data.tfds_name"),
    (dict(source="text", paths="a", text_unit="word"), "text_unit"),
  ]:
    with pytest.raises(ValueError, match=msg):
      P.validate_data_config(_data_cfg(**kw))


# ---------------------------------------------------------------------------
# Row builders.


def test_wrap_rows_exact():
  ids = [[10, 11, 12], [20], [30, 31, 32, 33]]
  # 'row': stream 10 11 12 E 20 E 30 31 32 33 E; each row BOS + 3 + EOS.
  np.testing.assert_array_equal(
    P.wrap_rows(ids, 5, bos_id=1, eos_id=2, style="row"),
    [[1, 10, 11, 12, 2], [1, 2, 20, 2, 2], [1, 30, 31, 32, 2]],
  )
  # 'doc': stream B 10 11 12 E B 20 E B 30 31 32 33 E cut into 5s.
  np.testing.assert_array_equal(
    P.wrap_rows(ids, 5, 1, 2, "doc"), [[1, 10, 11, 12, 2], [1, 20, 2, 1, 30]]
  )
  assert P.wrap_rows(ids, 5, 1, 2).dtype == np.int32
  # 'doc' with BOS = EOS (GPT-2's <|endoftext|>): one separator between documents, the stream
  # 10 11 12 E 20 E 30 31 32 33 E of the reference's wrapped OpenWebText (probe 18b: the doubled
  # E E was no convention of the reference's).
  np.testing.assert_array_equal(
    P.wrap_rows(ids, 5, 2, 2, "doc"), [[10, 11, 12, 2, 20], [2, 30, 31, 32, 33]]
  )


def test_pad_rows_exact():
  out = P.pad_rows([[5, 6], [7, 8, 9, 10, 11]], 5, bos_id=1, eos_id=2, pad_id=0)
  np.testing.assert_array_equal(out["tokens"], [[1, 5, 6, 2, 0], [1, 7, 8, 9, 10]])  # no EOS: cut
  np.testing.assert_array_equal(out["attention_mask"], [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
  assert out["tokens"].dtype == out["attention_mask"].dtype == np.int32


# ---------------------------------------------------------------------------
# Pipelines.


def test_wrap_embedded_shapes_and_specials(tok):
  ds = P.make_dataset(_data_cfg(), tok, split="train", seq_len=32, global_batch_size=8, seed=0)
  for b in _take(iter(ds), 5):
    assert set(b) == {"tokens", "attention_mask"}
    assert b["tokens"].shape == b["attention_mask"].shape == (8, 32)
    assert b["tokens"].dtype == b["attention_mask"].dtype == np.int32
    assert (b["attention_mask"] == 1).all()
    assert (b["tokens"][:, 0] == BOS).all() and (b["tokens"][:, -1] == EOS).all()
    assert not (b["tokens"][:, 1:-1] == BOS).any()
  # 'doc' style: BOS only right after an EOS (or at a row start).
  ds = P.make_dataset(
    _data_cfg(wrap_style="doc"),
    tok,
    split="eval",
    seq_len=32,
    global_batch_size=8,
    seed=0,
    shuffle=False,
  )
  t = next(iter(ds))["tokens"]
  flat = t.reshape(-1)
  assert flat[0] == BOS
  bos_at = np.nonzero(flat == BOS)[0]
  assert (flat[bos_at[1:] - 1] == EOS).all()
  # Unshuffled eval rows are the file-order stream of the validation split.
  doc_ids = [tok.encode(d) for d in S.embedded_corpus("validation")[:3]]
  stream = np.concatenate([[BOS] + d + [EOS] for d in doc_ids])
  n = min(len(stream), flat.size)
  np.testing.assert_array_equal(flat[:n], stream[:n])


def test_pad_mode_rows(tok, numbered_text):
  path, docs = numbered_text
  cfg = _data_cfg(source="text", paths=path, eval_paths=path, preprocess="pad")
  ds = P.make_dataset(
    cfg, tok, split="eval", seq_len=12, global_batch_size=8, seed=0, shuffle=False, num_epochs=1
  )
  batches = list(ds)
  assert len(batches) == 5
  for b in batches:
    t, m = b["tokens"], b["attention_mask"]
    assert t.shape == m.shape == (8, 12)
    assert (t[:, 0] == BOS).all() and (m[:, 0] == 1).all()
    n = m.sum(1)
    assert (m == (np.arange(12) < n[:, None])).all()  # mask is a prefix
    assert (t[m == 0] == PAD).all()
    for row, k in zip(t, n):
      if k < 12:
        assert row[k - 1] == EOS  # whole document: ends with EOS
      text = tok.decode(row)
      assert any(d.startswith(text) for d in docs)
  first = [tok.decode(r) for r in batches[0]["tokens"][:3]]
  assert first[0] == docs[0][: len(first[0])] and first[0].startswith("doc 0 ")


def test_eval_last_batch_filled_with_empty_rows(tok, numbered_text):
  path, _ = numbered_text
  for pre in ("pad", "wrap"):
    cfg = _data_cfg(source="text", paths=path, eval_paths=path, preprocess=pre)
    batches = list(
      P.make_dataset(cfg, tok, split="eval", seq_len=8, global_batch_size=12, seed=0, num_epochs=1)
    )
    last = batches[-1]
    assert last["tokens"].shape == (12, 8)
    empty = last["attention_mask"].sum(1) == 0
    assert empty.any() and (last["tokens"][empty] == PAD).all()
    assert not empty[0]
    # Train drops the remainder instead.
    train = list(
      P.make_dataset(cfg, tok, split="train", seq_len=8, global_batch_size=12, seed=0, num_epochs=1)
    )
    assert len(train) == len(batches) - 1
    assert all(b["attention_mask"][:, 0].all() for b in train)


def test_seeded_shuffle(tok):
  def first(seed):
    ds = P.make_dataset(_data_cfg(), tok, split="eval", seq_len=16, global_batch_size=4, seed=seed)
    return next(iter(ds))["tokens"]

  np.testing.assert_array_equal(first(1), first(1))
  assert not np.array_equal(first(1), first(2))


def _tfds_cfg(**kw):
  return _data_cfg(source="tfds", tfds_name="lm1b", train_split="train", eval_split="test", **kw)


@pytest.mark.parametrize("kind", ["wrap_embedded", "pad_text", "wrap_tfds"])
def test_iterator_state_round_trip(tok, numbered_text, kind):
  path, _ = numbered_text
  cfg = {
    "wrap_embedded": _data_cfg(),
    "pad_text": _data_cfg(source="text", paths=path, preprocess="pad"),
    "wrap_tfds": _tfds_cfg(),
  }[kind]
  with tfds.testing.mock_data(num_examples=300):
    ds = P.make_dataset(cfg, tok, split="train", seq_len=16, global_batch_size=4, seed=3)
    it = iter(ds)
    _take(it, 7)
    state = iterator_state.iterator_state_json(it)
    json.loads(state)  # JSON-able, as the grain orbax handler stores it
    expected = _take(it, 6)  # crosses an epoch of the 40-document text file
    it2 = iterator_state.restore_iterator_state(iter(ds), state)
    got = _take(it2, 6)
  for e, g in zip(expected, got):
    np.testing.assert_array_equal(e["tokens"], g["tokens"])
    np.testing.assert_array_equal(e["attention_mask"], g["attention_mask"])


def test_orbax_checkpoint_of_iterator(tok, tmp_path):
  ocp = pytest.importorskip("orbax.checkpoint")
  ds = P.make_dataset(_data_cfg(), tok, split="train", seq_len=16, global_batch_size=4, seed=0)
  it = iter(ds)
  _take(it, 3)
  with ocp.CheckpointManager(tmp_path) as mngr:
    mngr.save(3, args=ocp.args.Composite(data=iterator_state.checkpoint_args_save(it)))
    mngr.wait_until_finished()
  expected = _take(it, 4)
  it2 = iter(ds)
  with ocp.CheckpointManager(tmp_path) as mngr:
    mngr.restore(3, args=ocp.args.Composite(data=iterator_state.checkpoint_args_restore(it2)))
  for e, g in zip(expected, _take(it2, 4)):
    np.testing.assert_array_equal(e["tokens"], g["tokens"])
  data_files = lambda d: sorted(f for f in os.listdir(d) if f.endswith(".json"))  # noqa: E731
  assert data_files(tmp_path / "3" / "data") == [iterator_state.ITERATOR_FILE]  # one global state
  # A checkpoint written before the global order (grain's per-process file) still restores.
  import grain.checkpoint  # pylint: disable=g-import-not-at-top

  with ocp.CheckpointManager(tmp_path / "old") as mngr:
    mngr.save(3, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(iter(ds))))
    mngr.wait_until_finished()
  assert data_files(tmp_path / "old" / "3" / "data") == ["process_0-of-1.json"]
  it3 = iter(ds)
  _take(it3, 3)
  (tmp_path / "old" / "3" / "data" / "process_0-of-1.json").write_text(
    iterator_state.iterator_state_json(it3)
  )
  it4 = iter(ds)
  with ocp.CheckpointManager(
    tmp_path / "old", item_handlers={"data": iterator_state.global_iterator_handler()}
  ) as mngr:
    mngr.restore(3, args=ocp.args.Composite(data=iterator_state.checkpoint_args_restore(it4)))
  for e, g in zip(expected, _take(it4, 4)):
    np.testing.assert_array_equal(e["tokens"], g["tokens"])


def test_sharding_pad_disjoint_documents(tok, numbered_text):
  path, docs = numbered_text
  cfg = _data_cfg(source="text", paths=path, eval_paths=path, preprocess="pad")
  seen = []
  for p in range(2):
    ds = P.make_dataset(
      cfg,
      tok,
      split="eval",
      seq_len=64,
      global_batch_size=8,
      seed=0,
      process_index=p,
      process_count=2,
      num_epochs=1,
    )
    batches = list(ds)
    assert all(b["tokens"].shape == (4, 64) for b in batches)  # local batch
    seen.append(
      {tok.decode(r) for b in batches for r, m in zip(b["tokens"], b["attention_mask"]) if m.any()}
    )
  assert not seen[0] & seen[1]
  assert seen[0] | seen[1] == set(docs)


def test_sharding_wrap_disjoint_rows(tok):
  def rows(p, n):
    ds = P.make_dataset(
      _data_cfg(),
      tok,
      split="eval",
      seq_len=32,
      global_batch_size=4,
      seed=0,
      process_index=p,
      process_count=n,
      num_epochs=1,
      drop_remainder=True,
    )
    return _rows(list(ds))

  r0, r1, everything = rows(0, 2), rows(1, 2), rows(0, 1)
  assert not set(r0) & set(r1)
  assert len(r0) + len(r1) >= len(everything) - 4  # minus dropped remainders
  assert set(r0) | set(r1) <= set(everything)


def test_tfds_lm1b_mock(tok):
  with tfds.testing.mock_data(num_examples=50):
    texts = S.tfds_texts("lm1b", "train")
    assert len(texts) == 50 and isinstance(texts[0], str)
    shards = [S.tfds_texts("lm1b", "train", process_index=p, process_count=2) for p in range(2)]
    assert [len(s) for s in shards] == [25, 25]
    assert list(shards[1]) == [texts[i] for i in range(1, 50, 2)]
    for pre in ("wrap", "pad"):
      ds = P.make_dataset(
        _tfds_cfg(preprocess=pre),
        tok,
        split="eval",
        seq_len=16,
        global_batch_size=4,
        seed=0,
        process_index=1,
        process_count=2,
        num_epochs=1,
      )
      batches = list(ds)
      assert batches and all(b["tokens"].shape == (2, 16) for b in batches)
      assert all((b["tokens"][:, 0][b["attention_mask"][:, 0] == 1] == BOS).all() for b in batches)


class SetdiffTinyText(tfds.core.GeneratorBasedBuilder):
  """A tiny real TFDS text dataset (registered as 'setdiff_tiny_text')."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(
      builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()})
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples(10), "test": self._generate_examples(3)}

  def _generate_examples(self, n):
    for i in range(n):
      yield i, {"text": f"sentence {i} ünï"}


def test_tfds_prepared_array_record(tok, tmp_path):
  """The unmocked path: array_record files read without TensorFlow (bytes)."""
  SetdiffTinyText(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
  texts = S.tfds_texts("setdiff_tiny_text", "train", data_dir=str(tmp_path))
  assert sorted(texts) == sorted(f"sentence {i} ünï" for i in range(10))
  assert len(S.tfds_texts("setdiff_tiny_text", "train[:4]", data_dir=str(tmp_path))) == 4
  cfg = _data_cfg(
    source="tfds",
    tfds_name="setdiff_tiny_text",
    tfds_data_dir=str(tmp_path),
    eval_split="test",
    preprocess="pad",
  )
  batches = list(
    P.make_dataset(cfg, tok, split="eval", seq_len=16, global_batch_size=4, seed=0, num_epochs=1)
  )
  assert len(batches) == 1
  got = sorted(
    tok.decode(r) for r, m in zip(batches[0]["tokens"], batches[0]["attention_mask"]) if m.any()
  )
  assert got == [f"sentence {i} ünï" for i in range(3)]


LM1B_LAYOUT = os.path.join(os.path.dirname(__file__), "data", "lm1b_layout")


def test_lm1b_from_text_files_is_the_tfds_build(tmp_path, monkeypatch):
  """launch/prepare_lm1b.py's builder on a small tree in the released archive's layout (3 train,
  2 held-out shards; lines with outer spaces): the records, in order, that TFDS's own lm1b
  builder (tfds 4.9.10 with TensorFlow 2.21, its download pointed at this tree) wrote from the
  same files (tfds_order.json, recorded once), read back by the LM1B configs' data path."""
  from configs import lm1b_sw
  from setdiff_jax.data import lm1b_files

  data_dir = str(tmp_path / "tfds")
  temp = tmp_path / "temp"
  temp.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(temp))
  out = lm1b_files.build(LM1B_LAYOUT, data_dir)
  assert out == os.path.join(data_dir, "lm1b", "1.1.0")
  assert os.listdir(temp) == []  # no bucket lookup: no empty tmp*tfds folder left behind
  monkeypatch.undo()
  with open(os.path.join(LM1B_LAYOUT, "tfds_order.json"), encoding="utf-8") as f:
    expected = json.load(f)
  for split in ("train", "test"):
    assert list(S.tfds_texts("lm1b", split, data_dir=data_dir)) == expected[split], split
  assert len(expected["train"]) == 24 and expected["train"][0] == (
    "Sentence 11 mentions the market ( and a café ) ."  # stripped, as TFDS strips
  )
  config = lm1b_sw.get_config()
  config.data.tfds_data_dir = data_dir
  bert = T.get_tokenizer(config.tokenizer)
  batches = list(
    P.make_dataset(
      config.data, bert, split="eval", seq_len=16, global_batch_size=2, seed=0, num_epochs=1
    )
  )
  rows = np.concatenate([b["tokens"][b["attention_mask"][:, 0] == 1] for b in batches])
  assert len(rows) == 5 and (rows[:, 0] == bert.bos_id).all()  # wrapped rows: [CLS] ... [SEP]
  assert "held - out line" in bert.decode(rows[0])
  with pytest.raises(FileNotFoundError, match="no LM1B train files.*--text_dir"):
    lm1b_files.build(str(tmp_path), data_dir)
  # a second build into the same data_dir: tfds kept the first, whatever the new text said
  with pytest.raises(ValueError, match=r"lm1b/1.1.0 already holds a prepared LM1B .*delete that"):
    lm1b_files.build(LM1B_LAYOUT, data_dir)
  # a file that is not UTF-8: named (with its byte); the data_dir the build created is removed
  bad = tmp_path / "bad"
  shutil.copytree(LM1B_LAYOUT, bad)
  shard = sorted(
    glob.glob(str(bad / "*" / "training-monolingual.tokenized.shuffled" / "news.en-*"))
  )[1]
  with open(shard, "ab") as f:
    f.write(b"caf\xe9 latin-1 line\n")
  with pytest.raises(
    ValueError, match=rf"^{re.escape(shard)}: not UTF-8 text \(line \d+, byte \d+"
  ):
    lm1b_files.build(str(bad), str(tmp_path / "fresh"))
  assert not os.path.exists(tmp_path / "fresh")


def test_make_dataset_argument_errors(tok):
  cfg = _data_cfg()
  kw = dict(split="train", seq_len=16, seed=0)
  with pytest.raises(ValueError, match="not divisible by process_count=3"):
    P.make_dataset(cfg, tok, global_batch_size=8, process_count=3, **kw)
  with pytest.raises(ValueError, match="split="):
    P.make_dataset(cfg, tok, global_batch_size=8, **{**kw, "split": "test"})
  with pytest.raises(ValueError, match="seq_len=2 is too short"):
    P.make_dataset(cfg, tok, global_batch_size=8, **{**kw, "seq_len": 2})


# ---------------------------------------------------------------------------
# The global data order (the same batches on any number of processes).


def _global_order_cfg(kind, path):
  quiet = {"read_threads": 0, "prefetch": 0}  # no read-ahead: 20 iterators, 2 cores
  if kind == "wrap_embedded":  # the small split for both (tokenized by every iterator)
    return _data_cfg(train_split="validation", eval_split="validation", **quiet)
  if kind == "pad_text":
    return _data_cfg(source="text", paths=path, eval_paths=path, preprocess="pad", **quiet)
  if kind == "pairs":
    return _data_cfg(
      source="arithmetic", preprocess="pad", task_train_examples=60, task_eval_examples=30, **quiet
    )
  return _tfds_cfg(**quiet)


@pytest.mark.parametrize(
  "kind", ["wrap_embedded", "pad_text", "pairs", pytest.param("wrap_tfds", marks=pytest.mark.slow)]
)  # ~10 s: every iterator tokenizes the mock stream
def test_global_order_independent_of_process_count(tok, numbered_text, kind):
  """Process i of n's rows of each step, concatenated over i, are the 1-process global batch;
  an iterator state saved on 2 processes resumes the same global stream on 4 (and on 1)."""
  cfg = _global_order_cfg(kind, numbered_text[0])

  def iters(n, split="train", num_epochs=None):
    return [
      iter(
        P.make_dataset(
          cfg,
          tok,
          split=split,
          seq_len=40,
          global_batch_size=8,
          seed=3,
          process_index=i,
          process_count=n,
          num_epochs=num_epochs,
        )
      )
      for i in range(n)
    ]

  def steps(its, k):
    return [
      {key: np.concatenate([b[key] for b in bs]) for key in bs[0]}
      for bs in zip(*[_take(it, k) for it in its])
    ]

  def check_equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
      assert sorted(g) == sorted(w)
      for key in w:
        np.testing.assert_array_equal(g[key], w[key])

  with tfds.testing.mock_data(num_examples=60):
    want = steps(iters(1), 6)
    assert want[0]["tokens"].shape == (8, 40)
    assert not all(np.array_equal(want[0]["tokens"], w["tokens"]) for w in want[1:])
    for n in (2, 4):
      check_equal(steps(iters(n), 6), want)
    # Resume on another process count: the state is global (the same on every process).
    two = iters(2)
    check_equal(steps(two, 2), want[:2])
    states = {iterator_state.iterator_state_json(it) for it in two}
    assert len(states) == 1
    state = states.pop()
    for n in (4, 1):
      resumed = [iterator_state.restore_iterator_state(it, state) for it in iters(n)]
      check_equal(steps(resumed, 4), want[2:])
    # A finite eval pass with a short, padded last batch: the union is the 1-process pass.
    if kind != "wrap_tfds":
      one = list(iters(1, "eval", 1)[0])
      for n in (2, 4):
        got = [
          {key: np.concatenate([b[key] for b in bs]) for key in bs[0]}
          for bs in zip(*[list(it) for it in iters(n, "eval", 1)])
        ]
        real = lambda batches: sorted(
          tuple(r)
          for b in batches  # noqa: E731
          for r, m in zip(b["tokens"], b["attention_mask"])
          if m.any()
        )
        assert len(got) == len(one) and real(got) == real(one)
