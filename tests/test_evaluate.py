"""Evaluation: likelihood bound vs hand computation, batch-size invariance, the K-order estimate,
infill prompt construction on real Story Cloze rows, ROUGE wiring, the infill decoders, sample
statistics and generative perplexity.

Models are tiny (1 layer x 32, vocab 40, L <= 16) so compilation stays at a few seconds a function.
"""

import functools
import math
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from setdiff_jax import sampling
from setdiff_jax.diffusion import losses
from setdiff_jax.workdir import load as workdir_lib
from setdiff_jax.data import sources, tokenizers
from setdiff_jax.evaluation import generation, infill, likelihood
from setdiff_jax.models import init_params
from setdiff_jax.models.dit import DiT, DiTConfig

from conftest import CLOZE_FIXTURE

V = 40
PAD, BOS, EOS, MASK = 0, 2, 3, 4


@pytest.fixture(scope="module", autouse=True)
def _fast_compile():
  """Compilation dominates these tiny functions; most XLA passes are skipped (restored after)."""
  previous = jax.config.values["jax_disable_most_optimizations"]
  jax.config.update("jax_disable_most_optimizations", True)
  yield
  jax.config.update("jax_disable_most_optimizations", previous)


def tiny_model(objective="setdlm", head_scale=1.0, seed=0):
  cfg = DiTConfig(
    vocab_size=V,
    hidden_size=32,
    num_layers=1,
    num_heads=2,
    cond_dim=16,
    dropout=0.0,
    adaln=objective in ("mdlm", "bd3lm"),
  )
  params = init_params(cfg, jax.random.key(seed))
  if head_scale:
    params = dict(params)
    params["head"] = dict(params["head"])
    params["head"]["kernel"] = head_scale * jax.random.normal(
      jax.random.key(seed + 1), params["head"]["kernel"].shape
    )
  return DiT(cfg), params


def obj_config(name, **kw):
  return losses.ObjectiveConfig(
    name=name,
    mask_token_id=MASK,
    pad_token_id=PAD,
    eos_token_id=EOS,
    desired_set_size=2,
    block_size=4,
    **kw,
  )


def rows(n=5, length=12, seed=0):
  """BOS-led rows; row 1 right-padded, row 2 holds a pad-id token among real tokens."""
  rng = np.random.default_rng(seed)
  tok = rng.integers(5, V, (n, length)).astype(np.int32)
  tok[:, 0] = BOS
  att = np.ones_like(tok)
  tok[1, 7:], att[1, 7:] = PAD, 0
  tok[2, 5] = PAD
  return tok, att


# ----------------------------------------------------------------------------- likelihood
@functools.lru_cache(maxsize=None)
def _jitted_apply(model):
  return jax.jit(
    lambda params, tokens, positions, mask: model.apply(
      {"params": params}, tokens[None], positions[None], mask[None], deterministic=True
    )[0]
  )


def _logits_at(model, params, tokens, positions, mask, row, size=16):
  """Logits of query `row` from one forward over `tokens` (padded to `size` so that the jitted
  forward compiles once; padded slots are keys no real query sees)."""
  n = len(tokens)
  full = np.eye(size, dtype=bool)
  full[:n, :n] = mask
  pad = lambda a: np.concatenate([np.asarray(a, np.int32), np.zeros(size - n, np.int32)])
  out = _jitted_apply(model)(
    params, jnp.asarray(pad(tokens)), jnp.asarray(pad(positions)), jnp.asarray(full)
  )
  return np.asarray(out[row], np.float64)


def _log_softmax(z):
  z = z - z.max()
  return z - np.log(np.sum(np.exp(z)))


