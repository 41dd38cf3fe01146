"""Training the byte-level BPE of `tokenizer.kind=trained` (`tokenizers.train_tokenizer` wraps
it with the project's special ids): the trainer's settings, the long words it is given in pieces
and the line it logs first."""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from absl import logging
import tokenizers as hf
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

# The longest word (pre-token: a run of letters, digits, punctuation or whitespace) the BPE
# trainer is given whole. Its merges edit a word in place at a cost of the word's length per
# occurrence, so one long word (a whitespace-free line: base64, minified code, unspaced CJK text)
# trains in time quadratic in its length (1M characters: minutes, with no sign of progress); cut
# into pieces of this length it is linear, and it still teaches the pairs inside the pieces. The
# cut changes nothing for text whose words are all shorter (the embedded corpus's longest: 40).
MAX_TRAINING_WORD = 256
# Where a word may be longer than MAX_TRAINING_WORD: only these texts are pre-tokenized here.
_LONG_RUN = re.compile(rf"\S{{{MAX_TRAINING_WORD}}}|\s{{{MAX_TRAINING_WORD + 1}}}")


def cut_long_words(texts: Iterable[str], limit: int = MAX_TRAINING_WORD) -> tuple[list[str], int]:
  """`texts` with every pre-token longer than `limit` characters cut into `limit`-character
  pieces, each cut ending a text (so the trainer never joins the pieces); (texts, words cut)."""
  pre = pre_tokenizers.ByteLevel(add_prefix_space=False)  # train_bpe's pre-tokenizer
  out, cut_words = [], 0
  for text in texts:
    if not _LONG_RUN.search(text):
      out.append(text)
      continue
    start = 0
    for _, (begin, end) in pre.pre_tokenize_str(text):  # character offsets
      cut_words += end - begin > limit
      for cut in range(begin + limit, end, limit):
        out.append(text[start:cut])
        start = cut
    out.append(text[start:])
  return out, cut_words


def train_bpe(
  texts: Iterable[str], vocab_size: int, lowercase: bool, specials: Sequence[str]
) -> hf.Tokenizer:
  """A byte-level BPE of `vocab_size` tokens (`specials` first) trained on `texts`; words longer
  than MAX_TRAINING_WORD characters are trained on in pieces (linear time); one INFO line says
  what it trains on."""
  min_size = len(specials) + 256 + 1
  if vocab_size < min_size:
    raise ValueError(
      f"tokenizer.vocab_size={vocab_size} is too small for a "
      f"byte-level BPE (need at least {min_size})"
    )
  tok = hf.Tokenizer(models.BPE())
  if lowercase:
    tok.normalizer = normalizers.Lowercase()
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size,
    min_frequency=2,
    show_progress=False,
    special_tokens=list(specials),
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
  )
  texts = list(texts)
  pieces, cut_words = cut_long_words(texts)
  logging.info(
    "training a %d-token byte-level BPE tokenizer: %d documents, %d characters%s",
    vocab_size,
    len(texts),
    sum(map(len, texts)),
    f"; words longer than {MAX_TRAINING_WORD} characters (unspaced text), cut into "
    f"{MAX_TRAINING_WORD}-character pieces for it: {cut_words}"
    if cut_words
    else "",
  )
  tok.train_from_iterator(pieces, trainer=trainer)
  return tok


__all__ = ["MAX_TRAINING_WORD", "cut_long_words", "train_bpe"]
