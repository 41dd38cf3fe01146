r"""The GSM8K protocol of the reference (SPEC §6.4), for users with a real model.

  prompt  = gsm8k_prompt(question, chat=True)      # instruction + question [+ chat template]
  text    = cut_at_stops(decoded, STOP_STRINGS)    # lm-eval's `until`, plus the script's own
  hashed  = accuracy.boxed_to_hash(text)           # 'a \boxed{18} b' -> 'a #### 18'
  correct = gsm8k_exact_match(decoded, reference)  # lm-eval's strict-match exact_match

The reference (scripts/eval/harness_eval.py) cuts the decoded text at the task's `until` strings
(lm-eval's gsm8k task: 'Question:', '</s>', '<|im_end|>'), '<|eot_id|>' and EOS; rewrites the
first \boxed{...} as '#### answer' (the text after the box is dropped); the harness then scores
its strict-match: the first '#### <number>', compared as strings after dropping ',', '$' and a
final '.' (extractor 'gsm8k' of `evaluation.accuracy`). `boxed_equals_reference` is the
script's own log line: string equality of the first box's content with the text after '### '.

Two decode settings exist and which one produced the paper's table is unconfirmed (SPEC §4.6):
  gsm8k_shell  run_lm_eval_harness.sh defaults: tau = 0.9, N = L (1024), W = S, greedy, fht cache
               order (the Pareto points use this, with tau swept).
  gsm8k_repro  the repro suite: tau off, N = L - P, W = S, greedy, fht; its stop_on_im_end adds
               '<|im_end|>', which the task's `until` holds already: both cut the same text.
Our samplers stop at EOS only; a stop string cuts the decoded text before extraction (the same
answer; the decode itself runs on, so it is not a speed setting). N is capped by the context:
our samplers never crop the cache (SPEC §4.3 overflow), so N = L - longest prompt when L is set.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from setdiff_jax.data.pairs import format_prompt
from setdiff_jax.evaluation.accuracy import exact_match, extract_hash

IM_END = "<|im_end|>"
# lm-eval's gsm8k `until` (task version 3.0) + the reference script's '<|eot_id|>'
STOP_STRINGS = ("Question:", "</s>", IM_END, "<|eot_id|>")

PRESETS: Dict[str, Dict[str, Any]] = {
  "gsm8k_shell": {"threshold": 0.9, "max_new_tokens": None, "cache_order": "fht", "greedy": True},
  "gsm8k_repro": {"threshold": None, "max_new_tokens": None, "cache_order": "fht", "greedy": True},
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


def gsm8k_exact_match(
  output: str, reference: str, stop_strings: Sequence[str] = STOP_STRINGS
) -> bool:
  """The harness's strict-match exact match of the model's output (cut at `stop_strings`, the
  first box rewritten as '#### n') with the reference's '#### n'."""
  return exact_match(cut_at_stops(output, stop_strings), reference, "gsm8k")


def boxed_equals_reference(
  output: str, reference: str, stop_strings: Sequence[str] = STOP_STRINGS
) -> bool:
  """The reference script's own check: the first box's content (up to its first '}') of the
  output cut at `stop_strings` equals the text after '#### ', as strings."""
  output = cut_at_stops(output, stop_strings)
  if "boxed{" not in output:
    return False
  boxed, gold = output.split("boxed{", 2)[1].split("}", 1)[0], extract_hash(reference)
  return gold is not None and boxed == gold


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
    "stop_strings": STOP_STRINGS,
    "extractor": "gsm8k",
  }


__all__ = [
  "PRESETS",
  "IM_END",
  "STOP_STRINGS",
  "preset",
  "gsm8k_prompt",
  "cut_at_stops",
  "gsm8k_exact_match",
  "boxed_equals_reference",
  "resolve_preset",
]
