"""Text templates for decoding: prompts as token ids and the `[GAP:n]` infill syntax.

(The sampler matching a run's method, eval-time samples and the logic behind `launch/sample.py`
are in `setdiff_jax.decoding`.)

Tokenizer protocol (as `setdiff_jax.data.tokenizers.Tokenizer`): `encode(text) -> list[int]` (no
special tokens), `decode(ids) -> str` (drops specials), `bos_id`, `eos_id`, `pad_id`, `mask_id`,
`vocab_size`.

Infill syntax: the gap is written `[GAP:n]`, n >= 1 tokens to generate; several gaps are allowed.
The canvas is BOS + enc(text before) + M * n + enc(text after) (+ EOS), each text segment encoded on
its own so the gap sits on token boundaries; the printed result re-inserts the decoded middle into
the original text, which is thus unchanged around the gap.
"""

from __future__ import annotations

import dataclasses
import re
from typing import List, Optional, Sequence

_GAP = re.compile(r"\[GAP:(\d+)\]")
_GAP_LIKE = re.compile(r"\[\s*gap\b[^\]]*\]?", re.IGNORECASE)


@dataclasses.dataclass
class InfillTemplate:
  """A parsed infill text: segments[i] precedes gap i (len(segments) == len(gaps) + 1)."""

  segments: List[str]
  gaps: List[int]

  def canvas(self, tokenizer, mask_id: int, *, add_bos: bool = True, add_eos: bool = True):
    """Token canvas and, per gap, its token positions."""
    ids: List[int] = []
    if add_bos and getattr(tokenizer, "bos_id", None) is not None:
      ids.append(int(tokenizer.bos_id))
    spans = []
    for seg, n in zip(self.segments, self.gaps):
      ids += list(tokenizer.encode(seg)) if seg else []
      spans.append((len(ids), len(ids) + n))
      ids += [mask_id] * n
    if self.segments[-1]:
      ids += list(tokenizer.encode(self.segments[-1]))
    if add_eos and getattr(tokenizer, "eos_id", None) is not None:
      ids.append(int(tokenizer.eos_id))
    return ids, spans

  def fill(self, middles: Sequence[str]) -> str:
    out = [self.segments[0]]
    for mid, seg in zip(middles, self.segments[1:]):
      out += [mid, seg]
    return "".join(out)


def parse_infill(text: str) -> InfillTemplate:
  """Splits `text` at its `[GAP:n]` markers. ValueError on no gap, an empty gap or bad syntax."""
  segments, gaps, last = [], [], 0
  for mt in _GAP.finditer(text):
    segments.append(text[last : mt.start()])
    gaps.append(int(mt.group(1)))
    last = mt.end()
  segments.append(text[last:])
  for seg in segments:
    bad = _GAP_LIKE.search(seg)
    if bad:
      raise ValueError(
        f"unknown infill mask syntax {bad.group(0)!r}; write each gap as "
        "[GAP:n] with n >= 1 the number of tokens to generate"
      )
  if not gaps:
    raise ValueError("the infill text has no gap; mark the span to generate as [GAP:n]")
  for n in gaps:
    if n < 1:
      raise ValueError(f"empty gap [GAP:{n}]: a gap needs at least one token to generate")
  return InfillTemplate(segments=segments, gaps=gaps)


def prompt_ids(tokenizer, prompt: Optional[str]) -> List[int]:
  """[BOS] + encode(prompt) (BOS only when there is no prompt)."""
  ids = [int(tokenizer.bos_id)] if getattr(tokenizer, "bos_id", None) is not None else []
  if prompt:
    ids += list(tokenizer.encode(prompt))
  if not ids:
    raise ValueError("empty prompt and the tokenizer has no BOS token")
  return ids


__all__ = ["InfillTemplate", "parse_infill", "prompt_ids"]
