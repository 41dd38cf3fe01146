"""Answer extraction and exact match on hand-written examples, the GSM8K protocol, and
conditional decoding: a prompt decoded in a batch of mixed prompt lengths gives what it gives
alone, for every method's sampler."""

import jax
import numpy as np
import pytest

from helpers import random_params
from setdiff_jax import decoding
from setdiff_jax.diffusion import losses
from setdiff_jax.data import pairs
from setdiff_jax.evaluation import accuracy, gsm8k
from setdiff_jax.models.dit import DiT, DiTConfig
from setdiff_jax.sampling.config import CommitPolicy, DecodeSetting

pytestmark = pytest.mark.usefixtures("fast_compile")


@pytest.mark.parametrize(
  "text,hashed,boxed",
  [
    ("8+6=14\n14+5=19\n#### 19", "19", None),
    ("so she has 3.\n#### 1,234\n", "1,234", None),
    ("#### 5\nthen again\n#### 7", "7", None),  # the last answer line counts
    ("The answer is $\\boxed{18}$.", None, "18"),
    ("\\boxed{\\frac{1}{2}} and later \\boxed{42}", None, "42"),
    ("\\boxed{\\frac{1}{2}}", None, "\\frac{1}{2}"),
    ("unfinished \\boxed{12", None, None),
    ("no answer here", None, None),
  ],
)
def test_extractors(text, hashed, boxed):
  assert accuracy.extract_hash(text) == hashed
  assert accuracy.extract_boxed(text) == boxed
  assert accuracy.extract_answer(text, "auto") == (hashed if hashed is not None else boxed)


def test_normalize_and_exact_match():
  norm = accuracy.normalize_answer
  assert [norm(" 1,234. "), norm("$5"), norm("3.50"), norm("-7"), norm("  a  b ")] == [
    "1234",
    "5",
    "3.5",
    "-7",
    "a b",
  ]
  # canonical digits, never a float: values above 2**53 stay apart, zeros and signs fold
  assert [norm("9007199254740993"), norm("-0.00"), norm("+007.50"), norm("-00.50")] == [
    "9007199254740993",
    "0",
    "7.5",
    "-0.5",
  ]
  assert not accuracy.exact_match("#### 9007199254740993", "#### 9007199254740992")
  assert accuracy.exact_match("#### 12345678901234567890.10", "#### 12,345,678,901,234,567,890.1")
  assert accuracy.exact_match("9+5=14\n#### 14", "9+5=14\n#### 14")
  assert accuracy.exact_match("wrong steps\n#### 14", "#### 14")  # only the final answer counts
  assert not accuracy.exact_match("#### 15", "#### 14")
  assert not accuracy.exact_match("#### ", "#### 14")
  assert not accuracy.exact_match("8+6=14\n14+5=", "#### 19")  # cut off before the answer line
  assert accuracy.exact_match("It is \\boxed{1,000}.", "#### 1000")
  with pytest.raises(ValueError, match="reference answer has no final answer"):
    accuracy.exact_match("#### 3", "three")
  # Probe round 11: an empty final answer is none (it matched an empty reference's), the answer
  # is on the '####' line (not the next one), and '.5' is the number 0.5.
  for extractor in ("hash", "boxed", "auto", "gsm8k"):
    for empty in ("2+2=4\n#### ", "so \\boxed{}", "#### \n"):
      with pytest.raises(ValueError, match="reference answer has no final answer"):
        accuracy.exact_match(empty, empty, extractor)
  assert accuracy.extract_hash("####\nThe answer is 18") is None
  assert accuracy.extract_boxed("\\boxed{ }") is None
  assert norm(".5") == norm("0.5") == "0.5" and norm("-.50") == "-0.5" and norm(".") is None
  assert accuracy.exact_match("#### .5", "#### 0.50")


