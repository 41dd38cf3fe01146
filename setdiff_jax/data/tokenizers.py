"""Tokenizers: a small wrapper around the Hugging Face `tokenizers` library.

Three kinds (``cfg.kind``):

- ``wordpiece``: BERT WordPiece from a ``vocab.txt`` (the LM1B models use
  ``bert-base-uncased``, V = 30522).
- ``gpt2``: byte-level BPE from ``vocab.json`` + ``merges.txt`` plus one added
  mask token ``<|fim_middle|>`` (id 50257, V = 50258), as the OWT models.
- ``qwen3``: a Hugging Face ``tokenizer.json`` (``vocab_path``: the file or its
  directory, e.g. a local Qwen3 checkout) with the reference's specials: BOS = EOS
  = PAD = ``<|endoftext|>``, MASK = ``<|fim_middle|>`` (SPEC §5).
- ``trained``: a byte-level BPE trained on the run's own text at first use and
  saved in the workdir; later runs load it from there (as the Flax lm1b example
  does with SentencePiece).

The ``bert-base-uncased`` and GPT-2 vocabularies ship with the package
(``setdiff_jax/data/vocab/``, licence notices beside them): ``packaged_vocab(name)``
gives their installed paths, which the LM1B / OWT configs use by default.

Whatever the kind, ``get_tokenizer`` saves the result under ``<workdir>/tokenizer/``
(``tokenizer.json`` + ``special_tokens.json``) and later runs load it from there,
so a resumed run always sees the same ids.

``encode`` never adds special tokens: BOS/EOS/PAD placement is the data
pipeline's job (``setdiff_jax/data/pipeline.py``).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import tempfile
from typing import Callable, Iterable, Sequence

import ml_collections
import numpy as np
import tokenizers as hf
from tokenizers import decoders, models, normalizers, pre_tokenizers

from setdiff_jax import paths
from setdiff_jax.data import bpe

KINDS = ("wordpiece", "gpt2", "qwen3", "trained")
TOKENIZER_SUBDIR = "tokenizer"
_SPECIALS_FILE = "special_tokens.json"
_TOKENIZER_FILE = "tokenizer.json"

# Special tokens of the `trained` kind, at fixed low ids 0..4 (trainer order).
TRAINED_SPECIALS = ("[PAD]", "[UNK]", "[BOS]", "[EOS]", "[MASK]")

# The control tokens of each kind whose literal strings are text (besides BOS/EOS/PAD/MASK).
_KIND_SPECIALS = {
  "trained": TRAINED_SPECIALS,
  "wordpiece": ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
}

GPT2_EOS = "<|endoftext|>"  # id 50256; also BOS and PAD (SPEC §5)
GPT2_MASK = "<|fim_middle|>"  # added, id 50257 (SPEC §5)
QWEN3_EOS = "<|endoftext|>"  # 151643 in Qwen3-Base: also BOS and PAD (SPEC §5)
QWEN3_MASK = "<|fim_middle|>"  # 151660 in Qwen3-Base (SPEC §5)

# Vocabularies shipped as package data (setdiff_jax/data/vocab/README.md: origin, licences).
PACKAGED_VOCAB_DIR = pathlib.Path(__file__).resolve().parent / "vocab"
PACKAGED_VOCABS = ("bert-base-uncased/vocab.txt", "gpt2/vocab.json", "gpt2/merges.txt")


def packaged_vocab(name: str) -> str:
  """The installed path of a packaged vocabulary file, `name` one of `PACKAGED_VOCABS`."""
  if name not in PACKAGED_VOCABS:
    raise ValueError(f"no packaged vocabulary {name!r}; the package ships {PACKAGED_VOCABS}")
  path = PACKAGED_VOCAB_DIR / name
  if not path.is_file():  # an install that dropped the package data
    raise FileNotFoundError(
      f"packaged vocabulary {path} is missing: reinstall setdiff_jax "
      "(its package data holds setdiff_jax/data/vocab/)"
    )
  return str(path)


def default_tokenizer_config() -> ml_collections.ConfigDict:
  """Tokenizer config with defaults (the embedded-corpus tiny setup)."""
  cfg = ml_collections.ConfigDict()
  # 'wordpiece' (BERT vocab.txt) | 'gpt2' (vocab.json + merges.txt) |
  # 'trained' (byte-level BPE trained on the training text at first run).
  cfg.kind = "trained"
  # wordpiece: the vocab.txt; gpt2: vocab.json. Relative paths are relative to the
  # current directory; the LM1B / OWT configs default to packaged_vocab(...).
  cfg.vocab_path = ml_collections.FieldReference(None, field_type=str)
  # gpt2 only: merges.txt.
  cfg.merges_path = ml_collections.FieldReference(None, field_type=str)
  # trained only: vocabulary size including the 5 specials and the 256 bytes.
  cfg.vocab_size = 2048
  # Lowercase the text. None = the kind's default: True for wordpiece (the
  # uncased BERT vocab needs it), False for trained; gpt2 ignores it.
  cfg.lowercase = ml_collections.FieldReference(None, field_type=bool)
  # Literal control-token strings in data and prompts ("[MASK]", "[EOS]", "<|endoftext|>", ...)
  # are encoded as ordinary text; True makes them the control ids (the behaviour before).
  cfg.control_tokens_in_text = False
  return cfg


class Tokenizer:
  """A `tokenizers.Tokenizer` plus the special ids the project uses.

  Attributes:
    hf: the underlying `tokenizers.Tokenizer`.
    kind: 'wordpiece' | 'gpt2' | 'trained'.
    bos_id, eos_id, pad_id, mask_id: special token ids (may coincide, e.g. gpt2).
  """

  def __init__(
    self,
    hf_tokenizer: hf.Tokenizer,
    *,
    kind: str,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    mask_id: int,
    control_tokens_in_text: bool = False,
  ):
    self.hf = hf_tokenizer
    self.kind = kind
    self.bos_id = int(bos_id)
    self.eos_id = int(eos_id)
    self.pad_id = int(pad_id)
    self.mask_id = int(mask_id)
    self.control_tokens_in_text = bool(control_tokens_in_text)
    # The literal strings of the control tokens ([MASK], [EOS], <|endoftext|>, ...): ordinary
    # text in data and prompts unless control_tokens_in_text. Other added tokens (chat markup
    # such as <|im_start|>) keep their meaning.
    names = {
      hf_tokenizer.id_to_token(i) for i in (self.bos_id, self.eos_id, self.pad_id, self.mask_id)
    }
    names |= set(_KIND_SPECIALS.get(kind, ()))
    self._controls = tuple(sorted((n for n in names if n), key=len, reverse=True))
    self._controls_re = re.compile("(" + "|".join(re.escape(n) for n in self._controls) + ")")
    self._as_text = None  # a copy of `hf` that encodes special tokens as text (built lazily)

  def _text_encoder(self) -> hf.Tokenizer:
    if self._as_text is None:
      self._as_text = hf.Tokenizer.from_str(self.hf.to_str())
      self._as_text.encode_special_tokens = True
    return self._as_text

  def _has_controls(self, text: str) -> bool:
    return not self.control_tokens_in_text and any(n in text for n in self._controls)

  def _encode_literal(self, text: str) -> list[int]:
    """Text holding control-token strings: those pieces are encoded as ordinary text."""
    out = []
    for i, piece in enumerate(self._controls_re.split(text)):
      if piece:
        enc = self._text_encoder() if i % 2 else self.hf
        out += enc.encode(piece, add_special_tokens=False).ids
    return out

  @property
  def vocab_size(self) -> int:
    """Number of ids, added tokens included (the model's embedding rows)."""
    return self.hf.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, no special tokens added; a literal control-token string in it
    ("[MASK]", "<|endoftext|>", ...) is ordinary text unless control_tokens_in_text."""
    if self._has_controls(text):
      return self._encode_literal(text)
    return self.hf.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """`encode` for many texts at once (parallel in Rust; use this for corpora)."""
    texts = list(texts)
    encs = self.hf.encode_batch_fast(texts, add_special_tokens=False)
    return [
      self._encode_literal(t) if self._has_controls(t) else e.ids for t, e in zip(texts, encs)
    ]

  def decode(self, ids, skip_special: bool = True) -> str:
    """Text of `ids` (list or 1-D array); drops BOS/EOS/PAD/MASK if skip_special.

    Byte-level tokens that do not form whole UTF-8 characters (a sequence cut mid-character, or
    continuation bytes a model placed out of order) are dropped: the text never holds U+FFFD.
    """
    ids = np.asarray(ids).reshape(-1).tolist()
    return _drop_partial_bytes(self.hf.decode(ids, skip_special_tokens=skip_special))

  def decode_batch(self, ids, skip_special: bool = True) -> list[str]:
    """Texts of a batch of id rows, `ids`: [batch, length] (as `decode`)."""
    rows = [np.asarray(r).reshape(-1).tolist() for r in ids]
    return [
      _drop_partial_bytes(t) for t in self.hf.decode_batch(rows, skip_special_tokens=skip_special)
    ]

  def token_id(self, text: str) -> int | None:
    """The id of the token whose text is exactly `text` (e.g. '<|im_end|>'), None if none is."""
    return self.hf.token_to_id(text)

  def id_to_token(self, i: int) -> str | None:
    return self.hf.id_to_token(int(i))

  def special_ids(self) -> dict[str, int]:
    return dict(bos_id=self.bos_id, eos_id=self.eos_id, pad_id=self.pad_id, mask_id=self.mask_id)

  def save(self, directory) -> pathlib.Path:
    """Writes `tokenizer.json` and `special_tokens.json` into `directory`."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    meta = dict(
      kind=self.kind,
      vocab_size=self.vocab_size,
      **self.special_ids(),
      control_tokens_in_text=self.control_tokens_in_text,
    )
    # Write-then-rename, so a concurrent reader never sees half a file.
    _atomic_write(directory / _TOKENIZER_FILE, self.hf.to_str(pretty=True))
    _atomic_write(directory / _SPECIALS_FILE, json.dumps(meta, indent=2))
    return directory

  @classmethod
  def load(cls, directory) -> "Tokenizer":
    """Loads a tokenizer written by `save`; a damaged or edited file is one ValueError."""
    directory = pathlib.Path(directory)
    for name in (_TOKENIZER_FILE, _SPECIALS_FILE):
      if not (directory / name).is_file():
        raise FileNotFoundError(f"tokenizer file not found: {directory / name}")

    def damaged(name: str, why) -> ValueError:
      return ValueError(f"{directory / name} is damaged ({why}); copy the tokenizer/ folder again")

    try:
      meta = json.loads((directory / _SPECIALS_FILE).read_text(encoding="utf-8"))
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
      raise damaged(_SPECIALS_FILE, e) from e
    ids = ("bos_id", "eos_id", "pad_id", "mask_id")
    missing = [k for k in ("kind", *ids) if not isinstance(meta, dict) or k not in meta]
    if missing:
      raise damaged(_SPECIALS_FILE, f"no {', '.join(missing)}")
    try:
      tok = hf.Tokenizer.from_file(str(directory / _TOKENIZER_FILE))
    except Exception as e:  # the Rust loader raises a plain Exception
      raise damaged(_TOKENIZER_FILE, e) from e
    size = tok.get_vocab_size(with_added_tokens=True)
    for k in ids:  # an edited file: named here, not at the first embedding lookup
      if not isinstance(meta[k], int) or not 0 <= meta[k] < size:
        raise damaged(_SPECIALS_FILE, f"{k}={meta[k]!r} is no id of its {size}-token vocabulary")
    if meta["mask_id"] in (meta["bos_id"], meta["eos_id"], meta["pad_id"]):
      raise damaged(_SPECIALS_FILE, f"mask_id={meta['mask_id']} is also BOS, EOS or PAD")
    control_text = meta.get("control_tokens_in_text", False)
    return cls(
      tok, kind=meta["kind"], control_tokens_in_text=control_text, **{k: meta[k] for k in ids}
    )

  def __repr__(self):
    return (
      f"Tokenizer(kind={self.kind!r}, vocab_size={self.vocab_size}, "
      f"bos={self.bos_id}, eos={self.eos_id}, pad={self.pad_id}, "
      f"mask={self.mask_id})"
    )


