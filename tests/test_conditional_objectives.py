"""Prompt/answer rows in the four objectives: context tokens are never targets and never masked,
padding and prompt length do not change an answer's loss, and BD3LM leaves blocks that hold
context alone (SPEC §1.4, §1.6 masking step 3).

`TableModel` stands in for the DiT: the logits of an output row are a learnable table indexed by
the row's *position* (AR: the position of the label it predicts), and every call records its
input tokens. So d loss / d table[p] != 0 exactly when position p carries loss, and the recorded
noisy inputs show what was masked.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import random_params
from setdiff_jax import objectives
from setdiff_jax.diffusion import losses
from setdiff_jax.models.dit import DiT, DiTConfig

pytestmark = pytest.mark.usefixtures("fast_compile")

V, PAD, BOS, EOS, MASK = 24, 0, 1, 2, 3
NAMES = ("setdlm", "ar", "mdlm", "bd3lm")


@dataclasses.dataclass
class TableModel:
  shift: int = 0  # AR: output row j predicts position j + 1
  calls: list = dataclasses.field(default_factory=list)

  def apply(
    self, variables, tokens, positions, mask, deterministic=True, rngs=None, head_start=None
  ):
    self.calls.append(np.asarray(tokens))
    pos = positions[:, head_start:] if head_start else positions
    return variables["params"]["table"][pos + self.shift]


def pair_rows(prompt_len, answer_len, seq_len, batch=1, seed=0):
  """[BOS] prompt answer [EOS] pad..., context on BOS + prompt (the pairs layout)."""
  rng = np.random.default_rng(seed)
  n = 1 + prompt_len + answer_len + 1
  tokens = np.full((batch, seq_len), PAD, np.int32)
  row = np.concatenate(
    [[BOS], rng.integers(4, V, prompt_len), rng.integers(4, V, answer_len), [EOS]]
  )
  tokens[:, :n] = row
  attn = np.zeros((batch, seq_len), np.int32)
  attn[:, :n] = 1
  ctx = np.zeros((batch, seq_len), np.int32)
  ctx[:, : 1 + prompt_len] = 1
  return {"tokens": tokens, "attention_mask": attn, "context_mask": ctx}


def cfg_for(name, **kw):
  return losses.ObjectiveConfig(
    name=name,
    mask_token_id=MASK,
    pad_token_id=PAD,
    eos_token_id=EOS,
    keep_clean_bos=False,
    desired_set_size=2,
    block_size=4,
    **kw,
  )


def table_loss(name, batch, seed=0, train=True, table=None, **cfg_kw):
  model = TableModel(shift=1 if name == "ar" else 0)
  length = batch["tokens"].shape[1]
  if table is None:
    table = jnp.asarray(np.random.default_rng(1).normal(size=(length + 1, V)), jnp.float32)
  jb = {k: jnp.asarray(v) for k, v in batch.items()}
  fn = lambda t: objectives.compute_loss(
    cfg_for(name, **cfg_kw), model, {"table": t}, jb, jax.random.key(seed), train=train
  )[0]
  loss, grad = jax.value_and_grad(fn)(table)
  return float(loss), np.abs(np.asarray(grad)).sum(-1), model.calls


@pytest.mark.parametrize("name", NAMES)
def test_context_never_target_never_masked(name):
  batch = pair_rows(prompt_len=5, answer_len=6, seq_len=16, batch=64)
  _, grad, calls = table_loss(name, batch)
  ctx = np.arange(16) < 6
  ans = (np.arange(16) >= 6) & (np.arange(16) < 13)  # answer + EOS
  assert np.all(grad[:16][ctx] == 0), "a context position carries loss"
  assert np.all(grad[:16][ans] > 0), "an answer position never carries loss"
  pads_with_loss = np.flatnonzero(grad[:16][13:]) + 13
  # AR also learns the first pad after EOS (SPEC §1.6); no other pad ever carries loss
  assert list(pads_with_loss) == ([13] if name == "ar" else [])
  tokens = batch["tokens"]
  if name in ("mdlm", "bd3lm"):
    noisy = calls[-1][:, -16:]
    np.testing.assert_array_equal(noisy[:, ctx], tokens[:, ctx])
    assert np.any(noisy[:, ans] == MASK)
  if name == "setdlm":
    noisy = calls[-1][:, 16:]  # in order: the context leads (T = +inf)
    np.testing.assert_array_equal(noisy[:, :6], tokens[:, :6])
    assert np.all(noisy[:, 6:13] == MASK)


def test_ar_reference_weight_skips_the_first_answer_token():
  """`ar_first_answer_token=False` is the reference's input-side weight a_j (1 - c_j): label
  x_{j+1} counts iff x_j is a target, so the first answer token (position 6) never carries loss
  and the first pad (13) does; the default trains position 6 as well."""
  batch = pair_rows(prompt_len=5, answer_len=6, seq_len=16, batch=4)
  _, grad_ref, _ = table_loss("ar", batch, ar_first_answer_token=False)
  _, grad_ours, _ = table_loss("ar", batch)
  assert list(np.flatnonzero(grad_ref[:16])) == list(range(7, 14))
  assert list(np.flatnonzero(grad_ours[:16])) == list(range(6, 14))
  plain = pair_rows(prompt_len=5, answer_len=6, seq_len=16, batch=4)
  plain["context_mask"][:] = 0  # no prompt: the two weights are the same
  loss_ref, _, _ = table_loss("ar", plain, ar_first_answer_token=False)
  loss_ours, _, _ = table_loss("ar", plain)
  assert loss_ref == loss_ours


@pytest.mark.parametrize("name", NAMES)
def test_padding_and_prompt_length_do_not_change_answer_loss(name):
  """Logits that ignore the inputs: the loss is a mean over the answer's tokens only."""
  table_row = np.random.default_rng(2).normal(size=V)
  table_row[[PAD, EOS]] = table_row[9]  # every counted label (answer, EOS, AR's pad) costs the same
  row_losses = []
  for prompt_len, seq_len in ((2, 16), (2, 24), (7, 24)):
    batch = pair_rows(prompt_len, answer_len=4, seq_len=seq_len, batch=8)
    answer = np.full(4, 9)  # equal costs: every MDLM/BD3LM masked subset gives one value, and a
    # counted context or pad token (other ids) would change it
    batch["tokens"][:, 1 + prompt_len : 5 + prompt_len] = answer
    table = jnp.asarray(np.tile(table_row, (seq_len + 1, 1)), jnp.float32)
    loss, _, calls = table_loss(name, batch, seed=3, table=table)
    # MDLM/BD3LM: a row whose draw masked nothing has loss 0 (SPEC §1.6)
    with_mask = np.mean(np.any(calls[-1] == MASK, -1)) if name in ("mdlm", "bd3lm") else 1.0
    row_losses.append(loss / with_mask)
  vocab = np.arange(V) != MASK if name != "ar" else np.ones(V, bool)  # AR keeps M (SPEC §1.6)
  cost = -(table_row[9] - np.log(np.sum(np.exp(table_row[vocab]))))
  np.testing.assert_allclose(row_losses, cost, rtol=1e-5)


