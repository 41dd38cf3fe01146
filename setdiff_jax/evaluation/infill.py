"""Infilling evaluation: ROCStories Story Cloze (SPEC §6.5) and held-out corpus paragraphs.

Examples:
  cloze, 1-sentence ("1sent"): prefix = s1 s2, middle = s3, suffix = s4 s5;
  cloze, 3-sentence ("3sent"): prefix = s1, middle = s2 s3 s4, suffix = s5;
  s5 is the right ending (`AnswerRightEnding`) of the Story Cloze validation CSV (1871 stories).
  corpus ("corpus"): paragraphs of the embedded corpus's validation split (held-out chapters);
    the middle third of the paragraph's tokens is masked, the rest is context.

Canvas (SPEC §4.5): BOS + tokens(prefix) + M * |tokens(middle)| + tokens(suffix) + EOS, with the
*oracle* middle length. Each segment is tokenized on its own (sentences joined by one space, which
belongs to the following segment), so the gap sits on token boundaries. Stories whose canvas does
not fit the model's context length are skipped and counted.

Decoders (greedy by default, no EOS stop, N = the middle length):
  setdlm  the KV-cached set sampler in infill mode (`sampling.set_infill`): prefix and suffix are
          cached up front, window W (default S), threshold tau.
  mdlm    bidirectional predict-and-noise over the masked span with the whole canvas visible
          (prefix and suffix), `mdlm_infill` below (the MDLM sampler of SPEC §4.8 applied to an
          infill canvas, one sub-block = the span).
  ar,     cannot condition on a suffix (causal / block-causal attention on absolute positions):
  bd3lm   they continue BOS + prefix for |middle| tokens (`ar_generate`, `bd3lm_generate`).
          Within a batch every row decodes the batch's longest middle and keeps its own first
          |middle| tokens (exact for AR; for BD3LM the last, partial block sees a few extra masks).

Every batch is made to the same shapes (filler rows set the canvas, context and step maxima of the
whole example set; the last batch is completed with filler rows), so each decoder compiles once per
example set. Filler outputs are discarded; their decoding time is included in tokens/s.

Metric: ROUGE-1/2/L F-measure (`rouge-score`, default tokenizer, no stemmer: the defaults of
HF `evaluate`'s rouge) of the decoded middle against the reference middle, averaged over examples
(x 100).
"""
from __future__ import annotations

import csv
import dataclasses
import functools
import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from setdiff_jax import masks
from setdiff_jax.model import DiT

CLOZE_SETTINGS = ("1sent", "3sent")
SETTINGS = CLOZE_SETTINGS + ("corpus",)
CLOZE_COLUMNS = ("InputStoryid", "InputSentence1", "InputSentence2", "InputSentence3",
                 "InputSentence4", "RandomFifthSentenceQuiz1", "RandomFifthSentenceQuiz2",
                 "AnswerRightEnding")
DEFAULT_CLOZE_PATH = os.path.join("..", "shared", "data", "rocstories-cloze-val-2016.csv")
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


# ----------------------------------------------------------------------------- examples
@dataclasses.dataclass
class InfillExample:
  """One infill problem: text segments (reference middle text) or ready token ids."""
  id: str
  prefix: str
  middle: str
  suffix: str
  prefix_ids: Optional[List[int]] = None
  middle_ids: Optional[List[int]] = None
  suffix_ids: Optional[List[int]] = None


@dataclasses.dataclass
class TokenizedInfill:
  """A canvas ready for decoding. canvas: BOS + prefix + M*m + suffix + EOS; span = (start, end)
  of the masked middle; prompt = BOS + prefix (for the prefix-only decoders)."""
  example: InfillExample
  canvas: List[int]
  span: Tuple[int, int]
  middle_ids: List[int]

  @property
  def prompt(self) -> List[int]:
    return self.canvas[:self.span[0]]

  @property
  def middle_len(self) -> int:
    return self.span[1] - self.span[0]


