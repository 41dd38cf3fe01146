"""Samplers: KV-cached SetDLM set sampler, its no-cache reference, and AR / BD3LM / MDLM baselines.

Public API (all pure functions; one jitted `lax.while_loop` each, per-row state):

  SamplerConfig                       knobs (window W, commit policy, N, T, sampling, ids, ...)
  DecodeSetting, CommitPolicy         a report's decode setting (W, policy + its tau) and its name
  set_generate(model, params, prompts, cfg, rng=None)                    -> SampleOutput
  set_infill(model, params, canvases, cfg, rng=None)                     -> SampleOutput
  reference_generate / reference_infill (same arguments): the no-cache reference (reference.py)
  ar_generate / bd3lm_generate / mdlm_generate(model, params, prompts, cfg, rng=None)
  mdlm_infill(model, params, canvases, cfg, rng=None)                    -> dict of arrays
  parse_infill(text) -> InfillTemplate; prompt_ids(tokenizer, prompt); time_calls(...)

Which sampler a trained run uses, text-level generation and the CLI body are in
`setdiff_jax.decoding` (it asks the run's decoder, `setdiff_jax.decoders`, which sits above the
samplers).

`model` is a backbone module (`models.Backbone`, with its params), a `Forward(apply, params)`,
or a toy `logits_fn(tokens, positions, mask, kv_cache) -> (logits, kv)` (params ignored); see
`cache.py`.
"""

from setdiff_jax.sampling.ar_sampler import ar_generate
from setdiff_jax.sampling.baselines import bd3lm_generate, mdlm_generate
from setdiff_jax.sampling.cache import (
  Forward,
  KVCache,
  append,
  as_forward,
  dit_apply_fn,
  empty_cache,
  prefill,
)
from setdiff_jax.sampling.config import (
  CommitPolicy,
  DecodeSetting,
  SampleOutput,
  SamplerConfig,
  commit_policy,
  count_table,
  step_counts,
)
from setdiff_jax.sampling.set_inputs import SetInputs, infill_inputs, prompted_inputs
from setdiff_jax.sampling.set_sampler import (
  SetState,
  compact,
  set_generate,
  set_infill,
  set_init,
  set_step,
)
from setdiff_jax.sampling.mdlm_infill import mdlm_infill
from setdiff_jax.sampling.reference import reference_generate, reference_infill
from setdiff_jax.sampling.text import InfillTemplate, parse_infill, prompt_ids
from setdiff_jax.sampling.timing import time_calls

__all__ = [
  "CommitPolicy",
  "DecodeSetting",
  "commit_policy",
  "SamplerConfig",
  "SampleOutput",
  "step_counts",
  "count_table",
  "Forward",
  "KVCache",
  "as_forward",
  "dit_apply_fn",
  "empty_cache",
  "append",
  "prefill",
  "SetInputs",
  "SetState",
  "prompted_inputs",
  "infill_inputs",
  "set_init",
  "set_step",
  "compact",
  "set_generate",
  "set_infill",
  "reference_generate",
  "reference_infill",
  "ar_generate",
  "bd3lm_generate",
  "mdlm_generate",
  "mdlm_infill",
  "InfillTemplate",
  "parse_infill",
  "prompt_ids",
  "time_calls",
]
