"""The lm-evaluation-harness adapter (`setdiff_jax/evaluation/lm_eval_model.py`), offline.

A tiny conditional SetDLM is trained on the arithmetic task; lm_eval's `simple_evaluate` runs a
`generate_until` task (exact_match) and a `multiple_choice` task (acc) read from a local JSONL
file through task YAMLs (`dataset_path: json`). Checked against independent computations: the
generations equal `decoding.generate_text` on the same prompt and settings, every loglikelihood
equals the method's own eval loss on the same (context, continuation) row, and on a random AR
model the scores are the exact log-probabilities of a dense causal forward.
"""

import dataclasses
import json
import os
import runpy
import sys

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

lm_eval = pytest.importorskip("lm_eval")

from helpers import random_params  # noqa: E402
from configs import reasoning_common  # noqa: E402
from setdiff_jax import decoders, decoding, objectives, train  # noqa: E402
from setdiff_jax.evaluation import likelihood
from setdiff_jax.diffusion import masks
from setdiff_jax.diffusion import losses
from setdiff_jax.workdir import load as workdir_lib  # noqa: E402
from setdiff_jax.data import tasks  # noqa: E402
from setdiff_jax.evaluation import lm_eval_model as lem  # noqa: E402
from setdiff_jax.models.dit import DiT, DiTConfig  # noqa: E402
from setdiff_jax.sampling.config import CommitPolicy  # noqa: E402

pytestmark = pytest.mark.usefixtures("fast_compile")
L = 32
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Req:
  """The part of lm_eval's Instance the adapter reads."""

  def __init__(self, *args, task_name=None, doc_id=None):
    self.args, self.task_name, self.doc_id = tuple(args), task_name, doc_id


@pytest.fixture(scope="module")
def run(tmp_path_factory, fast_compile):
  """A tiny conditional SetDLM (S = 4, S_max = 8) trained a few steps on the arithmetic task."""
  del fast_compile
  c = reasoning_common.get_config("setdlm")
  c.model.hidden_size, c.model.num_layers, c.model.num_heads = 32, 1, 2
  c.data.task_train_examples, c.data.task_eval_examples = 64, 8
  c.batch_size, c.num_train_steps, c.warmup_steps, c.learning_rate = 8, 4, 1, 1e-2
  c.eval_every_steps = c.checkpoint_every_steps = c.log_every_steps = 4
  c.num_eval_steps, c.eval_batch_size = 1, 8
  workdir = str(tmp_path_factory.mktemp("lm_eval_run"))
  train.train_and_evaluate(c, workdir)
  return workdir


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("lm_eval_tasks")
  docs = []
  for p in tasks.arithmetic_pairs("test", 3, 0):
    body, value = p.answer.rsplit("#### ", 1)
    docs.append(
      {
        "prompt": p.prompt,
        "answer": p.answer,
        "label": 0,
        "choices": [p.answer, f"{body}#### {int(value) + 1}"],
      }
    )
  data = path / "arith.jsonl"
  data.write_text("".join(json.dumps(d) + "\n" for d in docs))
  common = (
    f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
    "test_split: test\ndoc_to_text: '{{prompt}}'\n"
  )
  (path / "arith_gen.yaml").write_text(
    "task: arith_gen\n" + common + "output_type: generate_until\ndoc_to_target: '{{answer}}'\n"
    "generation_kwargs:\n  until: ['####']\n  max_gen_toks: 16\n  do_sample: false\n"
    "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
  )
  (path / "arith_mc.yaml").write_text(
    "task: arith_mc\n" + common + "output_type: multiple_choice\ndoc_to_choice: '{{choices}}'\n"
    "doc_to_target: '{{label}}'\ntarget_delimiter: ''\n"
    "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
  )
  return path, docs


