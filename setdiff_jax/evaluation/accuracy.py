r"""Conditional decoding and exact-match accuracy on prompt/answer pairs.

  rows = accuracy_eval(model, params, tokenizer, obj_cfg, seq_len, pairs,
                       settings=[DecodeSetting(4), DecodeSetting(4, CommitPolicy("threshold", 0.9))])

Every test prompt ([BOS] + encode(prompt), the training context) is decoded with the run's sampler
(the prompt is cached, each row stops at its own EOS, batches of `batch_size` rows of mixed prompt
lengths, by default continuously batched: `batch_size` slots refilled as rows end,
`sampling.continuous`, for the set sampler and AR; `continuous=False` decodes static batches,
the same tokens), greedy. BD3LM and block-wise MDLM decode with blocks on the grid by default
(`align_to_blocks=True`, the official harness's `align_inputs_to_blocks=true` for every non-SetDLM
model, which made the paper's BD3LM GSM8K numbers; `SamplerConfig.align_to_blocks`). The final
answer is extracted from the decoded text and from the reference
answer with the same extractor and compared after number normalisation (exact match):
  hash   the last '#### n' line (GSM8K, and the answer line of the procedural task)
  boxed  the last \boxed{n} (balanced braces)
  auto   '#### n' if present, else \boxed{n}
  gsm8k  the reference's GSM8K scoring (SPEC §6.4, `launch/evaluate.py --preset`): the first
         \boxed{...} rewritten as '#### n' (`boxed_to_hash`), then lm-eval's strict-match (the
         first '#### <number>') compared as lm-eval's exact_match does (',', '$', a final '.'
         dropped, case ignored; strings, so 72.00 is not 72)
An empty final answer ('#### ' or \boxed{}) is no answer: never correct, and a reference with one
is refused (`check_references`).
Per setting (window W, threshold tau or a commit policy) it reports accuracy, mean generated
tokens per example (after the EOS cut, EOS included), tokens/step (committed tokens / decoding
steps, counting every committed token as the reference's parallelism factor),
kept_tokens_per_step (the tokens that come back, nothing committed after the first EOS, per step:
an EOS tail decoded in the stopping block does not inflate it), forward calls per example, kept
tokens per forward call (the generated tokens that come back over every call of the row, the
prompt-encoding call included), the copy fractions (`copy_stats`) and tokens/s at the decoding
batch and at batch 1 (on the first `speed_examples` prompts, one prompt per call). tokens/s is
compile-free (a batch that compiled is timed again, warm); beside it, the number of compiled
programs (prompt lengths are bucketed, so a data set compiles a bounded number) and the
compile-inclusive wall clock and tokens/s of the cold run. tokens/s counts the generated tokens
that come back (SPEC §6.7). `per_example=True` adds the per-problem correctness, kept tokens and
calls (for paired comparisons).
"""

from __future__ import annotations

import collections
import re
import time
from typing import Any, Dict, List, Optional, Sequence

import jax
import numpy as np
from absl import logging

from setdiff_jax import decoding
from setdiff_jax.data.pairs import format_prompt
from setdiff_jax.evaluation.generation import decoding_settings
from setdiff_jax.sampling import compiles
from setdiff_jax.sampling.config import DecodeSetting

EXTRACTORS = ("hash", "boxed", "auto", "gsm8k")
_HASH = re.compile(r"####[ \t]*([^\n]*)")  # the answer is on the '####' line, never the next
_NUMBER = re.compile(r"^([-+]?)([0-9]*)(?:\.([0-9]+))?$")  # '12', '-3.5', '.5'; ASCII digits
_STRICT_MATCH = re.compile(r"#### (-?[0-9.,]+)")  # lm-eval gsm8k's 'strict-match' filter
_HARNESS_IGNORED = re.compile(r",|\$|\.$")  # lm-eval gsm8k exact_match's regexes_to_ignore


def extract_hash(text: str) -> Optional[str]:
  """The text after the last '####' up to the end of its line (None if there is none, or it is
  empty)."""
  found = _HASH.findall(text)
  return (found[-1].strip() or None) if found else None


def extract_boxed(text: str) -> Optional[str]:
  r"""The content of the last \boxed{...}, braces balanced (None if there is none or it is open)."""
  start = text.rfind("\\boxed{")
  if start < 0:
    return None
  i, depth = start + len("\\boxed{"), 1
  for j in range(i, len(text)):
    depth += {"{": 1, "}": -1}.get(text[j], 0)
    if depth == 0:
      return text[i:j].strip() or None
  return None