def _hand_setdlm_row_nll(model, params, cfg, tok, att, key):
  """One row's SetDLM bound for the order drawn with `key`, by hand: the sum over the order of
  -log p(x_sigma(r) | x_sigma(<r)), each conditional from its own forward (clean prefix causal,
  one mask query seeing all of it), the BOS slot and pad-id targets dropped. Returns (nll, count)."""
  order = np.asarray(likelihood.row_order(cfg, jnp.asarray(tok), jnp.asarray(att), key))
  assert order[0] == 0 and sorted(order.tolist()) == list(range(len(tok)))
  assert set(order[att.sum() :].tolist()) == set(np.nonzero(att == 0)[0].tolist())
  row_nll, count = 0.0, 0
  for r in range(1, len(tok)):
    p = order[r]
    if not att[p] or tok[p] == PAD:
      continue
    prev = order[:r]
    tokens = np.concatenate([tok[prev], [MASK]])
    positions = np.concatenate([prev, [p]])
    mask = np.tril(np.ones((r + 1, r + 1), bool))
    mask[-1, :] = True
    z = _logits_at(model, params, tokens, positions, mask, r)
    z[MASK] = -np.inf
    row_nll -= _log_softmax(z)[tok[p]]
    count += 1
  return row_nll, count


def test_setdlm_bound_equals_hand_computation():
  model, params = tiny_model("setdlm")
  cfg = obj_config("setdlm")
  tok, att = rows()
  nll, count = likelihood.sequence_nlls(model, params, cfg, tok, att, seed=1, batch_size=4)
  keys = likelihood.row_keys(1, np.arange(len(tok)), 0)
  hand_total, hand_count = 0.0, 0
  for i in range(len(tok)):
    row_nll, row_count = _hand_setdlm_row_nll(model, params, cfg, tok[i], att[i], keys[i])
    np.testing.assert_allclose(nll[0, i], row_nll, rtol=2e-5)
    hand_total += row_nll
    hand_count += row_count
  assert (
    count.sum() == hand_count == (att.sum() - len(tok) - 1)
  )  # minus BOS slots, minus the pad id
  res = likelihood.likelihood_eval(model, params, cfg, tok, att, num_orders=1, seed=1)
  np.testing.assert_allclose(res["nll"], hand_total / hand_count, rtol=2e-5)
  np.testing.assert_allclose(res["ppl"], math.exp(hand_total / hand_count), rtol=1e-4)
  np.testing.assert_allclose(res["bpd"], hand_total / hand_count / math.log(2), rtol=2e-5)


def test_setdlm_k_order_estimate_equals_hand_computation():
  """K = 3 orders: draw k of row i uses row_keys(seed, i, k); the K estimate is
  -sum_i log mean_k exp(-nll[k, i]) / tokens, the one-order bound is draw 0, meanK the mean."""
  model, params = tiny_model("setdlm")
  cfg = obj_config("setdlm")
  tok, att = rows(n=3)
  k_orders, seed = 3, 4
  hand = np.zeros((k_orders, len(tok)))
  for k in range(k_orders):
    keys = likelihood.row_keys(seed, np.arange(len(tok)), k)
    for i in range(len(tok)):
      hand[k, i], _ = _hand_setdlm_row_nll(model, params, cfg, tok[i], att[i], keys[i])
  assert np.ptp(hand, 0).min() > 1e-3  # the orders differ, so the log-mean-exp is not draw 0
  res = likelihood.likelihood_eval(model, params, cfg, tok, att, num_orders=k_orders, seed=seed)
  tokens = res["num_tokens"]
  row_k = -np.log(np.mean(np.exp(-hand), 0))
  np.testing.assert_allclose(res["K_nll"], row_k.sum() / tokens, rtol=2e-5)
  np.testing.assert_allclose(res["nll"], hand[0].sum() / tokens, rtol=2e-5)
  np.testing.assert_allclose(res["meanK_nll"], hand.mean(0).sum() / tokens, rtol=2e-5)
  assert res["K_nll"] < res["meanK_nll"]  # Jensen: the K-order bound is the tighter one


def test_ar_nll_equals_hand_computation():
  model, params = tiny_model("ar")
  cfg = obj_config("ar")
  tok, att = rows(n=3, length=10)
  res = likelihood.likelihood_eval(model, params, cfg, tok, att, num_orders=4)
  total, count = 0.0, 0
  for i in range(len(tok)):
    for j in range(tok.shape[1] - 1):
      if not att[i, j]:  # label j+1 is weighted by the input-side mask (SPEC §1.6)
        continue
      z = _logits_at(
        model, params, tok[i, : j + 1], np.arange(j + 1), np.tril(np.ones((j + 1, j + 1), bool)), j
      )
      total -= _log_softmax(z)[tok[i, j + 1]]
      count += 1
  assert res["num_tokens"] == count and res["num_draws"] == 1
  np.testing.assert_allclose(res["nll"], total / count, rtol=2e-5)
  assert res["K_nll"] == res["nll"]