def test_setdlm_loss_with_real_dit_ignores_padding():
  cfg = DiTConfig(vocab_size=V, hidden_size=32, num_layers=1, num_heads=2, dropout=0.0)
  model, params = DiT(cfg), random_params(cfg)
  loss = jax.jit(
    lambda p, b, train: objectives.compute_loss(
      cfg_for("setdlm"), model, p, b, jax.random.key(0), train=train
    )[0],
    static_argnums=2,
  )
  values = []
  for seq_len in (14, 20):
    batch = pair_rows(prompt_len=4, answer_len=5, seq_len=seq_len, batch=1, seed=5)
    order = np.arange(seq_len)
    order[5:11] = [7, 5, 10, 6, 9, 8]  # context first, a fixed answer order, padding last
    batch["order"] = order[None]
    for train in (True, False):
      values.append(float(loss(params, {k: jnp.asarray(v) for k, v in batch.items()}, train)))
  np.testing.assert_allclose(values[:2], values[2:], rtol=1e-5)


def test_bd3lm_never_remasks_a_block_with_context():
  """Reference check of SPEC §1.6: 6-token context, S = 4: the mixed block 4-7 (context 4-5,
  answer 6-7) is never re-masked, so it holds exactly the masks of the t-draw; the answer-only
  block 8-11 is re-masked whenever the t-draw left it clean. The t-draw is re-derived from the
  objective's documented key split (t, mask, remask, dropout)."""
  n = 64
  batch = pair_rows(prompt_len=5, answer_len=5, seq_len=12, batch=n)  # 1+5 | 5 | EOS at 11
  model = TableModel()
  rng = jax.random.key(0)
  objectives.compute_loss(
    cfg_for("bd3lm"),
    model,
    {"table": jnp.zeros((13, V))},
    {k: jnp.asarray(v) for k, v in batch.items()},
    rng,
    train=True,
  )
  xt = model.calls[-1][:, 12:]
  t_rng, mask_rng, _, _ = jax.random.split(rng, 4)
  t = np.repeat(0.999 * np.asarray(jax.random.uniform(t_rng, (n, 3))) + 1e-3, 4, -1)
  drawn = (np.asarray(jax.random.uniform(mask_rng, (n, 12))) < t) & (np.arange(12) >= 6)
  clean_mixed = ~drawn[:, 4:8].any(-1)
  assert clean_mixed.sum() > 10  # the case exercises the rule
  np.testing.assert_array_equal(xt[:, 4:8] == MASK, drawn[:, 4:8])
  assert np.all(np.any(xt[:, 8:12] == MASK, -1))  # answer-only block: never left clean
  assert np.any(~drawn[:, 8:12].any(-1))  # ... and some of those were re-masked