def test_gsm8k_protocol():
  q = "Natalia sold 48 clips in April and half as many in May. How many in total?"
  plain = gsm8k.gsm8k_prompt(q, chat=False)
  assert plain == ("Please reason step by step, and put your final answer within $\\boxed{}$. " + q)
  chat = gsm8k.gsm8k_prompt(q)
  assert chat.startswith("<|im_start|>user\nPlease reason") and chat.endswith(
    q + "<|im_end|>\n<|im_start|>assistant\n"
  )
  ref = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n48+24 = <<48+24=72>>72\n#### 72"
  out = (
    "In May she sold 24, so 48 + 24 = 72.\nThe answer is $\\boxed{72}$.<|im_end|>junk \\boxed{5}"
  )
  # The reference's rewrite: the text before the first box, '#### ' + its content to the first
  # '}', '$\\' dropped; what follows the box is gone.
  assert accuracy.boxed_to_hash("so $\\boxed{72}$. Then \\boxed{5}") == "so #### 72"
  assert accuracy.boxed_to_hash("no box") == "no box"
  assert gsm8k.gsm8k_exact_match(out, ref)  # the first box; <|im_end|> cuts the junk in any case
  assert gsm8k.gsm8k_exact_match("x \\boxed{72} \\boxed{5}", ref, stop_strings=())
  assert not gsm8k.gsm8k_exact_match("x \\boxed{5} \\boxed{72}", ref, stop_strings=())
  # lm-eval's strict-match reads the first '#### <number>' of the rewritten text: a '####' the
  # model wrote before its box wins (probe round 11 read the box: the reference does not), and
  # an unboxed '#### 72' is read. Strings compare after ',', '$', a final '.': 72.00 is not 72.
  assert not gsm8k.gsm8k_exact_match("#### 48 clips\nSo \\boxed{72}", ref)
  assert gsm8k.gsm8k_exact_match("#### 72", ref)
  assert gsm8k.gsm8k_exact_match("\\boxed{72.}", ref) and gsm8k.gsm8k_exact_match("#### 7,2", ref)
  assert not gsm8k.gsm8k_exact_match("\\boxed{72.00}", ref)
  assert not gsm8k.gsm8k_exact_match(
    "\\boxed{$72}", ref
  )  # strict-match needs a digit after '#### '
  assert gsm8k.boxed_equals_reference("\\boxed{72}", ref)
  assert not gsm8k.boxed_equals_reference("\\boxed{72.00}", ref)  # the script's strings
  assert not gsm8k.boxed_equals_reference("\\boxed{5} then \\boxed{72}", ref)  # the first box
  assert gsm8k.boxed_equals_reference("\\boxed{72}<|im_end|>", ref)
  shell, repro = gsm8k.preset("gsm8k_shell"), gsm8k.preset("gsm8k_repro")
  assert shell["threshold"] == 0.9 and repro["threshold"] is None
  for name in ("gsm8k_shell", "gsm8k_repro"):  # lm-eval's `until` holds <|im_end|> for both
    got = gsm8k.resolve_preset(name, 1024)
    assert got["extractor"] == "gsm8k" and "<|im_end|>" in got["stop_strings"], got
  assert shell["cache_order"] == repro["cache_order"] == "fht"
  with pytest.raises(ValueError, match="unknown GSM8K preset"):
    gsm8k.preset("gsm8k_best")


V, PAD, BOS, EOS, MASK = 40, 0, 1, 2, 3


class _Tok:
  bos_id, eos_id, pad_id, mask_id = BOS, EOS, PAD, MASK

  def token_id(self, text):
    return None  # no stop string is one token of this vocabulary


