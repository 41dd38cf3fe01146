"""Decoding text with a run's method: its sampler and defaults, eval-time samples, and the logic
behind `launch/sample.py` (kept importable; the launcher only parses flags).

  cfg = sampler_config_for(obj_cfg, tokenizer, seq_len, window=8, threshold=0.9)  # tau 0.9
  texts = generate_text(model, params, tokenizer, obj_cfg, seq_len, num_samples=4, rng=key)
  report = sample_from_workdir("/tmp/run", prompt="It is a truth", num_samples=4)

Tokenizer protocol (as `setdiff_jax.data.tokenizers.Tokenizer`): `encode(text) -> list[int]` (no
special tokens), `decode(ids) -> str` (drops specials), `bos_id`, `eos_id`, `pad_id`, `mask_id`,
`vocab_size`. Infill syntax (`[GAP:n]`): see `sampling/text.py`.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
import time
from typing import Any, Callable, List, Optional, Sequence

import jax
import numpy as np

from setdiff_jax import decoders, paths
from setdiff_jax.data.pairs import format_prompt
from setdiff_jax.workdir import load as workdir_lib
from setdiff_jax.sampling import compiles, continuous, policies
from setdiff_jax.sampling.config import DecodeSetting, SampleOutput, SamplerConfig, commit_policy
from setdiff_jax.sampling.text import parse_infill, prompt_ids
from setdiff_jax.sampling.timing import time_calls


def sampler_config_for(
  objective_config,
  tokenizer,
  seq_len: int,
  *,
  setting: Optional[DecodeSetting] = None,
  threshold: Optional[float] = None,
  policy: Optional[str] = None,
  policy_arg: Optional[float] = None,
  **overrides,
) -> SamplerConfig:
  """The `SamplerConfig` matching a trained run: special ids, the method's defaults (W = S for
  SetDLM, G = S for BD3LM), max_length = seq_len, power-of-two length buckets (a bounded number
  of compiled programs; the tokens do not depend on them). `setting` sets the window and commit
  policy; the launchers' --threshold / --policy / --policy_arg become one `CommitPolicy`
  (`commit_policy`); `overrides` replace any other field (None ignored)."""
  oc = objective_config
  fields = dict(
    mask_token_id=int(oc.mask_token_id),
    eos_token_id=int(oc.eos_token_id),
    pad_token_id=int(oc.pad_token_id),
    bos_token_id=getattr(tokenizer, "bos_id", None),
    max_length=int(seq_len),
    max_new_tokens=max(1, int(seq_len) - 1),
    length_buckets="pow2",
  )
  fields.update(decoders.get(oc.name).sampler_fields(oc))
  if setting is not None:
    fields.update(setting.sampler_fields())
  if (threshold, policy, policy_arg) != (None, None, None):
    fields["policy"] = commit_policy(policy, policy_arg, threshold)
  fields.update({k: v for k, v in overrides.items() if v is not None})
  return SamplerConfig(**fields)


def decode_setting(objective_config, cfg: SamplerConfig) -> DecodeSetting:
  """The setting a run's method decodes `cfg` with, as reports name it: W only for a windowed
  sampler, the commit policy only for a method with one (AR: '-')."""
  method = decoders.get(objective_config.name)
  return DecodeSetting(
    cfg.window if method.uses_window else None, cfg.policy if method.uses_threshold else None
  )


DECODE_WEIGHTS = ("float32", "bfloat16")


def decode_weights(params, dtype: str = "float32"):
  """The parameters a sampler decodes with: 'float32' as they are; 'bfloat16' every floating leaf
  cast to bf16, half the bytes a memory-bound decoding step reads (batch 1 reads every weight
  once per call). Pair it with the backbone's compute dtype 'bfloat16' (`DiTConfig.dtype`,
  `Qwen3Config.dtype`): an fp32-compute model would convert the weights back on every call.
  The tokens can differ from fp32 where two candidates' probabilities are within bf16 rounding
  (tests/test_sampling.py: logits within bf16 tolerance, tokens equal on a tiny model)."""
  if dtype not in DECODE_WEIGHTS:
    raise ValueError(f"decode weights {dtype!r}: use one of {DECODE_WEIGHTS}")
  if dtype == "float32":
    return params
  cast = lambda x: x.astype(dtype) if jax.numpy.issubdtype(x.dtype, jax.numpy.floating) else x  # noqa: E731
  return jax.tree_util.tree_map(cast, params)


def sampler_for(objective: str) -> Callable[..., SampleOutput]:
  """The sampler of a method: generate(model, params, prompts, cfg, rng) -> SampleOutput."""
  return decoders.get(objective).generate


def continuous_for(objective: str, cfg: SamplerConfig) -> Optional[Callable[..., Any]]:
  """The continuous-batching decoder of a method when it is exact for this config
  (`sampling.continuous`): generate(model, params, prompts, cfg, rng, slots=B) ->
  ContinuousOutput; None when the method or config needs static batches."""
  kind = decoders.get(objective).continuous_kind
  if continuous.unsupported(kind, cfg) is not None:
    return None
  return functools.partial(continuous.continuous_generate, kind)


def generate_text(
  model,
  params,
  tokenizer,
  objective_config,
  seq_len: int,
  num_samples: int,
  rng,
  prompt: Optional[str] = None,
  *,
  max_new_tokens: Optional[int] = None,
  greedy: bool = False,
  top_p: float = 0.9,
  **overrides,
) -> List[str]:
  """Decodes `num_samples` texts from params with the sampler matching the objective.

  For the train loop's eval: unconditional (BOS) or from `prompt`, N = seq_len - len(prompt) by
  default, nucleus sampling (greedy=False, top_p) so the samples differ. Returns the decoded texts
  (prompt included).
  """
  ids = prompt_ids(tokenizer, prompt)
  n = max_new_tokens or seq_len - len(ids)
  if n < 1:
    raise ValueError(f"prompt of {len(ids)} tokens leaves no room in seq_len={seq_len}")
  cfg = sampler_config_for(
    objective_config, tokenizer, seq_len, max_new_tokens=n, greedy=greedy, top_p=top_p, **overrides
  )
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
  compiled_programs: int = 0  # decoding programs compiled by this run (the warm-up's)
  warmup_seconds: float = 0.0  # the untimed warm-up calls: one per batch shape, compile included

  @property
  def tokens_per_second(self) -> float:
    return self.num_generated / self.seconds if self.seconds > 0 else 0.0

  @property
  def tokens_per_step(self) -> float:
    return self.num_committed / self.num_steps if self.num_steps else 0.0


@dataclasses.dataclass
class _DecodeJob:
  """What `run_sampling` repeats per batch: the config, the input ids, the sampler call, the text
  of row b and the counts (steps, committed, forward calls, generated) of an output."""

  cfg: SamplerConfig
  ids: List[int]
  run: Callable[[Any, Any], Any]
  text: Callable[[Any, int], str]
  counts: Callable[[Any], tuple]


def _decode_job(method, model, params, tokenizer, cfg, seq_len, prompt, infill, max_new_tokens):
  """The infill (`--infill` template, every gap filled) or prompted (`--prompt`) job."""
  if infill is not None:
    if max_new_tokens is not None:  # honoured or refused, never dropped
      raise ValueError(
        "--infill's [GAP:n] spans set how many tokens are generated, so --max_new_tokens "
        "would be unused; give one"
      )
    if not method.infills_canvas:
      raise ValueError(
        f"this run's objective {method.name!r} cannot infill: {method.infill_unsupported}"
      )
    template = parse_infill(infill)
    ids, spans = template.canvas(tokenizer, cfg.mask_token_id)
    cfg = cfg.replace(max_new_tokens=sum(template.gaps))
    return _DecodeJob(
      cfg,
      ids,
      run=lambda rows, key: method.canvas_infill(model, params, rows, cfg, key),
      text=lambda out, b: template.fill(
        [tokenizer.decode(out["canvas"][b][s:e]) for s, e in spans]
      ),
      counts=lambda out: (
        out["num_steps"],
        out["num_committed"],
        out["forward_calls"],
        int(np.sum(out["num_committed"])),
      ),
    )
  ids = prompt_ids(tokenizer, prompt)
  if len(ids) >= seq_len:  # before N = L - prompt is derived (it would be <= 0)
    raise ValueError(
      f"the prompt is {len(ids)} tokens (BOS included) but the run's context is "
      f"seq_len={seq_len}; shorten --prompt to at most {seq_len - 2} tokens"
    )
  cfg = cfg.replace(max_new_tokens=seq_len - len(ids) if max_new_tokens is None else max_new_tokens)
  return _DecodeJob(
    cfg,
    ids,
    run=lambda rows, key: method.generate(model, params, rows, cfg, key),
    text=lambda out, b: tokenizer.decode(out.sequences[b]),
    counts=lambda out: (out.num_steps, out.num_committed, out.forward_calls, out.num_generated),
  )


def _timed_report(job: _DecodeJob, seed, num_samples, batch_size, warmup, write) -> SamplingReport:
  """Runs the job in batches (with `warmup`, first one untimed call per batch shape), writes each
  text and the throughput line."""
  key = jax.random.PRNGKey(seed)
  batches = [min(batch_size, num_samples - i) for i in range(0, num_samples, batch_size)]
  programs = compiles.compiled_programs()
  t0 = time.perf_counter()
  for nb in sorted(set(batches)) if warmup else ():  # every shape (a smaller last batch too)
    jax.block_until_ready(job.run([job.ids] * nb, key))
  warm = time.perf_counter() - t0
  outs, seconds, _ = time_calls(
    job.run, [([job.ids] * nb, jax.random.fold_in(key, i)) for i, nb in enumerate(batches)]
  )
  texts, generated, steps, committed, calls = [], 0, 0, 0, []
  for out, nb in zip(outs, batches):
    num_steps, num_committed, forward_calls, num_generated = job.counts(out)
    generated += int(num_generated)
    steps += int(np.sum(num_steps))
    committed += int(np.sum(num_committed))
    calls += [int(c) for c in forward_calls]
    for b in range(nb):
      texts.append(job.text(out, b))
      write(f"=== sample {len(texts)} ===\n{texts[-1]}\n")
  report = SamplingReport(
    texts=texts,
    num_generated=generated,
    seconds=float(sum(seconds)),
    num_steps=steps,
    num_committed=committed,
    forward_calls=calls,
    compiled_programs=compiles.compiled_programs() - programs,
    warmup_seconds=float(warm),
  )
  write(
    f"tokens/s: {report.tokens_per_second:.1f}  tokens/step: {report.tokens_per_step:.2f}  "
    f"compiled programs: {report.compiled_programs}  wall s with compile: "
    f"{report.seconds + report.warmup_seconds:.2f}"
  )
  return report


def run_sampling(
  model,
  params,
  tokenizer,
  objective_config,
  seq_len: int,
  *,
  prompt: Optional[str] = None,
  infill: Optional[str] = None,
  num_samples: int = 1,
  batch_size: int = 1,
  max_new_tokens: Optional[int] = None,
  window: Optional[int] = None,
  threshold: Optional[float] = None,
  policy: Optional[str] = None,
  policy_arg: Optional[float] = None,
  seed: int = 0,
  greedy: bool = False,
  top_p: float = 1.0,
  temperature: float = 1.0,
  repetition_penalty: float = 1.0,
  align_to_blocks: bool = False,
  warmup: bool = True,
  write: Callable[[str], Any] = print,
  header: Optional[str] = None,
) -> SamplingReport:
  """Samples `num_samples` texts in batches of `batch_size` and prints them (the CLI body).

  Prints `header` followed by the sampler settings (if a header is given), each sample as its own
  block, then `tokens/s: X  tokens/step: Y  compiled programs: C  wall s with compile: S`. With
  `warmup`, each batch shape (the first, and a smaller last one) is run once untimed so that
  compilation does not count in tokens/s (S counts it: the warm-ups plus the timed batches). `seed=-1` draws a random seed.
  `align_to_blocks`: BD3LM / block-wise MDLM blocks on the block grid (`SamplerConfig`).
  """
  if num_samples < 1 or batch_size < 1:
    raise ValueError(f"--num_samples={num_samples} and --batch_size={batch_size} must be >= 1")
  if prompt and infill:
    raise ValueError("give either --prompt or --infill, not both")
  check_sampling_flags(seq_len, window=window, max_new_tokens=max_new_tokens)
  if seed < 0:  # -1: a fresh seed per call, printed in the header
    seed = secrets.randbelow(2**31)
  method = decoders.get(objective_config.name)
  given = {"threshold": threshold, "policy_arg": policy_arg}
  given["policy"] = None if policy in (None, policies.DEFAULT) else policy
  check_method_flags(
    method,
    window=window,
    policy_flags=[name for name, value in given.items() if value is not None],
    align_to_blocks=align_to_blocks,
  )
  cfg = sampler_config_for(
    objective_config,
    tokenizer,
    seq_len,
    window=window,
    threshold=threshold,
    policy=policy,
    policy_arg=policy_arg,
    seed=seed,
    greedy=greedy,
    top_p=top_p,
    temperature=temperature,
    repetition_penalty=repetition_penalty,
    align_to_blocks=align_to_blocks,
  )
  job = _decode_job(method, model, params, tokenizer, cfg, seq_len, prompt, infill, max_new_tokens)
  if header is not None:
    write(f"{header}{sampler_settings(method, objective_config, job.cfg, infill is not None)}\n")
  return _timed_report(job, seed, num_samples, batch_size, warmup, write)


def check_method_flags(
  method,
  *,
  window=None,
  policy_flags: Sequence[str] = (),
  align_to_blocks: bool = False,
  prefix="--",
):
  """ValueError for a decoding setting the run's sampler has no use for (it would be dropped
  without a word): the window W (the set sampler's), a commit policy or tau (every sampler but
  AR's, which commits one token a step), block alignment (BD3LM and block-wise MDLM).
  `policy_flags`: the names of the policy settings given (e.g. ['threshold', 'policy'])."""
  unused = []
  if window is not None and not method.uses_window:
    unused.append((f"{prefix}window", "no set window W"))
  if not method.uses_threshold:
    unused += [
      (f"{prefix}{name}", "no commit policy: it commits one token a step") for name in policy_flags
    ]
  if align_to_blocks and not method.uses_block_grid:
    unused.append((f"{prefix}align_to_blocks", "no block grid"))
  if unused:
    names = " and ".join(dict.fromkeys(n for n, _ in unused))
    why = "; ".join(dict.fromkeys(w for _, w in unused))
    raise ValueError(
      f"{names} would be ignored: this {method.name} run's sampler has {why}; drop "
      f"{'it' if len(unused) == 1 else 'them'}"
    )


def check_sampling_flags(
  seq_len: int,
  *,
  window: Optional[int] = None,
  max_new_tokens: Optional[int] = None,
  prefix: str = "--",
):
  """None means "the run's default"; an explicit value is checked, never replaced. `prefix`:
  how the caller names its settings ('--' for the launchers' flags, 'model_args ' for lm_eval)."""
  if window is not None and not 1 <= window <= seq_len:
    raise ValueError(
      f"{prefix}window={window} must be in [1, seq_len={seq_len}] (W <= L; leave it "
      "unset for the run's set size S)"
    )
  if max_new_tokens is not None and not 1 <= max_new_tokens < seq_len:
    raise ValueError(
      f"{prefix}max_new_tokens={max_new_tokens} must be in [1, seq_len - 1 = "
      f"{seq_len - 1}] (leave it unset to fill the context)"
    )


def sampler_settings(method, objective_config, cfg: SamplerConfig, infill: bool = False) -> str:
  """One line: the method's sampler and its settings (the header of `launch/sample.py`)."""
  parts = [f"sampler: {method.name}{' (infill)' if infill else ''}"]
  parts += [
    f"{k}={getattr(cfg, k)}"
    for k in method.sampler_fields(objective_config)
    if k == "block_size" or method.uses_window
  ]
  if method.uses_threshold:  # the policy's report label: 'tau=0.5', 'policy=margin tau=off'
    threshold_rule = cfg.policy.name == policies.DEFAULT
    parts.append(cfg.policy.label if threshold_rule else f"policy={cfg.policy.label}")
  parts.append("greedy" if cfg.greedy else f"top_p={cfg.top_p} temperature={cfg.temperature}")
  parts += [
    f"repetition_penalty={cfg.repetition_penalty}",
    f"max_new_tokens={cfg.max_new_tokens}",
    f"seed={cfg.seed}",
  ]
  if cfg.align_to_blocks:
    parts.append("align_to_blocks")
  return "  ".join(parts)


def params_label(config, use_ema: bool) -> str:
  """What the sampled parameters are, in words: with ema_decay = 0 the EMA copy *is* the raw
  parameters; with eval_params = raw training evaluated (and sampled) the raw ones."""
  if not use_ema:
    return "raw"
  if float(config.get("ema_decay", 1.0) or 0.0) == 0.0:
    return "EMA = raw (ema_decay=0)"
  if str(config.get("eval_params", "ema")) == "raw":
    return "EMA (training evaluated the raw ones; --nouse_ema samples those)"
  return "EMA"


def sample_from_workdir(
  workdir: str,
  *,
  step: Optional[int] = None,
  use_ema: bool = True,
  dtype: Optional[str] = "float32",
  mesh: Optional[dict] = None,
  prompt_style: Optional[str] = None,
  **kwargs,
) -> SamplingReport:
  """Loads a trained run (parameters only, `workdir.load_inference_state`, placed on `mesh`: a
  {"data", "fsdp", "tensor"} size dict, default all devices on data); `run_sampling`. A `prompt`
  is wrapped as the run's training prompts were (`prompt_style`, default the run's
  data.prompt_style, e.g. the GSM8K instruction and chat template; 'plain': as given)."""
  if prompt_style is not None and kwargs.get("prompt") is None:
    raise ValueError("--prompt_style wraps --prompt, which is not given: drop it, or give a prompt")
  state = workdir_lib.load_inference_state(workdir, step=step, use_ema=use_ema, mesh_config=mesh)
  model = workdir_lib.inference_model(state.model_config, dtype)
  style = prompt_style or state.config.data.get("prompt_style", "plain")
  if kwargs.get("prompt") is not None:
    kwargs["prompt"] = format_prompt(kwargs["prompt"], style)
  kwargs.setdefault(
    "header",
    f"workdir: {paths.resolve(workdir)}  step: {state.step}  "
    f"params: {params_label(state.config, use_ema)}  "
    + (f"prompt_style: {style}  " if style != "plain" else ""),
  )
  return run_sampling(
    model,
    state.params,
    state.tokenizer,
    state.objective_config,
    int(state.config.seq_len),
    **kwargs,
  )


__all__ = [
  "DECODE_WEIGHTS",
  "decode_weights",
  "sampler_config_for",
  "decode_setting",
  "sampler_for",
  "continuous_for",
  "generate_text",
  "SamplingReport",
  "run_sampling",
  "check_method_flags",
  "check_sampling_flags",
  "sampler_settings",
  "sample_from_workdir",
  "params_label",
]
