"""`SamplerConfig.align_to_blocks` (the official `align_inputs_to_blocks`) for BD3LM and block-wise
MDLM on hand-worked prompts whose length P is not a multiple of the block G (issue 22).

The toy logits function counts what a query sees: a mask query at position q predicts
10 + (number of visible non-mask, non-pad keys, cache included) with a confidence that grows
with q, so greedy decoding commits the block's last mask first, and each committed value tells
how many clean keys the query saw (which shows what the cache held: a prompt token cached *and*
fed in the block would be counted twice, a finished block left out of the cache not at all).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from setdiff_jax.sampling import CommitPolicy, SamplerConfig, bd3lm_generate, mdlm_generate

pytestmark = pytest.mark.usefixtures("fast_compile")

V = 64
PAD, BOS, EOS, M = 0, 1, 2, 3


def toy(tokens, positions, mask, kv_cache):
  tok = tokens.astype(jnp.float32)[..., None]
  keys = tok if kv_cache is None else jnp.concatenate([kv_cache[0], tok], 1)
  kt = keys[..., 0]
  count = jnp.sum(mask & ((kt != M) & (kt != PAD))[:, None, :], -1)
  score = 1.0 + 0.5 * positions.astype(jnp.float32)
  logits = jnp.full(tokens.shape + (V,), -30.0).at[..., 4].set(0.0)
  logits = jnp.where(jax.nn.one_hot(10 + count % 50, V, dtype=bool), score[..., None], logits)
  return logits, (tok,)


def cfg(**kw):
  base = dict(
    mask_token_id=M,
    eos_token_id=EOS,
    pad_token_id=PAD,
    bos_token_id=BOS,
    max_new_tokens=6,
    block_size=4,
    stop_at_eos=False,
    mdlm_pad_to_max_length=False,
  )
  base.update(kw)
  return SamplerConfig(**base)


PROMPT6 = [BOS, 7, 8, 9, 10, 11]  # P = 6, G = 4: the prompt's tail [4, 6) shares grid block 1


def test_bd3lm_aligned_p6():
  out = bd3lm_generate(toy, None, [PROMPT6], cfg(align_to_blocks=True))
  # Prompt call: only the full block [0, 4) is cached. Block 0 of decoding is the grid block
  # [4, 8): the prompt tokens 10, 11 at 4, 5 are fed clean next to the masks at 6, 7.
  #   step 0: query 7 sees cache 0..3 + 4, 5 -> 6 keys -> 16 (position 7 is the most confident)
  #   step 1: query 6 sees those + 7 -> 17; the block has no mask left.
  # Block 1 [8, 12): its first step also feeds the finished block [4, 8) (prompt tail included)
  # and caches it, so its queries see 0..7: 18 at 11, then 19 at 10, 20 at 9, 21 at 8.
  np.testing.assert_array_equal(out.canvas[0, :12], PROMPT6 + [17, 16, 21, 20, 19, 18])
  np.testing.assert_array_equal(out.commit_step[0, 6:12], [1, 0, 5, 4, 3, 2])
  assert out.commit_step[0, :6].tolist() == [-1] * 6  # prompt tokens are never committed
  assert out.forward_calls.tolist() == [7] and out.num_steps.tolist() == [6]
  # Unaligned (the previous behaviour): the prompt [0, 6) is cached; block [6, 10) straddles the
  # grid: 16 at 9, 17 at 8 (sees 9), then 7 and 6 (grid block 1) never see 8, 9: 16 at 7, 17 at
  # 6; block [10, 12) sees 0..9: 20 at 11, 21 at 10.
  old = bd3lm_generate(toy, None, [PROMPT6], cfg(align_to_blocks=False))
  np.testing.assert_array_equal(old.canvas[0, 6:12], [17, 16, 17, 16, 21, 20])
  np.testing.assert_array_equal(old.commit_step[0, 6:12], [3, 2, 1, 0, 5, 4])


def test_bd3lm_aligned_prompt_shorter_than_a_block():
  # P = 2 < G: nothing is cached up front (no prompt call, as the official loop); block 0 is
  # [0, 4) with BOS, 7 fed clean: 12 at 3, 13 at 2; block 1 [4, 8) sees 0..3: 14 at 7 ... 17 at 4.
  out = bd3lm_generate(toy, None, [[BOS, 7]], cfg(align_to_blocks=True))
  np.testing.assert_array_equal(out.canvas[0, :8], [BOS, 7, 13, 12, 17, 16, 15, 14])
  np.testing.assert_array_equal(out.commit_step[0, 2:8], [1, 0, 5, 4, 3, 2])
  assert out.forward_calls.tolist() == [6]


def test_bd3lm_aligned_batch_of_mixed_phases_equals_rows_alone():
  prompts = [PROMPT6, [BOS, 7], [BOS, 7, 8, 9]]  # P % 4 = 2, 2, 0
  both = bd3lm_generate(toy, None, prompts, cfg(align_to_blocks=True))
  for i, p in enumerate(prompts):
    one = bd3lm_generate(toy, None, [p], cfg(align_to_blocks=True))
    assert both.generated[i] == one.generated[0]
    assert both.forward_calls[i] == one.forward_calls[0]
  # P % G == 0: aligned and unaligned decoding are the same.
  same = bd3lm_generate(toy, None, [[BOS, 7, 8, 9]], cfg(align_to_blocks=False))
  assert same.generated[0] == both.generated[2]
  np.testing.assert_array_equal(same.commit_step[0], both.commit_step[2, : same.canvas.shape[1]])


def test_bd3lm_aligned_block_count_is_the_officials():
  # ceil(N / G) = 2 blocks from the grid block at 4 cover [4, 12): of the span [6, 14) the last
  # P % G = 2 positions are never decoded (the official loop's block count) and are compacted.
  out = bd3lm_generate(toy, None, [PROMPT6], cfg(align_to_blocks=True, max_new_tokens=8))
  assert len(out.generated[0]) == 6
  np.testing.assert_array_equal(out.canvas[0, 12:14], [M, M])


def test_mdlm_aligned_subblocks_on_the_grid():
  # MDLM feeds the whole canvas (no cache); sub-blocks of G = 4 start at 4 (aligned) or at 6.
  out = mdlm_generate(toy, None, [PROMPT6], cfg(align_to_blocks=True))
  np.testing.assert_array_equal(out.canvas[0, 6:12], [17, 16, 21, 20, 19, 18])
  np.testing.assert_array_equal(out.commit_step[0, 6:12], [1, 0, 5, 4, 3, 2])
  assert out.forward_calls.tolist() == [6]
  old = mdlm_generate(toy, None, [PROMPT6], cfg(align_to_blocks=False))
  np.testing.assert_array_equal(old.canvas[0, 6:12], [19, 18, 17, 16, 21, 20])
  np.testing.assert_array_equal(old.commit_step[0, 6:12], [3, 2, 1, 0, 5, 4])


@pytest.mark.parametrize("generate", [bd3lm_generate, mdlm_generate])
def test_aligned_threshold_commits_only_generated_positions(generate):
  # tau below every confidence: each block commits all its masks at once, never a prompt slot.
  # Row 1 (P = 3): blocks [0, 4), [4, 8) hold 5 of its 6 positions (the official block count).
  out = generate(
    toy,
    None,
    [PROMPT6, [BOS, 7, 8]],
    cfg(align_to_blocks=True, policy=CommitPolicy("threshold", 0.5)),
  )
  np.testing.assert_array_equal(out.canvas[0, :6], PROMPT6)
  np.testing.assert_array_equal(out.canvas[1, :3], [BOS, 7, 8])
  assert out.num_steps.tolist() == [2, 2] and [len(g) for g in out.generated] == [6, 5]


def test_mdlm_one_subblock_ignores_alignment():
  # block_size None: one sub-block of N from P; aligning it would cut the span, so it is a no-op.
  a = mdlm_generate(toy, None, [PROMPT6], cfg(block_size=None, align_to_blocks=True))
  b = mdlm_generate(toy, None, [PROMPT6], cfg(block_size=None, align_to_blocks=False))
  assert a.generated == b.generated and len(a.generated[0]) == 6
  np.testing.assert_array_equal(a.commit_step, b.commit_step)


def toy_sum(tokens, positions, mask, kv_cache):
  """Like `toy`, but predicts 10 + (sum of the visible clean key tokens) % 50: it tells which
  tokens (not just how many) a query saw."""
  tok = tokens.astype(jnp.float32)[..., None]
  keys = tok if kv_cache is None else jnp.concatenate([kv_cache[0], tok], 1)
  kt = keys[..., 0]
  seen = mask & ((kt != M) & (kt != PAD))[:, None, :]
  total = jnp.sum(jnp.where(seen, kt[:, None, :], 0.0), -1).astype(jnp.int32)
  score = 1.0 + 0.5 * positions.astype(jnp.float32)
  logits = jnp.full(tokens.shape + (V,), -30.0).at[..., 4].set(0.0)
  logits = jnp.where(jax.nn.one_hot(10 + total % 50, V, dtype=bool), score[..., None], logits)
  return logits, (tok,)


@pytest.mark.parametrize("align", [False, True])
def test_bd3lm_partial_last_block_caches_the_previous_block(align):
  """N % G != 0: the last block runs past the canvas of the longest prompt (its positions are
  clamped); its fused step must still cache the true previous block. The row decoded alone
  (clamped) equals the row next to a longer prompt (a wider canvas, nothing clamped)."""
  c = cfg(align_to_blocks=align, max_new_tokens=6)
  alone = bd3lm_generate(toy_sum, None, [[BOS, 7]], c)
  wide = bd3lm_generate(toy_sum, None, [[BOS, 7], [BOS, 7, 8, 9, 10, 11, 12, 13, 14]], c)
  assert alone.generated[0] == wide.generated[0]
  np.testing.assert_array_equal(alone.commit_step[0], wide.commit_step[0, :8])
