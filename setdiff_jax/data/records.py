"""Record types shared by the data sources (no imports of other data modules, so any of them can
use these without an import cycle)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Pair:
  """One prompt/answer example. `where` names it in errors ('file.jsonl:12', 'gsm8k test #3')."""

  prompt: str
  answer: str
  where: str = ""


__all__ = ["Pair"]
