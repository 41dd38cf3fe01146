"""lm-evaluation-harness adapter: a trained run as an `lm_eval` model named `setdiff_jax`.

  pip install -e ".[lmeval]"
  python -m setdiff_jax.evaluation.lm_eval_model --model setdiff_jax \
      --model_args workdir=DIR,window=4,threshold=0.9 --tasks TASK [--include_path TASK_DIR] ...

lm_eval 0.4.x finds models only in its own name table (`lm_eval/models/__init__.py`; no entry
points, and `--include_path` adds tasks only), so the plain `lm_eval` command cannot see this
class: the `python -m` line above (or `launch/lm_eval_harness.py`) imports this module, which
registers the class, then runs lm_eval's own CLI on the same arguments. In Python, import this module and
call `lm_eval.simple_evaluate(model="setdiff_jax", model_args={...}, ...)`. lm_eval is imported
here only: the rest of the package never needs it.

model_args (all optional except workdir):
  workdir          the training run (config.json, tokenizer/, checkpoints/; parameters only)
  step             checkpoint step (default: the latest that loads)
  ema              true / false (default: the run's `eval_params`)
  window / W       the set window W (default: the method's, e.g. the trained S)
  threshold / tau  confidence threshold tau; 'off' or none disables (default off)
  policy           commit policy (setdiff_jax/sampling/policies.py; default threshold)
  policy_arg       its parameter (gamma, f, tau, k or d; default: the policy's own)
  max_new_tokens   cap on generated tokens (default: the request's max_gen_toks)
  batch_size       rows per decoding / scoring call (default 8; `--batch_size` works too)
  seed             decoding seed (sampled generation, 'fht' reveal times) and likelihood seed
  cache_order      l2r (default) or fht (SPEC §4.3)
  align_to_blocks  true (default) / false: BD3LM and block-wise MDLM decode on the block grid
                   (`SamplerConfig.align_to_blocks`, the official `align_inputs_to_blocks`,
                   which the official GSM8K harness script sets for every non-SetDLM model);
                   false decodes from each prompt's end. No effect on SetDLM, AR, or MDLM
                   without a sub-block size
  num_orders       K draws per loglikelihood request (default 1: the one-order / one-draw bound)
  greedy_check     true (default): is_greedy is computed by decoding; false: always False
  overflow         error (default) or truncate_prompt: a context that leaves no room in the
                   model's context L (keep BOS + the context's last tokens; counted in a warning;
                   generate_until keeps room for max_gen_toks new tokens, as lm_eval's HF model)
  continuous       true (default) / false: generate_until decodes with continuous batching
                   (batch_size slots refilled as rows end, `sampling.continuous`) for the set
                   sampler and AR (greedy: the same text as static batches); false: static
                   batches
  mesh             the decoding mesh, AXIS=SIZE joined by ';' (e.g. data=2;tensor=4), as the
                   launchers' --mesh (default: every device on data)

Requests:
  generate_until         [BOS] + encode(context) is decoded with the run's own sampler
                         (`decoding.sampler_for`; prompt cached, each row stops at its EOS, batches
                         of mixed prompt lengths), greedy unless the task sets do_sample. N =
                         min(max_gen_toks, max_new_tokens, L - prompt length) per request; a
                         shorter N than max_gen_toks is logged. The text is cut at the first EOS,
                         then at the first of the request's `until` strings. Sampled: request i
                         draws from fold_in(PRNGKey(seed), id_i), id_i a hash of its context,
                         generation kwargs and occurrence number (`generation_ids`: lm_eval's
                         repeats each draw their own): its text is that of decoding it alone,
                         whatever the other requests and batch_size (up to float rounding,
                         `sampling.continuous`). Static batches (continuous=false, cache_order=
                         fht, MDLM, BD3LM) draw a batch from one key, a hash of its rows' ids:
                         the same batches, the same texts, but a row's text depends on its batch
                         (batch_size=1: its own, as continuous batching draws it).
  loglikelihood          log p(continuation | context) as the method's own likelihood bound on the
                         row [BOS] context continuation with context_mask = 1 on BOS + context
                         (the `data/pairs.py` layout, no EOS appended), from
                         `likelihood.sequence_nlls`. Per method (its registry `estimator`):
                         SetDLM the one-order bound (the exact log-likelihood under one sampled
                         staggered order; a lower bound on log p), with num_orders = K the K-order
                         log-mean-exp; MDLM / BD3LM the NELBO in its discrete form (per block, k
                         ~ U{1..n} of its n continuation tokens masked, weight n/k: never nothing
                         masked; SPEC §1.6) with one draw (K: the mean of K draws); AR the exact
                         log-likelihood. A request's draw key is a hash of its two strings, so its
                         value does not depend on the other
                         requests or the batch. is_greedy: whether the run's greedy sampler, given
                         the context and N = len(continuation) tokens, writes exactly the
                         continuation's tokens (for AR: the argmax at every position).
  loglikelihood_rolling  the unconditional bound over [BOS] + encode(text) (same estimators), in
                         lm_eval's rolling windows of L tokens when the text is longer: the first
                         window conditions on BOS, each later one on the token before it.
Context and continuation are encoded separately (as training pairs are), so the boundary is a
token boundary; values are in nats. The half that needs no lm_eval (pair scoring, draw keys,
generation kwargs) is `lm_eval_requests.py`.
"""

