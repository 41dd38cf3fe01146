"""File helpers shared by the text and pair sources: path lists and (compressed) text files."""
from __future__ import annotations

import bz2
import gzip
import lzma
import os


def parse_paths(paths) -> list[str]:
  """A list/tuple of paths, or one comma-separated string, as a list."""
  if paths is None:
    return []
  if isinstance(paths, str):
    paths = paths.split(",")
  return [str(p).strip() for p in paths if str(p).strip()]


def open_text(path: str, field: str):
  if not os.path.isfile(path):
    raise FileNotFoundError(f"data file not found: {path!r} (set the config "
                            f"field data.{field})")
  opener = {".gz": gzip.open, ".xz": lzma.open, ".bz2": bz2.open}.get(
      os.path.splitext(path)[1], open)
  return opener(path, "rt", encoding="utf-8")


__all__ = ["parse_paths", "open_text"]
