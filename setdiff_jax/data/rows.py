"""Fixed-length rows from tokenized documents (SPEC §6): one padded row per document
(`pad_rows`, with `fit_documents` applying data.overlong to over-long ones) or documents wrapped
into a stream cut in rows (`wrap_rows`, and the stream pieces the lazy grain path uses).
"""

from __future__ import annotations

from absl import logging
import numpy as np

# data.overlong, for preprocess='pad': a document longer than a row ([BOS] doc [EOS] > seq_len).
OVERLONG_RULES = ("cut", "wrap", "skip", "error")


def pad_rows(
  ids: list[list[int]], seq_len: int, bos_id: int, eos_id: int, pad_id: int
) -> dict[str, np.ndarray]:
  """One row per document: [BOS] + doc + [EOS], truncated, right-padded.

  Returns tokens and attention_mask, both int32 [len(ids), seq_len].
  """
  tokens = np.full((len(ids), seq_len), pad_id, np.int32)
  mask = np.zeros((len(ids), seq_len), np.int32)
  for i, doc in enumerate(ids):
    doc = list(doc)
    if doc and doc[-1] == _EOS_MARK:  # the last piece of a wrapped document (fit_documents)
      row = [bos_id] + doc[:-1] + [eos_id]
    else:  # a whole document, cut to the row (an earlier wrapped piece: exactly [BOS] + piece)
      row = ([bos_id] + doc + [eos_id])[:seq_len]
    tokens[i, : len(row)] = row
    mask[i, : len(row)] = 1
  return {"tokens": tokens, "attention_mask": mask}


def fit_documents(ids, seq_len: int, rule: str, *, what: str = "documents"):
  """Applies data.overlong to tokenized documents for one-document-per-row rows.

  A document is over-long when [BOS] + doc + [EOS] > seq_len. 'cut' keeps it (pad_rows
  truncates it), 'wrap' splits doc + [EOS] into pieces of seq_len - 1 tokens (each becomes
  [BOS] + piece; the EOS lands on the last piece; the marker -1 stands for it here), 'skip'
  drops it, 'error' raises naming the count. Returns (list of documents for pad_rows, number of
  over-long documents); logs a warning line when that number is not 0.
  """
  if rule not in OVERLONG_RULES:
    raise ValueError(f"data.overlong={rule!r}; expected one of {OVERLONG_RULES}")
  room = seq_len - 2  # [BOS] doc [EOS]
  long_idx = [i for i, d in enumerate(ids) if len(d) > room]
  n = len(long_idx)
  if n and rule == "error":
    raise ValueError(
      f"{n} of {len(ids)} {what} are longer than a row (seq_len={seq_len} holds {room} tokens "
      f"plus BOS and EOS; the first is #{long_idx[0]}, {len(ids[long_idx[0]])} tokens): set "
      f"data.overlong=cut, wrap or skip, or raise seq_len"
    )
  out = ids
  if n and rule == "skip":
    drop = set(long_idx)
    out = [d for i, d in enumerate(ids) if i not in drop]
  elif n and rule == "wrap":
    out = []
    for d in ids:
      if len(d) <= room:
        out.append(d)
        continue
      full = list(d) + [_EOS_MARK]
      out.extend(full[j : j + seq_len - 1] for j in range(0, len(full), seq_len - 1))
  if n:
    lost = sum(len(ids[i]) - room for i in long_idx)
    logging.warning(
      "data: %d of %d %s (%.1f%%) are longer than a row of seq_len=%d: %s (data.overlong=%s; %s)",
      n,
      len(ids),
      what,
      100.0 * n / max(len(ids), 1),
      seq_len,
      {
        "cut": f"cut to the row, {lost} tokens dropped",
        "wrap": "continued on further rows",
        "skip": "skipped",
      }[rule],
      rule,
      "the other choices: " + ", ".join(r for r in OVERLONG_RULES if r != rule),
    )
  return out, n


_EOS_MARK = -1  # a wrapped document's EOS, placed by pad_rows (only on its last piece)


def token_stream(ids: list[list[int]], style: str, bos_id: int, eos_id: int) -> np.ndarray:
  """Concatenated token stream of documents: 'row': doc EOS ...; 'doc': BOS doc EOS ... With
  BOS = EOS (GPT-2, Qwen3: <|endoftext|>) 'doc' is doc EOS doc EOS ..., one separator between
  documents, as the MDLM / BD3LM wrapped OpenWebText (`..._specialFalse.dat`, SPEC §5) is."""
  head = [bos_id] if style == "doc" and bos_id != eos_id else []
  parts = [np.asarray(head + list(doc) + [eos_id], np.int32) for doc in ids]
  return np.concatenate(parts) if parts else np.zeros((0,), np.int32)


def chunk_len(seq_len: int, style: str) -> int:
  """Stream tokens per row: 'row' style spends two slots on BOS and EOS."""
  return seq_len - 2 if style == "row" else seq_len


def add_row_specials(chunks: np.ndarray, style: str, bos_id: int, eos_id: int) -> np.ndarray:
  """[n, chunk_len] -> [n, seq_len]: 'row' style frames each row with BOS/EOS."""
  if style != "row":
    return chunks
  n = chunks.shape[0]
  return np.concatenate(
    [np.full((n, 1), bos_id, np.int32), chunks, np.full((n, 1), eos_id, np.int32)], axis=1
  )


def wrap_rows(
  ids: list[list[int]], seq_len: int, bos_id: int, eos_id: int, style: str = "row"
) -> np.ndarray:
  """Concatenate tokenized documents and cut into rows; int32 [n_rows, seq_len].

  The final partial row is dropped (as the reference's wrapping does).
  """
  stream = token_stream(ids, style, bos_id, eos_id)
  chunk = chunk_len(seq_len, style)
  n = len(stream) // chunk
  chunks = stream[: n * chunk].reshape(n, chunk)
  return add_row_specials(chunks, style, bos_id, eos_id)
