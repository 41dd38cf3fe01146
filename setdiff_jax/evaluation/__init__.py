"""Evaluation: likelihood bounds, infilling, decoding speed and sample quality (SPEC §6).

likelihood  one-order bound (SPEC §1.5, §6.1) and K-order estimate; batch-size invariant
infill      ROCStories Story Cloze 1-/3-sentence infilling (SPEC §6.5) and held-out corpus
            paragraphs; ROUGE-1/2/L
generation  decoding speed (tokens/s, tokens/step, forward calls; SPEC §6.7) and unconditional
            sample statistics (entropy, distinct-n, generative perplexity under an AR judge)
run         `evaluate_workdir` (the body of launch/evaluate.py)
results     the JSON results file (history keys, reading, writing, the hardware stamp)
tables      markdown tables of results
"""

from setdiff_jax.evaluation.generation import (
  decoding_settings,
  distinct_n,
  generative_perplexity,
  measure,
  parse_thresholds,
  sample_stats,
  samples_eval,
  speed_eval,
  unigram_entropy,
)
from setdiff_jax.evaluation.infill import (
  InfillExample,
  TokenizedInfill,
  cloze_examples,
  corpus_examples,
  decode_infill,
  infill_eval,
  mdlm_infill,
  read_cloze,
  rouge_scores,
  tokenize_example,
  tokenize_examples,
)
from setdiff_jax.evaluation.likelihood import (
  eval_rows,
  likelihood_eval,
  logmeanexp,
  make_row_nll_fn,
  row_keys,
  row_order,
  sequence_nlls,
  summarize,
)
from setdiff_jax.evaluation.results import EVALS, hardware
from setdiff_jax.evaluation.run import EvalOptions, evaluate_state, evaluate_workdir
from setdiff_jax.evaluation.tables import format_results, markdown_table

__all__ = [
  "likelihood_eval",
  "sequence_nlls",
  "summarize",
  "eval_rows",
  "row_keys",
  "row_order",
  "make_row_nll_fn",
  "logmeanexp",
  "InfillExample",
  "TokenizedInfill",
  "read_cloze",
  "cloze_examples",
  "corpus_examples",
  "tokenize_example",
  "tokenize_examples",
  "rouge_scores",
  "mdlm_infill",
  "decode_infill",
  "infill_eval",
  "decoding_settings",
  "parse_thresholds",
  "measure",
  "speed_eval",
  "samples_eval",
  "sample_stats",
  "unigram_entropy",
  "distinct_n",
  "generative_perplexity",
  "EVALS",
  "EvalOptions",
  "evaluate_state",
  "evaluate_workdir",
  "format_results",
  "hardware",
  "markdown_table",
]
