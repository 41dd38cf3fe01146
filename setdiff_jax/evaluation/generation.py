"""Decoding speed (SPEC §6.7) and unconditional sample quality (SPEC §6.2, §4.4).

Speed: unconditional generation from BOS, N = L - 1 new tokens, no EOS stop (the reference's LM1B
throughput mode), with the sampler of the run's objective, per setting (window W, threshold tau)
and batch size. One untimed warm-up call compiles; then `repeats` timed calls (new keys), each
ended by the host copy of its outputs. Reported:
  tokens_per_second   median over the timed calls of (generated tokens of all rows / wall
                      seconds); the median resists a call slowed by other jobs on a shared
                      machine (tokens_per_second_mean: total tokens / total seconds);
  tokens_per_step     committed tokens / decoding steps (the parallelism factor);
  forward_calls       model calls per row (prompt encoding included);
  compile_seconds     first call minus a timed call;
  compiled_programs   programs the setting compiled (0 when an earlier one had the same shapes);
  tokens_per_second_with_compile  the compile-inclusive rate: the compiling call counted with the
                      timed ones (its tokens counted as those of the first timed call).

Samples: the same unconditional decoding with nucleus sampling; per sample the unigram entropy
(nats, of its own token distribution; the reference rejects samples below 4 nats at OWT scale),
distinct-n over all samples (unique n-grams / n-grams), and the generative perplexity under an AR
judge: exp(total NLL / total tokens) of the judge on BOS + sample. If the judge's tokenizer is the
run's, the ids are scored directly; otherwise the decoded text is re-tokenized with the judge's.
Samples longer than the judge's context are cut to it.
"""

from __future__ import annotations

import collections
import math
from typing import Any, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from setdiff_jax import decoders, decoding, objectives
from setdiff_jax.config import fields as ranges
from setdiff_jax.sampling import policies
from setdiff_jax.sampling.config import CommitPolicy, DecodeSetting, tau_label
from setdiff_jax.workdir import load as workdir_lib
from setdiff_jax.sampling import compiles
from setdiff_jax.sampling.timing import time_calls


def parse_thresholds(values: Sequence[str], flag: str = "--thresholds") -> List[Optional[float]]:
  """['off', '0.9'] -> [None, 0.9]; anything else is a ValueError naming `flag`."""
  out = []
  for v in values:
    v = str(v).strip().lower()
    if v in ("off", "none", ""):
      out.append(None)
      continue
    try:
      tau = float(v)
    except ValueError:
      tau = float("nan")
    if not ranges.SHARED["threshold"].ok(tau):  # NaN too
      raise ValueError(
        f"{flag}={','.join(map(str, values))}: {v!r} is not a threshold; each "
        f"value is {ranges.SHARED['threshold'].describe()} or 'off'"
      )
    out.append(tau)
  return out


def decoding_settings(
  obj_cfg,
  *,
  windows: Optional[Sequence[int]] = None,
  thresholds: Sequence[Optional[float]] = (None, 0.9),
) -> List[DecodeSetting]:
  """The settings to measure for a run's method (its decoder decides).

  setdlm: every window (default [S]) x every tau; bd3lm and mdlm: every tau (BD3LM with its block
  S, MDLM with one sub-block of N); ar: one setting (tau does not apply: no commit policy).
  """
  if not len(thresholds):  # no settings would fall back to the defaults (`speed_eval`)
    raise ValueError("--thresholds is empty: give at least one value ('off' or a tau)")
  decoder = decoders.get(obj_cfg.name)
  pairs = decoder.decoding_settings(obj_cfg, windows, thresholds)  # {"window", "threshold"} each
  policy = lambda tau: CommitPolicy(policies.DEFAULT, tau) if decoder.uses_threshold else None  # noqa: E731
  return [DecodeSetting(p["window"], policy(p["threshold"])) for p in pairs]