def test_simple_evaluate_matches_our_sampler_and_bound(run, task_dir, tmp_path, monkeypatch):
  monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
  path, docs = task_dir
  from lm_eval.tasks import TaskManager

  manager = TaskManager(include_path=str(path), include_defaults=False)
  res = lm_eval.simple_evaluate(
    model=lem.NAME,
    model_args=f"workdir={run},W=4,tau=0.9,batch_size=1,greedy_check=false",
    tasks=["arith_gen", "arith_mc"],
    task_manager=manager,
    log_samples=True,
  )
  assert 0.0 <= res["results"]["arith_gen"]["exact_match,none"] <= 1.0
  assert 0.0 <= res["results"]["arith_mc"]["acc,none"] <= 1.0
  assert res["config"]["model"] == lem.NAME

  state = workdir_lib.load_inference_state(run, use_ema=False)  # the run's eval_params: raw
  oc, tok = state.objective_config, state.tokenizer
  model = workdir_lib.inference_model(state.model_config, "float32")
  gens = sorted(res["samples"]["arith_gen"], key=lambda s: s["doc_id"])
  assert len(gens) == len(docs)
  for s, doc in zip(gens, docs):
    ((context, kwargs),) = [tuple(a) for a in s["arguments"]]
    assert context == doc["prompt"]
    n = 16  # max_gen_toks; 1 + len(prompt) + 16 <= L
    ours = decoding.generate_text(
      model,
      state.params,
      tok,
      oc,
      L,
      1,
      jax.random.PRNGKey(0),
      prompt=context,
      max_new_tokens=n,
      greedy=True,
      top_p=1.0,
      window=4,
      threshold=0.9,
    )[0]
    assert ours.startswith(context)
    assert s["resps"][0][0] == ours[len(context) :].split("####")[0]

  method = objectives.get(oc.name)
  for s in res["samples"]["arith_mc"]:
    for (context, continuation), [(value, is_greedy)] in zip(s["arguments"], s["resps"]):
      assert is_greedy is False  # greedy_check=false
      ctx = [tok.bos_id] + tok.encode(context)
      cont = tok.encode(continuation)
      row = ctx + cont
      batch = {
        "tokens": np.full((1, L), oc.pad_token_id, np.int32),
        "attention_mask": np.zeros((1, L), np.int32),
        "context_mask": np.zeros((1, L), np.int32),
      }
      batch["tokens"][0, : len(row)], batch["attention_mask"][0, : len(row)] = row, 1
      batch["context_mask"][0, : len(ctx)] = 1
      key = likelihood.row_keys(0, np.array([lem.request_key(context, continuation)]), 0)[0]
      _, m = method.loss(
        oc, model, state.params, method.eval_batch(oc, batch, key), key, train=False
      )
      assert float(m["num_tokens"]) == len(cont)
      np.testing.assert_allclose(value, -float(m["nll_sum"]), rtol=1e-5, atol=1e-5)