from __future__ import annotations

import inspect
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from absl import logging
import numpy as np

from setdiff_jax import cli, errors

try:  # first: without the extra, the error line comes before jax loads
  from lm_eval import utils as lm_utils
  from lm_eval.api.model import LM
  from lm_eval.api.registry import register_model
except ModuleNotFoundError as _e:  # the lmeval extra is not installed: one error line
  try:
    errors.missing_extra(_e, "lm_eval", "lmeval", "the lm-evaluation-harness adapter")
  except errors.MissingExtraError as _missing:
    if __name__ == "__main__":  # python -m setdiff_jax.evaluation.lm_eval_model
      sys.exit(cli.report(_missing))
    raise
  raise
import jax  # noqa: E402

from setdiff_jax import decoders, decoding, objectives, sharding  # noqa: E402
from setdiff_jax.evaluation import accuracy  # noqa: E402
from setdiff_jax.evaluation.lm_eval_requests import (  # noqa: E402
  NAME,
  fit_prompt,
  gen_settings,
  generation_ids,
  int_arg,
  merge_aliases,
  parse_bool,
  request_key,
  request_where,
  score_pairs,
  threshold_arg,
)
from setdiff_jax.sampling import policies
from setdiff_jax.sampling.config import commit_policy
from setdiff_jax.workdir import load as workdir_lib

OVERFLOW_RULES = ("error", "truncate_prompt")
# The commit policy's settings by their model_args names (`commit_policy`'s messages).
MODEL_ARGS = dict(policy="policy", policy_arg="policy_arg", threshold="model_args threshold / tau")