# The threshold and BD3LM cases (~20 s) run in the slow tier (`.ci/run` runs it) to keep the default
# tier near 12 minutes.
@pytest.mark.parametrize(
  "name,setting",
  [
    ("setdlm", DecodeSetting(4)),
    pytest.param(
      "setdlm", DecodeSetting(2, CommitPolicy("threshold", 0.05)), marks=pytest.mark.slow
    ),
    ("ar", DecodeSetting(None, None)),
    ("mdlm", DecodeSetting()),
    pytest.param("bd3lm", DecodeSetting(), marks=pytest.mark.slow),
  ],
)
def test_batch_of_mixed_prompts_equals_each_alone(name, setting):
  cfg = DiTConfig(
    vocab_size=V,
    hidden_size=32,
    num_layers=1,
    num_heads=2,
    cond_dim=16,
    dropout=0.0,
    adaln=name in ("mdlm", "bd3lm"),
  )
  model, params = DiT(cfg), random_params(cfg, seed=3)
  oc = losses.ObjectiveConfig(
    name=name,
    mask_token_id=MASK,
    pad_token_id=PAD,
    eos_token_id=EOS,
    desired_set_size=4,
    block_size=4,
  )
  rng = np.random.default_rng(0)
  prompts = [[BOS] + rng.integers(4, V, n).tolist() for n in (2, 6, 4)]
  scfg = accuracy._sampler_config(oc, _Tok(), 16, setting, 8, "l2r", 0)
  sampler = decoding.sampler_for(name)
  batched = accuracy.decode_all(sampler, model, params, prompts, scfg, batch_size=3)
  alone = accuracy.decode_all(sampler, model, params, prompts, scfg, batch_size=1)
  assert batched["generated"] == alone["generated"]
  assert batched["num_steps"] == alone["num_steps"]
  assert all(len(g) >= 1 for g in batched["generated"])
  cont = decoding.continuous_for(name, scfg)  # continuous batching: the same rows
  assert (cont is None) == (name not in ("setdlm", "ar"))
  if cont is not None:
    flow = accuracy.decode_all(sampler, model, params, prompts, scfg, batch_size=2, continuous=cont)
    for key in ("generated", "num_steps", "num_committed", "forward_calls", "commit_steps"):
      assert flow[key] == batched[key], key
    assert flow["continuous"]["slots"] == 2 and flow["padded_rows"] == 0
  if name == "setdlm" and setting.tau is None:  # one sampler is enough for the fill
    two = accuracy.decode_all(sampler, model, params, prompts, scfg, batch_size=2)  # padded last
    assert two["generated"] == batched["generated"] and two["padded_rows"] == 1


def test_accuracy_eval_counts_a_known_model():
  """A toy logits function that always writes the right answer: accuracy 1, and the counters
  follow the generated length."""
  answer = [10, 11, 12]  # decodes to the answer line via the toy tokenizer below

  class Tok(_Tok):
    def encode_batch(self, texts):
      return [[20 + len(t)] for t in texts]

    def decode_batch(self, rows):
      return ["#### 7" if r[:3] == answer else "#### 0" for r in rows]

  def logits_fn(tokens, positions, mask, kv_cache=None):
    b, s = tokens.shape
    target = np.array(answer + [EOS] * 20)
    want = jax.numpy.asarray(target)[jax.numpy.clip(positions - 2, 0, 20)]
    return jax.nn.one_hot(want, V) * 50.0, (tokens.astype(np.float32)[..., None],)

  oc = losses.ObjectiveConfig(
    name="setdlm", mask_token_id=MASK, pad_token_id=PAD, eos_token_id=EOS, desired_set_size=4
  )
  test = [pairs.Pair("a", "#### 7"), pairs.Pair("b", "#### 7"), pairs.Pair("c", "#### 8")]
  rows = accuracy.accuracy_eval(
    logits_fn,
    None,
    Tok(),
    oc,
    12,
    test,
    settings=[DecodeSetting(4), DecodeSetting(4, CommitPolicy("threshold", 0.9))],
    batch_size=2,
    speed_examples=2,
  )
  off, tau = rows
  assert off["decoding"] == tau["decoding"] == "continuous"
  static = accuracy.accuracy_eval(
    logits_fn,
    None,
    Tok(),
    oc,
    12,
    test,
    settings=[DecodeSetting(4, CommitPolicy("threshold", 0.9))],
    batch_size=2,
    speed_examples=0,
    continuous=False,
    per_example=True,
  )[0]
  assert static["decoding"] == "static" and static["slot_utilisation"] is None
  for key in ("num_correct", "mean_generated_tokens", "tokens_per_step", "forward_calls"):
    assert static[key] == tau[key], key
  assert off["num_correct"] == tau["num_correct"] == 2 and off["accuracy"] == pytest.approx(2 / 3)
  assert off["mean_generated_tokens"] == 4  # 3 answer tokens + EOS
  assert off["tokens_per_step"] == pytest.approx(1.0) and tau["tokens_per_step"] > 1.5
  assert off["batch1_matches_batched"] and tau["batch1_matches_batched"]
  assert off["examples"][0]["correct"] and not off["examples"][2]["correct"]
  with pytest.raises(ValueError, match="does not fit the model's context"):
    accuracy.accuracy_eval(logits_fn, None, Tok(), oc, 12, test, max_new_tokens=11)