def _drop_partial_bytes(text: str) -> str:
  # The byte-level decoders replace invalid UTF-8 with U+FFFD (from_utf8_lossy).
  return text.replace("\ufffd", "")


def _atomic_write(path: pathlib.Path, text: str):
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".tmp")
  with os.fdopen(fd, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, path)


def _require_file(path, field: str, what: str = "the file") -> str:
  if path is None or str(path) == "":
    raise ValueError(f"tokenizer config field {field} is not set")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"tokenizer file not found: {path!r} (set --config.{field} to {what})")
  return str(path)


def _read(build, what: str, fix: str):
  """`build()` (reads files); the tokenizers library's bare `Exception` as one ValueError."""
  try:
    return build()
  except Exception as e:  # pylint: disable=broad-except  (tokenizers raises plain Exception)
    raise ValueError(f"{what} ({(str(e).splitlines() or [type(e).__name__])[0]}); {fix}") from e


def _lowercase(cfg, default: bool) -> bool:
  value = cfg.get("lowercase", None)
  return default if value is None else bool(value)


def _special_id(tok: hf.Tokenizer, token: str) -> int:
  i = tok.token_to_id(token)
  if i is None:
    raise ValueError(f"special token {token!r} is not in the vocabulary")
  return i


def wordpiece_tokenizer(vocab_path: str, lowercase: bool = True) -> Tokenizer:
  """BERT WordPiece from `vocab_path` (e.g. bert-base-uncased-vocab.txt)."""
  vocab_path = _require_file(vocab_path, "tokenizer.vocab_path")
  tok = _read(
    lambda: hf.Tokenizer(models.WordPiece.from_file(vocab_path, unk_token="[UNK]")),
    f"tokenizer.vocab_path={vocab_path} is not a WordPiece vocab.txt",
    "set --config.tokenizer.vocab_path to one (one token per line, e.g. bert-base-uncased's)",
  )
  tok.normalizer = normalizers.BertNormalizer(
    clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
  )
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.decoder = decoders.WordPiece(prefix="##")
  specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  if missing := [t for t in specials if tok.token_to_id(t) is None]:  # no [UNK]: encode fails
    raise ValueError(
      f"tokenizer.vocab_path={vocab_path} lacks the BERT special tokens {missing}: a WordPiece "
      f"vocab.txt needs all of {specials} (bert-base-uncased's has them); add them to the file"
    )
  tok.add_special_tokens(specials)  # in the vocab: same ids, matched whole, skipped by decode
  # SPEC §5 caveat: the reference "wrapped" LM1B data (MDLM/BD3LM pipeline)
  # starts each row with encode(bos)[0] = [CLS] = 101, so BOS = 101 here to match
  # that data and the keep_clean_bos position 0; EOS = [SEP] = 102 (the reference
  # tokenizer's eos). The reference's own stream uses 101 for "EOS" too (a quirk of
  # the same trick) and starts unconditional generation from [SEP]; we keep
  # BOS != EOS so document ends and row starts stay distinguishable.
  return Tokenizer(
    tok,
    kind="wordpiece",
    bos_id=_special_id(tok, "[CLS]"),
    eos_id=_special_id(tok, "[SEP]"),
    pad_id=_special_id(tok, "[PAD]"),
    mask_id=_special_id(tok, "[MASK]"),
  )


