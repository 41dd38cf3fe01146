"""Tokenizers: known ids, special ids, save/load, clear errors.

The WordPiece and GPT-2 tests read the vocabularies the package ships (setdiff_jax/data/vocab/),
so they run on any clone; the files are pinned to the upstream ones by their SHA-256.
"""

import hashlib
import json
import shutil

import pytest

from setdiff_jax.data import sources
from setdiff_jax.data import tokenizers as T


BERT_VOCAB = T.packaged_vocab("bert-base-uncased/vocab.txt")
GPT2_VOCAB = T.packaged_vocab("gpt2/vocab.json")
GPT2_MERGES = T.packaged_vocab("gpt2/merges.txt")
# SHA-256 of the upstream files: bert-base-uncased's vocab.txt (Google BERT) and GPT-2's
# vocab.json / merges.txt (OpenAI), as distributed by the PyPI packages that ship them.
UPSTREAM_SHA256 = {
  "bert-base-uncased/vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
  "gpt2/vocab.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
  "gpt2/merges.txt": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}


def _cfg(**kw):
  cfg = T.default_tokenizer_config()
  for k, v in kw.items():
    cfg[k] = v
  return cfg


@pytest.fixture(scope="module")
def bert():
  return T.get_tokenizer(_cfg(kind="wordpiece", vocab_path=BERT_VOCAB))


@pytest.fixture(scope="module")
def gpt2():
  return T.get_tokenizer(_cfg(kind="gpt2", vocab_path=GPT2_VOCAB, merges_path=GPT2_MERGES))


def test_wordpiece_known_ids(bert):
  assert bert.encode("hello world") == [7592, 2088]
  # Uncased: the BERT normalizer lowercases; a literal "[MASK]" is text (issue 23).
  assert bert.encode("Hello, World! [MASK]") == [7592, 1010, 2088, 999, 1031, 7308, 1033]
  assert bert.vocab_size == 30522
  # SPEC §5 caveat: BOS = [CLS] (what the wrapped LM1B data starts rows with).
  assert (bert.bos_id, bert.eos_id, bert.pad_id, bert.mask_id) == (101, 102, 0, 103)
  assert bert.decode([101, 7592, 2088, 102, 0, 0]) == "hello world"
  assert bert.decode([101, 7592, 103], skip_special=False) == "[CLS] hello [MASK]"


def test_gpt2_round_trip_and_mask(gpt2):
  text = "Hello world!  It's a test,\n\nwith ünïcode and 🙂 emoji."
  ids = gpt2.encode(text)
  assert gpt2.decode(ids) == text
  assert gpt2.encode("Hello world") == [15496, 995]
  assert gpt2.vocab_size == 50258
  assert gpt2.mask_id == 50257
  assert gpt2.bos_id == gpt2.eos_id == gpt2.pad_id == 50256
  assert gpt2.encode("a<|fim_middle|>b<|endoftext|>")[:1] == [64]  # text: see below
  assert gpt2.decode([64, 50257, 65, 50256]) == "ab"