def test_is_greedy_and_errors(run):
  # The settings of the simple_evaluate test, so that the compiled loops are reused.
  lm = lem.SetDiffLM(workdir=run, window=4, threshold=0.9, batch_size=1)
  prompt = tasks.arithmetic_pairs("test", 1, 0)[0].prompt
  [out] = lm.generate_until([Req(prompt, {"until": [], "max_gen_toks": 16})])
  ctx = [lm.tokenizer.bos_id] + lm.tokenizer.encode(prompt)
  [gen] = lm._decode([ctx], lm._sampler_config(16))  # the greedy sampler's own tokens
  # Continuous batching by default; continuous=false (static batches) gives the same texts.
  reqs = [
    Req(p.prompt, {"until": [], "max_gen_toks": 16}) for p in tasks.arithmetic_pairs("test", 5, 0)
  ]
  flow = lem.SetDiffLM.from_state(lm.state, window=4, threshold=0.9, batch_size=2)
  static = lem.SetDiffLM.from_state(
    lm.state, window=4, threshold=0.9, batch_size=2, continuous="false"
  )
  assert flow.continuous and not static.continuous
  assert flow.generate_until(reqs) == static.generate_until(reqs)
  assert lm.tokenizer.decode(gen) == out and len(gen) >= 1
  other = [gen[0] + 1 if gen[0] + 1 < lm.tokenizer.vocab_size else gen[0] - 1] + gen[1:]
  assert lm._is_greedy([(ctx, gen), (ctx, other)]) == [True, False]
  # A request's value does not depend on the other requests (per-request draw keys).
  lm = lem.SetDiffLM.from_state(lm.state, window=4, threshold=0.9, batch_size=1, greedy_check=False)
  a, b = lm.loglikelihood([Req(prompt, "1+2=3"), Req("9-4\n", "9-4=5")])
  b2, a2 = lm.loglikelihood([Req("9-4\n", "9-4=5"), Req(prompt, "1+2=3")])
  assert a == a2 and b == b2
  with pytest.raises(ValueError, match=r"request 0 \(task t, doc 7\).*L = seq_len = 32"):
    lm.generate_until([Req("1+2+3+4+5+6+7+8+9" * 4, {"until": []}, task_name="t", doc_id=7)])
  with pytest.raises(ValueError, match="encodes to no tokens"):
    lm.loglikelihood([Req(prompt, "")])
  with pytest.raises(ValueError, match="not supported"):
    lm.generate_until([Req(prompt, {"until": [], "num_beams": 4})])
  with pytest.raises(ValueError, match="needs model_args workdir"):
    lem.SetDiffLM()
  with pytest.raises(FileNotFoundError, match="no such directory"):
    lem.SetDiffLM(workdir=os.path.join(run, "missing"))
  with pytest.raises(ValueError, match="unknown model_args"):
    lem.SetDiffLM(workdir=run, widow=4)
  # commit policies (sampling/policies.py) by model_args
  with pytest.raises(ValueError, match="model_args policy='nope'.*valid: threshold"):
    lem.SetDiffLM.from_state(lm.state, policy="nope")
  # named as model_args spell them: the launchers' --policy is not an lm_eval setting
  with pytest.raises(
    ValueError, match="model_args policy_arg=-1.0 for policy=entropy_bound: gamma must be >= 0"
  ):
    lem.SetDiffLM.from_state(lm.state, policy="entropy_bound", policy_arg="-1")
  # the launchers' ranges (a probe found num_orders=0 run as K = 1, seed=-5 accepted, bare
  # int() / float() errors)
  for args, what in (
    (dict(num_orders="0"), "num_orders='0': an integer >= 1"),
    (dict(seed="-5"), "seed='-5': an integer >= 0"),
    (dict(batch_size="0"), "batch_size='0': an integer >= 1"),
    (dict(window="abc"), "window='abc': an integer >= 1"),
    (dict(max_new_tokens="x"), "max_new_tokens='x': an integer >= 1"),
    (dict(threshold="abc"), "threshold / tau='abc': a number in \\(0, 1\\], or off"),
    (dict(threshold="1.5"), "threshold / tau=1.5 is out of range"),
    (dict(threshold="0"), "threshold / tau=0.0 is out of range"),  # accepted, failed later
  ):
    with pytest.raises(ValueError, match=f"^model_args {what}"):
      lem.SetDiffLM.from_state(lm.state, **args)
  with pytest.raises(ValueError, match="^model_args step='abc': an integer >= 1"):
    lem.SetDiffLM(workdir=run, step="abc")
  top = lem.SetDiffLM.from_state(lm.state, policy="topk", policy_arg="2")
  assert top._sampler_config(8).policy == CommitPolicy("topk", 2)
  assert top.get_model_info()["setting"] == "W=4 topk k=2"  # the reports' one name


def _ar_state(tok):
  cfg = DiTConfig(
    vocab_size=tok.vocab_size,
    hidden_size=32,
    num_layers=1,
    num_heads=2,
    cond_dim=16,
    dropout=0.0,
    adaln=False,
  )
  oc = losses.ObjectiveConfig(
    name="ar", mask_token_id=tok.mask_id, pad_token_id=tok.pad_id, eos_token_id=tok.eos_id
  )
  config = ml_collections.ConfigDict({"seq_len": 32})
  return workdir_lib.InferenceState(config, cfg, oc, random_params(cfg, seed=1), tok, 0), cfg


def _causal_logprob(cfg, params, ids, start):
  """sum_j log p(ids[j] | ids[:j]) for j >= start, from one dense causal forward (NumPy)."""
  x = np.asarray(ids[:-1], np.int32)[None]
  pos = np.arange(x.shape[1], dtype=np.int32)[None]
  causal = np.asarray(masks.causal_mask(x.shape[1]))[None]
  logits = DiT(cfg).apply({"params": params}, x, pos, causal, deterministic=True)
  z = np.asarray(logits, np.float64)[0]
  logp = (
    z
    - np.log(np.sum(np.exp(z - z.max(-1, keepdims=True)), -1, keepdims=True))
    - z.max(-1, keepdims=True)
  )
  return float(sum(logp[j - 1, ids[j]] for j in range(start, len(ids))))