def gpt2_tokenizer(vocab_path: str, merges_path: str) -> Tokenizer:
  """GPT-2 byte-level BPE plus the added mask `<|fim_middle|>` (id 50257)."""
  vocab_path = _require_file(vocab_path, "tokenizer.vocab_path")
  merges_path = _require_file(merges_path, "tokenizer.merges_path")
  tok = _read(
    lambda: hf.Tokenizer(models.BPE.from_file(vocab_path, merges_path)),
    f"tokenizer.vocab_path={vocab_path} and tokenizer.merges_path={merges_path} are not a GPT-2 "
    "vocab.json / merges.txt pair",
    f"set them to the two files of one byte-level BPE (the packaged GPT-2's: {PACKAGED_VOCAB_DIR}"
    "/gpt2/vocab.json and merges.txt)",
  )
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([GPT2_EOS, GPT2_MASK])
  eos = _special_id(tok, GPT2_EOS)
  # SPEC §5: BOS = EOS = PAD = <|endoftext|> (50256), MASK = 50257 (added).
  return Tokenizer(
    tok, kind="gpt2", bos_id=eos, eos_id=eos, pad_id=eos, mask_id=_special_id(tok, GPT2_MASK)
  )


def qwen3_tokenizer(path: str) -> Tokenizer:
  """A Qwen3 `tokenizer.json` (file or directory) with the reference's special ids (SPEC §5)."""
  path = os.fspath(path)
  file = os.path.join(path, _TOKENIZER_FILE) if os.path.isdir(path) else path
  file = _require_file(
    file, "tokenizer.vocab_path", "a Qwen3 tokenizer.json or the directory holding it"
  )
  fix = "set --config.tokenizer.vocab_path to a Qwen3 tokenizer.json or the directory holding it"
  tok = _read(lambda: hf.Tokenizer.from_file(file), f"{file} is not a HF tokenizer.json", fix)
  ids = {}
  for name in (QWEN3_EOS, QWEN3_MASK):
    i = tok.token_to_id(name)
    if i is None:
      raise ValueError(
        f"{file}: the vocabulary has no {name!r} token; a Qwen3 SetDLM needs "
        f"BOS=EOS=PAD={QWEN3_EOS!r} and MASK={QWEN3_MASK!r} (SPEC §5)"
      )
    ids[name] = i
  eos = ids[QWEN3_EOS]
  return Tokenizer(tok, kind="qwen3", bos_id=eos, eos_id=eos, pad_id=eos, mask_id=ids[QWEN3_MASK])