def with_policy(
  obj_cfg,
  settings: List[DecodeSetting],
  policy: str,
  policy_args: Sequence[Optional[float]] = (None,),
) -> List[DecodeSetting]:
  """Every setting x every parameter of a commit policy (`sampling/policies.py`); the default
  policy 'threshold' keeps the settings (its tau is theirs). Methods without a commit rule (AR)
  keep theirs. A non-default policy with a tau in the settings is an error."""
  policies.get(policy)
  for a in policy_args:
    policies.check_arg(policy, a, "--policy_args")
  if policy == policies.DEFAULT and any(a is not None for a in policy_args):
    raise ValueError(  # never dropped without a word
      "--policy_args sets tau of --policy=threshold, which the settings' thresholds hold: pass "
      "the values as --thresholds"
    )
  if policy == policies.DEFAULT or not decoders.get(obj_cfg.name).uses_threshold:
    return settings
  if any(s.tau is not None for s in settings):
    raise ValueError(
      f"--thresholds sets tau of --policy=threshold; with --policy={policy} leave "
      "it at 'off' and sweep --policy_args"
    )
  out = []
  for s in settings:
    for a in policy_args:
      setting = DecodeSetting(s.window, CommitPolicy(policy, a))
      if setting not in out:
        out.append(setting)
  return out


def _sampler_config(
  obj_cfg,
  tokenizer,
  seq_len: int,
  setting: DecodeSetting,
  *,
  greedy: bool,
  top_p: float,
  seed: int,
  max_new_tokens: Optional[int],
  repetition_penalty: float = 1.0,
):
  n = max_new_tokens or seq_len - 1
  return decoding.sampler_config_for(
    obj_cfg,
    tokenizer,
    seq_len,
    setting=setting,
    greedy=greedy,
    top_p=top_p,
    seed=seed,
    max_new_tokens=n,
    stop_at_eos=False,
    repetition_penalty=repetition_penalty,
  )


def measure(
  model,
  params,
  tokenizer,
  obj_cfg,
  seq_len: int,
  setting: DecodeSetting,
  *,
  batch_size: int,
  repeats: int = 2,
  greedy: bool = False,
  top_p: float = 0.95,
  seed: int = 0,
  max_new_tokens: Optional[int] = None,
  repetition_penalty: float = 1.0,
) -> Dict[str, Any]:
  """Times one decoding setting at one batch size; returns metrics and the generated ids."""
  cfg = _sampler_config(
    obj_cfg,
    tokenizer,
    seq_len,
    setting,
    greedy=greedy,
    top_p=top_p,
    seed=seed,
    max_new_tokens=max_new_tokens,
    repetition_penalty=repetition_penalty,
  )
  sampler = decoders.get(obj_cfg.name).generate
  prompts = [[int(tokenizer.bos_id)]] * batch_size
  key = jax.random.PRNGKey(seed)
  timed = max(1, repeats)
  run = lambda k: sampler(model, params, prompts, cfg, k)
  programs = compiles.compiled_programs()
  outs, times, first = time_calls(
    run,
    [(jax.random.fold_in(key, r),) for r in range(timed)],
    warmup=(jax.random.fold_in(key, 10_000),),
  )
  seconds = float(sum(times))
  generated = sum(out.num_generated for out in outs)
  steps = sum(int(np.sum(out.num_steps)) for out in outs)
  committed = sum(int(np.sum(out.num_committed)) for out in outs)
  calls = [int(c) for out in outs for c in out.forward_calls]
  samples = [list(map(int, g)) for out in outs for g in out.generated]
  rates = [out.num_generated / dt if dt > 0 else 0.0 for out, dt in zip(outs, times)]
  return {
    "method": obj_cfg.name,
    "setting": setting.name,
    "window": setting.window,
    "threshold": tau_label(setting.tau),
    "batch_size": batch_size,
    "repeats": timed,
    "new_tokens": cfg.max_new_tokens,
    "tokens_per_second": float(np.median(rates)),
    "tokens_per_second_mean": generated / seconds if seconds > 0 else 0.0,
    "tokens_per_step": committed / steps if steps else 0.0,
    "forward_calls": float(np.mean(calls)),
    "seconds": seconds,
    "compile_seconds": max(first - seconds / timed, 0.0),
    "compiled_programs": compiles.compiled_programs() - programs,
    # the cold run: the compiling call's wall clock counted with the timed ones
    "tokens_per_second_with_compile": (generated + outs[0].num_generated) / (first + seconds)
    if first + seconds > 0
    else 0.0,
    "samples": samples,
  }