def test_ar_scores_are_exact_log_probabilities(tok):
  """AR: loglikelihood = log p(cont | ctx) exactly (no stop label after the text), and
  loglikelihood_rolling of a short text = log p(text | BOS); a long text is scored in windows."""
  state, cfg = _ar_state(tok)
  lm = lem.SetDiffLM.from_state(state, batch_size=2, greedy_check=False)
  ctx, cont = "It is a truth", " universally acknowledged"
  [(value, _)] = lm.loglikelihood([Req(ctx, cont)])
  c, x = [tok.bos_id] + tok.encode(ctx), tok.encode(cont)
  assert len(c) + len(x) < 32  # the row has pads after it
  np.testing.assert_allclose(value, _causal_logprob(cfg, state.params, c + x, len(c)), rtol=1e-5)
  text = "Elizabeth smiled."
  [rolled] = lm.loglikelihood_rolling([Req(text)])
  ids = [tok.bos_id] + tok.encode(text)
  np.testing.assert_allclose(rolled, _causal_logprob(cfg, state.params, ids, 1), rtol=1e-5)
  long_text = (
    "It is a truth universally acknowledged, that a single man in possession of a good "
    "fortune, must be in want of a wife."
  )
  assert len(tok.encode(long_text)) > 32
  [long_value] = lm.loglikelihood_rolling([Req(long_text)])
  assert np.isfinite(long_value) and long_value < rolled


def test_settings_the_runs_sampler_never_reads_are_refused(tok):
  """Probe round 11: W, tau and a commit policy on an AR run were dropped without a word (and
  lm_eval's header recorded tau as if used); sample.py and evaluate.py refuse them."""
  state, _ = _ar_state(tok)
  for args, name in (
    (dict(window=3), "model_args window"),
    (dict(threshold=0.9), "model_args threshold"),
    (dict(policy="topk", policy_arg="2"), "model_args policy and model_args policy_arg"),
  ):
    with pytest.raises(ValueError, match=f"^{name} would be ignored: this ar run's sampler"):
      lem.SetDiffLM.from_state(state, **args)
  lem.SetDiffLM.from_state(state, batch_size=2)  # its own settings pass


def test_conflicting_policy_model_args_are_refused_by_the_constructor(tok, tmp_path, monkeypatch):
  """Probe 16a: tau with another policy, or a tau and a policy_arg that disagree, passed the
  constructor and were refused only at the first generate_until, naming the launchers' flags
  (--threshold, --policy_arg), which lm_eval's users do not have."""
  state, _ = _ar_state(tok)
  setdlm = dataclasses.replace(state.objective_config, name="setdlm")
  state = dataclasses.replace(state, objective_config=setdlm)
  monkeypatch.setattr(workdir_lib, "load_config", lambda workdir: state.config)
  monkeypatch.setattr(workdir_lib, "load_inference_state", lambda workdir, **kw: state)
  make = lambda args: lem.SetDiffLM.create_from_arg_string(f"workdir={tmp_path},{args}")  # noqa: E731
  disagree = "model_args threshold / tau=0.9 and policy_arg=0.5 both set tau of policy=threshold"
  for args, what in (
    (
      "policy=entropy_bound,tau=0.9",
      "model_args threshold / tau=0.9 is the parameter of policy=threshold; for "
      "policy=entropy_bound pass policy_arg",
    ),
    ("policy=threshold,policy_arg=0.5,tau=0.9", disagree + " and disagree; give one"),
    ("policy_arg=0.5,threshold=0.9", disagree + " and disagree; give one"),
  ):
    with pytest.raises(ValueError) as e:
      make(args)
    assert str(e.value) == what
  for args, policy in (
    ("policy=entropy_bound,policy_arg=0.2", CommitPolicy("entropy_bound", 0.2)),
    ("tau=0.9", CommitPolicy("threshold", 0.9)),
    ("policy=threshold,policy_arg=0.9,tau=0.9", CommitPolicy("threshold", 0.9)),
    ("policy=topk,tau=off", CommitPolicy("topk", None)),
  ):
    assert make(args)._sampler_config(8).policy == policy