def test_trained_saved_and_reloaded(tmp_path):
  texts = sources.embedded_corpus("validation")
  cfg = _cfg(kind="trained", vocab_size=400)
  calls = []

  def train_texts():
    calls.append(1)
    return iter(texts)

  tok = T.get_tokenizer(cfg, tmp_path, train_texts=train_texts)
  assert calls == [1]
  assert (tmp_path / "tokenizer" / "tokenizer.json").is_file()
  meta = json.loads((tmp_path / "tokenizer" / "special_tokens.json").read_text())
  assert meta["kind"] == "trained" and meta["vocab_size"] == 400
  assert tok.vocab_size == 400
  assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.mask_id) == (0, 2, 3, 4)
  assert tok.id_to_token(1) == "[UNK]"
  text = texts[3]
  assert tok.decode(tok.encode(text)) == text  # byte-level: exact round trip
  # Second run: loaded from the workdir, the texts are not needed (not called).
  tok2 = T.get_tokenizer(cfg, tmp_path, train_texts=train_texts)
  assert calls == [1]
  assert tok2.encode(text) == tok.encode(text)
  assert tok2.special_ids() == tok.special_ids()
  # An edited special_tokens.json (probe round 11): an id outside the vocabulary, or a mask id
  # that is also BOS / EOS / PAD, is named when loaded, not at the first embedding lookup.
  path = tmp_path / "tokenizer" / "special_tokens.json"
  for edit, words in (
    ({"mask_id": 400}, "mask_id=400 is no id"),
    ({"mask_id": 3}, "mask_id=3 is also BOS"),
  ):
    path.write_text(json.dumps(dict(meta, **edit)))
    with pytest.raises(ValueError, match=f"special_tokens.json is damaged \\({words}"):
      T.Tokenizer.load(tmp_path / "tokenizer")


def test_workdir_kind_mismatch(tmp_path):
  T.get_tokenizer(
    _cfg(kind="trained", vocab_size=300), tmp_path, train_texts=["some text here"] * 10
  )
  with pytest.raises(ValueError, match="kind='trained'.*fresh workdir"):
    T.get_tokenizer(_cfg(kind="wordpiece", vocab_path="x"), tmp_path)


def test_wordpiece_save_load(bert, tmp_path):
  bert.save(tmp_path)
  tok = T.Tokenizer.load(tmp_path)
  assert tok.encode("hello world") == [7592, 2088]
  assert tok.special_ids() == bert.special_ids()
  assert tok.kind == "wordpiece"


def test_missing_files_raise_clear_errors(tmp_path):
  missing = str(tmp_path / "nope" / "vocab.txt")
  with pytest.raises(FileNotFoundError, match="nope/vocab.txt.*tokenizer.vocab_path"):
    T.get_tokenizer(_cfg(kind="wordpiece", vocab_path=missing))
  with pytest.raises(FileNotFoundError, match="merges.txt.*tokenizer.merges_path"):
    T.get_tokenizer(
      _cfg(
        kind="gpt2",
        vocab_path=GPT2_VOCAB,
        merges_path=str(tmp_path / "merges.txt"),
      )
    )
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    T.Tokenizer.load(tmp_path)


def test_config_errors():
  with pytest.raises(ValueError, match="tokenizer.kind"):
    T.get_tokenizer(_cfg(kind="sentencepiece"))
  with pytest.raises(ValueError, match="needs tokenizer.vocab_path"):
    T.get_tokenizer(_cfg(kind="wordpiece"))
  with pytest.raises(ValueError, match="needs train_texts"):
    T.get_tokenizer(_cfg(kind="trained"))
  with pytest.raises(ValueError, match="too small"):
    T.get_tokenizer(_cfg(kind="trained", vocab_size=100), train_texts=["a b"])


def test_packaged_vocabularies_build_the_config_tokenizers(tmp_path, monkeypatch):
  """The LM1B / OWT configs need no file outside the package: their default vocab paths are the
  packaged copies (with licence notices), and they give the known ids of bert-base-uncased and
  GPT-2 from any working directory."""
  from configs import lm1b_ar, lm1b_sw, owt_sw

  monkeypatch.chdir(tmp_path)  # nothing relative to the checkout
  for name in T.PACKAGED_VOCABS:
    path = T.packaged_vocab(name)
    assert path.startswith(str(T.PACKAGED_VOCAB_DIR)) and (T.PACKAGED_VOCAB_DIR / name).is_file()
  for d, licence in (("bert-base-uncased", "Apache License"), ("gpt2", "MIT License")):
    assert licence in (T.PACKAGED_VOCAB_DIR / d / "LICENSE").read_text(encoding="utf-8")
  for config in (lm1b_sw.get_config(), lm1b_ar.get_config()):
    assert config.tokenizer.vocab_path == T.packaged_vocab("bert-base-uncased/vocab.txt")
    bert = T.get_tokenizer(config.tokenizer)
    assert bert.encode("Hello, World! [MASK]") == [7592, 1010, 2088, 999, 1031, 7308, 1033]
    assert (bert.vocab_size, bert.bos_id, bert.eos_id, bert.mask_id) == (30522, 101, 102, 103)
  gpt2 = T.get_tokenizer(owt_sw.get_config().tokenizer)
  assert gpt2.encode("Hello world") == [15496, 995]
  assert (gpt2.vocab_size, gpt2.eos_id, gpt2.mask_id) == (50258, 50256, 50257)
  with pytest.raises(ValueError, match="no packaged vocabulary 'gpt2/vocab.txt'"):
    T.packaged_vocab("gpt2/vocab.txt")