def train_tokenizer(texts: Iterable[str], vocab_size: int, lowercase: bool = False) -> Tokenizer:
  """Trains a byte-level BPE on `texts` (`bpe.train_bpe`: decode(encode(x)) == x for any text,
  deterministic for the same texts). Specials get ids 0..4: [PAD]=0 [UNK]=1 [BOS]=2 [EOS]=3
  [MASK]=4."""
  tok = bpe.train_bpe(texts, vocab_size, lowercase, TRAINED_SPECIALS)
  ids = {t: _special_id(tok, t) for t in TRAINED_SPECIALS}
  return Tokenizer(
    tok,
    kind="trained",
    bos_id=ids["[BOS]"],
    eos_id=ids["[EOS]"],
    pad_id=ids["[PAD]"],
    mask_id=ids["[MASK]"],
  )


def validate_tokenizer_config(cfg):
  """Raises ValueError with a readable message for a bad tokenizer config."""
  if cfg.kind not in KINDS:
    raise ValueError(f"tokenizer.kind={cfg.kind!r}; expected one of {KINDS}")
  if cfg.kind in ("wordpiece", "gpt2", "qwen3") and not cfg.get("vocab_path"):
    raise ValueError(f"tokenizer.kind={cfg.kind} needs tokenizer.vocab_path")
  if cfg.kind == "gpt2" and not cfg.get("merges_path"):
    raise ValueError("tokenizer.kind=gpt2 needs tokenizer.merges_path")
  if cfg.kind == "trained" and not cfg.get("vocab_size"):
    raise ValueError("tokenizer.kind=trained needs tokenizer.vocab_size")