@register_model(NAME)
class SetDiffLM(LM):
  """A setdiff_jax training run (any method of the registry) behind lm_eval's LM interface."""

  def __init__(
    self,
    workdir: Optional[str] = None,
    step: Optional[int] = None,
    ema=None,
    window: Optional[int] = None,
    W: Optional[int] = None,
    threshold=None,
    tau=None,
    policy: str = "threshold",
    policy_arg=None,
    max_new_tokens: Optional[int] = None,
    batch_size=8,
    seed: int = 0,
    cache_order: str = "l2r",
    num_orders: int = 1,
    greedy_check=True,
    overflow: str = "error",
    mesh: Optional[str] = None,
    align_to_blocks=True,
    continuous=True,
    max_batch_size=None,
    device=None,
    **unknown,
  ):
    super().__init__()
    if unknown:
      raise ValueError(
        f"unknown model_args {sorted(unknown)} for --model {NAME}; known: workdir, "
        "step, ema, window (W), threshold (tau), policy, policy_arg, "
        "max_new_tokens, batch_size, seed, "
        "cache_order, num_orders, greedy_check, overflow, mesh, align_to_blocks, continuous"
      )
    if not workdir:
      raise ValueError(
        f"--model {NAME} needs model_args workdir=DIR (a training run written by launch/train.py)"
      )
    if not os.path.isdir(workdir):
      raise FileNotFoundError(f"model_args workdir={workdir!r}: no such directory")
    if overflow not in OVERFLOW_RULES:
      raise ValueError(f"model_args overflow={overflow!r}; expected one of {OVERFLOW_RULES}")
    aliased = merge_aliases(window, W, threshold, tau)
    del max_batch_size, device  # lm_eval passes them to every model; JAX picks its devices
    config = workdir_lib.load_config(workdir)
    use_ema = (config.get("eval_params", "ema") == "ema") if ema is None else parse_bool("ema", ema)
    # mesh: 'data=2;tensor=4' (';' since lm_eval splits model_args at commas), as --mesh
    mesh_config = sharding.parse_mesh(
      None if mesh is None else str(mesh).replace(";", ","), "model_args mesh"
    )
    step = int_arg("step", step, 1)
    state = workdir_lib.load_inference_state(
      workdir, step=step, use_ema=use_ema, mesh_config=mesh_config, mesh_what="model_args mesh"
    )
    self._setup(
      state,
      os.path.abspath(workdir),
      use_ema,
      **aliased,
      policy=policy,
      policy_arg=policy_arg,
      max_new_tokens=max_new_tokens,
      batch_size=batch_size,
      seed=seed,
      cache_order=cache_order,
      num_orders=num_orders,
      greedy_check=greedy_check,
      overflow=overflow,
      align_to_blocks=align_to_blocks,
      continuous=continuous,
    )

  @classmethod
  def from_state(
    cls, state: workdir_lib.InferenceState, name: str = "<in memory>", use_ema: bool = True, **knobs
  ) -> "SetDiffLM":
    """The adapter over an already loaded run (`workdir.load_inference_state`, or parameters
    built in memory); `knobs` are the sampler / scoring model_args (W and tau too)."""
    known = [p for p in inspect.signature(cls._setup).parameters if p not in ("self", "state")]
    unknown = sorted(set(knobs) - set(known[2:]) - {"W", "tau"})
    if unknown:
      raise ValueError(f"from_state: unknown model_args {unknown}; known: {known[2:]}, W, tau")
    aliased = merge_aliases(*(knobs.pop(k, None) for k in ("window", "W", "threshold", "tau")))
    self = cls.__new__(cls)
    LM.__init__(self)
    self._setup(state, name, use_ema, **knobs, **aliased)
    return self

  def _setup(
    self,
    state,
    name: str,
    use_ema: bool,
    *,
    window=None,
    threshold=None,
    policy="threshold",
    policy_arg=None,
    max_new_tokens=None,
    batch_size=8,
    seed=0,
    cache_order="l2r",
    num_orders=1,
    greedy_check=True,
    overflow="error",
    align_to_blocks=True,
    continuous=True,
  ):
    if overflow not in OVERFLOW_RULES:
      raise ValueError(f"model_args overflow={overflow!r}; expected one of {OVERFLOW_RULES}")
    self.workdir, self.state, self.use_ema = name, state, use_ema
    self.tokenizer = state.tokenizer
    self.obj_cfg = state.objective_config
    self.objective = objectives.get(self.obj_cfg.name)
    self.seq_len = int(state.config.seq_len)
    self.score_model = workdir_lib.inference_model(state.model_config, None)  # the run's dtype
    self.decode_model = workdir_lib.inference_model(state.model_config, "float32")
    auto = batch_size is None or str(batch_size).startswith("auto")
    self.batch_size = 8 if auto else int_arg("batch_size", batch_size, 1)
    self.max_new_tokens = int_arg("max_new_tokens", max_new_tokens, 1)
    self.seed, self.num_orders = int_arg("seed", seed, 0), int_arg("num_orders", num_orders, 1)
    window = int_arg("window", window, 1)
    self.greedy_check, self.overflow = parse_bool("greedy_check", greedy_check), overflow
    decoding.check_sampling_flags(
      self.seq_len, window=window, max_new_tokens=self.max_new_tokens, prefix="model_args "
    )
    policies.get(str(policy), "model_args policy")
    self.sampler_overrides = {
      "window": window,
      "threshold": threshold_arg(threshold),
      "cache_order": cache_order,
      "seed": self.seed,
      "policy": str(policy),
      "policy_arg": policies.parse_arg(policy_arg, "model_args policy_arg"),
      "align_to_blocks": parse_bool("align_to_blocks", align_to_blocks),
    }
    o = self.sampler_overrides
    policies.check_arg(str(policy), o["policy_arg"], "model_args policy_arg", "policy")
    # tau with another policy, or a disagreeing policy_arg: refused here, not at generate_until
    commit_policy(str(policy), o["policy_arg"], o["threshold"], MODEL_ARGS)
    # settings the run's sampler never reads: refused, as launchers do
    given = ["policy"] if o["policy"] != policies.DEFAULT else []
    given += [k for k in ("threshold", "policy_arg") if o[k] is not None]
    method = decoders.get(self.obj_cfg.name)
    decoding.check_method_flags(method, window=window, policy_flags=given, prefix="model_args ")
    self.sampler = decoding.sampler_for(self.obj_cfg.name)
    self.continuous = parse_bool("continuous", continuous)
    self._truncated, self._chat_warned = 0, False

  @classmethod
  def create_from_arg_string(cls, arg_string, additional_config=None):
    """model_args win over the CLI's defaults (its --batch_size is always 1 unless given)."""
    args = lm_utils.simple_parse_args_string(arg_string)
    extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in args}
    return cls(**args, **extra)

  @classmethod
  def create_from_arg_obj(cls, arg_dict, additional_config=None):
    extra = {
      k: v for k, v in (additional_config or {}).items() if v is not None and k not in arg_dict
    }
    return cls(**arg_dict, **extra)

  @property
  def tokenizer_name(self) -> str:
    return f"{NAME}:{self.workdir}"

  def apply_chat_template(self, chat_history, add_generation_prompt: bool = True) -> str:
    """The Qwen chat format of the GSM8K recipe (`data.pairs.CHAT_TEMPLATE`), any turns."""
    style = self.state.config.get("data", {}).get("prompt_style", "plain")
    if style != "gsm8k_chat" and not self._chat_warned:
      self._chat_warned = True
      logging.warning(
        "--apply_chat_template: the run was trained with data.prompt_style=%s, not gsm8k_chat; "
        "its prompts now carry the Qwen chat markup it never saw in training (leave the flag "
        "out to prompt it as trained)",
        style,
      )
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in chat_history)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

  def get_model_info(self) -> Dict[str, Any]:
    return {
      "workdir": self.workdir,
      "step": self.state.step,
      "method": self.objective.name,
      "params": "EMA" if self.use_ema else "raw",
      "estimator": self.objective.estimator,
      "setting": decoding.decode_setting(self.obj_cfg, self._sampler_config(1)).name,
      **{k: v for k, v in self.sampler_overrides.items()},
    }

  # ------------------------------------------------------------------ tokens
  def _prompt(self, context: str, where: str, room: int) -> List[int]:
    """[BOS] + encode(context), leaving `room` tokens of the context L (overflow rule)."""
    ids = [int(self.tokenizer.bos_id)] + list(self.tokenizer.encode(context) if context else [])
    fitted = fit_prompt(ids, self.seq_len, room, self.overflow, where)
    if len(fitted) < len(ids):
      self._truncated += 1
      logging.warning(
        "%s: context truncated from %d to %d tokens (overflow=truncate_prompt; %d so far)",
        where,
        len(ids),
        len(fitted),
        self._truncated,
      )
    return fitted

  def _sampler_config(self, n: int, greedy: bool = True, **kw):
    return decoding.sampler_config_for(
      self.obj_cfg,
      self.tokenizer,
      self.seq_len,
      max_new_tokens=n,
      greedy=greedy,
      stop_at_eos=True,
      **self.sampler_overrides,
      **kw,
    )

  def _decode(self, prompts: Sequence[List[int]], cfg, row_ids=None) -> List[List[int]]:
    """Generated ids per prompt (cut at the first EOS): continuously batched (`batch_size`
    slots) where exact, else in batches of one fixed shape. row_ids (sampled: one uint32 per
    prompt, `generation_ids`): row r draws from fold_in(key, row_ids[r]), a static batch of more
    rows from fold_in(key, a hash of their ids); None (greedy: rows read no key): by position."""
    size, eos, key = self.batch_size, int(self.obj_cfg.eos_token_id), jax.random.PRNGKey(self.seed)
    model = (self.decode_model, self.state.params)
    cont = decoding.continuous_for(self.obj_cfg.name, cfg) if self.continuous else None
    if cont is not None:
      gens = cont(*model, list(prompts), cfg, key, slots=size, row_ids=row_ids).result.generated
    else:
      gens = []
      for j in range(0, len(prompts), size):
        rows = list(prompts[j : j + size])
        fill = rows + [rows[0]] * (size - len(rows))  # one shape per call: one compile
        # sampled: one key per batch, its row's id or a hash of its rows' ids (never shared)
        ids = [] if row_ids is None else list(row_ids[j : j + size])
        sub = j if not ids else ids[0] if len(ids) == 1 else request_key(*map(str, ids))
        gens += self.sampler(*model, fill, cfg, jax.random.fold_in(key, sub)).generated[: len(rows)]
    gens = [[int(t) for t in g] for g in gens]
    return [g[: g.index(eos)] if eos in g else g for g in gens]

  # ------------------------------------------------------------------ generate_until
  def generate_until(self, requests, disable_tqdm: bool = False) -> List[str]:
    del disable_tqdm
    groups: Dict[Tuple, List[Tuple[int, List[int]]]] = {}
    untils: Dict[int, List[str]] = {}
    short, specs = 0, []
    for i, req in enumerate(requests):
      context, kwargs = req.args
      where = request_where(req, i)
      until, max_gen, greedy, extra = gen_settings(kwargs, where)
      want = min(max_gen, self.max_new_tokens or max_gen)
      # truncate_prompt leaves room for all max_gen_toks (as lm_eval's HF model); error needs one
      room = min(want, self.seq_len - 1) if self.overflow == "truncate_prompt" else 1
      prompt = self._prompt(context, where, room=room)
      n = min(want, self.seq_len - len(prompt))
      short += n < want
      untils[i] = until
      specs.append((context, (until, max_gen, sorted(extra.items()))))
      groups.setdefault((n, greedy, tuple(sorted(extra.items()))), []).append((i, prompt))
    if short:
      logging.warning(
        "%d of %d generate_until requests get fewer new tokens than max_gen_toks: "
        "prompt + N must fit the model's context L = %d",
        short,
        len(requests),
        self.seq_len,
      )
    texts: List[Optional[str]] = [None] * len(requests)
    row_ids = generation_ids(specs)  # a sampled request's draw: its own strings only
    for (n, greedy, extra), items in groups.items():
      cfg = self._sampler_config(n, greedy, **dict(extra))
      sampled = None if greedy else [row_ids[i] for i, _ in items]  # greedy reads no key
      ids = self._decode([p for _, p in items], cfg, sampled)
      for (i, _), g in zip(items, ids):  # a one-token stop (<|im_end|>) cuts the ids first
        texts[i] = accuracy.answer_texts(self.tokenizer, [g], [u for u in untils[i] if u])[0]
        self.cache_hook.add_partial("generate_until", requests[i].args, texts[i])
    return texts

  # ------------------------------------------------------------------ likelihoods
  def score(self, pairs: Sequence[Tuple[List[int], List[int]]], keys: Sequence[int]) -> np.ndarray:
    return score_pairs(
      self.score_model,
      self.state.params,
      self.obj_cfg,
      pairs,
      keys,
      seq_len=self.seq_len,
      num_orders=self.num_orders,
      seed=self.seed,
      batch_size=self.batch_size,
    )

  def _is_greedy(self, pairs) -> List[bool]:
    """Whether the greedy sampler writes exactly each continuation (grouped by its length)."""
    out = [False] * len(pairs)
    if not self.greedy_check:
      return out
    by_len: Dict[int, List[int]] = {}
    for i, (_, cont) in enumerate(pairs):
      by_len.setdefault(len(cont), []).append(i)
    for n, idx in by_len.items():
      ids = self._decode([pairs[i][0] for i in idx], self._sampler_config(n))
      for i, g in zip(idx, ids):
        out[i] = g == list(pairs[i][1])
    return out

  def loglikelihood(self, requests, disable_tqdm: bool = False) -> List[Tuple[float, bool]]:
    del disable_tqdm
    pairs, keys = [], []
    for i, req in enumerate(requests):
      context, continuation = req.args
      cont = list(self.tokenizer.encode(continuation)) if continuation else []
      if not cont:
        raise ValueError(
          f"{request_where(req, i)}: the continuation {continuation!r} encodes "
          "to no tokens; nothing to score"
        )
      pairs.append((self._prompt(context, request_where(req, i), room=len(cont)), cont))
      keys.append(request_key(context, continuation))
    if not pairs:
      return []
    values = self.score(pairs, keys)
    greedy = self._is_greedy(pairs)
    out = [(float(v), bool(g)) for v, g in zip(values, greedy)]
    for req, res in zip(requests, out):
      self.cache_hook.add_partial("loglikelihood", req.args, res)
    return out

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> List[float]:
    del disable_tqdm
    windows, keys, owner = [], [], []
    for i, req in enumerate(requests):
      (text,) = req.args[:1]
      ids = list(self.tokenizer.encode(text)) if text else []
      for w, pair in enumerate(
        lm_utils.get_rolling_token_windows(ids, int(self.tokenizer.bos_id), self.seq_len - 1, 1)
      ):
        windows.append(lm_utils.make_disjoint_window(pair))
        keys.append(request_key(text, str(w)))
        owner.append(i)
    totals = np.zeros((len(requests),), np.float64)
    if windows:
      np.add.at(totals, np.asarray(owner), self.score(windows, keys))
    out = [float(v) for v in totals]
    for req, res in zip(requests, out):
      self.cache_hook.add_partial("loglikelihood_rolling", req.args, res)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
  """lm_eval's own CLI (its arguments, unchanged), with this model registered as `--model
  setdiff_jax`. Our expected errors (a bad workdir, a context too long, ...) end with one
  `error: ...` line and exit status 1, as the other launchers (`setdiff_jax.cli`)."""
  from lm_eval.__main__ import cli_evaluate  # pylint: disable=g-import-not-at-top  (CLI only)

  sys.argv = ["lm_eval"] + list(sys.argv[1:] if argv is None else argv)
  try:
    cli_evaluate()
  except cli.EXPECTED as e:
    return cli.report(e)
  return 0


if __name__ == "__main__":
  sys.exit(main())