def test_uniform_model_bound_is_log_vocab():
  """A zero output head is uniform over the V - 1 non-mask tokens: every bound is log(V - 1)."""
  model, params = tiny_model("setdlm", head_scale=0.0)
  tok, att = rows()
  res = likelihood.likelihood_eval(model, params, obj_config("setdlm"), tok, att, num_orders=3)
  np.testing.assert_allclose(
    [res["nll"], res["K_nll"], res["meanK_nll"]], math.log(V - 1), rtol=1e-6
  )
  np.testing.assert_allclose(res["ppl"], V - 1, rtol=1e-5)


@pytest.mark.parametrize("name", ["setdlm", "mdlm", "bd3lm", "ar"])
def test_batch_size_invariance(name):
  model, params = tiny_model(name)
  cfg = obj_config(name)
  tok, att = rows(n=7, length=8, seed=3)
  fn = likelihood.make_row_nll_fn(model, cfg)
  a, ca = likelihood.sequence_nlls(model, params, cfg, tok, att, num_draws=2, batch_size=3, fn=fn)
  b, cb = likelihood.sequence_nlls(model, params, cfg, tok, att, num_draws=2, batch_size=8, fn=fn)
  np.testing.assert_allclose(a, b, rtol=1e-5)
  np.testing.assert_array_equal(ca, cb)
  if name != "ar":  # the two draws differ: per-draw keys are in use
    assert not np.allclose(a[0], a[1])
  # Evaluating the second half on its own, with its global row offset, gives the same values.
  c, _ = likelihood.sequence_nlls(
    model, params, cfg, tok[4:], att[4:], num_draws=2, batch_size=3, row_offset=4, fn=fn
  )
  np.testing.assert_allclose(c, a[:, 4:], rtol=1e-5)


def test_k_order_estimate():
  model, params = tiny_model("setdlm", head_scale=2.0)
  cfg = obj_config("setdlm")
  tok, att = rows(n=6, length=12, seed=5)
  one = likelihood.likelihood_eval(model, params, cfg, tok, att, num_orders=1, seed=1)
  assert one["K_nll"] == one["nll"]  # K = 1 is the one-order bound
  gaps = []
  for seed in range(1, 5):
    r = likelihood.likelihood_eval(model, params, cfg, tok, att, num_orders=6, seed=seed)
    assert r["K_nll"] <= r["meanK_nll"] + 1e-9  # log-mean-exp >= mean, row by row
    gaps.append(r["nll"] - r["K_nll"])
  assert np.mean(gaps) > 0  # tighter than the one-order bound on average
  # MDLM: the K-draw value is the mean of K NELBO draws.
  m_model, m_params = tiny_model("mdlm")
  r = likelihood.likelihood_eval(m_model, m_params, obj_config("mdlm"), tok, att, num_orders=3)
  assert r["K_nll"] == r["meanK_nll"] and "NELBO" in r["estimator_K"]


def test_logmeanexp():
  x = np.array([[0.0, -1000.0], [math.log(3.0), -1000.0]])
  np.testing.assert_allclose(likelihood.logmeanexp(x, 0), [math.log(2.0), -1000.0])


# ----------------------------------------------------------------------------- infill
@pytest.fixture(scope="module")
def bpe():
  """A small byte-level BPE trained on the corpus's validation split (a fraction of a second)."""
  return tokenizers.train_tokenizer(sources.embedded_corpus("validation"), 512)


