"""Text-level helpers: the sampler matching an objective, infill parsing, eval-time samples, and the
logic behind `launch/sample.py` (kept importable; the launcher only parses flags).

Tokenizer protocol (as `setdiff_jax.data.tokenizers.Tokenizer`): `encode(text) -> list[int]` (no
special tokens), `decode(ids) -> str` (drops specials), `bos_id`, `eos_id`, `pad_id`, `mask_id`,
`vocab_size`.

Infill syntax: the gap is written `[GAP:n]`, n >= 1 tokens to generate; several gaps are allowed.
The canvas is BOS + enc(text before) + M * n + enc(text after) (+ EOS), each text segment encoded on
its own so the gap sits on token boundaries; the printed result re-inserts the decoded middle into
the original text, which is thus unchanged around the gap.
"""
from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Callable, List, Optional, Sequence

import jax
import numpy as np

from setdiff_jax.sampling.baselines import ar_generate, bd3lm_generate, mdlm_generate
from setdiff_jax.sampling.config import SampleOutput, SamplerConfig
from setdiff_jax.sampling.set_sampler import set_generate, set_infill

_GAP = re.compile(r"\[GAP:(\d+)\]")
_GAP_LIKE = re.compile(r"\[\s*gap\b[^\]]*\]?", re.IGNORECASE)


@dataclasses.dataclass
class InfillTemplate:
  """A parsed infill text: segments[i] precedes gap i (len(segments) == len(gaps) + 1)."""
  segments: List[str]
  gaps: List[int]

  def canvas(self, tokenizer, mask_id: int, *, add_bos: bool = True, add_eos: bool = True):
    """Token canvas and, per gap, its token positions."""
    ids: List[int] = []
    if add_bos and getattr(tokenizer, "bos_id", None) is not None:
      ids.append(int(tokenizer.bos_id))
    spans = []
    for seg, n in zip(self.segments, self.gaps):
      ids += list(tokenizer.encode(seg)) if seg else []
      spans.append((len(ids), len(ids) + n))
      ids += [mask_id] * n
    if self.segments[-1]:
      ids += list(tokenizer.encode(self.segments[-1]))
    if add_eos and getattr(tokenizer, "eos_id", None) is not None:
      ids.append(int(tokenizer.eos_id))
    return ids, spans

  def fill(self, middles: Sequence[str]) -> str:
    out = [self.segments[0]]
    for mid, seg in zip(middles, self.segments[1:]):
      out += [mid, seg]
    return "".join(out)


def parse_infill(text: str) -> InfillTemplate:
  """Splits `text` at its `[GAP:n]` markers. ValueError on no gap, an empty gap or bad syntax."""
  segments, gaps, last = [], [], 0
  for mt in _GAP.finditer(text):
    segments.append(text[last:mt.start()])
    gaps.append(int(mt.group(1)))
    last = mt.end()
  segments.append(text[last:])
  for seg in segments:
    bad = _GAP_LIKE.search(seg)
    if bad:
      raise ValueError(f"unknown infill mask syntax {bad.group(0)!r}; write each gap as "
                       "[GAP:n] with n >= 1 the number of tokens to generate")
  if not gaps:
    raise ValueError("the infill text has no gap; mark the span to generate as [GAP:n]")
  for n in gaps:
    if n < 1:
      raise ValueError(f"empty gap [GAP:{n}]: a gap needs at least one token to generate")
  return InfillTemplate(segments=segments, gaps=gaps)


