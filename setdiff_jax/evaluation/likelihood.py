"""Likelihood evaluation (SPEC §1.5, §6.1): see `setdiff_jax.likelihood`, which it re-exports.

The implementation lives one layer down, in `setdiff_jax/likelihood.py`, because the training
loop's eval uses the very same code (so `eval/nll` in metrics.jsonl equals
`launch/evaluate.py --eval=likelihood` for the same checkpoint, rows and seed).
"""
from setdiff_jax.likelihood import (DEFAULT_SEED, eval_rows, likelihood_eval, logmeanexp,
                                    make_row_nll_fn, per_token, row_keys, row_order,
                                    sequence_nlls, summarize)

__all__ = ["DEFAULT_SEED", "row_keys", "row_order", "make_row_nll_fn", "logmeanexp", "per_token",
           "sequence_nlls", "summarize", "eval_rows", "likelihood_eval"]
