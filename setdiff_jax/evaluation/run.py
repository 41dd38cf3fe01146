"""Evaluation of a training workdir: the logic behind `launch/evaluate.py`.

  results = evaluate_workdir("/tmp/run", ["likelihood", "infill"], EvalOptions(num_orders=8))

Loads the checkpoint (by default the parameters the run's training evaluated, its `eval_params`;
use_ema=True / False: EMA / raw), runs the requested evaluations, appends the results to
WORKDIR/eval_results.json (its `history` is keyed by step, EMA/raw, eval kind, settings, data and,
for timed evals, the machine; nothing else is ever replaced; `evaluation/results.py`) and returns
them;
`evaluation/tables.format_results` renders markdown tables.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, List, Optional, Sequence

import jax

from setdiff_jax import decoders, decoding, objectives, paths
from setdiff_jax.workdir import load as workdir_lib
from setdiff_jax.data import data_flags
from setdiff_jax.data import pairs as pairs_lib
from setdiff_jax.evaluation import accuracy, generation, gsm8k, infill, likelihood
from setdiff_jax.sampling import policies
from setdiff_jax.sampling.config import CommitPolicy, DecodeSetting, tau_label
from setdiff_jax.evaluation.results import (
  EVALS,
  RESULTS_FILE,
  TIMED_EVALS,
  check_output_path,
  hardware,
  machine,
  file_identity,
  history_key,
  read_record,
  save_evaluation,
  split_identity,
)
from setdiff_jax.evaluation.checks import (
  check_method_options,
  check_options,
  check_owner,
  check_pair_fields,
)
from setdiff_jax.evaluation.tables import format_results


@dataclasses.dataclass
class EvalOptions:
  """Knobs of every evaluation (defaults follow SPEC §6 where it says)."""

  # likelihood (SPEC §6.1)
  seed: int = likelihood.DEFAULT_SEED  # order / t draws: fold_in(fold_in(key(seed), row), k)
  num_orders: int = 4  # K for the K-order (SetDLM) / K-draw (MDLM, BD3LM) value
  batch_size: int = 32  # rows per call (results do not depend on it)
  max_rows: Optional[int] = None  # first rows of the eval split only (None: all)
  # infill (SPEC §6.5)
  cloze_path: str = infill.DEFAULT_CLOZE_PATH
  infill_settings: Sequence[str] = infill.SETTINGS
  num_infill: Optional[int] = 100  # examples per setting (None: all that fit)
  infill_batch_size: int = 8
  infill_thresholds: Sequence[Optional[float]] = (None,)
  repetition_penalty: float = 1.0  # infill decoders (the paper's throughput runs use 1.2)
  # set sampler: 'auto' (= 'cached' for infill) | 'visible' (prefix, suffix and commits: the
  # paper's infill runs)
  penalty_history: str = "auto"
  # speed and samples (SPEC §6.7, §6.2)
  window: Optional[int] = None  # set-sampler W (None: the run's S)
  # taus of the threshold policy (None: the default, (off, 0.9), or (off,) under another --policy;
  # an explicit tau is refused for a sampler without one, AR)
  thresholds: Optional[Sequence[Optional[float]]] = None
  policy: str = "threshold"  # commit policy (sampling/policies.py) for speed/accuracy
  policy_args: Sequence[Optional[float]] = (None,)  # its parameters swept (None: its default)
  batch_sizes: Sequence[int] = (1, 8)
  repeats: int = 2  # timed calls per setting after the compiling one
  max_new_tokens: Optional[int] = None  # N (None: L - 1)
  top_p: float = 0.95  # nucleus for speed and samples
  num_samples: int = 16
  judge_workdir: Optional[str] = None  # AR run whose model scores samples (gen PPL)
  sampling_seed: int = 0
  # accuracy (conditional decoding of prompt/answer pairs; evaluation/accuracy.py). Uses
  # window and thresholds above; N = max_new_tokens (None: L - the longest prompt).
  accuracy_data: Optional[str] = None  # JSONL of pairs (default: the run's eval split)
  num_examples: Optional[int] = None  # first test pairs only (None: all)
  accuracy_batch_size: int = 32  # rows per decoding call (continuous batching: slots)
  continuous: bool = True  # accuracy: continuous batching where exact (False: static batches)
  speed_examples: int = 16  # prompts timed one per call (batch 1)
  extractor: str = "auto"  # hash ('#### n') | boxed | auto | gsm8k (evaluation/accuracy.py)
  # gsm8k_shell | gsm8k_repro (SPEC §6.4; sets tau, N, the stop strings and extractor gsm8k)
  preset: Optional[str] = None
  # BD3LM / block-wise MDLM blocks on the grid (the official harness's align_inputs_to_blocks);
  # False: from each P. None: the default (on); an explicit value is refused for other samplers.
  align_to_blocks: Optional[bool] = None

  def taus(self) -> List[Optional[float]]:
    """The thresholds swept (the default when none were given)."""
    if self.thresholds is not None:
      return list(self.thresholds)
    return [None, 0.9] if self.policy == policies.DEFAULT else [None]

  def to_json(self) -> Dict[str, Any]:
    # the defaults resolved: the settings (and history keys) of a default run stay as they were
    d = dict(dataclasses.asdict(self), thresholds=self.taus())
    d["align_to_blocks"] = self.align_to_blocks is not False
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def inference_models(state):
  """A run's models for evaluation: (likelihood model in the run's dtype, decoding model in fp32)."""
  return (
    workdir_lib.inference_model(state.model_config, None),
    workdir_lib.inference_model(state.model_config, "float32"),
  )


def run_likelihood(state, opts: EvalOptions, model=None) -> Dict[str, Any]:
  model = model or inference_models(state)[0]
  tokens, att, ctx = likelihood.eval_rows(state.config, state.tokenizer, max_rows=opts.max_rows)
  return likelihood.likelihood_eval(
    model,
    state.params,
    state.objective_config,
    tokens,
    att,
    context_mask=ctx,
    num_orders=opts.num_orders,
    seed=opts.seed,
    batch_size=opts.batch_size,
  )


def run_infill(state, opts: EvalOptions, model=None) -> List[Dict[str, Any]]:
  model = model or inference_models(state)[1]
  oc = state.objective_config
  decoder = decoders.get(oc.name)
  length = int(state.config.seq_len)
  rows = []
  for setting in opts.infill_settings:
    items, skipped = infill.setting_items(
      state.tokenizer,
      length,
      int(oc.mask_token_id),
      setting,
      cloze_path=opts.cloze_path,
      num_infill=opts.num_infill,
    )
    if not items:
      rows.append({"method": oc.name, "dataset": setting, "num_examples": 0, "skipped": skipped})
      continue
    taus = list(opts.infill_thresholds) if decoder.uses_threshold else [None]
    for tau in taus:
      cfg = decoding.sampler_config_for(
        oc,
        state.tokenizer,
        length,
        setting=DecodeSetting(opts.window, CommitPolicy(policies.DEFAULT, tau)),
        greedy=True,
        seed=opts.sampling_seed,
        repetition_penalty=opts.repetition_penalty,
        penalty_history=opts.penalty_history,
        stop_at_eos=False,
      )
      res = infill.infill_eval(
        oc.name, model, state.params, state.tokenizer, items, cfg, batch_size=opts.infill_batch_size
      )
      rows.append(
        {
          "method": oc.name,
          "dataset": setting,
          "skipped": skipped,
          "window": cfg.window if decoder.uses_window else None,
          "threshold": tau_label(tau),
          **res,
        }
      )
  return rows


def _settings(state, opts: EvalOptions):
  windows = [opts.window] if opts.window else None
  settings = generation.decoding_settings(
    state.objective_config, windows=windows, thresholds=opts.taus()
  )
  return generation.with_policy(state.objective_config, settings, opts.policy, opts.policy_args)


def run_speed(state, opts: EvalOptions, model=None) -> List[Dict[str, Any]]:
  model = model or inference_models(state)[1]
  return generation.speed_eval(
    model,
    state.params,
    state.tokenizer,
    state.objective_config,
    int(state.config.seq_len),
    settings=_settings(state, opts),
    batch_sizes=opts.batch_sizes,
    repeats=opts.repeats,
    top_p=opts.top_p,
    seed=opts.sampling_seed,
    max_new_tokens=opts.max_new_tokens,
  )


def accuracy_pairs(state, opts: EvalOptions):
  """The test pairs: --accuracy_data (JSONL, the run's prompt/answer field names) or the run's
  own eval split of a pair source."""
  data = state.config.data
  if opts.accuracy_data:
    fields = (data.get("prompt_field", "prompt"), data.get("answer_field", "answer"))
    check_pair_fields(opts.accuracy_data, *fields)
    test = pairs_lib.jsonl_pairs(opts.accuracy_data, *fields, "accuracy_data")
  elif data.source in pairs_lib.PAIR_SOURCES:
    test = pairs_lib.load_pairs(data, "eval")
  else:
    raise ValueError(
      f"--eval=accuracy needs prompt/answer pairs: this run's data.source="
      f"{data.source!r} is not one of {pairs_lib.PAIR_SOURCES}; pass "
      "--accuracy_data=FILE.jsonl"
    )
  return test[: opts.num_examples] if opts.num_examples else test


def run_accuracy(state, opts: EvalOptions, model=None) -> List[Dict[str, Any]]:
  model = model or inference_models(state)[1]
  seq_len = int(state.config.seq_len)
  extra = gsm8k.resolve_preset(opts.preset, seq_len)
  thresholds = [extra.pop("threshold")] if opts.preset else opts.taus()
  windows = [opts.window] if opts.window else None
  settings = generation.decoding_settings(
    state.objective_config, windows=windows, thresholds=thresholds
  )
  settings = generation.with_policy(state.objective_config, settings, opts.policy, opts.policy_args)
  extra.setdefault("extractor", opts.extractor)
  extra.setdefault("prompt_style", state.config.data.get("prompt_style", "plain"))
  extra["max_new_tokens"] = opts.max_new_tokens or extra.get("max_new_tokens")
  return accuracy.accuracy_eval(
    model,
    state.params,
    state.tokenizer,
    state.objective_config,
    seq_len,
    accuracy_pairs(state, opts),
    settings=settings,
    batch_size=opts.accuracy_batch_size,
    speed_examples=opts.speed_examples,
    seed=opts.sampling_seed,
    align_to_blocks=opts.align_to_blocks is not False,
    continuous=opts.continuous,
    **extra,
  )


def judge_uses_ema(path: str) -> bool:
  """The judge's parameters: those its own training evaluated (its `eval_params`), which its
  logged eval PPL describes."""
  return str(workdir_lib.load_config(path).get("eval_params", "ema")) == "ema"


def load_judge(path: Optional[str]):
  if not path:
    return None
  judge = workdir_lib.load_inference_state(path, use_ema=judge_uses_ema(path))
  if not objectives.get(judge.objective_config.name).exact_likelihood:
    raise ValueError(
      f"--judge_workdir={path!r} is a {judge.objective_config.name!r} run; the "
      "generative-perplexity judge must be an AR run"
    )
  return judge


def run_samples(state, opts: EvalOptions, model=None, judge=None) -> List[Dict[str, Any]]:
  model = model or inference_models(state)[1]
  judge = judge if judge is not None else load_judge(opts.judge_workdir)
  rows = generation.samples_eval(
    model,
    state.params,
    state.tokenizer,
    state.objective_config,
    int(state.config.seq_len),
    num_samples=opts.num_samples,
    batch_size=max(opts.batch_sizes),
    settings=_settings(state, opts),
    top_p=opts.top_p,
    seed=opts.sampling_seed,
    judge=judge,
    max_new_tokens=opts.max_new_tokens,
  )
  if judge is not None and opts.judge_workdir:  # which parameters scored the samples
    for row in rows:
      row["judge_params"] = "ema" if judge_uses_ema(opts.judge_workdir) else "raw"
  return rows


def eval_data(state, name: str, opts: EvalOptions) -> Optional[Dict[str, Any]]:
  """The data an eval read, as stored with its result (and in its history key): files by path
  and content hash; None for evals that read none (speed, samples)."""
  data = state.config.data
  if name == "likelihood":
    return split_identity(data)
  if name == "accuracy":
    return file_identity(opts.accuracy_data) if opts.accuracy_data else split_identity(data)
  if name == "infill":
    out = {}
    if any(s != "corpus" for s in opts.infill_settings) and paths.exists(opts.cloze_path):
      out["cloze"] = file_identity(opts.cloze_path)
    if "corpus" in opts.infill_settings:
      out["corpus"] = {"source": "embedded", "split": "validation"}
    return out
  return None


def evaluate_state(
  state, evals: Sequence[str], opts: EvalOptions, *, judge=None, log=print, on_result=None
) -> Dict[str, Any]:
  """Runs `evals` on a loaded `workdir.InferenceState`; returns {eval: result}. `on_result(name,
  result)`, if given, receives each eval's result as soon as it ends (`evaluate_workdir` saves it
  there, so a stop or an error in a later eval loses none of the finished ones)."""
  if not evals:
    raise ValueError(f"--eval is empty: give some of {','.join(EVALS)}")
  bad = [e for e in evals if e not in EVALS]
  if bad:
    raise ValueError(f"unknown eval(s) {bad}; expected some of {EVALS}")
  check_options(opts, int(state.config.seq_len))
  if set(evals) - {"likelihood"}:  # the decoding evals: a setting the run's sampler cannot use
    check_method_options(state, evals, opts)
  if "samples" in evals and judge is None:  # a judge that cannot score fails before any eval
    judge = load_judge(opts.judge_workdir)
  lik_model, gen_model = inference_models(state)
  out: Dict[str, Any] = {}
  for name in evals:
    t0 = time.perf_counter()
    if name == "likelihood":
      out[name] = run_likelihood(state, opts, lik_model)
    elif name == "infill":
      out[name] = run_infill(state, opts, gen_model)
    elif name == "speed":
      out[name] = run_speed(state, opts, gen_model)
    elif name == "accuracy":
      out[name] = run_accuracy(state, opts, gen_model)
    else:
      out[name] = run_samples(state, opts, gen_model, judge)
    if log:
      log(f"[{state.objective_config.name}] {name} done in {time.perf_counter() - t0:.1f}s")
    if on_result is not None:
      on_result(name, out[name])
  return out


def params_label(config, use_ema: bool, chosen: bool) -> str:
  """The evaluated parameters in words; `chosen`: given by the caller (else the run's
  eval_params, the parameters its logged eval PPL describes)."""
  trained = str(config.get("eval_params", "ema"))
  label = "EMA" if use_ema else "raw"
  if use_ema and float(config.get("ema_decay", 1.0) or 0.0) == 0.0:
    return label + " = raw (ema_decay=0)"
  if not chosen:
    return label + " (the run's eval_params, as its training evaluated)"
  if trained != ("ema" if use_ema else "raw"):
    other = "--nouse_ema" if use_ema else "--use_ema"
    return label + f" (training evaluated the {trained} ones; {other} evaluates those)"
  return label


def _judge_label(evals: Sequence[str], opts: EvalOptions) -> str:
  if "samples" not in evals or not opts.judge_workdir:
    return ""
  params = "EMA" if judge_uses_ema(opts.judge_workdir) else "raw"
  return f"  judge: {paths.resolve(opts.judge_workdir)} ({params}, its run's eval_params)"


def evaluate_workdir(
  workdir: str,
  evals: Sequence[str],
  opts: Optional[EvalOptions] = None,
  *,
  step: Optional[int] = None,
  use_ema: Optional[bool] = None,
  output: Optional[str] = None,
  log=print,
  data_overrides: Optional[Dict[str, Any]] = None,
  show=None,
  mesh: Optional[Dict[str, int]] = None,
) -> Dict[str, Any]:
  """Loads WORKDIR's checkpoint, runs `evals`, appends them to the JSON file, returns the record.

  use_ema: the EMA (True) or raw (False) parameters; None (the default, as `launch/evaluate.py`):
  those the run's training evaluated (its `eval_params`). The printed tables start with a line
  naming them.

  The file keeps every result in `history`, keyed by (step, EMA/raw, eval kind, settings, data;
  each entry names its data: `eval_data`; the evals that time decoding, TIMED_EVALS, also by the
  hardware and mesh, `results.machine`, so another machine's numbers are kept beside): a new
  evaluation adds or refreshes its own keys and never replaces another one; evaluations writing
  one file at the same time merge (the file is re-read under a lock: `results.locked`). A file that
  is not a results file, or holds another run's results, or lies in one of a run directory's
  folders, is refused before anything runs (`read_record`, `check_owner`, `check_output_path`).
  Its top level mirrors
  the latest evaluation (merged with earlier evals of the same step and parameters). Each eval is
  saved as soon as it ends (a stop or an error in a later one keeps it); `show`, if given,
  receives its markdown table (the first with a header naming the run) before that write (a
  failed write keeps it: `write_results`). `data_overrides`, {field: (flag, value)}, replaces
  fields of the run's `data` config (eval_paths, tfds_data_dir: the data moved since training); a
  field the run's source does not read, or an unusable file, is refused
  (`data_flags.apply_overrides`). `mesh`: the decoding mesh ({"data", "fsdp", "tensor"} sizes;
  default all devices on data), the parameters placed with their training sharding
  (`workdir.load_inference_state`).
  """
  opts = opts or EvalOptions()
  path = output or paths.join(workdir, RESULTS_FILE)
  if output is not None:
    check_output_path(output, workdir)
  check_owner(read_record(path), path, workdir, output)  # before the evaluation: fail fast
  chosen = use_ema is not None
  if not chosen:
    use_ema = str(workdir_lib.load_config(workdir).get("eval_params", "ema")) == "ema"
  state = workdir_lib.load_inference_state(workdir, step=step, use_ema=use_ema, mesh_config=mesh)
  data_flags.apply_overrides(state.config.data, data_overrides or {})
  where = machine(state.params)
  writer = jax.process_index() == 0  # every process computed the same results; one writes them
  resolved = paths.resolve(workdir)
  top_fields = dict(  # the file's top level: the latest evaluation's run and machine
    workdir=resolved,
    step=state.step,
    objective=state.objective_config.name,
    use_ema=use_ema,
    hardware=hardware(),
    mesh=where["mesh"],
  )
  header = (
    f"workdir: {resolved}  step: {state.step}  "
    f"params: {params_label(state.config, use_ema, chosen)}{_judge_label(evals, opts)}\n\n"
  )
  saved: Dict[str, Any] = {}

  def save(name: str, result):  # as soon as the eval ends: a later stop or error keeps it
    if show is not None:  # the table before the write (a failed write keeps it)
      show(("" if saved else header) + format_results({name: result}))
    now = time.strftime("%Y-%m-%d %H:%M:%S")
    data = eval_data(state, name, opts)
    timed = where if name in TIMED_EVALS else None
    entry = {
      "step": state.step,
      "use_ema": use_ema,
      "eval": name,
      "settings": opts.to_json(),
      "data": data,
      **(timed or {}),  # hardware and mesh of a timed eval
      "time": now,
      "result": result,
    }
    saved["record"] = save_evaluation(
      path,
      writer,
      top={**top_fields, "time": now},
      entries={history_key(state.step, use_ema, name, opts.to_json(), data, timed): entry},
      options={name: opts.to_json()},
      data_of={name: data},
      results={name: result},
    )

  evaluate_state(state, evals, opts, log=log, on_result=save)
  record = saved["record"]
  record["path"] = path
  return record


__all__ = [
  "EvalOptions",
  "run_likelihood",
  "run_infill",
  "run_speed",
  "run_samples",
  "accuracy_pairs",
  "run_accuracy",
  "judge_uses_ema",
  "load_judge",
  "eval_data",
  "params_label",
  "evaluate_state",
  "evaluate_workdir",
]