def _check_cloze_settings(path, n):
  """Both settings cut each story into prefix / middle / suffix that join back to it."""
  stories = infill.read_cloze(path)
  one = infill.cloze_examples(path, "1sent")
  three = infill.cloze_examples(path, "3sent")
  assert len(stories) == len(one) == len(three) == n
  for ex1, ex3, s in zip(one[:50], three[:50], stories[:50]):
    story = " ".join(s[f"s{i}"] for i in range(1, 6))
    assert " ".join([ex1.prefix, ex1.middle, ex1.suffix]) == story
    assert " ".join([ex3.prefix, ex3.middle, ex3.suffix]) == story
  return one, three


def test_cloze_examples_on_fixture_rows():
  """The committed stand-in (tests/data/cloze_fixture.csv: the Story Cloze columns, stories
  written for the tests, quoted commas, both AnswerRightEnding values)."""
  one, three = _check_cloze_settings(str(CLOZE_FIXTURE), 24)
  assert one[0].prefix == (
    "Tom wanted to learn to bake bread. He bought flour, yeast and a large bowl."
  )
  assert one[0].middle == "His first loaf came out flat and hard."
  assert one[0].suffix == (
    "He read about kneading and tried again. The second loaf rose high and tasted good."
  )
  assert three[0].prefix == "Tom wanted to learn to bake bread."
  assert three[0].middle == (
    "He bought flour, yeast and a large bowl. His first loaf came out flat and hard. "
    "He read about kneading and tried again."
  )
  # Story 2 has AnswerRightEnding = 2: its suffix ends with the second candidate.
  assert one[1].suffix.endswith("Mia thanked him and went inside.")
  assert three[0].suffix == "The second loaf rose high and tasted good."