def test_packaged_vocabularies_equal_the_reference_files():
  for name, sha256 in UPSTREAM_SHA256.items():
    assert hashlib.sha256((T.PACKAGED_VOCAB_DIR / name).read_bytes()).hexdigest() == sha256, name


def test_vocab_path_stays_overridable(tmp_path):
  """--config.tokenizer.vocab_path still points a packaged-default config elsewhere."""
  from configs import lm1b_sw

  c = lm1b_sw.get_config()
  c.tokenizer.vocab_path = shutil.copy(BERT_VOCAB, str(tmp_path / "my-vocab.txt"))
  assert c.tokenizer.vocab_path != BERT_VOCAB
  assert T.get_tokenizer(c.tokenizer).encode("hello world") == [7592, 2088]
  c.tokenizer.vocab_path = "/nonexistent/vocab.txt"
  with pytest.raises(FileNotFoundError, match="/nonexistent/vocab.txt.*tokenizer.vocab_path"):
    T.get_tokenizer(c.tokenizer)
  # Probe round 11: a vocab.txt without [UNK] loaded (the specials appended as new ids) and the
  # first unknown word raised a bare Exception; it is refused when loaded, naming what is missing.
  words = [w for w in open(BERT_VOCAB, encoding="utf-8").read().splitlines() if w != "[UNK]"]
  (tmp_path / "no-unk.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
  c.tokenizer.vocab_path = str(tmp_path / "no-unk.txt")
  with pytest.raises(ValueError, match=r"no-unk.txt lacks the BERT special tokens \['\[UNK\]'\]"):
    T.get_tokenizer(c.tokenizer)


# ----------------------------------------------------------------------------- specials as text
def _qwen3_like(gpt2, tmp_path):
  """A tokenizer.json with Qwen3's special names (GPT-2's BPE + added specials)."""
  import tokenizers as hf

  tok = hf.Tokenizer.from_str(gpt2.hf.to_str())
  tok.add_special_tokens([T.QWEN3_MASK, "<|im_start|>", "<|im_end|>"])
  path = tmp_path / "tokenizer.json"
  tok.save(str(path))
  return T.qwen3_tokenizer(str(path))


def _special_text_cases(tok, literals):
  """Every literal control string is text: no control id, and it decodes back unchanged."""
  controls = {tok.bos_id, tok.eos_id, tok.pad_id, tok.mask_id}
  for lit in literals:
    text = f"before {lit} after{lit}"
    ids = tok.encode(text)
    assert not controls & set(ids), (lit, ids)
    assert tok.encode_batch(["plain", text])[1] == ids
    if tok.kind == "wordpiece":  # BERT's decoder spaces out punctuation
      assert tok.decode(ids).replace(" ", "") == text.lower().replace(" ", ""), lit
    else:
      assert tok.decode(ids) == text, lit
  assert tok.encode("plain words") == tok.hf.encode("plain words", add_special_tokens=False).ids


def test_special_token_text_is_text_trained(tmp_path):
  cfg = _cfg(kind="trained", vocab_size=300)
  tok = T.get_tokenizer(cfg, str(tmp_path), train_texts=["some text [MASK] here"] * 20)
  _special_text_cases(tok, T.TRAINED_SPECIALS)
  again = T.Tokenizer.load(tmp_path / T.TOKENIZER_SUBDIR)  # the choice is saved with it
  assert again.encode("a [MASK]") == tok.encode("a [MASK]")
  control = T.get_tokenizer(
    _cfg(kind="trained", vocab_size=300, control_tokens_in_text=True),
    train_texts=["some text [MASK] here"] * 20,
  )
  assert control.encode("[MASK]") == [control.mask_id]  # the documented opt-in


def test_special_token_text_is_text_wordpiece(bert):
  _special_text_cases(bert, ["[MASK]", "[SEP]", "[CLS]", "[PAD]", "[UNK]"])
  control = T.get_tokenizer(
    _cfg(
      kind="wordpiece",
      control_tokens_in_text=True,
      vocab_path=BERT_VOCAB,
    )
  )
  assert control.encode("Hello, World! [MASK]") == [7592, 1010, 2088, 999, 103]


def test_special_token_text_is_text_gpt2(gpt2):
  _special_text_cases(gpt2, ["<|endoftext|>", "<|fim_middle|>"])
  # Text pieces are encoded as GPT-2 encodes the same characters with no special tokens.
  assert gpt2.encode("<|endoftext|>") == [27, 91, 437, 1659, 5239, 91, 29]
  control = T.get_tokenizer(
    _cfg(
      kind="gpt2",
      control_tokens_in_text=True,
      vocab_path=GPT2_VOCAB,
      merges_path=GPT2_MERGES,
    )
  )
  assert control.encode("a<|fim_middle|>b<|endoftext|>") == [64, 50257, 65, 50256]


def test_special_token_text_is_text_qwen3(gpt2, tmp_path):
  tok = _qwen3_like(gpt2, tmp_path)
  _special_text_cases(tok, [T.QWEN3_EOS, T.QWEN3_MASK])
  # Chat markup is not a control token of the model: it keeps its one id (chat templates).
  start = tok.hf.token_to_id("<|im_start|>")
  assert tok.encode("<|im_start|>user\nhi <|endoftext|>")[0] == start


def test_files_the_tokenizer_library_cannot_parse_are_one_line(tmp_path):
  """Probe 18b: a vocab.json that is not GPT-2's, the vocab and merges swapped, a file that is not
  JSON, a JSON that is not a tokenizer.json each ended in the tokenizers library's bare Exception
  (a traceback); each is one ValueError naming the fields and the fix."""
  vocab, merges = T.packaged_vocab("gpt2/vocab.json"), T.packaged_vocab("gpt2/merges.txt")
  small = tmp_path / "small.json"
  small.write_text(json.dumps({"a": 0, "b": 1}))
  not_json = tmp_path / "notjson.json"
  not_json.write_text("hello there")
  pair = "are not a GPT-2 vocab.json / merges.txt pair"
  for v, m in ((str(small), merges), (merges, vocab), (str(not_json), merges)):
    with pytest.raises(ValueError) as e:
      T.gpt2_tokenizer(v, m)
    message = str(e.value)
    assert "\n" not in message and message.startswith(
      f"tokenizer.vocab_path={v} and tokenizer.merges_path={m} {pair} ("
    ), message
    assert "set them to the two files of one byte-level BPE" in message
  for bad in (small, not_json):
    with pytest.raises(ValueError, match=f"{bad} is not a HF tokenizer.json .*vocab_path"):
      T.qwen3_tokenizer(str(bad))
  binary = tmp_path / "vocab.txt"
  binary.write_bytes(b"\xff\xfe\x00bad")
  with pytest.raises(ValueError, match="is not a WordPiece vocab.txt"):
    T.wordpiece_tokenizer(str(binary))
