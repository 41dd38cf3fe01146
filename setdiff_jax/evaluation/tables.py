"""Markdown tables of evaluation results (`launch/evaluate.py` prints them; benchmarks reuse
`markdown_table`)."""

from __future__ import annotations

from typing import Any, Dict, Sequence


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


def format_results(results: Dict[str, Any]) -> str:
  """Markdown tables of whatever evals `results` holds."""
  parts = []
  lik = results.get("likelihood")
  if lik:
    parts.append(
      "Likelihood (eval split; per token)\n\n"
      + markdown_table(
        ["method", "sequences", "tokens", "NLL", "PPL", "BPD", "K", "K NLL", "K PPL"],
        [
          [
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
        ],
      )
      + f"\n\none draw: {lik['estimator']}; K: {lik['estimator_K']}"
    )
  if results.get("infill"):
    parts.append(
      "Infill (ROUGE F x 100, greedy, oracle length)\n\n"
      + markdown_table(
        [
          "method",
          "dataset",
          "W",
          "tau",
          "n",
          "skipped",
          "R-1",
          "R-2",
          "R-L",
          "tok/s",
          "tok/step",
          "programs",
          "tok/s w/ compile",
        ],
        [
          [
            r["method"],
            r["dataset"],
            r.get("window"),
            r.get("threshold"),
            r["num_examples"],
            r["skipped"],
            r.get("rouge1"),
            r.get("rouge2"),
            r.get("rougeL"),
            r.get("tokens_per_second"),
            r.get("tokens_per_step"),
            r.get("compiled_programs"),
            r.get("tokens_per_second_with_compile"),
          ]
          for r in results["infill"]
        ],
      )
    )
  if results.get("speed"):
    parts.append(
      "Decoding speed (unconditional, N = L - 1, no EOS stop)\n\n"
      + markdown_table(
        [
          "method",
          "setting",
          "batch",
          "tok/s",
          "tok/step",
          "forward calls",
          "compile s",
          "programs",
          "tok/s w/ compile",
        ],
        [
          [
            r["method"],
            r["setting"],
            r["batch_size"],
            r["tokens_per_second"],
            r["tokens_per_step"],
            r["forward_calls"],
            r["compile_seconds"],
            r.get("compiled_programs"),
            r.get("tokens_per_second_with_compile"),
          ]
          for r in results["speed"]
        ],
      )
    )
  if results.get("accuracy"):
    parts.append(
      "Accuracy (exact match of the final answer, greedy, EOS stop per row)\n\n"
      + markdown_table(
        [
          "method",
          "setting",
          "n",
          "accuracy",
          "gen tokens",
          "tok/step",
          "kept tok/step",
          "fwd calls",
          "kept/call",
          "copies",
          "tok/s b=1",
          "tok/s batch",
          "batch",
          "programs",
          "tok/s w/ compile",
        ],
        [
          [
            r["method"],
            r["setting"],
            r["num_examples"],
            r["accuracy"],
            r["mean_generated_tokens"],
            r["tokens_per_step"],
            r.get("kept_tokens_per_step"),
            r["forward_calls"],
            r.get("kept_tokens_per_call"),
            r.get("copy_fraction"),
            r["tokens_per_second_batch1"],
            r["tokens_per_second"],
            r["batch_size"],
            r.get("compiled_programs"),
            r.get("tokens_per_second_with_compile"),
          ]
          for r in results["accuracy"]
        ],
      )
    )
  if results.get("samples"):
    parts.append(
      "Unconditional samples\n\n"
      + markdown_table(
        ["method", "setting", "n", "entropy", "dist-1", "dist-2", "dist-3", "gen PPL", "tok/s"],
        [
          [
            r["method"],
            r["setting"],
            r["num_samples"],
            r["unigram_entropy"],
            r["distinct_1"],
            r["distinct_2"],
            r["distinct_3"],
            r.get("gen_ppl"),
            r["tokens_per_second"],
          ]
          for r in results["samples"]
        ],
      )
    )
    for r in results["samples"]:
      for i, text in enumerate(r.get("examples", [])[:2]):
        parts.append(f"sample {i} ({r['method']} {r['setting']}): {text}")
  return "\n\n".join(parts)


__all__ = ["markdown_table", "format_results"]
