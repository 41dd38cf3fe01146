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
          (prefix and suffix), `sampling.mdlm_infill` (the MDLM sampler of SPEC §4.8 applied to an
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
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from absl import logging
import jax
import numpy as np

from setdiff_jax import decoders
from setdiff_jax.data import sources
from setdiff_jax.sampling.mdlm_infill import mdlm_infill
from setdiff_jax.sampling import compiles
from setdiff_jax.sampling.timing import time_calls

CLOZE_SETTINGS = ("1sent", "3sent")
SETTINGS = CLOZE_SETTINGS + ("corpus",)
CLOZE_COLUMNS = (
  "InputStoryid",
  "InputSentence1",
  "InputSentence2",
  "InputSentence3",
  "InputSentence4",
  "RandomFifthSentenceQuiz1",
  "RandomFifthSentenceQuiz2",
  "AnswerRightEnding",
)
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
    return self.canvas[: self.span[0]]

  @property
  def middle_len(self) -> int:
    return self.span[1] - self.span[0]


def read_cloze(path: str) -> List[Dict[str, str]]:
  """Rows of the Story Cloze CSV with s1..s5 (s5 = the right ending) and the story id."""
  if not os.path.isfile(path):
    raise FileNotFoundError(
      f"Story Cloze CSV not found at {path!r} ({os.path.abspath(path)}): pass the path of "
      "rocstories-cloze-val-2016.csv as --cloze_path (its default is relative to the current "
      "directory: ../shared/data/rocstories-cloze-val-2016.csv), or --infill_settings=corpus"
    )
  try:
    return _read_cloze_rows(path)
  except UnicodeDecodeError as e:
    raise ValueError(f"{path}: not UTF-8 text ({e})") from e


def _read_cloze_rows(path: str) -> List[Dict[str, str]]:
  with open(path, newline="", encoding="utf-8-sig") as f:  # -sig: a spreadsheet's BOM
    reader = csv.DictReader(f)
    missing = [c for c in CLOZE_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
      raise ValueError(f"{path}: not a Story Cloze CSV, missing columns {missing}")
    rows = []
    for r in reader:
      empty = [c for c in CLOZE_COLUMNS if r.get(c) is None]  # a row with too few fields
      if empty:
        raise ValueError(
          f"{path}: line {reader.line_num} has too few columns (no {empty[0]}); fix or remove "
          "that line"
        )
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


def corpus_examples(
  tokenizer,
  *,
  max_length: int,
  num_examples: Optional[int] = None,
  min_tokens: int = 24,
  split: str = "validation",
) -> Tuple[List[InfillExample], int]:
  """Held-out paragraphs of the embedded corpus, middle third masked (token level).

  Paragraphs with min_tokens <= n <= max_length - 2 tokens are kept (BOS and EOS must fit); the
  middle is tokens [n // 3, 2n // 3). Returns (examples in corpus order, number of paragraphs
  skipped for length); `num_examples` keeps the first ones.
  """
  out, skipped = [], 0
  for i, para in enumerate(sources.embedded_corpus(split)):
    ids = list(tokenizer.encode(para))
    n = len(ids)
    if not min_tokens <= n <= max_length - 2:
      skipped += 1
      continue
    a, b = n // 3, (2 * n) // 3
    pre, mid, suf = ids[:a], ids[a:b], ids[b:]
    out.append(
      InfillExample(
        f"{split}-{i}",
        tokenizer.decode(pre),
        tokenizer.decode(mid),
        tokenizer.decode(suf),
        pre,
        mid,
        suf,
      )
    )
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


def tokenize_examples(
  tokenizer, examples: Sequence[InfillExample], mask_id: int, max_length: int
) -> Tuple[List[TokenizedInfill], int]:
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
def decode_infill(
  method: str,
  model,
  params,
  items: Sequence[TokenizedInfill],
  cfg,
  *,
  batch_size: int = 8,
  rng=None,
) -> Dict[str, Any]:
  """Fills the middle of every item with the decoder of `method` (see the module docstring).

  Methods that infill a canvas (their registry entry's `canvas_infill`: SetDLM, MDLM) see prefix
  and suffix; the others continue BOS + prefix for the middle's length with their sampler.

  Args:
    cfg: a `sampling.SamplerConfig` (window, threshold, greedy, repetition penalty...);
      `stop_at_eos` is turned off and N comes from the items.
  Returns:
    dict: middles (list of generated middle ids per item), seconds (decoding wall time after a
    compiling warm-up batch), tokens (middle tokens generated), steps, committed, forward_calls
    (sums over items), compile_seconds, compiled_programs (decoding programs compiled),
    wall_seconds_with_compile / tokens_with_compile (the cold run: warm-up and timed batches).
  """
  if not items:
    raise ValueError("no infill examples to decode")
  entry = decoders.get(method)
  key = jax.random.PRNGKey(cfg.seed) if rng is None else rng
  m_max = max(t.middle_len for t in items)
  bos = int(cfg.bos_token_id if cfg.bos_token_id is not None else cfg.pad_token_id)
  cfg = cfg.replace(stop_at_eos=False)
  shapes = {
    "length": max(len(t.canvas) for t in items),
    "max_targets": m_max,
    "max_visible": max(len(t.canvas) - t.middle_len for t in items),
    "batch_size": batch_size,
  }
  if not entry.infills_canvas:
    cfg = cfg.replace(max_new_tokens=m_max, max_length=None)
    fill = [[bos] * max(len(t.prompt) for t in items)]  # pins the prompt width

  def run(batch: List[TokenizedInfill], k):
    """Decodes one batch (completed to batch_size real+filler rows); returns per-item results."""
    if entry.infills_canvas:
      out = entry.canvas_infill(model, params, [t.canvas for t in batch], cfg, k, shapes=shapes)
      mids = [
        [int(x) for x in out["canvas"][i, t.span[0] : t.span[1]]] for i, t in enumerate(batch)
      ]
      return mids, out["num_steps"], out["num_committed"], out["forward_calls"]
    rows = [t.prompt for t in batch] + fill
    rows += [fill[0]] * (batch_size + len(fill) - len(rows))
    out = entry.generate(model, params, rows, cfg, k)
    mids = [list(out.generated[i][: t.middle_len]) for i, t in enumerate(batch)]
    n = len(batch)
    return mids, out.num_steps[:n], out.num_committed[:n], out.forward_calls[:n]

  batches = [list(items[i : i + batch_size]) for i in range(0, len(items), batch_size)]
  programs = compiles.compiled_programs()
  outs, times, compile_s = time_calls(
    run, [(b, jax.random.fold_in(key, i)) for i, b in enumerate(batches)], warmup=(batches[0], key)
  )  # compile (same shapes for every batch)
  middles = [m for out in outs for m in out[0]]
  seconds = float(sum(times))
  return dict(
    middles=middles,
    seconds=seconds,
    tokens=sum(t.middle_len for t in items),
    steps=int(sum(np.sum(o[1]) for o in outs)),
    committed=int(sum(np.sum(o[2]) for o in outs)),
    forward_calls=int(sum(np.sum(o[3]) for o in outs)),
    compile_seconds=max(compile_s - seconds / len(batches), 0.0),
    compiled_programs=compiles.compiled_programs() - programs,
    # the cold run: the compiling warm-up (batch 0 again) with the timed batches
    wall_seconds_with_compile=compile_s + seconds,
    tokens_with_compile=sum(t.middle_len for t in items) + sum(t.middle_len for t in batches[0]),
  )


def infill_eval(
  method: str,
  model,
  params,
  tokenizer,
  items: Sequence[TokenizedInfill],
  cfg,
  *,
  batch_size: int = 8,
  rng=None,
  num_shown: int = 3,
) -> Dict[str, Any]:
  """Decodes `items` and scores them: ROUGE-1/2/L, tokens/s, tokens/step, forward calls.

  Returns a JSON-able dict (per-example ROUGE dropped) with a few decoded examples.
  """
  dec = decode_infill(method, model, params, items, cfg, batch_size=batch_size, rng=rng)
  preds = [
    tokenizer.decode([i for i in mid if i != cfg.mask_token_id]).strip() for mid in dec["middles"]
  ]
  refs = [t.example.middle.strip() for t in items]
  rouge = rouge_scores(preds, refs)
  n = len(items)
  out = {k: rouge[k] for k in ROUGE_TYPES}
  out.update(
    num_examples=n,
    tokens=dec["tokens"],
    seconds=dec["seconds"],
    tokens_per_second=dec["tokens"] / dec["seconds"] if dec["seconds"] > 0 else 0.0,
    tokens_per_step=dec["committed"] / dec["steps"] if dec["steps"] else 0.0,
    forward_calls_per_example=dec["forward_calls"] / n,
    compile_seconds=dec["compile_seconds"],
    compiled_programs=dec["compiled_programs"],
    tokens_per_second_with_compile=(
      dec["tokens_with_compile"] / dec["wall_seconds_with_compile"]
      if dec["wall_seconds_with_compile"] > 0
      else 0.0
    ),
    examples=[
      {
        "id": t.example.id,
        "prefix": t.example.prefix,
        "reference": r,
        "generated": p,
        "suffix": t.example.suffix,
      }
      for t, r, p in list(zip(items, refs, preds))[:num_shown]
    ],
  )
  return out


def setting_items(
  tok, seq_len: int, mask_id: int, setting: str, *, cloze_path: str, num_infill=None
) -> Tuple[List[TokenizedInfill], int]:
  """(tokenized examples of one infill setting for a run of context `seq_len`, how many were
  skipped as too long). No example that fits is one ValueError naming the fix (n = 0 with every
  metric '-' would read as a result); some skipped is a warning."""
  if setting == "corpus":
    examples, skipped_len = corpus_examples(tok, max_length=seq_len, num_examples=num_infill)
    items, skipped = tokenize_examples(tok, examples, mask_id, seq_len)
    if not items:
      raise ValueError(
        f"--infill_settings=corpus: no held-out corpus paragraph fits this run's "
        f"seq_len={seq_len} (BOS + paragraph + EOS): drop corpus from --infill_settings"
      )
    return items, skipped + skipped_len
  stories = cloze_examples(cloze_path, setting)
  items, skipped = tokenize_examples(tok, stories, mask_id, seq_len)
  if not items:
    raise ValueError(
      f"--infill_settings={setting}: every one of the {len(stories)} stories of "
      f"{cloze_path} is longer than this run's seq_len={seq_len} (BOS + story + EOS): drop "
      f"{setting} from --infill_settings, or evaluate a run with a longer context"
      if stories
      else f"--cloze_path={cloze_path} holds no stories: pass the Story Cloze CSV"
    )
  if skipped:
    logging.warning(
      "infill %s: %d of %d stories are longer than seq_len=%d and are skipped (the table's "
      "'skipped' column)",
      setting,
      skipped,
      len(stories),
      seq_len,
    )
  if num_infill is not None:
    items = items[:num_infill]
  return items, skipped


__all__ = [
  "CLOZE_SETTINGS",
  "SETTINGS",
  "DEFAULT_CLOZE_PATH",
  "ROUGE_TYPES",
  "InfillExample",
  "TokenizedInfill",
  "read_cloze",
  "cloze_examples",
  "corpus_examples",
  "tokenize_example",
  "tokenize_examples",
  "setting_items",
  "rouge_scores",
  "mdlm_infill",
  "decode_infill",
  "infill_eval",
]
