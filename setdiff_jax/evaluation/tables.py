"""Markdown tables of evaluation results (`launch/evaluate.py` prints them; benchmarks reuse
`markdown_table`)."""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Sequence


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  def fmt(v):
    if v is None:
      return "-"
    if isinstance(v, float):
      return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.3g}" if abs(v) < 0.01 and v else f"{v:.2f}"
    return str(v)

  lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
  lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
  return "\n".join(lines)


class _Column(NamedTuple):
  """One table column: its header and the record field it shows (optional: a missing field
  shows as "-"; required: a missing field is a KeyError, a malformed record)."""

  header: str
  field: str
  optional: bool = False


def _opt(header: str, field: str) -> _Column:
  return _Column(header, field, optional=True)


# One (results key, title, columns) per list-of-records section, in the order they print.
_SECTIONS = (
  (
    "infill",
    "Infill (ROUGE F x 100, greedy, oracle length)",
    (
      _Column("method", "method"),
      _Column("dataset", "dataset"),
      _opt("W", "window"),
      _opt("tau", "threshold"),
      _Column("n", "num_examples"),
      _Column("skipped", "skipped"),
      _opt("R-1", "rouge1"),
      _opt("R-2", "rouge2"),
      _opt("R-L", "rougeL"),
      _opt("tok/s", "tokens_per_second"),
      _opt("tok/step", "tokens_per_step"),
      _opt("programs", "compiled_programs"),
      _opt("tok/s w/ compile", "tokens_per_second_with_compile"),
    ),
  ),
  (
    "speed",
    "Decoding speed (unconditional, N = {n}, no EOS stop)",
    (
      _Column("method", "method"),
      _Column("setting", "setting"),
      _Column("batch", "batch_size"),
      _Column("tok/s", "tokens_per_second"),
      _Column("tok/step", "tokens_per_step"),
      _Column("forward calls", "forward_calls"),
      _Column("compile s", "compile_seconds"),
      _opt("programs", "compiled_programs"),
      _opt("tok/s w/ compile", "tokens_per_second_with_compile"),
    ),
  ),
  (
    "accuracy",
    "Accuracy (exact match of the final answer, greedy, EOS stop per row)",
    (
      _Column("method", "method"),
      _Column("setting", "setting"),
      _Column("n", "num_examples"),
      _Column("accuracy", "accuracy"),
      _Column("gen tokens", "mean_generated_tokens"),
      _Column("tok/step", "tokens_per_step"),
      _opt("kept tok/step", "kept_tokens_per_step"),
      _Column("fwd calls", "forward_calls"),
      _opt("kept/call", "kept_tokens_per_call"),
      _opt("copies", "copy_fraction"),
      _Column("tok/s b=1", "tokens_per_second_batch1"),
      _Column("tok/s batch", "tokens_per_second"),
      _Column("batch", "batch_size"),
      _opt("programs", "compiled_programs"),
      _opt("tok/s w/ compile", "tokens_per_second_with_compile"),
    ),
  ),
  (
    "samples",
    "Unconditional samples",
    (
      _Column("method", "method"),
      _Column("setting", "setting"),
      _Column("n", "num_samples"),
      _Column("entropy", "unigram_entropy"),
      _Column("dist-1", "distinct_1"),
      _Column("dist-2", "distinct_2"),
      _Column("dist-3", "distinct_3"),
      _opt("gen PPL", "gen_ppl"),
      _Column("tok/s", "tokens_per_second"),
    ),
  ),
)


def _records_table(title: str, records: Sequence[Dict[str, Any]], columns) -> str:
  """A titled table with one row per record."""
  rows = [[r.get(c.field) if c.optional else r[c.field] for c in columns] for r in records]
  return f"{title}\n\n" + markdown_table([c.header for c in columns], rows)


def _likelihood_table(lik: Dict[str, Any]) -> str:
  """The one-row likelihood table and the estimators it used."""
  header = ["method", "sequences", "tokens", "NLL", "PPL", "BPD", "K", "K NLL", "K PPL"]
  row = [
    lik["method"],
    lik["num_sequences"],
    int(lik["num_tokens"]),
    lik["nll"],
    lik["ppl"],
    lik["bpd"],
    lik["num_draws"],
    lik["K_nll"],
    lik["K_ppl"],
  ]
  return (
    "Likelihood (eval split; per token)\n\n"
    + markdown_table(header, [row])
    + f"\n\none draw: {lik['estimator']}; K: {lik['estimator_K']}"
  )


def _sample_texts(samples: Sequence[Dict[str, Any]]) -> List[str]:
  """The first two example texts of each sampling setting."""
  return [
    f"sample {i} ({r['method']} {r['setting']}): {text}"
    for r in samples
    for i, text in enumerate(r.get("examples", [])[:2])
  ]


def format_results(results: Dict[str, Any]) -> str:
  """Markdown tables of whatever evals `results` holds."""
  parts = []
  if results.get("likelihood"):
    parts.append(_likelihood_table(results["likelihood"]))
  for key, title, columns in _SECTIONS:
    if results.get(key):
      if key == "speed":  # the N the rows generated (--max_new_tokens), not always L - 1
        found = sorted({r["new_tokens"] for r in results[key] if "new_tokens" in r})
        title = title.format(n=", ".join(map(str, found)) if found else "L - 1")
      parts.append(_records_table(title, results[key], columns))
  if results.get("samples"):
    parts += _sample_texts(results["samples"])
  return "\n\n".join(parts)


__all__ = ["markdown_table", "format_results"]
