"""The lm_eval adapter's requests, without lm_eval: the bound of (context, continuation) token
pairs (`score_pairs`), their draw keys (`request_key`, `generation_ids`), prompts cut to the
model's context (`fit_prompt`), the generation kwargs a request may set, model_args
values (booleans, integers, the threshold, the aliases W and tau). `lm_eval_model.SetDiffLM`
(which needs the `lmeval` extra) turns lm_eval's requests into these calls.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from setdiff_jax import objectives
from setdiff_jax.config import fields as ranges
from setdiff_jax.evaluation import likelihood

NAME = "setdiff_jax"  # the model name lm_eval knows the adapter by (--model setdiff_jax)
# gen_kwargs we read; any other key (top_k, num_beams > 1, ...) is refused, never ignored.
NEUTRAL_GEN_KWARGS = {"num_beams": 1, "top_k": None, "repetition_penalty": 1.0}


def parse_bool(name: str, value) -> bool:
  if isinstance(value, bool):
    return value
  if str(value).lower() in ("true", "1", "yes"):
    return True
  if str(value).lower() in ("false", "0", "no"):
    return False
  raise ValueError(f"model_args {name}={value!r}: expected true or false")


def threshold_arg(value) -> Optional[float]:
  if value is None or str(value).lower() in ("off", "none", ""):
    return None
  try:
    tau = float(value)
  except ValueError:
    raise ValueError(f"model_args threshold / tau={value!r}: a number in (0, 1], or off") from None
  ranges.check("threshold", tau, "model_args threshold / tau")  # the launchers' range
  return tau


def int_arg(name: str, value, low: int) -> Optional[int]:
  """A model_args integer (None stays None), one error line when it is not one or below `low`:
  the launchers' ranges (batch_size >= 1, seed >= 0, num_orders >= 1, step >= 1, ...)."""
  if value is None:
    return None
  try:
    number = int(str(value))
  except ValueError:
    number = None
  if number is None or number < low:
    raise ValueError(f"model_args {name}={value!r}: an integer >= {low}")
  return number


def merge_aliases(window=None, W=None, threshold=None, tau=None) -> Dict[str, Any]:
  """{window, threshold} from model_args that may name them by their aliases W and tau; one error
  when a name and its alias disagree."""
  if window is not None and W is not None and int_arg("window", window, 1) != int_arg("W", W, 1):
    raise ValueError(f"model_args window={window} and W={W} disagree; give one")
  if threshold is not None and tau is not None and threshold_arg(threshold) != threshold_arg(tau):
    raise ValueError(f"model_args threshold={threshold} and tau={tau} disagree; give one")
  return {
    "window": W if window is None else window,
    "threshold": tau if threshold is None else threshold,
  }


def request_key(*texts: str) -> int:
  """The draw index of a scoring request: a hash of its strings (order- and batch-free)."""
  return zlib.crc32("\x00".join(texts).encode("utf-8"))


def generation_ids(requests: Sequence[Tuple[str, Any]]) -> List[int]:
  """The draw index (uint32) of each generate_until request, given as (context, settings) with
  settings any repr-stable value of its generation settings (`gen_settings`'s).

  A hash of the context, the settings and the request's occurrence number k (0 for the first
  request with these strings and settings in the list, 1 for the next, ...): lm_eval sends a
  request `repeats` times and each copy must draw its own sample, while no request's index
  depends on the other requests, their order or the batching.
  """
  seen: Dict[Tuple[str, str], int] = {}
  out = []
  for context, settings in requests:
    ident = (context, repr(settings))
    k = seen.get(ident, 0)
    seen[ident] = k + 1
    out.append(request_key("generate_until", *ident, str(k)))
  return out


def fit_prompt(ids: List[int], seq_len: int, room: int, overflow: str, where: str) -> List[int]:
  """The prompt ids [BOS] + context, leaving `room` tokens of the model's context L = seq_len:
  as they are when they fit; else a ValueError (overflow='error', or no context fits), or
  (overflow='truncate_prompt') BOS + the context's last seq_len - room - 1 tokens."""
  limit = seq_len - room
  if len(ids) <= limit:
    return ids
  if limit < 1:  # no truncation helps
    raise ValueError(
      f"{where}: {room} continuation / new tokens need {room + 1} positions with BOS, but the "
      f"model's context is L = seq_len = {seq_len}; no context fits (overflow="
      "truncate_prompt only shortens the context): use a shorter continuation"
    )
  if overflow == "error":
    raise ValueError(
      f"{where}: the context is {len(ids)} tokens (BOS included) and needs {room} more, but "
      f"the model's context is L = seq_len = {seq_len} (at most {limit} context "
      "tokens fit); use a shorter context or fewer new tokens, or model_args "
      "overflow=truncate_prompt (keeps BOS and the context's last tokens)"
    )
  return ids[:1] + ids[len(ids) - limit + 1 :]