# ----------------------------------------------------------------------------- objective dispatch
def sampler_config_for(objective_config, tokenizer, seq_len: int, **overrides) -> SamplerConfig:
  """The `SamplerConfig` matching a trained run: special ids, W = S (setdlm), G = S (bd3lm),
  max_length = seq_len. `overrides` replace any field (None values are ignored)."""
  oc = objective_config
  fields = dict(mask_token_id=int(oc.mask_token_id), eos_token_id=int(oc.eos_token_id),
                pad_token_id=int(oc.pad_token_id),
                bos_token_id=getattr(tokenizer, "bos_id", None), max_length=int(seq_len),
                window=int(getattr(oc, "desired_set_size", 4)),
                max_new_tokens=max(1, int(seq_len) - 1))
  if oc.name == "bd3lm":
    fields["block_size"] = int(oc.block_size)
  fields.update({k: v for k, v in overrides.items() if v is not None})
  return SamplerConfig(**fields)


def sampler_for(objective: str) -> Callable[..., SampleOutput]:
  """setdlm -> set sampler; ar -> AR; mdlm -> MDLM; bd3lm -> BD3LM."""
  table = {"setdlm": set_generate, "ar": ar_generate, "mdlm": mdlm_generate,
           "bd3lm": bd3lm_generate}
  if objective not in table:
    raise ValueError(f"no sampler for objective {objective!r}; expected one of {sorted(table)}")
  return table[objective]


def prompt_ids(tokenizer, prompt: Optional[str]) -> List[int]:
  """[BOS] + encode(prompt) (BOS only when there is no prompt)."""
  ids = [int(tokenizer.bos_id)] if getattr(tokenizer, "bos_id", None) is not None else []
  if prompt:
    ids += list(tokenizer.encode(prompt))
  if not ids:
    raise ValueError("empty prompt and the tokenizer has no BOS token")
  return ids


def generate_text(model, params, tokenizer, objective_config, seq_len: int, num_samples: int,
                  rng, prompt: Optional[str] = None, *, max_new_tokens: Optional[int] = None,
                  greedy: bool = False, top_p: float = 0.9, **overrides) -> List[str]:
  """Decodes `num_samples` texts from params with the sampler matching the objective.

  For the train loop's eval: unconditional (BOS) or from `prompt`, N = seq_len - len(prompt) by
  default, nucleus sampling (greedy=False, top_p) so the samples differ. Returns the decoded texts
  (prompt included).
  """
  ids = prompt_ids(tokenizer, prompt)
  n = max_new_tokens or seq_len - len(ids)
  if n < 1:
    raise ValueError(f"prompt of {len(ids)} tokens leaves no room in seq_len={seq_len}")
  cfg = sampler_config_for(objective_config, tokenizer, seq_len, max_new_tokens=n, greedy=greedy,
                           top_p=top_p, **overrides)
  out = sampler_for(objective_config.name)(model, params, [ids] * num_samples, cfg, rng)
  return [tokenizer.decode(seq) for seq in out.sequences]


# ----------------------------------------------------------------------------- the CLI logic
@dataclasses.dataclass
class SamplingReport:
  texts: List[str]
  num_generated: int
  seconds: float
  num_steps: int
  num_committed: int
  forward_calls: List[int]

  @property
  def tokens_per_second(self) -> float:
    return self.num_generated / self.seconds if self.seconds > 0 else 0.0

  @property
  def tokens_per_step(self) -> float:
    return self.num_committed / self.num_steps if self.num_steps else 0.0