def boxed_to_hash(text: str) -> str:
  r"""The reference's rewrite of a GSM8K output (harness_eval.py): the text before the first
  'boxed{', then '#### ' and that box's content up to its first '}', with '$\' dropped (what
  follows the box is gone); the text unchanged without a box."""
  if "boxed{" not in text:
    return text
  before, rest = text.split("boxed{", 1)
  content = rest.split("boxed{", 1)[0].split("}", 1)[0]
  return (before + "#### " + content).replace("$\\", "")


def extract_gsm8k(text: str) -> Optional[str]:
  """lm-eval's strict-match on the rewritten text (`boxed_to_hash`): the first '#### <number>'."""
  found = _STRICT_MATCH.search(boxed_to_hash(text))
  return found.group(1) if found else None


def _harness_form(answer: Optional[str]) -> Optional[str]:
  """An answer as lm-eval's gsm8k exact_match compares it (None for an empty one)."""
  if answer is None:
    return None
  return _HARNESS_IGNORED.sub("", answer).lower() or None


def extract_answer(text: str, extractor: str = "auto") -> Optional[str]:
  if extractor not in EXTRACTORS:
    raise ValueError(f"extractor={extractor!r}; expected one of {EXTRACTORS}")
  if extractor == "hash":
    return extract_hash(text)
  if extractor == "boxed":
    return extract_boxed(text)
  if extractor == "gsm8k":
    return extract_gsm8k(text)
  found = extract_hash(text)
  return found if found is not None else extract_boxed(text)


def normalize_answer(ans: Optional[str]) -> Optional[str]:
  """'1,234.' -> '1234'; '$5' -> '5'; '3.50' -> '3.5'; '-0' -> '0'; other text: stripped, spaces squeezed.

  Numbers are canonicalised on their digits, never through a float: two answers are equal exactly
  when their values are (9007199254740993 is not 9007199254740992). Commas go, as in lm-eval's GSM8K
  exact match.
  """
  if ans is None:
    return None
  s = ans.strip().replace(",", "").replace("$", "").rstrip(".").strip()
  number = _NUMBER.match(s)
  if number and (number.group(2) or number.group(3)):
    sign, whole, fraction = number.group(1), number.group(2), number.group(3) or ""
    digits = (whole.lstrip("0") or "0") + (
      "." + fraction.rstrip("0") if fraction.rstrip("0") else ""
    )
    return digits if digits == "0" or sign != "-" else "-" + digits
  return " ".join(s.split()) or None


def final_answer(text: str, extractor: str = "auto") -> Optional[str]:
  """The extracted answer in the form `exact_match` compares (None: no answer): normalised, or as
  lm-eval's gsm8k compares it for extractor 'gsm8k'."""
  form = _harness_form if extractor == "gsm8k" else normalize_answer
  return form(extract_answer(text, extractor))


def exact_match(prediction: str, reference: str, extractor: str = "auto") -> bool:
  """Whether the extracted, normalised answers are equal (an unreadable prediction is wrong;
  extractor 'gsm8k' compares as lm-eval does, the module doc)."""
  pred, gold = final_answer(prediction, extractor), final_answer(reference, extractor)
  if gold is None:
    raise ValueError(
      f"the reference answer has no final answer for extractor={extractor!r}: {reference[-80:]!r}"
    )
  return pred is not None and pred == gold


# ----------------------------------------------------------------------------- decoding
def encode_prompts(tokenizer, pairs, prompt_style: str = "plain") -> List[List[int]]:
  """[BOS] + encode(format_prompt(prompt)): exactly the training context of each pair."""
  texts = [format_prompt(p.prompt, prompt_style) for p in pairs]
  return [[int(tokenizer.bos_id)] + list(ids) for ids in tokenizer.encode_batch(texts)]


def copy_stats(
  prompt: Sequence[int], generated: Sequence[int], steps: Sequence[int]
) -> Dict[str, int]:
  """How much of a row's output is copied from its prompt.

  A kept token y_i is a copy when the pair (y_{i-1}, y_i) occurs as adjacent tokens in the prompt
  (y_{-1} = the prompt's last token): it continues a verbatim prompt span, so a model can commit
  it by matching, not computing. (Single tokens are too coarse: with one token per digit every
  digit of an answer also occurs in its prompt.) Steps: the decoding step of each kept token; a
  token is a parallel commit when another kept token was committed at the same step.
  Returns counts {kept, copies, parallel, parallel_copies}.
  """
  pairs = set(zip(prompt[:-1], prompt[1:]))
  prev = list(prompt[-1:]) + list(generated[:-1])
  copies = [(a, b) in pairs for a, b in zip(prev, generated)]
  per_step = collections.Counter(steps)
  parallel = [per_step[s] > 1 for s in steps]
  return {
    "kept": len(generated),
    "copies": int(sum(copies)),
    "parallel": int(sum(parallel)),
    "parallel_copies": int(sum(c and p for c, p in zip(copies, parallel))),
  }


