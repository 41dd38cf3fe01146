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
"""

from __future__ import annotations

import re
from typing import Callable, Dict, Sequence

import numpy as np

from setdiff_jax.evaluation import accuracy

FIELD = "rl.reward"
_NUMBER = re.compile(r"^[-+]?\d+(\.\d+)?$")


def exact_match(completion: str, reference: str) -> float:
  return float(accuracy.exact_match(completion, reference, "hash"))


def format_ok(completion: str, reference: str) -> float:
  del reference
  if completion.count("####") != 1:
    return 0.0
  answer = accuracy.normalize_answer(accuracy.extract_hash(completion))
  return float(answer is not None and _NUMBER.match(answer) is not None)


REWARDS: Dict[str, Callable[[str, str], float]] = {"exact_match": exact_match, "format": format_ok}


def get(name: str) -> Callable[[str, str], float]:
  """The reward `name` ('a' or 'a+b': the sum); ValueError naming the field and the valid ones."""
  parts = [p.strip() for p in str(name).split("+")]
  bad = [p for p in parts if p not in REWARDS]
  if bad or not parts:
    raise ValueError(
      f"{FIELD}={name!r}: {', '.join(repr(b) for b in bad)} is not a reward; valid: "
      f"{', '.join(REWARDS)} (or a sum of them, e.g. 'exact_match+format')"
    )
  fns = [REWARDS[p] for p in parts]
  return lambda completion, reference: float(sum(f(completion, reference) for f in fns))


def compute(
  name: str,
  completions: Sequence[str],
  references: Sequence[str],
  steps: Sequence[int],
  step_cost: float = 0.0,
) -> np.ndarray:
  """fp32 [N]: reward `name` of each completion minus step_cost * its decoding steps."""
  if len(completions) != len(references) or len(completions) != len(steps):
    raise ValueError(
      f"{len(completions)} completions, {len(references)} references and "
      f"{len(steps)} step counts: one of each per row"
    )
  fn = get(name)
  base = np.array([fn(c, r) for c, r in zip(completions, references)], np.float64)
  return (base - float(step_cost) * np.asarray(steps, np.float64)).astype(np.float32)


__all__ = ["REWARDS", "get", "compute", "exact_match", "format_ok"]