def read_cloze(path: str) -> List[Dict[str, str]]:
  """Rows of the Story Cloze CSV with s1..s5 (s5 = the right ending) and the story id."""
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f"Story Cloze CSV not found at {path!r}: pass the path of "
        "rocstories-cloze-val-2016.csv (e.g. ../shared/data/rocstories-cloze-val-2016.csv)")
  with open(path, newline="", encoding="utf-8") as f:
    reader = csv.DictReader(f)
    missing = [c for c in CLOZE_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
      raise ValueError(f"{path}: not a Story Cloze CSV, missing columns {missing}")
    rows = []
    for r in reader:
      answer = r["AnswerRightEnding"].strip()
      if answer not in ("1", "2"):
        raise ValueError(f"{path}: story {r['InputStoryid']} has AnswerRightEnding={answer!r}")
      s = [r[f"InputSentence{i}"].strip() for i in range(1, 5)]
      s.append(r[f"RandomFifthSentenceQuiz{answer}"].strip())
      rows.append({"id": r["InputStoryid"], **{f"s{i + 1}": s[i] for i in range(5)}})
  return rows


def cloze_examples(path: str, setting: str) -> List[InfillExample]:
  """Story Cloze infill problems for '1sent' or '3sent' (SPEC §6.5), in file order."""
  if setting not in CLOZE_SETTINGS:
    raise ValueError(f"cloze setting {setting!r}; expected one of {CLOZE_SETTINGS}")
  out = []
  for r in read_cloze(path):
    s = [r[f"s{i}"] for i in range(1, 6)]
    if setting == "1sent":
      pre, mid, suf = s[:2], s[2:3], s[3:]
    else:
      pre, mid, suf = s[:1], s[1:4], s[4:]
    out.append(InfillExample(r["id"], " ".join(pre), " ".join(mid), " ".join(suf)))
  return out


def corpus_examples(tokenizer, *, max_length: int, num_examples: Optional[int] = None,
                    min_tokens: int = 24, split: str = "validation") -> Tuple[List[InfillExample], int]:
  """Held-out paragraphs of the embedded corpus, middle third masked (token level).

  Paragraphs with min_tokens <= n <= max_length - 2 tokens are kept (BOS and EOS must fit); the
  middle is tokens [n // 3, 2n // 3). Returns (examples in corpus order, number of paragraphs
  skipped for length); `num_examples` keeps the first ones.
  """
  from setdiff_jax.data import sources
  out, skipped = [], 0
  for i, para in enumerate(sources.embedded_corpus(split)):
    ids = list(tokenizer.encode(para))
    n = len(ids)
    if not min_tokens <= n <= max_length - 2:
      skipped += 1
      continue
    a, b = n // 3, (2 * n) // 3
    pre, mid, suf = ids[:a], ids[a:b], ids[b:]
    out.append(InfillExample(f"{split}-{i}", tokenizer.decode(pre), tokenizer.decode(mid),
                             tokenizer.decode(suf), pre, mid, suf))
    if num_examples is not None and len(out) >= num_examples:
      break
  return out, skipped


def tokenize_example(tokenizer, ex: InfillExample, mask_id: int) -> TokenizedInfill:
  """Canvas BOS + prefix + M * |middle| + suffix + EOS (oracle middle length)."""
  if ex.middle_ids is not None:
    pre, mid, suf = ex.prefix_ids, ex.middle_ids, ex.suffix_ids
  else:
    pre = list(tokenizer.encode(ex.prefix)) if ex.prefix else []
    mid = list(tokenizer.encode((" " if ex.prefix else "") + ex.middle))
    suf = list(tokenizer.encode(" " + ex.suffix)) if ex.suffix else []
  if not mid:
    raise ValueError(f"example {ex.id}: the middle has no tokens")
  head = [int(tokenizer.bos_id)] + list(pre)
  canvas = head + [int(mask_id)] * len(mid) + list(suf) + [int(tokenizer.eos_id)]
  return TokenizedInfill(ex, canvas, (len(head), len(head) + len(mid)), list(mid))


def tokenize_examples(tokenizer, examples: Sequence[InfillExample], mask_id: int,
                      max_length: int) -> Tuple[List[TokenizedInfill], int]:
  """Tokenized examples whose canvas fits `max_length`, and how many were skipped."""
  kept, skipped = [], 0
  for ex in examples:
    t = tokenize_example(tokenizer, ex, mask_id)
    if len(t.canvas) > max_length:
      skipped += 1
    else:
      kept.append(t)
  return kept, skipped


# ----------------------------------------------------------------------------- ROUGE
def rouge_scores(predictions: Sequence[str], references: Sequence[str]) -> Dict[str, Any]:
  """Mean ROUGE-1/2/L F-measure x 100 (rouge-score defaults) and the per-example values."""
  from rouge_score import rouge_scorer
  if len(predictions) != len(references):
    raise ValueError("predictions and references differ in length")
  scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=False)
  per = {k: [] for k in ROUGE_TYPES}
  for p, r in zip(predictions, references):
    s = scorer.score(r, p)  # score(target, prediction)
    for k in ROUGE_TYPES:
      per[k].append(100.0 * s[k].fmeasure)
  out: Dict[str, Any] = {k: float(np.mean(v)) if v else 0.0 for k, v in per.items()}
  out["per_example"] = per
  return out