def _batches(n: int, size: int):
  return [range(i, min(i + size, n)) for i in range(0, n, size)]


def decode_all(
  sampler,
  model,
  params,
  prompts: Sequence[Sequence[int]],
  cfg,
  *,
  batch_size: int,
  seed: int = 0,
  continuous=None,
) -> Dict[str, Any]:
  """Decodes every prompt and returns per-row generated ids and counters plus timings.

  Static batches (`continuous=None`): batches of `batch_size` rows (the last one padded with
  copies of the first prompt so every call has one batch size). The samplers pad a batch's
  prompts to a length bucket (`cfg.length_buckets`), so the data set compiles at most one
  program per bucket. `continuous` (`decoding.continuous_for`): one continuous-batching call
  over every prompt with `batch_size` slots (`sampling.continuous`; row r draws from
  fold_in(key, r), so greedy rows equal the static batches' rows); its counters come back as
  `continuous` (decode steps, prefill calls, slot utilisation).
  Every call is timed (`wall_seconds`: the compile-inclusive wall clock of a cold run); a call
  that compiled a program (the jitted loops' cache grew) is decoded again with the same key and
  that warm time replaces its cold one in `seconds` (compile-free; the same tokens).
  `compiled_programs`: programs compiled.
  """
  n = len(prompts)
  key = jax.random.PRNGKey(seed)
  if continuous is not None:
    calls = [(list(prompts), key, n)]
    run = lambda rows, k: continuous(model, params, rows, cfg, k, slots=batch_size)
  else:
    fill = lambda idx: [prompts[i] for i in idx] + [prompts[0]] * (batch_size - len(idx))
    calls = [
      (fill(idx), jax.random.fold_in(key, j), len(idx))
      for j, idx in enumerate(_batches(n, batch_size))
    ]
    run = lambda rows, k: sampler(model, params, rows, cfg, k)
  generated, steps, committed, forward, gen_steps = [], [], [], [], []
  seconds, wall, start, counters = 0.0, 0.0, compiles.compiled_programs(), None
  for rows, k_j, k in calls:
    before = compiles.compiled_programs()
    t0 = time.perf_counter()
    out = run(rows, k_j)
    dt = time.perf_counter() - t0
    wall += dt
    if compiles.compiled_programs() > before:  # this call compiled: time it again, warm
      t0 = time.perf_counter()
      out = run(rows, k_j)
      dt = time.perf_counter() - t0
    seconds += dt
    if continuous is not None:
      out, counters = out.result, out.counters
    generated += [list(map(int, g)) for g in out.generated[:k]]
    for b, g in enumerate(out.generated[:k]):  # the kept tokens' positions, in order
      pos = np.nonzero(out.target[b] & (out.canvas[b] != cfg.mask_token_id))[0][: len(g)]
      gen_steps.append([int(s) for s in out.commit_step[b][pos]])
    steps += [int(s) for s in out.num_steps[:k]]
    committed += [int(c) for c in out.num_committed[:k]]
    forward += [int(c) for c in out.forward_calls[:k]]
  # Rows added to fill the last batch are decoded but not counted: tokens/s counts real rows.
  padded_rows = 0 if continuous is not None else len(calls) * batch_size - n
  return {
    "generated": generated,
    "num_steps": steps,
    "num_committed": committed,
    "forward_calls": forward,
    "seconds": seconds,
    "wall_seconds": wall,
    "compiled_programs": compiles.compiled_programs() - start,
    "padded_rows": padded_rows,
    "commit_steps": gen_steps,
    "continuous": counters,
  }


def _sampler_config(
  obj_cfg,
  tokenizer,
  seq_len: int,
  setting: DecodeSetting,
  n: int,
  cache_order: str,
  seed: int,
  align_to_blocks: bool = True,
):
  return decoding.sampler_config_for(
    obj_cfg,
    tokenizer,
    seq_len,
    setting=setting,
    greedy=True,
    seed=seed,
    max_new_tokens=n,
    stop_at_eos=True,
    cache_order=cache_order,
    align_to_blocks=align_to_blocks,
  )