def speed_eval(
  model,
  params,
  tokenizer,
  obj_cfg,
  seq_len: int,
  *,
  settings: Optional[List[DecodeSetting]] = None,
  batch_sizes: Sequence[int] = (1, 8),
  repeats: int = 2,
  greedy: bool = False,
  top_p: float = 0.95,
  seed: int = 0,
  max_new_tokens: Optional[int] = None,
  keep_samples: bool = False,
) -> List[Dict[str, Any]]:
  """`measure` for every setting x batch size; samples dropped unless `keep_samples`."""
  settings = settings or decoding_settings(obj_cfg)
  rows = []
  for setting in settings:
    for bs in batch_sizes:
      row = measure(
        model,
        params,
        tokenizer,
        obj_cfg,
        seq_len,
        setting,
        batch_size=int(bs),
        repeats=repeats,
        greedy=greedy,
        top_p=top_p,
        seed=seed,
        max_new_tokens=max_new_tokens,
      )
      if not keep_samples:
        row.pop("samples")
      rows.append(row)
  return rows


# ----------------------------------------------------------------------------- sample statistics
def unigram_entropy(ids: Sequence[int]) -> float:
  """Entropy (nats) of the token frequencies of one sample (0 for an empty sample)."""
  if not len(ids):
    return 0.0
  counts = np.array(list(collections.Counter(int(i) for i in ids).values()), np.float64)
  p = counts / counts.sum()
  return float(-np.sum(p * np.log(p)))


def distinct_n(samples: Sequence[Sequence[int]], n: int) -> float:
  """Unique n-grams / total n-grams over all samples (0 if there are none)."""
  grams = [tuple(s[i : i + n]) for s in samples for i in range(len(s) - n + 1)]
  return len(set(grams)) / len(grams) if grams else 0.0


def same_tokenizer(a, b) -> bool:
  """Whether two tokenizers map text to the same ids (same vocabulary and specials)."""
  try:
    return a.hf.to_str() == b.hf.to_str() and (a.bos_id, a.eos_id, a.pad_id, a.mask_id) == (
      b.bos_id,
      b.eos_id,
      b.pad_id,
      b.mask_id,
    )
  except AttributeError:
    return a is b


def _make_judge_nll(model, obj_cfg):
  """jit(params, tokens, attention) -> (nll_sum [B], num_tokens [B]): the judge's own bound."""
  objective = objectives.get(obj_cfg.name)

  @jax.jit
  def fn(params, tokens, attention):
    _, m = jax.vmap(
      lambda t, a: objective.loss(
        obj_cfg,
        model,
        params,
        {"tokens": t[None], "attention_mask": a[None]},
        jax.random.key(0),
        train=False,
      )
    )(tokens, attention)
    return m["nll_sum"], m["num_tokens"]

  return fn


