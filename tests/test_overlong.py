"""data.overlong: documents longer than a row under preprocess='pad' are cut, wrapped, skipped
or refused, and always counted in the log (issue 24)."""

import logging

import pytest

from setdiff_jax.data import pipeline as P
from setdiff_jax.data import sources as S
from setdiff_jax.data import tokenizers as T

BOS, EOS, PAD = 1, 2, 0


def test_fit_documents_by_hand(caplog):
  """seq_len 5 holds 3 document tokens plus BOS and EOS; [10..15] (6 tokens) is over-long."""
  docs = [[7, 8], [10, 11, 12, 13, 14, 15], [9, 9, 9]]
  rows = lambda ids: P.pad_rows(ids, 5, BOS, EOS, PAD)["tokens"].tolist()
  with caplog.at_level(logging.WARNING):
    cut, n = P.fit_documents(docs, 5, "cut")
  assert n == 1 and rows(cut) == [[1, 7, 8, 2, 0], [1, 10, 11, 12, 13], [1, 9, 9, 9, 2]]
  assert (
    "1 of 3 documents (33.3%) are longer than a row of seq_len=5: cut to the row, "
    "3 tokens dropped (data.overlong=cut" in caplog.text
  )
  wrap, n = P.fit_documents(docs, 5, "wrap")
  # doc + EOS = 7 tokens in pieces of 4: [BOS 10 11 12 13], [BOS 14 15 EOS].
  assert n == 1 and rows(wrap) == [
    [1, 7, 8, 2, 0],
    [1, 10, 11, 12, 13],
    [1, 14, 15, 2, 0],
    [1, 9, 9, 9, 2],
  ]
  exact, _ = P.fit_documents([[3, 4, 5, 6, 7, 8, 9, 10]], 5, "wrap")  # 9 = 4 + 4 + 1
  assert rows(exact) == [[1, 3, 4, 5, 6], [1, 7, 8, 9, 10], [1, 2, 0, 0, 0]]
  skip, n = P.fit_documents(docs, 5, "skip")
  assert n == 1 and rows(skip) == [[1, 7, 8, 2, 0], [1, 9, 9, 9, 2]]
  with pytest.raises(
    ValueError,
    match=r"1 of 3 documents are longer than a row \(seq_len=5 "
    r"holds 3 tokens.*the first is #1, 6 tokens\): set data.overlong=cut",
  ):
    P.fit_documents(docs, 5, "error")
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    same, n = P.fit_documents(docs[:1], 5, "error")  # nothing over-long: no line, no change
  assert n == 0 and same == docs[:1] and "longer than a row" not in caplog.text


@pytest.fixture(scope="module")
def tok():
  cfg = T.default_tokenizer_config()
  cfg.vocab_size = 512
  return T.get_tokenizer(cfg, train_texts=S.embedded_corpus("validation"))


def test_text_lines_overlong_in_the_pipeline(tok, tmp_path, caplog):
  """Every mode through make_dataset on a line file; the rows hold every token of every line
  under 'wrap', and the log names the count."""
  lines = [("word " * k).strip() for k in (1, 3, 12, 2, 20, 4)]
  path = tmp_path / "lines.txt"
  path.write_text("\n".join(lines) + "\n")
  ids = [tok.encode(l) for l in lines]
  seq_len = 10
  over = sum(len(i) > seq_len - 2 for i in ids)
  assert 0 < over < len(lines)

  def rows(rule):
    cfg = P.default_data_config()
    cfg.source, cfg.paths, cfg.eval_paths, cfg.text_unit = "text", str(path), str(path), "line"
    cfg.preprocess, cfg.overlong = "pad", rule
    ds = P.make_dataset(
      cfg,
      tok,
      split="eval",
      seq_len=seq_len,
      global_batch_size=2,
      seed=0,
      shuffle=False,
      num_epochs=1,
    )
    out = [(r, m) for b in ds for r, m in zip(b["tokens"], b["attention_mask"]) if m.sum()]
    return out

  with caplog.at_level(logging.WARNING):
    cut = rows("cut")
  assert len(cut) == len(lines)
  assert f"{over} of {len(lines)} text eval documents" in caplog.text
  wrapped = rows("wrap")
  # Concatenating each row's content (without BOS / EOS / PAD) gives back every token.
  body = [t for r, m in wrapped for t in r[m == 1].tolist() if t not in (tok.bos_id, tok.eos_id)]
  assert body == [t for i in ids for t in i]
  assert len(wrapped) == sum(-(-(len(i) + 1) // (seq_len - 1)) for i in ids)
  assert sum(int(r[m == 1][-1] == tok.eos_id) for r, m in wrapped) == len(lines)
  skipped = rows("skip")
  assert len(skipped) == len(lines) - over
  with pytest.raises(ValueError, match="data.overlong"):
    rows("error")
  cfg = P.default_data_config()
  cfg.overlong = "drop"
  with pytest.raises(ValueError, match=r"data.overlong='drop'; expected one of \('cut', 'wrap'"):
    P.validate_data_config(cfg)