def _generation_budget(
  prompts: Sequence[Sequence[int]], pairs, seq_len: int, max_new_tokens
) -> int:
  """N, the tokens each prompt may generate (None: seq_len - the longest prompt); raises
  ValueError, naming the pair, when the longest prompt plus N does not fit the context, and warns
  when one long prompt leaves every pair a much smaller N than the median prompt would."""
  lengths = [len(p) for p in prompts]
  i = int(np.argmax(lengths))
  longest, where = lengths[i], pairs[i].where or f"test pair #{i}"
  n = max_new_tokens or seq_len - longest
  if n < 1 or longest + n > seq_len:
    fix = (
      "lower --max_new_tokens, or shorten or drop it" if max_new_tokens else "shorten or drop it"
    )
    raise ValueError(
      f"{where}: its prompt has {longest} tokens (BOS included); with max_new_tokens={n} it does "
      f"not fit the model's context seq_len={seq_len}: {fix}"
    )
  median_n = seq_len - int(np.median(lengths))
  if max_new_tokens is None and n < median_n / 2:
    logging.warning(
      "every test pair may generate N=%d tokens, set by the %d-token prompt of %s (the median "
      "prompt leaves %d): shorten or drop it, or pass --max_new_tokens",
      n,
      longest,
      where,
      median_n,
    )
  return n


def check_references(
  pairs,
  extractor: str,
  fix: str = "end it with '#### ANSWER' (or \\boxed{ANSWER}), or pass the "
  "--extractor that reads it",
):
  """ValueError, before any decoding, naming the first pair whose reference has no final answer
  the extractor can read (it could never be scored), and `fix`."""
  for i, p in enumerate(pairs):
    if final_answer(p.answer, extractor) is None:
      raise ValueError(
        f"{p.where or f'test pair #{i}'}: the reference answer has no final answer for "
        f"extractor={extractor!r}: {p.answer[-80:]!r}; {fix}"
      )


def answer_texts(tokenizer, generated, stop_strings: Sequence[str]) -> List[str]:
  """The decoded texts, each cut at the first of `stop_strings`. A stop string that is one token
  (Qwen3's <|im_end|>: a special token, which the decoded text leaves out) cuts the ids first."""
  stop_ids = {i for i in map(tokenizer.token_id, stop_strings) if i is not None}
  rows = []
  for ids in generated:
    ids = [int(t) for t in ids]
    rows.append(ids[: next((k for k, t in enumerate(ids) if t in stop_ids), len(ids))])
  texts = tokenizer.decode_batch(rows)
  for stop in stop_strings:
    texts = [t.split(stop, 1)[0] for t in texts]
  return texts


def _step_metrics(res: Dict[str, Any], align_to_blocks: bool) -> Dict[str, Any]:
  """Generated tokens, tokens per step and per forward call of a `decode_all` result."""
  num_gen = [len(g) for g in res["generated"]]
  steps, committed = sum(res["num_steps"]), sum(res["num_committed"])
  return {
    "mean_generated_tokens": float(np.mean(num_gen)),
    "tokens_per_step": committed / steps if steps else 0.0,
    "kept_tokens_per_step": sum(num_gen) / steps if steps else 0.0,
    "align_to_blocks": align_to_blocks,  # BD3LM / block-wise MDLM only
    "forward_calls": float(np.mean(res["forward_calls"])),
    "kept_tokens_per_call": sum(num_gen) / max(sum(res["forward_calls"]), 1),
  }


def _copy_metrics(prompts: Sequence[Sequence[int]], res: Dict[str, Any]) -> Dict[str, Any]:
  """The fractions of kept tokens copied from the prompt, committed in parallel, or both
  (`copy_stats` summed over the rows)."""
  cs = [copy_stats(p, g, s) for p, g, s in zip(prompts, res["generated"], res["commit_steps"])]
  total = lambda key: sum(c[key] for c in cs)
  return {
    "copy_fraction": total("copies") / max(total("kept"), 1),
    "parallel_fraction": total("parallel") / max(total("kept"), 1),
    "parallel_copy_fraction": (
      total("parallel_copies") / total("parallel") if total("parallel") else None
    ),
  }


