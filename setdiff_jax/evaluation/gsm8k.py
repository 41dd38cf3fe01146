r"""The GSM8K protocol of the reference (SPEC §6.4), for users with a real model.

  prompt  = gsm8k_prompt(question, chat=True)      # instruction + question [+ chat template]
  text    = cut_at_stops(decoded, preset)          # the preset's stop strings
  hashed  = boxed_to_hash(text)                    # '... \boxed{18}' -> '... #### 18'
  correct = gsm8k_exact_match(text, reference)     # '#### n' of both, numbers normalised

The reference rewrites the model's \boxed{...} as '#### answer' so the harness's exact-match
filters read it; `gsm8k_exact_match` does the same and compares with the reference's '#### n'
(commas, '$' and a trailing '.' dropped). `boxed_equals_reference` is the script's own stricter
log line: string equality of the boxed content with the text after '#### '.

Two decode settings exist and which one produced the paper's table is unconfirmed (SPEC §4.6):
  gsm8k_shell  run_lm_eval_harness.sh defaults: tau = 0.9, N = L (1024), W = S, greedy, fht cache
               order, no '<|im_end|>' stop (the Pareto points use this, with tau swept).
  gsm8k_repro  the repro suite: tau off, N = L - P, W = S, greedy, fht, stop at '<|im_end|>'.
Our samplers stop at EOS only; a stop string cuts the decoded text before extraction (the same
answer; the decode itself runs on, so it is not a speed setting). N is capped by the context:
our samplers never crop the cache (SPEC §4.3 overflow), so N = L - longest prompt when L is set.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from setdiff_jax.data.pairs import format_prompt
from setdiff_jax.evaluation.accuracy import extract_boxed, extract_hash, exact_match

IM_END = "<|im_end|>"

PRESETS: Dict[str, Dict[str, Any]] = {
  "gsm8k_shell": {
    "threshold": 0.9,
    "max_new_tokens": None,
    "cache_order": "fht",
    "stop_strings": (),
    "greedy": True,
  },
  "gsm8k_repro": {
    "threshold": None,
    "max_new_tokens": None,
    "cache_order": "fht",
    "stop_strings": (IM_END,),
    "greedy": True,
  },
}


def preset(name: str) -> Dict[str, Any]:
  if name not in PRESETS:
    raise ValueError(f"unknown GSM8K preset {name!r}; expected one of {sorted(PRESETS)}")
  return dict(PRESETS[name])


def gsm8k_prompt(question: str, chat: bool = True) -> str:
  """The reference prompt: the boxed instruction + question, optionally in the chat template."""
  return format_prompt(question, "gsm8k_chat" if chat else "gsm8k")


def cut_at_stops(text: str, stop_strings: Sequence[str] = ()) -> str:
  for stop in stop_strings:
    text = text.split(stop, 1)[0]
  return text


def boxed_to_hash(text: str) -> str:
  r"""'... \boxed{18} ...' -> '... #### 18' (the reference's rewrite); unchanged without a box."""
  boxed = extract_boxed(text)
  return text if boxed is None else f"{text}\n#### {boxed}"


def gsm8k_exact_match(output: str, reference: str, stop_strings: Sequence[str] = ()) -> bool:
  """Exact match of the model's boxed answer (as '#### n') with the reference's '#### n'."""
  out = cut_at_stops(output, stop_strings)
  boxed = extract_boxed(out)
  if boxed is None:
    return False
  return exact_match(f"#### {boxed}", reference, "hash")


def boxed_equals_reference(output: str, reference: str) -> bool:
  """The reference script's own check: boxed content == the text after '#### ' (as strings)."""
  boxed, gold = extract_boxed(output), extract_hash(reference)
  return boxed is not None and gold is not None and boxed.strip() == gold.strip()


def resolve_preset(name: Optional[str], seq_len: int) -> Dict[str, Any]:
  """A preset's accuracy-eval arguments for a model of context `seq_len` (N = None: L minus the
  longest prompt). The prompt style is the run's own (data.prompt_style, e.g. gsm8k_chat)."""
  if not name:
    return {}
  p = preset(name)
  return {
    "threshold": p["threshold"],
    "max_new_tokens": p["max_new_tokens"],
    "cache_order": p["cache_order"],
    "stop_strings": tuple(p["stop_strings"]),
  }


__all__ = [
  "PRESETS",
  "IM_END",
  "preset",
  "gsm8k_prompt",
  "cut_at_stops",
  "boxed_to_hash",
  "gsm8k_exact_match",
  "boxed_equals_reference",
  "resolve_preset",
]