def build_tokenizer(cfg, train_texts=None) -> Tokenizer:
  """Builds the tokenizer `cfg` describes (trains it for kind='trained').

  `train_texts`: iterable of str, or a zero-argument callable returning one
  (called only when training is needed). Pass the *whole* training split, not a
  per-process shard, so every host trains the same tokenizer.
  """
  validate_tokenizer_config(cfg)
  tok = _build(cfg, train_texts)
  if cfg.get("control_tokens_in_text", False):
    tok = Tokenizer(tok.hf, kind=tok.kind, **tok.special_ids(), control_tokens_in_text=True)
  return tok


def _build(cfg, train_texts) -> Tokenizer:
  if cfg.kind == "wordpiece":
    return wordpiece_tokenizer(cfg.vocab_path, _lowercase(cfg, True))
  if cfg.kind == "gpt2":
    return gpt2_tokenizer(cfg.vocab_path, cfg.merges_path)
  if cfg.kind == "qwen3":
    return qwen3_tokenizer(cfg.vocab_path)
  if train_texts is None:
    raise ValueError(
      "tokenizer.kind=trained needs train_texts on its first run "
      "(no saved tokenizer was found in the workdir)"
    )
  if callable(train_texts):
    train_texts = train_texts()
  return train_tokenizer(train_texts, int(cfg.vocab_size), _lowercase(cfg, False))


