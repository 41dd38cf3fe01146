"""The prompts an RL run draws: the task's train pairs as its SFT run encoded them.

`encoded_pool` applies the SFT run's `data.overflow` (`pairs.encode_pairs`, as its training rows:
`skip` leaves out the pairs longer than seq_len, `truncate_prompt` keeps a long prompt's last
tokens), so the pool holds the prompts SFT trained on, each beside its reference answer;
`warn_short_n` says when one N for every row cannot hold some of those answers.
"""

from __future__ import annotations

from absl import logging

from setdiff_jax.config.run import RunConfig
from setdiff_jax.data import pairs
from setdiff_jax.evaluation import accuracy


def prompt_pool(run, tokenizer):
  """(pairs, encoded prompts) of the task's train split, as the SFT run read them (`encoded_pool`)."""
  pool, prompts, _ = encoded_pool(run, tokenizer)
  return pool, prompts


def encoded_pool(run, tokenizer):
  """(pairs, encoded prompts [BOS] + prompt, answer lengths with EOS) of the task's train split,
  under the SFT run's `data.overflow` rule (`pairs.encode_pairs`, as its training rows): `skip`
  leaves out the pairs that did not fit seq_len, `truncate_prompt` keeps a long prompt's last
  tokens. The pairs stay aligned with their prompts (the references of the rewards)."""
  pool = pairs.load_pairs(run.data, "train")
  # every step's accuracy metric (and the exact_match reward) reads them: fail before anything
  accuracy.check_references(pool, "hash", "RL reads '#### ANSWER' final answers: end each with one")
  style = run.data.get("prompt_style", "plain")
  kept, stats = pairs.encode_pairs(
    tokenizer,
    pool,
    int(run.seq_len),
    overflow=run.data.get("overflow", "error"),
    prompt_style=style,
  )
  pool = [pool[i] for i in stats["kept_indices"]]  # `skip` left some out: the rest, in order
  return pool, [p for p, _ in kept], [len(a) for _, a in kept]


def warn_short_n(run: RunConfig, n: int, longest: int, answer_lens):
  """One warning line when N new tokens cannot hold the reference answer (+ EOS) of some train
  prompts: their rollouts are cut at N tokens, so a reward that needs an answer as long as the
  reference's (the '#### n' line at its end) never comes. A warning, not a refusal: a completion
  may answer in fewer tokens than the reference's worked solution."""
  short = sum(a > n for a in answer_lens)
  if not short:
    return
  most = int(run.seq_len) - longest
  if int(run.rl.max_new_tokens) and n < most:
    fix = f"raise --config.rl.max_new_tokens (at most {most} = seq_len - the longest prompt)"
  else:
    fix = (
      f"N = seq_len {run.seq_len} - the longest train prompt ({longest} tokens) is the most that "
      "fits every row (one N for all rows); an SFT run with a larger seq_len, or without its "
      "longest prompts, leaves more"
    )
  logging.warning(
    "rl.max_new_tokens: N=%d new tokens cannot hold the reference answer (+EOS) of %d of the %d "
    "train prompts (longest answer %d tokens): their rollouts are cut before that length; %s",
    n,
    short,
    len(answer_lens),
    max(answer_lens),
    fix,
  )


__all__ = ["prompt_pool", "encoded_pool", "warn_short_n"]