def test_request_edges_of_probe_round_12(tmp_path, caplog):
  """A special-token `until` (Qwen3's <|im_end|>, which the decoded text leaves out) cuts the
  answer (it used to keep the next turns); max_gen_toks < 1 or not an integer names itself and
  the request; a continuation longer than L says no truncation helps; from_state takes W and tau;
  the chat template on a run not trained on it is said once."""
  from setdiff_jax.data import tokenizers

  gpt2 = tokenizers.packaged_vocab("gpt2/vocab.json"), tokenizers.packaged_vocab("gpt2/merges.txt")
  g = tokenizers.gpt2_tokenizer(*gpt2)
  g.hf.add_special_tokens(["<|im_start|>", "<|im_end|>"])  # as a Qwen3 tokenizer.json
  g.hf.save(str(tmp_path / "tokenizer.json"))
  tok = tokenizers.qwen3_tokenizer(str(tmp_path))
  state, _ = _ar_state(tok)
  lm = lem.SetDiffLM.from_state(state, batch_size=1, overflow="truncate_prompt")
  im_end = tok.token_id("<|im_end|>")
  gen = tok.encode("The answer is 4.") + [im_end] + tok.encode("<|im_start|>user\nAnd 7?")
  lm._decode = lambda prompts, cfg, row_ids=None: [
    list(gen) for _ in prompts
  ]  # what the model wrote
  [out] = lm.generate_until([Req("2+2?", {"until": ["<|im_end|>"], "max_gen_toks": 20})])
  assert out == "The answer is 4."
  for bad in (0, -1, 8.7, "abc"):
    with pytest.raises(ValueError, match=rf"^request 0: generation kwarg max_gen_toks={bad!r}: an"):
      lm.generate_until([Req("2+2?", {"until": [], "max_gen_toks": bad})])
  with pytest.raises(ValueError, match=r"need 41 positions with BOS.*no context fits \(overflow="):
    lm.loglikelihood([Req("It", " a" * 40)])
  with pytest.raises(ValueError, match=r"from_state: unknown model_args \['widow'\]"):
    lem.SetDiffLM.from_state(state, widow=4)
  setdlm = dataclasses.replace(state.objective_config, name="setdlm")
  set_state = dataclasses.replace(state, objective_config=setdlm)
  aliased = lem.SetDiffLM.from_state(set_state, W=3, tau=0.5)
  assert (aliased.sampler_overrides["window"], aliased.sampler_overrides["threshold"]) == (3, 0.5)
  with pytest.raises(ValueError, match="window=2 and W=3 disagree"):
    lem.SetDiffLM.from_state(set_state, window=2, W=3)
  assert lm.apply_chat_template([{"role": "user", "content": "Hi"}]).startswith("<|im_start|>")
  lm.apply_chat_template([{"role": "user", "content": "Hi"}])
  assert caplog.text.count("trained with data.prompt_style=plain, not gsm8k_chat") == 1


def test_truncate_prompt_keeps_room_for_max_gen_toks(tok):
  """Probe round 13: overflow=truncate_prompt cut a long context to L - 1 tokens, so
  generate_until wrote one token whatever max_gen_toks said; the context now keeps its last
  L - max_gen_toks tokens (lm_eval's HF model does the same). overflow=error still needs one."""
  state, _ = _ar_state(tok)  # L = 32
  seen = []
  context = " ".join(["word"] * 80)
  for overflow, n, want_prompt in (("truncate_prompt", 12, 20), ("truncate_prompt", 40, 1)):
    lm = lem.SetDiffLM.from_state(state, batch_size=1, overflow=overflow)
    lm._decode = lambda prompts, cfg, row_ids=None: (
      seen.append((prompts, cfg)),
      [[5] for _ in prompts],
    )[1]
    lm.generate_until([Req(context, {"until": [], "max_gen_toks": n})])
    prompts, cfg = seen[-1]
    assert (len(prompts[0]), cfg.max_new_tokens) == (want_prompt, min(n, 31))
    ids = tok.encode(context)
    assert prompts[0] == [tok.bos_id] + ids[len(ids) - (want_prompt - 1) :]
  lm = lem.SetDiffLM.from_state(state, batch_size=1)
  with pytest.raises(ValueError, match=r"needs 1 more, but the model's context is L = seq_len"):
    lm.generate_until([Req(context, {"until": [], "max_gen_toks": 12})])