def test_bad_references_and_prompts_are_named_before_any_decoding(caplog):
  """A reference without a final answer used to fail after the whole set was decoded, naming
  neither file nor line; a prompt that does not fit named neither; one long prompt shrank every
  pair's N without a word. Now: the pair's file:line, before the model is called, and a warning."""

  class Tok(_Tok):
    def encode_batch(self, texts):
      return [[20] * len(t) for t in texts]  # one token per character

  def never(*args, **kwargs):
    pytest.fail("decoded before the inputs were checked")

  oc = losses.ObjectiveConfig(
    name="setdlm", mask_token_id=MASK, pad_token_id=PAD, eos_token_id=EOS, desired_set_size=4
  )
  bad_ref = [pairs.Pair("a", "#### 7", "t.jsonl:1"), pairs.Pair("b", "0", "t.jsonl:2")]
  with pytest.raises(ValueError, match=r"^t.jsonl:2: the reference answer .*'#### ANSWER'"):
    accuracy.accuracy_eval(never, None, Tok(), oc, 40, bad_ref)
  too_long = [pairs.Pair("a", "#### 7", "t.jsonl:1"), pairs.Pair("b" * 45, "#### 7", "t.jsonl:2")]
  with pytest.raises(ValueError, match=r"^t.jsonl:2: its prompt has 46 tokens .*shorten or drop"):
    accuracy.accuracy_eval(never, None, Tok(), oc, 40, too_long)
  four = [
    pairs.Pair(c, "#### 7", f"t.jsonl:{i}") for i, c in enumerate(["a", "b", "c", "d" * 30], 1)
  ]
  assert accuracy._generation_budget(accuracy.encode_prompts(Tok(), four), four, 40, None) == 9
  assert "set by the 31-token prompt of t.jsonl:4 (the median prompt leaves 38)" in caplog.text


def test_copy_stats_hand_worked():
  # prompt 7 + 5 \n ; output "7 + 5 = 1 2": (\n,7) no, (7,+) yes, (+,5) yes, (5,=) no, (=,1) no,
  # (1,2) no -> 2 copies of 6; steps: 7 and + together (parallel), the rest one per step
  prompt = [1, 7, 10, 5, 11]
  out = accuracy.copy_stats(prompt, [7, 10, 5, 12, 1, 2], [0, 0, 1, 2, 3, 4])
  assert out == {"kept": 6, "copies": 2, "parallel": 2, "parallel_copies": 1}
  assert accuracy.copy_stats(prompt, [], [])["kept"] == 0


def test_a_special_token_stop_string_cuts_the_decoded_text():
  """Probe round 11: Qwen3's <|im_end|> is a special token, which the decoded text leaves out, so
  the preset's stop never cut (the text after it was scored). It now cuts the ids first."""
  import tokenizers as hf_tokenizers
  from tokenizers import decoders, models, pre_tokenizers

  from setdiff_jax.data import tokenizers

  bpe = models.BPE.from_file(
    tokenizers.packaged_vocab("gpt2/vocab.json"), tokenizers.packaged_vocab("gpt2/merges.txt")
  )
  hf = hf_tokenizers.Tokenizer(bpe)
  hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  hf.decoder = decoders.ByteLevel()
  hf.add_special_tokens(["<|endoftext|>", "<|im_end|>", "<|fim_middle|>"])
  end, mask = hf.token_to_id("<|endoftext|>"), hf.token_to_id("<|fim_middle|>")
  tok = tokenizers.Tokenizer(hf, kind="gpt2", bos_id=end, eos_id=end, pad_id=end, mask_id=mask)
  ids = tok.encode("So \\boxed{72}.") + [tok.token_id("<|im_end|>")] + tok.encode(" \\boxed{5}")
  assert tok.decode_batch([ids]) == ["So \\boxed{72}. \\boxed{5}"]  # the token is not in the text
  texts = accuracy.answer_texts(tok, [ids, tok.encode("a Question: b")], gsm8k.STOP_STRINGS)
  assert texts == ["So \\boxed{72}.", "a "]