def request_where(req, i: int) -> str:
  task = getattr(req, "task_name", None)
  doc = getattr(req, "doc_id", None)
  return f"request {i} (task {task}, doc {doc})" if task is not None else f"request {i}"


def _max_gen_toks(value, where: str) -> int:
  try:
    number = float(value)
  except (TypeError, ValueError):
    number = math.nan
  if isinstance(value, bool) or not math.isfinite(number) or number != int(number) or number < 1:
    raise ValueError(
      f"{where}: generation kwarg max_gen_toks={value!r}: an integer >= 1 (the task's "
      "generation_kwargs, or --gen_kwargs)"
    )
  return int(number)


def gen_settings(kwargs: Dict[str, Any], where: str):
  """(until strings, max_gen_toks, greedy, sampler kwargs) of a generate_until request; any
  generation kwarg we do not read is refused, never ignored."""
  kwargs = dict(kwargs or {})
  until = kwargs.pop("until", None) or []
  until = [until] if isinstance(until, str) else list(until)
  max_gen = _max_gen_toks(kwargs.pop("max_gen_toks", 256), where)
  do_sample = parse_bool("do_sample", kwargs.pop("do_sample", False))
  temperature = float(kwargs.pop("temperature", 1.0 if do_sample else 0.0))
  top_p = float(kwargs.pop("top_p", 1.0))
  for k, neutral in NEUTRAL_GEN_KWARGS.items():
    if k in kwargs and kwargs[k] in (neutral, 0 if neutral is None else neutral):
      kwargs.pop(k)
  if kwargs:
    raise ValueError(
      f"{where}: generation kwargs {kwargs} are not supported by {NAME} (it "
      "reads until, max_gen_toks, do_sample, temperature, top_p)"
    )
  sample = do_sample and temperature > 0
  extra = {"temperature": temperature, "top_p": top_p} if sample else {}
  return until, max_gen, (not sample), extra


def score_pairs(
  model,
  params,
  obj_cfg,
  pairs: Sequence[Tuple[Sequence[int], Sequence[int]]],
  keys: Sequence[int],
  *,
  seq_len: int,
  num_orders: int = 1,
  seed: int = 0,
  batch_size: int = 8,
) -> np.ndarray:
  """The method's bound on log p(cont | ctx) per (ctx ids, cont ids) pair (nats, float64 [n]).

  Rows are [ctx] [cont] pad... (len <= seq_len) with context_mask = 1 on ctx (ctx starts with BOS
  or, for later rolling windows, with the text before the window); `keys` are the rows' draw
  indices (`likelihood.row_keys`). K = num_orders draws are combined by the method's
  `aggregate_draws` (SetDLM: log-mean-exp over orders; MDLM / BD3LM: mean NELBO; AR: exact).
  MDLM / BD3LM draw the NELBO in its discrete form (`losses._mask_counts`: k ~ U{1..n} of a
  block's n continuation tokens masked): the Bernoulli form scores nothing when its draw masks
  no token, which for a one-token continuation is half of the draws (a tie at log p = 0).
  """
  obj_cfg = dataclasses.replace(obj_cfg, eval_mask_counts=True)
  objective = objectives.get(obj_cfg.name)
  n = len(pairs)
  tokens = np.full((n, seq_len), int(obj_cfg.pad_token_id), np.int32)
  att, ctx = np.zeros((n, seq_len), np.int32), np.zeros((n, seq_len), np.int32)
  tail = objective.scores_end_of_text  # causal: a real context tail adds no stop label
  for r, (c, x) in enumerate(pairs):
    row = list(c) + list(x)
    if len(row) > seq_len or not c or not x:
      raise ValueError(
        f"scoring row {r}: context {len(c)} + continuation {len(x)} tokens must "
        f"be >= 1 each and fit seq_len={seq_len}"
      )
    tokens[r, : len(row)], att[r, : len(row)], ctx[r, : len(c)] = row, 1, 1
    if tail:
      att[r, len(row) :], ctx[r, len(row) :] = 1, 1
  nll, count = likelihood.sequence_nlls(
    model,
    params,
    obj_cfg,
    tokens,
    att,
    context_mask=ctx,
    num_draws=objective.num_draws(num_orders),
    seed=seed,
    batch_size=batch_size,
    row_ids=np.asarray(keys, np.int64),
  )
  want = np.array([len(x) for _, x in pairs], np.float64)
  if not np.array_equal(count, want):  # e.g. a pad-id token inside a continuation
    bad = int(np.nonzero(count != want)[0][0])
    raise ValueError(
      f"scoring row {bad}: {int(count[bad])} of {int(want[bad])} continuation "
      "tokens are scored (does it contain the pad id?)"
    )
  return -objective.aggregate_draws(nll)