def _dense_logp(cfg, params, tok, row, masked, stream=None):
  """log p(row[i] | row with `masked` positions set to the mask id) at every position [L], from
  one dense forward (NumPy softmax, the mask id excluded): bidirectional over the real tokens
  (MDLM), or the BD3LM two-stream [x, x_t] under the block-causal mask (stream = block size)."""
  x = np.asarray(row, np.int32)
  xt = x.copy()
  xt[list(masked)] = tok.mask_id
  real = x != tok.pad_id
  if stream is None:
    tokens, pos, allowed = xt[None], np.arange(len(x))[None], (real[:, None] & real[None])[None]
  else:
    tokens = np.concatenate([x, xt])[None]
    pos = np.concatenate([np.arange(len(x))] * 2)[None]
    two = np.concatenate([real, real])
    allowed = (masks.block_causal_mask(len(x), stream) & two[:, None] & two[None])[None]
  z = np.asarray(DiT(cfg).apply({"params": params}, tokens, pos, allowed), np.float64)[0]
  z = z[-len(x) :]
  z[:, tok.mask_id] = -np.inf
  z = z - z.max(-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  return logp[np.arange(len(x)), x]


def _diffusion_state(tok, name):
  state, cfg = _ar_state(tok)
  oc = dataclasses.replace(state.objective_config, name=name, block_size=4)
  return dataclasses.replace(state, objective_config=oc), cfg


def test_diffusion_loglikelihood_never_scores_nothing(tok):
  """Probe round 13: MDLM / BD3LM scored a one-token continuation 0.0 (p = 1) in about half of
  its draws (a Bernoulli(t) mask that hit nothing), so multiple-choice answers tied at 0.0. The
  adapter draws the discrete form of the same NELBO (k ~ U{1..n} of a block's n tokens masked,
  weight n/k): one token is scored exactly, whatever the draw; three tokens in one block average
  to the NELBO enumerated over every mask subset with dense forwards."""
  import math
  from itertools import combinations

  ctx = [tok.bos_id] + tok.encode("12 + 30 =")
  for name, stream in (("mdlm", None), ("bd3lm", 4)):
    state, cfg = _diffusion_state(tok, name)
    params = state.params
    one = tok.encode(" 42")[:1]
    row = ctx + one + [tok.pad_id] * (L - len(ctx) - 1)
    want = _dense_logp(cfg, params, tok, row, [len(ctx)], stream)[len(ctx)]
    for seed in (0, 1, 2):
      lm = lem.SetDiffLM.from_state(state, batch_size=2, greedy_check=False, seed=seed)
      got = lm.score([(ctx, one)], [7])[0]
      np.testing.assert_allclose(got, want, rtol=2e-5, err_msg=name)
  # three tokens in one block (MDLM: the row is one block): the exact expectation and variance
  # of the estimator X = (n/k) sum_M -log p over its draws, by enumeration
  state, cfg = _diffusion_state(tok, "mdlm")
  cont = tok.encode(" 42 7")[:3]
  assert len(cont) == 3
  row = ctx + cont + [tok.pad_id] * (L - len(ctx) - 3)
  where = list(range(len(ctx), len(ctx) + 3))
  n, values, probs = 3, [], []
  for k in range(1, n + 1):
    for subset in combinations(where, k):
      logp = _dense_logp(cfg, state.params, tok, row, subset)
      values.append(-(n / k) * sum(-logp[i] for i in subset))
      probs.append(1.0 / (n * math.comb(n, k)))
  values, probs = np.array(values), np.array(probs)
  mean = float(probs @ values)
  std = float(np.sqrt(probs @ (values - mean) ** 2))
  draws = 400
  lm = lem.SetDiffLM.from_state(state, batch_size=8, greedy_check=False, num_orders=draws)
  got = lm.score([(ctx, cont)], [3])[0]
  assert abs(got - mean) < 4 * std / math.sqrt(draws), (got, mean, std)


def test_registered_and_cli_launcher(monkeypatch, capsys):
  """`--model setdiff_jax` resolves to the adapter; the launchers hand argv to lm_eval's CLI."""
  assert lm_eval.api.registry.get_model(lem.NAME) is lem.SetDiffLM
  seen = {}
  import lm_eval.__main__ as lm_main

  monkeypatch.setattr(lm_main, "cli_evaluate", lambda: seen.setdefault("argv", list(sys.argv)))
  monkeypatch.setattr(sys, "argv", ["x"])
  assert lem.main(["--model", lem.NAME, "--model_args", "workdir=/w", "--tasks", "t"]) == 0
  assert seen["argv"] == [
    "lm_eval",
    "--model",
    lem.NAME,
    "--model_args",
    "workdir=/w",
    "--tasks",
    "t",
  ]

  def fails():
    raise FileNotFoundError("model_args workdir='/w': no such directory")

  monkeypatch.setattr(lm_main, "cli_evaluate", fails)
  assert lem.main(["--model", lem.NAME]) == 1
  assert capsys.readouterr().err == "error: model_args workdir='/w': no such directory\n"
  # launch/lm_eval_harness.py loads (and only imports the adapter). Its folder is first on
  # sys.path when it runs, so no launcher may be named after the package it imports.
  names = runpy.run_path(os.path.join(REPO, "launch", "lm_eval_harness.py"), run_name="launcher")
  assert names["lm_eval_model"] is lem
  assert not os.path.exists(os.path.join(REPO, "launch", "lm_eval.py"))


def _bd3lm_state(tok, block_size=4):
  cfg = DiTConfig(
    vocab_size=tok.vocab_size,
    hidden_size=32,
    num_layers=1,
    num_heads=2,
    cond_dim=16,
    dropout=0.0,
    adaln=False,
  )
  oc = losses.ObjectiveConfig(
    name="bd3lm",
    mask_token_id=tok.mask_id,
    pad_token_id=tok.pad_id,
    eos_token_id=tok.eos_id,
    block_size=block_size,
  )
  config = ml_collections.ConfigDict({"seq_len": 32})
  return workdir_lib.InferenceState(config, cfg, oc, random_params(cfg, seed=2), tok, 0)


def test_align_to_blocks_model_arg_is_the_samplers_field(tok, run):
  """model_args align_to_blocks (default true, as the official GSM8K harness script for every
  non-SetDLM model) parsed from lm_eval's model_args string and from from_state knobs, is the
  SamplerConfig field that generate_until (and is_greedy) hand the sampler."""
  state = _bd3lm_state(tok)
  for arg, want in ((None, True), ("true", True), ("false", False), (False, False)):
    lm = lem.SetDiffLM.from_state(
      state, batch_size=1, **({} if arg is None else {"align_to_blocks": arg})
    )
    seen = []

    class Out:  # the part of SampleOutput the adapter reads
      generated = [[tok.encode("7")[0], tok.eos_id]]

    lm.sampler = lambda model, params, prompts, cfg, rng, _seen=seen: (_seen.append(cfg), Out)[1]
    assert lm.generate_until([Req("abcde", {"until": [], "max_gen_toks": 8})]) == ["7"]
    assert [c.align_to_blocks for c in seen] == [want] and seen[0].block_size == 4
    assert lm.get_model_info()["align_to_blocks"] is want
  with pytest.raises(
    ValueError,
    match=r"model_args align_to_blocks='maybe': expected true or "
    r"false",
  ):
    lem.SetDiffLM.from_state(state, align_to_blocks="maybe")
  on = lem.SetDiffLM.create_from_arg_string(f"workdir={run}")
  off = lem.SetDiffLM.create_from_arg_string(f"workdir={run},align_to_blocks=false")
  assert on._sampler_config(8).align_to_blocks is True
  assert off._sampler_config(8).align_to_blocks is False


@pytest.mark.slow
def test_align_to_blocks_decodes_on_the_grid(tok):
  """BD3LM through generate_until with a prompt of P = 6 (P % 4 != 0): the text is the sampler's
  own tokens with that setting; aligned, the grid blocks [4, 8), [8, 12) cover the 8 new tokens'
  span [6, 14) only up to 12 (the official block count), unaligned all 8 are decoded."""
  state = _bd3lm_state(tok)
  text = "abcde"
  prompt = [tok.bos_id] + tok.encode(text)
  assert len(prompt) % 4 != 0
  for arg, want in (("true", True), ("false", False)):
    lm = lem.SetDiffLM.from_state(state, batch_size=1, align_to_blocks=arg)
    [got] = lm.generate_until([Req(text, {"until": [], "max_gen_toks": 8})])
    direct = decoders.get("bd3lm").generate(
      lm.decode_model,
      state.params,
      [prompt],
      decoding.sampler_config_for(
        state.objective_config,
        tok,
        32,
        max_new_tokens=8,
        greedy=True,
        stop_at_eos=False,
        align_to_blocks=want,
      ),
      jax.random.PRNGKey(0),
    )
    ids = [int(t) for t in direct.generated[0]]
    assert len(ids) == (8 - len(prompt) % 4 if want else 8)
    assert got == tok.decode(ids[: ids.index(tok.eos_id)] if tok.eos_id in ids else ids)


@pytest.mark.slow  # ~100 s on the shared 2 cores: two adapters' decode and scoring compiles
def test_mesh_model_arg_gives_the_single_device_results(run):
  """model_args mesh (issue 26): the adapter restored on data=2 x fsdp=2 x tensor=2 of the 8
  emulated devices (parameters split by the training rules, batches over data x fsdp) generates
  the same text, greedy flags and loglikelihoods as the same run on one device."""
  import dataclasses
  from setdiff_jax.sampling import placement

  knobs = dict(window=4, threshold=0.9, batch_size=4)
  lm = lem.SetDiffLM(workdir=run, mesh="data=2;fsdp=2;tensor=2", **knobs)
  mesh = placement.mesh_of(lm.state.params)
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  specs = [x.sharding.spec for x in jax.tree_util.tree_leaves(lm.state.params)]
  assert any("fsdp" in s for s in specs) and any("tensor" in s for s in specs)
  one = dataclasses.replace(
    lm.state, params=jax.device_put(jax.device_get(lm.state.params), jax.devices()[0])
  )
  assert placement.mesh_of(one.params) is None
  single = lem.SetDiffLM.from_state(one, use_ema=lm.use_ema, **knobs)
  prompts = [p.prompt for p in tasks.arithmetic_pairs("test", 5, 1)]  # 5 rows: 2 batches of 4
  gen = [Req(p, {"until": [], "max_gen_toks": 8}) for p in prompts]
  scored = [Req(p, f"{i}+{i}={2 * i}") for i, p in enumerate(prompts)]
  texts = lm.generate_until(gen)
  assert texts == single.generate_until(gen) and any(texts)
  got, want = lm.loglikelihood(scored), single.loglikelihood(scored)
  assert [g for _, g in got] == [g for _, g in want]
  np.testing.assert_allclose([v for v, _ in got], [v for v, _ in want], rtol=1e-5, atol=1e-5)


def _texts(lm, reqs):
  return lm.generate_until([Req(c, dict(k)) for c, k in reqs])


def test_sampled_generation_draws_per_request(tok):
  """Probe 17a: sampled requests were keyed by their row inside their (N, greedy) group: two
  groups reused one stream (different prompts came back with the same text) and a request's
  text changed with its neighbours. Each now draws from a hash of its own strings, settings and
  occurrence number: the same text alone or with others, in any order, for any batch_size."""
  state, _ = _ar_state(tok)
  kw = lambda n, **more: {"until": ["\n\n"], "max_gen_toks": n, "do_sample": True, **more}  # noqa: E731
  reqs = [("a", kw(3)), ("It is a truth", kw(8)), ("Mr Darcy was", kw(20)), ("b", kw(3))]
  flows = [lem.SetDiffLM.from_state(state, batch_size=b, seed=3) for b in (1, 3)]
  alone = [_texts(flows[0], [r])[0] for r in reqs]
  assert len(set(alone)) == 4
  for lm in flows:
    assert _texts(lm, reqs) == alone
    assert _texts(lm, reqs[::-1]) == alone[::-1]
  # Static batches (continuous=false): a batch draws from one key, a hash of its requests' ids;
  # with batch_size 1, a request's text is its own.
  static = lem.SetDiffLM.from_state(state, batch_size=1, seed=3, continuous="false")
  texts = _texts(static, reqs)
  assert texts == [_texts(static, [r])[0] for r in reqs] == _texts(static, reqs[::-1])[::-1]
  # One prompt in two groups (3 and 5 new tokens): two streams, not a stream and its prefix,
  # continuous or static (batch_size 3: one batch per group).
  static3 = lem.SetDiffLM.from_state(state, batch_size=3, seed=3, continuous="false")
  for lm in (flows[1], static3):
    short, longer = _texts(lm, [("a", kw(3)), ("a", kw(5))])
    assert not longer.startswith(short), (short, longer)
  # The same request twice (lm_eval's repeats): two draws, the same two on every call; the first
  # is the request's text alone. Another seed, other draws.
  for lm in (flows[1], static):
    twice = _texts(lm, [reqs[2], reqs[2]])
    assert twice[0] != twice[1] and twice == _texts(lm, [reqs[2], reqs[2]])
    assert twice[0] == alone[2] == _texts(lm, [reqs[2]])[0]
  reseeded = lem.SetDiffLM.from_state(state, batch_size=3, seed=4)
  assert _texts(reseeded, reqs) != alone


def test_model_args_range_errors_name_model_args(tok, run):
  """Probe 17a: window / max_new_tokens out of range and a mesh of the wrong size named the
  launchers' flags (--window, --mesh), which lm_eval users do not have; the launchers' messages
  stay theirs."""
  state, _ = _ar_state(tok)
  state = dataclasses.replace(
    state, objective_config=dataclasses.replace(state.objective_config, name="setdlm")
  )
  for args, what in (
    (dict(window=99), "model_args window=99 must be in [1, seq_len=32]"),
    (dict(max_new_tokens=40), "model_args max_new_tokens=40 must be in [1, seq_len - 1 = 31]"),
  ):
    with pytest.raises(ValueError) as e:
      lem.SetDiffLM.from_state(state, **args)
    assert str(e.value).startswith(what), str(e.value)
  with pytest.raises(ValueError, match=r"^--window=99 must be in \[1, seq_len=32\]"):
    decoding.check_sampling_flags(32, window=99)
  n = len(jax.devices())
  with pytest.raises(ValueError, match=f"^model_args mesh {{'data': {n + 1}, .*needs {n + 1} dev"):
    lem.SetDiffLM(workdir=run, mesh=f"data={n + 1}")
