"""Bounded compiles (issue 26): length buckets, their compile count on a GSM8K-like prompt-length
mix, and bucketed decoding == unbucketed decoding (the padding slots are never attended)."""

import numpy as np
import pytest
from helpers import random_dit

from setdiff_jax.evaluation.accuracy import decode_all
from setdiff_jax.models.dit import DiTConfig
from setdiff_jax.sampling import (
  CommitPolicy,
  SamplerConfig,
  ar_generate,
  bd3lm_generate,
  mdlm_generate,
  set_generate,
)
from setdiff_jax.sampling import compiles
from setdiff_jax.sampling.config import bucket_length

TV = 48
IDS = dict(mask_token_id=3, eos_token_id=2, pad_token_id=0, bos_token_id=1)


@pytest.fixture(scope="module")
def tiny():
  """A random tiny DiT (non-zero head), drawn in NumPy."""
  cfg = DiTConfig(vocab_size=TV, hidden_size=32, num_layers=1, num_heads=2, dropout=0.0)
  return random_dit(cfg, seed=1)


def gsm8k_like_lengths(n: int, seed: int = 0):
  """Prompt lengths of a GSM8K-like mix: a long-tailed spread (here 9..60 tokens)."""
  rng = np.random.default_rng(seed)
  return np.clip(rng.lognormal(np.log(24), 0.45, size=n).astype(int), 9, 60)


def mixed_prompts(lengths, seed: int = 0):
  rng = np.random.default_rng(seed)
  return [[1] + list(rng.integers(4, TV, size=int(n) - 1)) for n in lengths]


def test_bucket_length_by_hand():
  assert [bucket_length(n, "pow2") for n in (1, 8, 9, 16, 17, 100)] == [8, 8, 16, 16, 32, 128]
  assert [bucket_length(n, (10, 20)) for n in (3, 10, 11, 20, 25)] == [10, 10, 20, 20, 25]
  assert bucket_length(13, None) == 13
  with pytest.raises(ValueError, match="length_buckets"):
    SamplerConfig(mask_token_id=3, length_buckets=(20, 10))
  assert SamplerConfig(mask_token_id=3, length_buckets=[8, 16]).length_buckets == (8, 16)


def test_gsm8k_like_mix_compiles_at_most_the_buckets(tiny):
  model, params = tiny
  lengths = gsm8k_like_lengths(24)
  prompts = mixed_prompts(lengths)
  cfg = SamplerConfig(
    **IDS, window=2, max_new_tokens=3, stop_at_eos=False, max_length=70, length_buckets="pow2"
  )
  res = decode_all(set_generate, model, params, prompts, cfg, batch_size=2)
  longest = [max(lengths[i : i + 2]) for i in range(0, len(lengths), 2)]
  buckets = {bucket_length(n, "pow2") for n in longest}
  assert len(set(longest)) > len(buckets)  # unbucketed, the mix would compile more programs
  # one program per bucket (at most: an earlier test of this process may have compiled one)
  assert 1 <= res["compiled_programs"] <= len(buckets)
  assert res["wall_seconds"] >= res["seconds"] > 0
  before = compiles.compiled_programs()
  again = decode_all(set_generate, model, params, prompts, cfg, batch_size=2)
  assert compiles.compiled_programs() == before and again["compiled_programs"] == 0
  assert again["generated"] == res["generated"]


def _eos_config(sampler, model, params, prompts, **kw):
  """A config whose EOS is a token the greedy decode of row 0 writes (so that row stops early)."""
  cfg = SamplerConfig(**IDS, stop_at_eos=False, **kw)
  first = sampler(model, params, prompts, cfg)
  return cfg.replace(stop_at_eos=True, eos_token_id=int(first.generated[0][2]))


@pytest.mark.parametrize("name", ["setdlm", "ar", pytest.param("bd3lm", marks=pytest.mark.slow)])
def test_bucketed_equals_unbucketed(tiny, name):
  model, params = tiny
  sampler, kw = {
    "setdlm": (set_generate, dict(window=3, policy=CommitPolicy("threshold", 0.3))),
    "ar": (ar_generate, {}),
    "bd3lm": (bd3lm_generate, dict(block_size=2)),
  }[name]
  prompts = mixed_prompts([5, 11, 3, 7])
  cfg = _eos_config(sampler, model, params, prompts, max_new_tokens=6, max_length=40, **kw)
  exact = sampler(model, params, prompts, cfg)
  padded = sampler(model, params, prompts, cfg.replace(length_buckets=(16, 32)))
  assert exact.canvas.shape[1] < padded.canvas.shape[1]  # the padding is there
  assert padded.generated == exact.generated
  assert padded.sequences == exact.sequences
  np.testing.assert_array_equal(padded.num_steps, exact.num_steps)
  np.testing.assert_array_equal(padded.stopped, exact.stopped)
  assert exact.stopped[0]