# ----------------------------------------------------------------------------- decoders
@functools.partial(jax.jit, static_argnames=("apply", "cfg"))
def _mdlm_infill_core(apply, params, canvas, target, valid, counts, nsteps, key, *, cfg):
  from setdiff_jax.sampling import processors
  b, length = canvas.shape
  m = cfg.mask_token_id
  positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))
  attn = masks.padding_mask(valid) | jnp.eye(length, dtype=bool)[None]  # no row is empty

  def cond(s):
    return jnp.any(~s["done"])

  def body(s):
    live = ~s["done"]
    logits, _ = apply(params, s["canvas"], positions, attn, None, 0)
    is_mask = target & (s["canvas"] == m) & live[:, None]
    key, sub = jax.random.split(s["key"])
    hist = (valid & (s["canvas"] != m)) if cfg.repetition_penalty != 1.0 else None
    n_i = processors.schedule_count(counts, s["step"])
    cand, keep = processors.decide(logits, is_mask, n_i, sub, cfg, s["canvas"], hist)
    canvas, commit_step = processors.scatter_commits(s["canvas"], s["commit_step"], positions, keep,
                                                     cand, s["step"])
    step = s["step"] + live.astype(jnp.int32)
    done = s["done"] | ~jnp.any(target & (canvas == m), -1) | (step >= nsteps)
    return dict(canvas=canvas, commit_step=commit_step, step=step, done=done,
                calls=s["calls"] + live.astype(jnp.int32),
                committed=s["committed"] + jnp.sum(keep, -1).astype(jnp.int32), key=key)

  init = dict(canvas=canvas, commit_step=jnp.full(canvas.shape, -1, jnp.int32),
              step=jnp.zeros((b,), jnp.int32), done=~jnp.any(target, -1),
              calls=jnp.zeros((b,), jnp.int32), committed=jnp.zeros((b,), jnp.int32), key=key)
  s = jax.lax.while_loop(cond, body, init)
  return dict(canvas=s["canvas"], num_steps=s["step"], forward_calls=s["calls"],
              num_committed=s["committed"])