def test_cloze_csv_with_a_bom_or_a_short_row(tmp_path):
  """Probe round 11: a copy saved with a BOM was "missing columns ['InputStoryid']", and a row
  with too few columns raised AttributeError. Now the BOM is read, the short row named."""
  lines = CLOZE_FIXTURE.read_text(encoding="utf-8").splitlines(keepends=True)
  bom = tmp_path / "bom.csv"
  bom.write_text("".join(lines), encoding="utf-8-sig")
  assert infill.read_cloze(str(bom)) == infill.read_cloze(str(CLOZE_FIXTURE))
  short = tmp_path / "short.csv"
  short.write_text("".join(lines[:3]) + "abc,Only one sentence.\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"short.csv: line 4 has too few columns \(no Input"):
    infill.read_cloze(str(short))


def test_cloze_examples_on_real_rows(shared_data):
  """The real file (not redistributable, so not in the repository): its layout and first rows."""
  path = str(shared_data / "rocstories-cloze-val-2016.csv")
  one, three = _check_cloze_settings(path, 1871)
  assert one[0].prefix == (
    "Rick grew up in a troubled household. He never found good support in "
    "family, and turned to gangs."
  )
  assert one[0].middle == "It wasn't long before Rick got shot in a robbery."
  assert one[0].suffix == "The incident caused him to turn a new leaf. He is happy now."
  assert three[0].prefix == "Rick grew up in a troubled household."
  assert three[0].middle == (
    "He never found good support in family, and turned to gangs. It wasn't "
    "long before Rick got shot in a robbery. The incident caused him to "
    "turn a new leaf."
  )
  assert three[0].suffix == "He is happy now."
  # Story 3 has AnswerRightEnding = 2: its suffix ends with the second candidate.
  assert one[2].suffix.endswith("Sarah decided that she preferred her home over Europe.")


def test_cloze_canvas_construction(bpe):
  path = str(CLOZE_FIXTURE)
  for setting in infill.CLOZE_SETTINGS:
    for ex in infill.cloze_examples(path, setting)[:20]:
      t = infill.tokenize_example(bpe, ex, bpe.mask_id)
      pre, mid, suf = (
        bpe.encode(ex.prefix),
        bpe.encode(" " + ex.middle),
        bpe.encode(" " + ex.suffix),
      )
      assert t.canvas == [bpe.bos_id] + pre + [bpe.mask_id] * len(mid) + suf + [bpe.eos_id]
      assert t.span == (1 + len(pre), 1 + len(pre) + len(mid)) and t.middle_ids == mid
      assert t.prompt == [bpe.bos_id] + pre
      story = " ".join([ex.prefix, ex.middle, ex.suffix])
      assert bpe.decode(pre + mid + suf) == story  # the gap sits on token boundaries
  examples = infill.cloze_examples(path, "1sent")
  lengths = [len(infill.tokenize_example(bpe, ex, bpe.mask_id).canvas) for ex in examples]
  limit = int(np.median(lengths))
  kept, skipped = infill.tokenize_examples(bpe, examples, bpe.mask_id, limit)
  assert skipped == sum(n > limit for n in lengths) > 0
  assert len(kept) + skipped == len(examples) and all(len(k.canvas) <= limit for k in kept)


def test_cloze_missing_file_message(tmp_path):
  with pytest.raises(FileNotFoundError, match="Story Cloze CSV not found"):
    infill.read_cloze(str(tmp_path / "nope.csv"))


def test_corpus_examples(bpe):
  examples, skipped = infill.corpus_examples(bpe, max_length=64, num_examples=10)
  assert len(examples) == 10 and skipped > 0
  for ex in examples:
    n = len(ex.prefix_ids) + len(ex.middle_ids) + len(ex.suffix_ids)
    assert 24 <= n <= 62 and len(ex.prefix_ids) == n // 3
    assert len(ex.middle_ids) == (2 * n) // 3 - n // 3
    t = infill.tokenize_example(bpe, ex, bpe.mask_id)
    assert len(t.canvas) == n + 2 and t.middle_len == len(ex.middle_ids)


def test_rouge_known_pair():
  r = infill.rouge_scores(["the cat sat on the mat", "a b c"], ["the cat is on the mat", "a b c"])
  # Pair 1: 5/6 unigrams, 3/5 bigrams, LCS 5 of 6 in both; pair 2 identical.
  np.testing.assert_allclose(r["per_example"]["rouge1"], [100 * 5 / 6, 100.0])
  np.testing.assert_allclose(r["per_example"]["rouge2"], [60.0, 100.0])
  np.testing.assert_allclose(r["per_example"]["rougeL"], [100 * 5 / 6, 100.0])
  np.testing.assert_allclose(r["rouge2"], 80.0)


def _items(n=3, seed=0):
  """Token-level infill items of different lengths (ids only)."""
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    a, m, b = 2 + i, 3 + 2 * i, 4 - i
    ids = rng.integers(5, V, a + m + b).tolist()
    ex = infill.InfillExample(str(i), "p", "m", "s", ids[:a], ids[a : a + m], ids[a + m :])
    out.append(infill.tokenize_example(type("T", (), {"bos_id": BOS, "eos_id": EOS})(), ex, MASK))
  return out


@pytest.mark.parametrize("method", ["setdlm", "mdlm", "ar", "bd3lm"])
def test_decode_infill(method):
  model, params = tiny_model(method, head_scale=3.0)
  items = _items()
  cfg = sampling.SamplerConfig(
    mask_token_id=MASK,
    eos_token_id=EOS,
    pad_token_id=PAD,
    bos_token_id=BOS,
    window=2,
    block_size=4,
    max_length=16,
  )
  out = infill.decode_infill(method, model, params, items, cfg, batch_size=2)
  assert [len(m) for m in out["middles"]] == [t.middle_len for t in items]
  assert all(MASK not in m for m in out["middles"])
  assert out["tokens"] == sum(t.middle_len for t in items)
  # greedy with the cache in position order: the seed draws nothing (why evaluate.py refuses
  # --sampling_seed with --eval=infill alone); seed is not a static field, so no new compile
  reseeded = infill.decode_infill(method, model, params, items, cfg.replace(seed=7), batch_size=2)
  assert reseeded["middles"] == out["middles"]
  # pinned shapes: every batch runs one program (none if an earlier test compiled it)
  assert out["compiled_programs"] <= 1 and out["wall_seconds_with_compile"] >= out["seconds"]
  if method in ("setdlm", "mdlm"):  # one token per step, +1 context-encoding call (set sampler)
    assert out["steps"] == out["committed"] == out["tokens"]
    assert out["forward_calls"] == out["tokens"] + (len(items) if method == "setdlm" else 0)
  # Filler rows and batch padding do not change a row's result: decode item 1 on its own.
  t = items[1]
  if method == "setdlm":
    alone = sampling.set_infill(model, params, [t.canvas], cfg.replace(stop_at_eos=False))
    assert out["middles"][1] == alone.canvas[0, t.span[0] : t.span[1]].tolist()
  elif method == "mdlm":
    alone = infill.mdlm_infill(model, params, [t.canvas], cfg)
    assert out["middles"][1] == alone["canvas"][0, t.span[0] : t.span[1]].tolist()
  elif method == "ar":
    alone = sampling.ar_generate(
      model, params, [t.prompt], cfg.replace(max_new_tokens=t.middle_len, stop_at_eos=False)
    )
    assert out["middles"][1] == alone.generated[0]


# ----------------------------------------------------------------------------- samples
def test_unigram_entropy_and_distinct_n():
  assert generation.unigram_entropy([1, 1, 2, 2]) == pytest.approx(math.log(2))
  assert generation.unigram_entropy([7, 7, 7]) == 0.0
  assert generation.distinct_n([[1, 2, 1, 2], [1, 2]], 1) == pytest.approx(2 / 6)
  assert generation.distinct_n([[1, 2, 1, 2], [1, 2]], 2) == pytest.approx(2 / 4)
  assert generation.parse_thresholds(["off", "0.9"]) == [None, 0.9]


def test_generative_perplexity_equals_hand_ar_nll():
  """A random-head AR judge: gen NLL = the sum over samples of -log p(x_j | BOS x_<j) from causal
  forwards (every sample token a target, BOS not, M ids dropped, no mask suppression) / tokens."""
  model, params = tiny_model("ar")
  tok = types.SimpleNamespace(bos_id=BOS, eos_id=EOS, pad_id=PAD, mask_id=MASK)
  judge = workdir_lib.InferenceState(
    config=ml_collections.ConfigDict({"seq_len": 12}),
    model_config=model.config,
    objective_config=obj_config("ar"),
    params=params,
    tokenizer=tok,
    step=0,
  )
  rng = np.random.default_rng(3)
  samples = [rng.integers(5, V, n).tolist() for n in (4, 9, 20)]  # the last one is cut to L
  samples[1][2] = MASK
  total, count = 0.0, 0
  for ids in samples:
    row = [BOS] + [i for i in ids if i != MASK][:11]
    for j in range(len(row) - 1):
      z = _logits_at(model, params, row, np.arange(len(row)), np.tril(np.ones((len(row),) * 2)), j)
      total -= _log_softmax(z)[row[j + 1]]
      count += 1
  r = generation.generative_perplexity(judge, samples, tok, batch_size=2)
  assert r["num_tokens"] == count == 4 + 8 + 11 and not r["retokenized"]
  np.testing.assert_allclose(r["gen_nll"], total / count, rtol=2e-5)
  np.testing.assert_allclose(r["gen_ppl"], math.exp(total / count), rtol=1e-4)


def test_generative_perplexity_of_a_uniform_judge(bpe):
  """A zero-head AR judge is uniform over its V tokens (no mask suppression): gen PPL = V."""
  cfg = DiTConfig(vocab_size=bpe.vocab_size, hidden_size=32, num_layers=1, num_heads=2, dropout=0.0)
  judge = workdir_lib.InferenceState(
    config=ml_collections.ConfigDict({"seq_len": 32}),
    model_config=cfg,
    objective_config=obj_config("ar"),
    params=init_params(cfg, jax.random.key(0)),
    tokenizer=bpe,
    step=0,
  )
  samples = [bpe.encode("It was a truth universally acknowledged."), [bpe.bos_id] * 40]
  r = generation.generative_perplexity(judge, samples, bpe)
  assert not r["retokenized"]
  assert r["num_tokens"] == len(samples[0]) + 31  # the second sample is cut to the context
  np.testing.assert_allclose(r["gen_ppl"], bpe.vocab_size, rtol=1e-4)
  stats = generation.sample_stats(samples, bpe, judge=judge)
  assert stats["num_samples"] == 2 and stats["gen_ppl"] == pytest.approx(r["gen_ppl"])