def _speed_metrics(
  res: Dict[str, Any], one: Optional[Dict[str, Any]], k: int, batch_size: int, continuous: bool
) -> Dict[str, Any]:
  """tokens/s at the decoding batch (warm and compile-inclusive) and at batch 1 (`one`: the
  first `k` prompts decoded alone, None when k = 0)."""
  kept = sum(len(g) for g in res["generated"])
  return {
    "batch_size": batch_size,
    "decoding": "continuous" if continuous else "static",
    "slot_utilisation": (res["continuous"] or {}).get("utilisation"),
    "tokens_per_second": kept / res["seconds"] if res["seconds"] else 0.0,
    "compiled_programs": res["compiled_programs"],
    "wall_seconds_with_compile": res["wall_seconds"],
    "tokens_per_second_with_compile": kept / res["wall_seconds"] if res["wall_seconds"] else 0.0,
    "speed_examples_batch1": k,
    "tokens_per_second_batch1": (
      sum(len(g) for g in one["generated"]) / one["seconds"] if one and one["seconds"] else None
    ),
    "batch1_matches_batched": (one["generated"] == res["generated"][:k]) if one else None,
  }


def accuracy_eval(
  model,
  params,
  tokenizer,
  obj_cfg,
  seq_len: int,
  pairs,
  *,
  settings: Optional[List[DecodeSetting]] = None,
  batch_size: int = 32,
  speed_examples: int = 16,
  max_new_tokens: Optional[int] = None,
  extractor: str = "auto",
  prompt_style: str = "plain",
  cache_order: str = "l2r",
  stop_strings: Sequence[str] = (),
  seed: int = 0,
  num_shown: int = 3,
  per_example: bool = False,
  align_to_blocks: bool = True,
  continuous: bool = True,
) -> List[Dict[str, Any]]:
  """One row of metrics per decoding setting (see the module docstring).

  continuous: decode with continuous batching (`batch_size` slots refilled as rows end,
    `sampling.continuous`) where it is exact for the method and setting (set sampler, AR; the
    same greedy tokens as static batches); False: static batches of `batch_size` rows.

  max_new_tokens: N (None: seq_len - the longest prompt, so every prompt fits the context).
  stop_strings: the decoded text is cut at the first of these before extraction.
  align_to_blocks: BD3LM / block-wise MDLM blocks on the grid (the official harness; default) or
    starting at each prompt's end (False, the unaligned sampler).
  """
  if not pairs:
    raise ValueError("accuracy eval: no test pairs")
  settings = settings or decoding_settings(obj_cfg)
  check_references(pairs, extractor)
  prompts = encode_prompts(tokenizer, pairs, prompt_style)
  n = _generation_budget(prompts, pairs, seq_len, max_new_tokens)
  sampler = decoding.sampler_for(obj_cfg.name)
  rows = []
  for setting in settings:
    cfg = _sampler_config(
      obj_cfg, tokenizer, seq_len, setting, n, cache_order, seed, align_to_blocks
    )
    cont = decoding.continuous_for(obj_cfg.name, cfg) if continuous else None
    res = decode_all(
      sampler, model, params, prompts, cfg, batch_size=batch_size, seed=seed, continuous=cont
    )
    texts = answer_texts(tokenizer, res["generated"], stop_strings)
    correct = [exact_match(t, p.answer, extractor) for t, p in zip(texts, pairs)]
    k = min(speed_examples, len(prompts))
    one = (
      decode_all(sampler, model, params, prompts[:k], cfg, batch_size=1, seed=seed) if k else None
    )
    row = {
      "method": obj_cfg.name,
      **setting.row(),  # setting (its one name), window, threshold, policy, policy_arg
      "num_examples": len(pairs),
      "num_correct": int(sum(correct)),
      "accuracy": float(np.mean(correct)),
      "max_new_tokens": n,
      **_step_metrics(res, cfg.align_to_blocks),
      **_copy_metrics(prompts, res),
      **_speed_metrics(res, one, k, batch_size, cont is not None),
      "examples": [
        {"prompt": p.prompt, "output": t, "reference": p.answer, "correct": c}
        for p, t, c in list(zip(pairs, texts, correct))[:num_shown]
      ],
    }
    if per_example:
      row["per_example"] = {
        "correct": [bool(c) for c in correct],
        "kept": [len(g) for g in res["generated"]],
        "calls": [int(c) for c in res["forward_calls"]],
      }
    rows.append(row)
  return rows


__all__ = [
  "EXTRACTORS",
  "extract_hash",
  "extract_boxed",
  "boxed_to_hash",
  "extract_gsm8k",
  "extract_answer",
  "normalize_answer",
  "final_answer",
  "answer_texts",
  "exact_match",
  "check_references",
  "encode_prompts",
  "copy_stats",
  "decode_all",
  "accuracy_eval",
]
