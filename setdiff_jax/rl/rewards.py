"""Rewards chosen by name: what an RL completion earns, from its decoded text and its step count.

  fn = rewards.get("exact_match+format")            # ValueError listing the valid names
  r = rewards.compute("exact_match", texts, references, steps, step_cost=0.01)  # fp32 [N]

Registry (`REWARDS`: name -> fn(completion text, reference answer text) -> float):
  exact_match  1 if the completion's final answer (the last '#### n' line) equals the reference's
               after number normalisation (`evaluation.accuracy.exact_match`, extractor 'hash',
               the accuracy eval's rule), else 0.
  format       1 if the completion has exactly one '#### ' answer line and it holds a number,
               else 0 (whatever the number).
A name may join several with '+' (their sum), e.g. 'exact_match+format'. The optional per-step
cost lambda (`rl.step_cost`) subtracts lambda * (decoding steps of the row) from any reward, so a
policy that finishes in fewer forward calls earns more.

A registered reward must return a finite number for every completion: `compute` refuses anything
else (None, a string, NaN, inf) in one ValueError naming the reward, the row and the value, before
group advantages or the optimiser can turn it into NaN parameters.
"""

from __future__ import annotations

import math
import re
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np

from setdiff_jax.evaluation import accuracy

FIELD = "rl.reward"
_NUMBER = re.compile(r"^[-+]?[0-9]+(\.[0-9]+)?$")  # ASCII digits, as accuracy's numbers


def exact_match(completion: str, reference: str) -> float:
  return float(accuracy.exact_match(completion, reference, "hash"))


def format_ok(completion: str, reference: str) -> float:
  del reference
  if completion.count("####") != 1:
    return 0.0
  answer = accuracy.normalize_answer(accuracy.extract_hash(completion))
  return float(answer is not None and _NUMBER.match(answer) is not None)


REWARDS: Dict[str, Callable[[str, str], float]] = {"exact_match": exact_match, "format": format_ok}


def _parts(name: str) -> List[Tuple[str, Callable[[str, str], float]]]:
  """[(part name, fn)] of reward `name`; ValueError naming the field and the valid ones."""
  parts = [p.strip() for p in str(name).split("+")]
  bad = [p for p in parts if p not in REWARDS]
  if bad or not parts:
    raise ValueError(
      f"{FIELD}={name!r}: {', '.join(repr(b) for b in bad)} is not a reward; valid: "
      f"{', '.join(REWARDS)} (or a sum of them, e.g. 'exact_match+format')"
    )
  return [(p, REWARDS[p]) for p in parts]


def _checked(name: str, part: str, value, row, completion: str) -> float:
  """`value` (what REWARDS[part] returned) as a float; ValueError unless a finite number (None or
  NaN would otherwise surface as a bare TypeError or as non-finite metrics blamed on the lr)."""
  try:  # a str converts too ('1'), but a reward returning text is a bug
    ok = not isinstance(value, (str, bytes)) and math.isfinite(float(value))
  except (TypeError, ValueError):
    ok = False
  if not ok:
    where = "" if row is None else f" for completion row {row}"
    raise ValueError(
      f"{FIELD}={name!r}: the reward {part!r} returned {value!r}{where} "
      f"(completion {completion[:60]!r}); a reward must return a finite number: fix "
      f"rewards.REWARDS[{part!r}]"
    )
  return float(value)


def get(name: str) -> Callable[[str, str], float]:
  """The reward `name` ('a' or 'a+b': the sum); ValueError naming the field and the valid ones.
  The returned fn raises ValueError (naming the reward) for a part's non-finite or non-number
  value."""
  fns = _parts(name)
  return lambda completion, reference: float(
    sum(_checked(name, p, f(completion, reference), None, completion) for p, f in fns)
  )


def compute(
  name: str,
  completions: Sequence[str],
  references: Sequence[str],
  steps: Sequence[int],
  step_cost: float = 0.0,
) -> np.ndarray:
  """fp32 [N]: reward `name` of each completion minus step_cost * its decoding steps ([N]).

  ValueError for mismatched lengths, `steps` not of shape [N], or a reward that returns anything
  but a finite number (naming the reward, the row and the value)."""
  shape = np.shape(steps)
  if len(shape) != 1:
    raise ValueError(
      f"steps has shape {list(shape)}: one decoding step count per completion, shape [N] "
      f"(N = {len(completions)} completions)"
    )
  if len(completions) != len(references) or len(completions) != shape[0]:
    raise ValueError(
      f"{len(completions)} completions, {len(references)} references and "
      f"{shape[0]} step counts: one of each per row"
    )
  fns = _parts(name)
  base = np.array(
    [
      sum(_checked(name, p, f(c, r), i, c) for p, f in fns)
      for i, (c, r) in enumerate(zip(completions, references))
    ],
    np.float64,
  ).reshape(-1)  # [N] also when N = 0
  return (base - float(step_cost) * np.asarray(steps, np.float64)).astype(np.float32)


__all__ = ["REWARDS", "get", "compute", "exact_match", "format_ok"]