def mdlm_infill(model, params, canvases: Sequence[Sequence[int]], cfg, rng=None, *,
                length: Optional[int] = None, max_targets: Optional[int] = None):
  """MDLM infilling: every M of each canvas is generated with the whole canvas visible.

  Predict-and-noise (SPEC §4.8) over one sub-block = all masked positions of the row: N = the
  row's number of masks, min(T, N) steps, n_i most confident masks committed per step plus those
  with probability >= tau. Each step is one full bidirectional forward over the row's real tokens
  (padding is masked out of attention). Canvases are right-padded to `length` (default: the
  longest) and the step table to `max_targets` columns, so fixed sizes compile once.

  Returns dict of NumPy arrays: canvas [B, Lc], num_steps [B], forward_calls [B], num_committed [B].
  """
  from setdiff_jax.sampling import as_forward, count_table
  rows = [np.asarray(c, np.int64) for c in canvases]
  lc = length or max(len(c) for c in rows)
  b = len(rows)
  canvas = np.full((b, lc), cfg.pad_token_id, np.int32)
  valid = np.zeros((b, lc), bool)
  for i, c in enumerate(rows):
    if len(c) > lc:
      raise ValueError(f"canvas {i} has {len(c)} tokens > length={lc}")
    canvas[i, :len(c)] = c
    valid[i, :len(c)] = True
  target = valid & (canvas == cfg.mask_token_id)
  n_target = target.sum(-1)
  counts = count_table(n_target, cfg.num_steps)
  k = max(counts.shape[1], max_targets or 0)
  counts = np.pad(counts, ((0, 0), (0, k - counts.shape[1])))
  nsteps = np.array([n if cfg.num_steps is None else min(n, cfg.num_steps) for n in n_target],
                    np.int32)
  fwd = as_forward(model, params)
  key = jax.random.PRNGKey(cfg.seed) if rng is None else rng
  res = _mdlm_infill_core(fwd.apply, fwd.params, jnp.asarray(canvas), jnp.asarray(target),
                          jnp.asarray(valid), jnp.asarray(counts), jnp.asarray(nsteps), key,
                          cfg=cfg.static())
  return {k: np.asarray(v) for k, v in jax.device_get(res).items()}


def _fillers(method: str, items: Sequence[TokenizedInfill], bos: int, mask_id: int):
  """Filler rows that pin each decoder's input shapes to the maxima over `items`."""
  if method == "setdlm":
    lc = max(len(t.canvas) for t in items)
    m_max = max(t.middle_len for t in items)
    v_max = max(len(t.canvas) - t.middle_len for t in items)
    return [[bos] * (lc - m_max) + [mask_id] * m_max, [bos] * v_max + [mask_id]]
  if method in ("ar", "bd3lm"):
    return [[bos] * max(len(t.prompt) for t in items)]
  return []  # mdlm: padded explicitly