def generative_perplexity(
  judge, sample_ids: Sequence[Sequence[int]], tokenizer, *, batch_size: int = 16
) -> Dict[str, Any]:
  """Gen PPL of samples under an AR judge (`workdir.InferenceState` of a run whose method has an
  exact likelihood).

  Each sample is scored as BOS + tokens (cut to the judge's context length), every sample token a
  target, BOS excluded. Returns {gen_ppl, gen_nll, num_tokens, retokenized}.
  """
  if not objectives.get(judge.objective_config.name).exact_likelihood:
    raise ValueError(
      f"the judge must be an AR run (an exact likelihood); got "
      f"objective={judge.objective_config.name!r}"
    )
  jt = judge.tokenizer
  length = int(judge.config.seq_len)
  retok = not same_tokenizer(tokenizer, jt)
  rows = []
  for ids in sample_ids:
    ids = [int(i) for i in ids]
    if retok:
      ids = list(jt.encode(tokenizer.decode(ids)))
    else:
      ids = [i for i in ids if i != jt.mask_id]
    rows.append([int(jt.bos_id)] + ids[: length - 1])
  rows = [r for r in rows if len(r) > 1]
  if not rows:
    return {"gen_ppl": float("nan"), "gen_nll": float("nan"), "num_tokens": 0, "retokenized": retok}
  fn = _make_judge_nll(workdir_lib.inference_model(judge.model_config), judge.objective_config)
  total, count = 0.0, 0.0
  for i in range(0, len(rows), batch_size):
    chunk = rows[i : i + batch_size]
    tok = np.full((batch_size, length), jt.pad_id, np.int32)
    att = np.zeros((batch_size, length), np.int32)
    for j, r in enumerate(chunk):
      tok[j, : len(r)] = r
      att[j, : len(r) - 1] = 1  # the AR loss weights label j + 1 by input j: no label after the end
    s, c = jax.device_get(fn(judge.params, jnp.asarray(tok), jnp.asarray(att)))
    total += float(np.sum(s))
    count += float(np.sum(c))
  nll = total / max(count, 1.0)
  return {
    "gen_ppl": float(math.exp(min(nll, 700.0))),
    "gen_nll": nll,
    "num_tokens": int(count),
    "retokenized": retok,
  }


def sample_stats(
  sample_ids: Sequence[Sequence[int]], tokenizer=None, *, judge=None, num_shown: int = 3
) -> Dict[str, Any]:
  """Entropy, distinct-1/2/3, mean length, gen PPL (with a judge) and a few decoded samples."""
  out: Dict[str, Any] = {
    "num_samples": len(sample_ids),
    "mean_length": float(np.mean([len(s) for s in sample_ids])) if sample_ids else 0.0,
    "unigram_entropy": float(np.mean([unigram_entropy(s) for s in sample_ids]))
    if sample_ids
    else 0.0,
  }
  for n in (1, 2, 3):
    out[f"distinct_{n}"] = distinct_n(sample_ids, n)
  if judge is not None:
    out.update(generative_perplexity(judge, sample_ids, tokenizer))
  if tokenizer is not None:
    out["examples"] = [tokenizer.decode(list(s)) for s in sample_ids[:num_shown]]
  return out


def samples_eval(
  model,
  params,
  tokenizer,
  obj_cfg,
  seq_len: int,
  *,
  num_samples: int = 16,
  batch_size: int = 8,
  settings: Optional[List[DecodeSetting]] = None,
  top_p: float = 0.95,
  seed: int = 0,
  judge=None,
  max_new_tokens: Optional[int] = None,
) -> List[Dict[str, Any]]:
  """Unconditional samples per setting (nucleus top_p) and their statistics (see module doc)."""
  settings = settings or decoding_settings(obj_cfg)
  rows = []
  for setting in settings:
    repeats = max(1, -(-num_samples // batch_size))
    m = measure(
      model,
      params,
      tokenizer,
      obj_cfg,
      seq_len,
      setting,
      batch_size=batch_size,
      repeats=repeats,
      greedy=False,
      top_p=top_p,
      seed=seed,
      max_new_tokens=max_new_tokens,
    )
    samples = m.pop("samples")[:num_samples]
    row = {
      "method": obj_cfg.name,
      "setting": m["setting"],
      "window": m["window"],
      "threshold": m["threshold"],
      "top_p": top_p,
      "tokens_per_second": m["tokens_per_second"],
      "tokens_per_step": m["tokens_per_step"],
    }
    row.update(sample_stats(samples, tokenizer, judge=judge))
    rows.append(row)
  return rows


__all__ = [
  "parse_thresholds",
  "decoding_settings",
  "with_policy",
  "measure",
  "speed_eval",
  "unigram_entropy",
  "distinct_n",
  "same_tokenizer",
  "generative_perplexity",
  "sample_stats",
  "samples_eval",
]