def saved_in(workdir) -> bool:
  """Whether `<workdir>/tokenizer/` holds a saved tokenizer."""
  return workdir is not None and paths.isfile(paths.join(workdir, TOKENIZER_SUBDIR, _SPECIALS_FILE))


def fingerprint(workdir) -> str:
  """SHA-256 of the files of `<workdir>/tokenizer/` (names and bytes), '' when none is saved:
  what the processes of a run compare to know they read the same tokenizer."""
  if not saved_in(workdir):
    return ""
  import hashlib  # pylint: disable=g-import-not-at-top

  tok_dir = paths.join(workdir, TOKENIZER_SUBDIR)
  digest = hashlib.sha256()
  for name in paths.listdir(tok_dir):
    digest.update(name.encode("utf-8") + b"\0" + paths.read_bytes(paths.join(tok_dir, name)))
  return digest.hexdigest()


def save_in(tok: Tokenizer, workdir):
  """Writes `tok` to `<workdir>/tokenizer/` (staged: the folder appears complete or not at all)."""
  with paths.staged_dir(paths.join(workdir, TOKENIZER_SUBDIR)) as local:
    tok.save(local)


def get_tokenizer(
  cfg,
  workdir=None,
  train_texts: Iterable[str] | Callable[[], Iterable[str]] | None = None,
  save: bool = True,
) -> Tokenizer:
  """The run's tokenizer: loaded from `<workdir>/tokenizer/` if saved there,
  otherwise built from `cfg` and saved there (when `workdir` is given and `save`; the trainer
  saves it itself once its data is validated).

  Raises ValueError if the saved tokenizer is of another kind than cfg.kind
  (a workdir reused with a different config).
  """
  if workdir is not None:  # through `setdiff_jax.paths`: the workdir may be on gs://
    tok_dir = paths.join(workdir, TOKENIZER_SUBDIR)
    if paths.isfile(paths.join(tok_dir, _SPECIALS_FILE)):
      with paths.local_copy(tok_dir) as local:
        tok = Tokenizer.load(local)
      if tok.kind != cfg.kind:
        raise ValueError(
          f"workdir tokenizer {tok_dir} is kind={tok.kind!r} but the config "
          f"says tokenizer.kind={cfg.kind!r}; use a fresh workdir"
        )
      return tok
    if train_texts is None and cfg.kind == "trained":
      raise ValueError(
        f"no saved tokenizer in {tok_dir} (tokenizer/{_SPECIALS_FILE} is missing): the run's "
        f"tokenizer was deleted or not copied; copy the run's tokenizer/ folder to {tok_dir}"
      )
  tok = build_tokenizer(cfg, train_texts)
  if workdir is not None and save:
    save_in(tok, workdir)
  return tok