def decode_infill(method: str, model, params, items: Sequence[TokenizedInfill], cfg, *,
                  batch_size: int = 8, rng=None) -> Dict[str, Any]:
  """Fills the middle of every item with the decoder of `method` (see the module docstring).

  Args:
    cfg: a `sampling.SamplerConfig` (window, threshold, greedy, repetition penalty...);
      `stop_at_eos` is turned off and N comes from the items.
  Returns:
    dict: middles (list of generated middle ids per item), seconds (decoding wall time after a
    compiling warm-up batch), tokens (middle tokens generated), steps, committed, forward_calls
    (sums over items), compile_seconds.
  """
  from setdiff_jax import sampling
  if not items:
    raise ValueError("no infill examples to decode")
  if method not in ("setdlm", "mdlm", "ar", "bd3lm"):
    raise ValueError(f"no infill decoder for objective {method!r}")
  key = jax.random.PRNGKey(cfg.seed) if rng is None else rng
  m_max = max(t.middle_len for t in items)
  bos = int(cfg.bos_token_id if cfg.bos_token_id is not None else cfg.pad_token_id)
  fill = _fillers(method, items, bos, cfg.mask_token_id)
  cfg = cfg.replace(stop_at_eos=False)
  if method in ("ar", "bd3lm"):
    cfg = cfg.replace(max_new_tokens=m_max, max_length=None)
  lc = max(len(t.canvas) for t in items)

  def run(batch: List[TokenizedInfill], k):
    """Decodes one batch (completed to batch_size real+filler rows); returns per-item results."""
    n_real = len(batch)
    if method == "setdlm":
      rows = [t.canvas for t in batch] + fill
      rows += [fill[0]] * (batch_size + len(fill) - len(rows))
      out = sampling.set_infill(model, params, rows, cfg, k)
      mids = [[int(x) for x in out.canvas[i, t.span[0]:t.span[1]]] for i, t in enumerate(batch)]
      res = (out.num_steps, out.num_committed, out.forward_calls)
    elif method == "mdlm":
      rows = [t.canvas for t in batch] + [[bos]] * (batch_size - n_real)
      out = mdlm_infill(model, params, rows, cfg, k, length=lc, max_targets=m_max)
      mids = [[int(x) for x in out["canvas"][i, t.span[0]:t.span[1]]] for i, t in enumerate(batch)]
      res = (out["num_steps"], out["num_committed"], out["forward_calls"])
    else:
      rows = [t.prompt for t in batch] + fill
      rows += [fill[0]] * (batch_size + len(fill) - len(rows))
      sampler = sampling.ar_generate if method == "ar" else sampling.bd3lm_generate
      out = sampler(model, params, rows, cfg, k)
      mids = [list(out.generated[i][:t.middle_len]) for i, t in enumerate(batch)]
      res = (out.num_steps, out.num_committed, out.forward_calls)
    steps, committed, calls = (np.asarray(r)[:n_real] for r in res)
    return mids, steps, committed, calls

  batches = [list(items[i:i + batch_size]) for i in range(0, len(items), batch_size)]
  t0 = time.perf_counter()
  jax.block_until_ready(run(batches[0], key)[0])  # compile (same shapes for every batch)
  compile_s = time.perf_counter() - t0
  middles, seconds, tokens, steps, committed, calls = [], 0.0, 0, 0, 0, 0
  for i, batch in enumerate(batches):
    t0 = time.perf_counter()
    mids, s, c, f = run(batch, jax.random.fold_in(key, i))
    seconds += time.perf_counter() - t0
    middles += mids
    tokens += sum(t.middle_len for t in batch)
    steps += int(s.sum())
    committed += int(c.sum())
    calls += int(f.sum())
  return dict(middles=middles, seconds=seconds, tokens=tokens, steps=steps, committed=committed,
              forward_calls=calls, compile_seconds=max(compile_s - seconds / len(batches), 0.0))


def infill_eval(method: str, model, params, tokenizer, items: Sequence[TokenizedInfill], cfg, *,
                batch_size: int = 8, rng=None, num_shown: int = 3) -> Dict[str, Any]:
  """Decodes `items` and scores them: ROUGE-1/2/L, tokens/s, tokens/step, forward calls.

  Returns a JSON-able dict (per-example ROUGE dropped) with a few decoded examples.
  """
  dec = decode_infill(method, model, params, items, cfg, batch_size=batch_size, rng=rng)
  preds = [tokenizer.decode([i for i in mid if i != cfg.mask_token_id]).strip()
           for mid in dec["middles"]]
  refs = [t.example.middle.strip() for t in items]
  rouge = rouge_scores(preds, refs)
  n = len(items)
  out = {k: rouge[k] for k in ROUGE_TYPES}
  out.update(
      num_examples=n, tokens=dec["tokens"], seconds=dec["seconds"],
      tokens_per_second=dec["tokens"] / dec["seconds"] if dec["seconds"] > 0 else 0.0,
      tokens_per_step=dec["committed"] / dec["steps"] if dec["steps"] else 0.0,
      forward_calls_per_example=dec["forward_calls"] / n,
      compile_seconds=dec["compile_seconds"],
      examples=[{"id": t.example.id, "prefix": t.example.prefix, "reference": r, "generated": p,
                 "suffix": t.example.suffix} for t, r, p in list(zip(items, refs, preds))[:num_shown]])
  return out


__all__ = ["CLOZE_SETTINGS", "SETTINGS", "DEFAULT_CLOZE_PATH", "ROUGE_TYPES", "InfillExample",
           "TokenizedInfill", "read_cloze", "cloze_examples", "corpus_examples",
           "tokenize_example", "tokenize_examples", "rouge_scores", "mdlm_infill",
           "decode_infill", "infill_eval"]
