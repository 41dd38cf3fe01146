"""evaluation/tables: the markdown report `launch/evaluate.py` prints, against hand-written text."""

import pytest

from setdiff_jax.evaluation import tables


def test_markdown_table_number_formats():
  text = tables.markdown_table(["a", "b"], [[1234.5, 0.004], [None, 0.5]])
  assert text == "| a | b |\n| --- | --- |\n| 1,234.5 | 0.004 |\n| - | 0.50 |"


def test_format_results_sections_in_order():
  results = {
    "samples": [
      {
        "method": "mdlm",
        "setting": "T=8",
        "num_samples": 2,
        "unigram_entropy": 4.5,
        "distinct_1": 0.5,
        "distinct_2": 0.75,
        "distinct_3": 1.0,
        "tokens_per_second": 300.0,
        "examples": ["one", "two", "three"],
      }
    ],
    "speed": [
      {
        "method": "ar",
        "setting": "W=1",
        "batch_size": 2,
        "tokens_per_second": 1234.5,
        "tokens_per_step": 1.0,
        "forward_calls": 15,
        "compile_seconds": 0.004,
        "compiled_programs": 1,
      }
    ],
    "likelihood": {
      "method": "ar",
      "num_sequences": 4,
      "num_tokens": 60.0,
      "nll": 3.0,
      "ppl": 20.09,
      "bpd": 4.33,
      "num_draws": 1,
      "K_nll": 3.0,
      "K_ppl": 20.09,
      "estimator": "exact",
      "estimator_K": "exact",
    },
    "infill": [],  # empty: no section
  }
  assert tables.format_results(results) == "\n\n".join(
    [
      "Likelihood (eval split; per token)\n\n"
      "| method | sequences | tokens | NLL | PPL | BPD | K | K NLL | K PPL |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
      "| ar | 4 | 60 | 3.00 | 20.09 | 4.33 | 1 | 3.00 | 20.09 |\n\n"
      "one draw: exact; K: exact",
      "Decoding speed (unconditional, N = L - 1, no EOS stop)\n\n"
      "| method | setting | batch | tok/s | tok/step | forward calls | compile s | programs "
      "| tok/s w/ compile |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
      "| ar | W=1 | 2 | 1,234.5 | 1.00 | 15 | 0.004 | 1 | - |",
      "Unconditional samples\n\n"
      "| method | setting | n | entropy | dist-1 | dist-2 | dist-3 | gen PPL | tok/s |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
      "| mdlm | T=8 | 2 | 4.50 | 0.50 | 0.75 | 1.00 | - | 300.0 |",
      "sample 0 (mdlm T=8): one",
      "sample 1 (mdlm T=8): two",
    ]
  )
  assert tables.format_results({"infill": [], "accuracy": None}) == ""


def test_format_results_missing_required_field_raises():
  # An optional field shows as "-"; a required one missing is a malformed record.
  with pytest.raises(KeyError, match="skipped"):
    tables.format_results({"infill": [{"method": "ar", "dataset": "x", "num_examples": 1}]})
