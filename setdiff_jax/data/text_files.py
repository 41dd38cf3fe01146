"""File helpers shared by the text and pair sources: path lists and (compressed) text files."""

from __future__ import annotations

import bz2
import codecs
import gzip
import lzma
import os
import zlib


def not_utf8(path: str, e: UnicodeDecodeError) -> str:
  """The one-line message for a data file that is not UTF-8: the line and byte of the file (`e`
  counts from the start of the chunk a text reader decoded, so the file is scanned again)."""
  where = first_bad_utf8(path)
  at = f"line {where[1]}, byte {where[0]}" if where else f"byte {e.start} of a read"
  return f"{path}: not UTF-8 text ({at}: {e.reason}); convert it, e.g. iconv -f latin1 -t utf-8"


def first_bad_utf8(path: str, chunk_bytes: int = 1 << 20):
  """(byte offset, line number) of the first byte of `path` (decompressed) that is not UTF-8,
  None if there is none or the file cannot be read; memory bounded by `chunk_bytes`."""
  decoder = codecs.getincrementaldecoder("utf-8")()
  offset, line = 0, 1  # bytes and line breaks of the chunks decoded so far
  try:
    with _opener(path)(path, "rb") as f:
      while chunk := f.read(chunk_bytes):
        pending = len(decoder.getstate()[0])  # an unfinished character from the last chunk
        try:
          decoder.decode(chunk)
        except UnicodeDecodeError as e:
          at = max(0, e.start - pending)  # an error in the pending bytes: no line break there
          return offset + e.start - pending, line + chunk[:at].count(b"\n")
        offset, line = offset + len(chunk), line + chunk.count(b"\n")
      decoder.decode(b"", final=True)
  except UnicodeDecodeError:  # the file ends inside a character
    return offset - len(decoder.getstate()[0]), line
  except (OSError, *_DAMAGE):
    return None
  return None


DECOMPRESSED = {".gz": gzip.open, ".xz": lzma.open, ".bz2": bz2.open}  # by extension, any case


def _opener(path: str):
  """The open function of a data file by its extension (.gz / .xz / .bz2, any case)."""
  return DECOMPRESSED.get(os.path.splitext(path)[1].lower(), open)


def content_name(path: str) -> str:
  """`path` without the compression extension it is read through (`a.jsonl.gz` -> `a.jsonl`)."""
  stem, ext = os.path.splitext(path)
  return stem if ext.lower() in DECOMPRESSED else path


def parse_paths(paths) -> list[str]:
  """A list/tuple of paths, or one comma-separated string, as a list."""
  if paths is None:
    return []
  if isinstance(paths, str):
    paths = paths.split(",")
  return [str(p).strip() for p in paths if str(p).strip()]


# What a truncated or damaged compressed file raises while it is read.
_DAMAGE = (EOFError, lzma.LZMAError, gzip.BadGzipFile, zlib.error)


class _TextFile:
  """A text file whose context turns damage of a compressed file, raised while it is read, into
  one ValueError naming the file (UnicodeDecodeError passes: the callers name the byte)."""

  def __init__(self, path: str, f):
    self.path, self._f = path, f

  def __enter__(self):
    self._f.__enter__()
    return self._f

  def __exit__(self, exc_type, exc, tb):
    try:
      self._f.close()
    except Exception:  # noqa: BLE001 - closing a damaged stream: the error below says more
      if exc is None:
        raise
    damaged = isinstance(exc, _DAMAGE) or (  # bz2 reports damage as an OSError
      isinstance(exc, OSError) and "Invalid data stream" in str(exc)
    )
    if damaged:
      raise ValueError(
        f"data file {self.path} is truncated or damaged ({exc}); decompress it "
        "to check, or copy it again"
      ) from exc
    return False


def open_text(path: str, field: str):
  """Opens a data file (.gz / .xz / .bz2, any case, decompressed) as UTF-8 text, in a context that names
  the file if it is truncated or damaged. A missing file or a directory is a ValueError naming
  the config field."""
  if os.path.isdir(path):
    raise ValueError(
      f"data file {path!r} is a directory; data.{field} takes files "
      f"(comma-separated): list the files in it"
    )
  if not os.path.isfile(path):
    raise FileNotFoundError(f"data file not found: {path!r} (set the config field data.{field})")
  # utf-8-sig: a leading byte-order mark (Windows editors write one) is not text of the first
  # document (nor a JSON error on line 1); otherwise the same as utf-8
  return _TextFile(path, _opener(path)(path, "rt", encoding="utf-8-sig"))


def read_text(path: str, field: str, flag: str | None = None) -> str:
  """The whole text of a data file (as `open_text` reads it), refusing what cannot be text data,
  the one check of every data file (training's data fields, evaluate's file flags): not UTF-8,
  NUL bytes (a binary file), nothing but whitespace (a file given by name yet holding no document
  is a wrong name or a failed download or export, never worth a silent skip). Errors name the
  file and `flag` (e.g. '--eval_paths') if given, else the config field data.`field`.
  """
  where = f"{flag}={path}" if flag else f"data file {path} (data.{field})"
  with open_text(path, field) as f:
    try:
      text = f.read()
    except UnicodeDecodeError as e:
      raise ValueError((f"{flag}=" if flag else "") + not_utf8(path, e)) from e
  if "\x00" in text:
    raise ValueError(f"{where} is binary (it holds NUL bytes), not text; pass a text file")
  if not text.strip():
    fix = "pass a file with data" if flag else f"drop it from data.{field} (or put text in it)"
    raise ValueError(f"{where} is empty (nothing but whitespace); {fix}")
  # A byte-order mark past byte 0 (files joined with `cat`) is no text either; utf-8-sig drops
  # only the first. Tested first: no copy of a file without one.
  return text.replace("\ufeff", "") if "\ufeff" in text else text


__all__ = [
  "parse_paths",
  "open_text",
  "read_text",
  "not_utf8",
  "first_bad_utf8",
  "content_name",
  "DECOMPRESSED",
]