def run_sampling(model, params, tokenizer, objective_config, seq_len: int, *,
                 prompt: Optional[str] = None, infill: Optional[str] = None,
                 num_samples: int = 1, batch_size: int = 1,
                 max_new_tokens: Optional[int] = None, window: Optional[int] = None,
                 threshold: Optional[float] = None, seed: int = 0, greedy: bool = False,
                 top_p: float = 1.0, temperature: float = 1.0, repetition_penalty: float = 1.0,
                 warmup: bool = True, write: Callable[[str], Any] = print) -> SamplingReport:
  """Samples `num_samples` texts in batches of `batch_size` and prints them (the CLI body).

  Prints each sample as its own block, then `tokens/s: X  tokens/step: Y`. With `warmup`, the first
  batch is run once untimed so that compilation does not count in tokens/s.
  """
  if num_samples < 1 or batch_size < 1:
    raise ValueError("num_samples and batch_size must be >= 1")
  if prompt and infill:
    raise ValueError("give either a prompt or an infill text, not both")
  objective = objective_config.name
  cfg = sampler_config_for(objective_config, tokenizer, seq_len, window=window or None,
                           threshold=threshold, seed=seed, greedy=greedy, top_p=top_p,
                           temperature=temperature, repetition_penalty=repetition_penalty)
  if infill is not None:
    if objective != "setdlm":
      raise ValueError(f"infilling needs a setdlm model; this run's objective is {objective!r}")
    template = parse_infill(infill)
    ids, spans = template.canvas(tokenizer, cfg.mask_token_id)
    cfg = cfg.replace(max_new_tokens=sum(template.gaps))
    run = lambda rows, key: set_infill(model, params, rows, cfg, key)
    decode = lambda out, b: template.fill([tokenizer.decode(out.canvas[b][s:e]) for s, e in spans])
  else:
    ids = prompt_ids(tokenizer, prompt)
    n = max_new_tokens or seq_len - len(ids)
    cfg = cfg.replace(max_new_tokens=n)
    sampler = sampler_for(objective)
    run = lambda rows, key: sampler(model, params, rows, cfg, key)
    decode = lambda out, b: tokenizer.decode(out.sequences[b])

  key = jax.random.PRNGKey(seed)
  batches = [min(batch_size, num_samples - i) for i in range(0, num_samples, batch_size)]
  if warmup:
    run([ids] * batches[0], key)
  texts, seconds, generated, steps, committed, calls = [], 0.0, 0, 0, 0, []
  for i, nb in enumerate(batches):
    t0 = time.perf_counter()
    out = run([ids] * nb, jax.random.fold_in(key, i))
    seconds += time.perf_counter() - t0
    generated += out.num_generated
    steps += int(np.sum(out.num_steps))
    committed += int(np.sum(out.num_committed))
    calls += [int(c) for c in out.forward_calls]
    for b in range(nb):
      text = decode(out, b)
      texts.append(text)
      write(f"=== sample {len(texts)} ===\n{text}\n")
  report = SamplingReport(texts=texts, num_generated=generated, seconds=seconds, num_steps=steps,
                          num_committed=committed, forward_calls=calls)
  write(f"tokens/s: {report.tokens_per_second:.1f}  tokens/step: {report.tokens_per_step:.2f}")
  return report


def inference_model(model_config, dtype: Optional[str] = "float32"):
  """A DiT for sampling: compute dtype `dtype` (None keeps the run's; the reference generates in
  fp32, SPEC §3.7) and, on CPU, a CPU attention path in place of `cudnn`."""
  import dataclasses as dc
  from setdiff_jax.model import DiT
  changes = {}
  if dtype is not None:
    changes["dtype"] = dtype
  if model_config.attention == "cudnn" and jax.default_backend() != "gpu":
    changes["attention"] = "xla"
  return DiT(dc.replace(model_config, **changes) if changes else model_config)


def sample_from_workdir(workdir: str, *, step: Optional[int] = None, use_ema: bool = True,
                        dtype: Optional[str] = "float32", **kwargs) -> SamplingReport:
  """Loads a trained run (`checkpointing.load_inference_state`) and calls `run_sampling`."""
  from setdiff_jax import checkpointing  # the train loop's module; imported only when needed
  state = checkpointing.load_inference_state(workdir, step=step, use_ema=use_ema)
  model = inference_model(state.model_config, dtype)
  return run_sampling(model, state.params, state.tokenizer, state.objective_config,
                      int(state.config.seq_len), **kwargs)


__all__ = ["InfillTemplate", "parse_infill", "sampler_config_for", "sampler_for", "prompt_ids",
           "generate_text", "SamplingReport", "run_sampling", "inference_model",
           "sample_from_workdir"]