def test_fht_order_needs_the_model_context_and_is_unchanged_by_buckets(tiny):
  """The 'fht' reveal schedule spans max_length (SPEC §4.3), never the padded canvas: without
  max_length, or with S_max = 2W past it, it is refused; with it, buckets leave the tokens alone."""
  model, params = tiny
  with pytest.raises(ValueError, match="cache_order='fht'.*set max_length"):
    set_generate(model, params, [[5]], SamplerConfig(**IDS, window=4, cache_order="fht"))
  with pytest.raises(ValueError, match=r"2 \* window <= max_length .* use window <= 8"):
    SamplerConfig(**IDS, window=9, max_new_tokens=8, cache_order="fht", max_length=16)
  cfg = SamplerConfig(
    **IDS, window=4, max_new_tokens=8, cache_order="fht", max_length=40, stop_at_eos=False
  )
  prompts = [[5], [1, 7, 9]]
  for seed in (1, 10):  # seeds whose keys moved with the canvas width before the fix
    exact = set_generate(model, params, prompts, cfg.replace(seed=seed))
    padded = set_generate(model, params, prompts, cfg.replace(seed=seed, length_buckets="pow2"))
    assert padded.generated == exact.generated, seed
    alone = set_generate(model, params, prompts[:1], cfg.replace(seed=seed, length_buckets="pow2"))
    assert alone.generated[0] == exact.generated[0], seed


@pytest.mark.parametrize("block_size", [None, 3])
def test_unpadded_mdlm_row_is_independent_of_its_batch(tiny, block_size):
  """Without padding to max_length a row attends its own prompt + N only: next to a longer
  prompt (whose width adds M slots after it) it decodes what it decodes alone."""
  model, params = tiny
  cfg = SamplerConfig(**IDS, max_new_tokens=6, block_size=block_size, stop_at_eos=False)
  short, long = [1, 5], mixed_prompts([9])[0]
  for c in (cfg, cfg.replace(max_length=32, mdlm_pad_to_max_length=False)):
    alone = mdlm_generate(model, params, [short], c)
    beside = mdlm_generate(model, params, [short, long], c)
    assert beside.generated[0] == alone.generated[0]
    assert beside.generated[1] == mdlm_generate(model, params, [long], c).generated[0]


def _programs_over(sampler, model, params, prompts, cfgs):
  before = compiles.compiled_programs()
  outs = [sampler(model, params, prompts, c) for c in cfgs]
  return outs, compiles.compiled_programs() - before


@pytest.mark.parametrize("name", ["ar", pytest.param("bd3lm", marks=pytest.mark.slow)])
def test_generation_lengths_share_one_program(tiny, name):
  """AR / BD3LM take N as a loop argument and pad the canvas to the bucketed N: N = 5, 7
  (bucket 8) compile one program, and each gives exactly the unbucketed output (tokens, steps,
  calls, commit steps, the canvas cut to P + N): with sampling on, the per-step keys are the
  same, and the slots past P + N are never attended nor generated."""
  model, params = tiny
  sampler, kw = {"ar": (ar_generate, {}), "bd3lm": (bd3lm_generate, dict(block_size=2))}[name]
  prompts = mixed_prompts([5, 11, 3, 7])
  base = SamplerConfig(
    **IDS,
    max_length=40,
    stop_at_eos=False,
    greedy=False,
    temperature=1.0,
    length_buckets=(16, 32),
    rollout_stats=True,
    **kw,
  )
  cfgs = [base.replace(max_new_tokens=n, seed=n) for n in (5, 7)]
  exact, n_exact = _programs_over(
    sampler, model, params, prompts, [c.replace(length_buckets=None) for c in cfgs]
  )
  padded, n_padded = _programs_over(
    sampler, model, params, prompts, [c.replace(length_buckets="pow2") for c in cfgs]
  )
  assert (n_exact, n_padded) == (2, 1)  # one per N (canvas P + N) vs one for the bucket 8
  for e, p, c in zip(exact, padded, cfgs):
    assert [len(g) for g in p.generated] == [c.max_new_tokens] * len(prompts)
    assert p.generated == e.generated and p.sequences == e.sequences
    for field in ("num_steps", "forward_calls", "num_committed"):
      np.testing.assert_array_equal(getattr(p, field), getattr(e, field))
    # the canvas is cut to (the bucketed prompt width 16) + N, not to the bucket of N
    assert p.canvas.shape == p.target.shape == (len(prompts), 16 + c.max_new_tokens)
    for b in range(len(prompts)):
      np.testing.assert_array_equal(p.canvas[b][p.target[b]], e.canvas[b][e.target[b]])
      np.testing.assert_array_equal(p.commit_step[b][p.target[b]], e.commit_step[b][e.target[b]])
      np.testing.assert_allclose(
        p.token_logprob[b][p.target[b]], e.token_logprob[b][e.target[b]], rtol=1e-5, atol=1e-6
      )
  assert padded[0].generated != padded[1].generated


def test_mdlm_generation_lengths_share_one_program(tiny):
  """MDLM with a canvas padded to max_length and a block size: N is a loop argument, so N = 4, 6
  share one program (N only bounds the blocks). Greedy, with the same canvas (prompt + M up to
  max_length) and blocks of 2, N = 6 writes N = 4's tokens first, then two more."""
  model, params = tiny
  base = SamplerConfig(
    **IDS, max_length=24, stop_at_eos=False, block_size=2, mdlm_pad_to_max_length=True
  )
  outs, programs = _programs_over(
    mdlm_generate,
    model,
    params,
    mixed_prompts([5, 9]),
    [base.replace(max_new_tokens=n) for n in (4, 6)],
  )
  assert programs <= 1  # 0 if an earlier test of this process compiled the same loop
  assert [len(g) for g in outs[0].generated] == [4, 4]
  assert [len(g) for g in outs[1].generated] == [6, 6]
  assert [g[:4] for g in outs[1].generated] == outs[0].generated
  assert all(o.canvas.shape[1] == 24 for o in outs)
