"""The likelihood bound of prompt/answer rows: prompt tokens (context_mask) are never targets for any
method, so the value is the answer's NLL (answer tokens and their EOS) given the prompt, and it
equals a sum worked out by hand; the eval rows carry the context mask (issue 22).

`PosTable` stands in for the DiT: the logits of an output row are a table row indexed by the
row's position (AR: the position of the label it predicts), so each position's NLL is known
without running a network, whatever the order or the mask draw.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from setdiff_jax import objectives
from setdiff_jax.data import pairs, tasks, tokenizers
from setdiff_jax.diffusion import losses, orders
from setdiff_jax.evaluation import likelihood

pytestmark = pytest.mark.usefixtures("fast_compile")

V, PAD, BOS, EOS, MASK = 24, 0, 1, 2, 3
L, PROMPT, ANSWER = 16, 5, 6  # [BOS] 5 prompt tokens, 6 answer tokens, [EOS], 3 pads
NAMES = ("setdlm", "ar", "mdlm", "bd3lm")


@dataclasses.dataclass
class PosTable:
  shift: int = 0
  config: object = None  # read (and ignored) by likelihood.sequence_nlls
  calls: list = dataclasses.field(default_factory=list)

  def apply(
    self, variables, tokens, positions, mask, deterministic=True, rngs=None, head_start=None
  ):
    if not isinstance(tokens, jax.core.Tracer):
      self.calls.append(np.asarray(tokens))
    pos = positions[:, head_start:] if head_start else positions
    return variables["params"]["table"][pos + self.shift]


def rows(n=3, seed=0):
  """n prompt/answer rows in the `data/pairs.py` layout (different prompts and answers)."""
  rng = np.random.default_rng(seed)
  encoded = [
    ([BOS] + list(rng.integers(4, V, PROMPT)), list(rng.integers(4, V, ANSWER)) + [EOS])
    for _ in range(n)
  ]
  return pairs.pair_rows(encoded, L, PAD)


def cfg_for(name):
  return losses.ObjectiveConfig(
    name=name,
    mask_token_id=MASK,
    pad_token_id=PAD,
    eos_token_id=EOS,
    keep_clean_bos=True,
    desired_set_size=2,
    block_size=4,
  )


def position_nll(table, tokens, suppress):
  """-log softmax(table[p])[x_p] for every position p, float64 [N, L] (numpy, by hand)."""
  z = np.asarray(table, np.float64)[:L].copy()
  if suppress:
    z[:, MASK] = -np.inf
  logp = (
    z
    - np.log(np.sum(np.exp(z - z.max(-1, keepdims=True)), -1, keepdims=True))
    - z.max(-1, keepdims=True)
  )
  return -logp[np.arange(L)[None], tokens]


@pytest.mark.parametrize("name", NAMES)
def test_bound_counts_answer_tokens_only_and_equals_hand_sum(name, monkeypatch):
  batch = rows()
  tokens, att, ctx = batch["tokens"], batch["attention_mask"], batch["context_mask"]
  table = np.random.default_rng(1).normal(size=(L + 1, V)).astype(np.float32)
  cfg = cfg_for(name)
  model = PosTable(shift=1 if name == "ar" else 0)
  params = {"table": jnp.asarray(table)}
  fn = likelihood.make_row_nll_fn(model, cfg)
  nll, count = likelihood.sequence_nlls(
    model, params, cfg, tokens, att, context_mask=ctx, seed=1, batch_size=2, fn=fn
  )
  answer = np.zeros(L, bool)
  answer[1 + PROMPT : 2 + PROMPT + ANSWER] = True  # the answer and its EOS
  per_pos = position_nll(table, tokens, suppress=name != "ar")
  hand = []
  for i in range(len(tokens)):
    if name in ("setdlm", "ar"):
      # Exact log-likelihood terms (SetDLM: under any order; the logits ignore the inputs). AR
      # also scores the first pad after EOS, its stop label (SPEC §1.6).
      scored = answer.copy()
      if name == "ar":
        scored[2 + PROMPT + ANSWER] = True
      assert count[i] == scored.sum()
      hand.append(per_pos[i][scored].sum())
    else:
      # 1/t NELBO of the row's draw: the masked positions as the model saw them, t of that draw.
      key = likelihood.row_keys(1, np.array([i]), 0)[0]
      model.calls.clear()
      objectives.compute_loss(
        cfg,
        model,
        params,
        {k: jnp.asarray(v[i : i + 1]) for k, v in batch.items()},
        key,
        train=False,
      )
      xt = model.calls[-1][0, -L:]
      masked = xt == MASK
      assert not np.any(masked & ~answer), "a prompt or pad position was masked"
      block = L if name == "mdlm" else cfg.block_size
      t = np.asarray(orders.sample_mask_times(jax.random.split(key, 4)[0], 1, L, block))[0]
      assert count[i] == answer.sum()
      hand.append(np.sum(per_pos[i][masked] / t[masked]))
  np.testing.assert_allclose(nll[0], hand, rtol=1e-5)
  monkeypatch.setattr(likelihood, "_cached_row_nll_fn", lambda *a: fn)
  res = likelihood.likelihood_eval(model, params, cfg, tokens, att, context_mask=ctx, seed=1)
  assert res["num_tokens"] == count.sum()
  assert res["nll"] == pytest.approx(np.sum(hand) / count.sum(), rel=1e-5)
  # Without the context mask the prompt would be scored too (the bug of issue 22).
  _, count_all = likelihood.sequence_nlls(model, params, cfg, tokens, att, seed=1, fn=fn)
  assert np.all(count_all > count)


@pytest.fixture(scope="module")
def arith_tok():
  texts = [p.prompt + p.answer for p in tasks.arithmetic_pairs("train", 300, seed=0)]
  return tokenizers.train_tokenizer(texts, 280)


def arith_config(pad_targets="none"):
  from configs import reasoning_common

  c = reasoning_common.get_config("setdlm")
  c.data.task_eval_examples = 12
  c.data.pad_targets = pad_targets
  return c


@pytest.mark.parametrize("pad_targets", ["none", "eos"])
def test_eval_rows_carry_the_context_mask(arith_tok, pad_targets):
  """eval_rows gives the pair rows' context mask; with EOS-tail training rows the bound's rows
  are the `none` layout: the answer and its first EOS, nothing attended after it."""
  c = arith_config(pad_targets)
  tokens, att, ctx = likelihood.eval_rows(c, arith_tok, max_rows=10)
  test = pairs.load_pairs(c.data, "eval")[:10]
  enc, _ = pairs.encode_pairs(arith_tok, test, int(c.seq_len))
  want = pairs.pair_rows(enc, int(c.seq_len), arith_tok.pad_id)
  np.testing.assert_array_equal(tokens, want["tokens"])
  np.testing.assert_array_equal(att, want["attention_mask"])
  np.testing.assert_array_equal(ctx, want["context_mask"])
  answer_tokens = [len(a) for _, a in enc]  # the answer and its EOS
  np.testing.assert_array_equal((att & ~ctx.astype(bool)).sum(-1), answer_tokens)


def test_text_eval_rows_have_an_empty_context_mask(tok):
  from configs import default

  c = default.get_config()
  c.seq_len = 32
  c.data.train_split = "validation"
  tokens, att, ctx = likelihood.eval_rows(c, tok, max_rows=4)
  assert tokens.shape == att.shape == ctx.shape == (4, 32) and not ctx.any()
