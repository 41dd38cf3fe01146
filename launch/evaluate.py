r"""Evaluates a trained run.

  python launch/evaluate.py --workdir=DIR --eval=likelihood|infill|speed|samples|accuracy[,...]
      [--mesh=data=-1]   (the decoding mesh: AXIS=SIZE over data, fsdp, tensor; see --helpfull)

  likelihood  one-order bound on the eval split (SPEC §6.1: one staggered order per sequence,
              seed 1, BOS and pad targets excluded, prompt tokens of prompt/answer rows never
              targets, so it is an answer-token NLL there; AR exact NLL, MDLM/BD3LM the 1/t
              NELBO) and a
              K-order estimate (--num_orders; log-mean-exp over K orders for SetDLM, mean of K NELBO
              draws for MDLM/BD3LM). NLL (nats/token), PPL, BPD. Independent of --batch_size.
  infill      ROCStories Story Cloze 1- and 3-sentence infilling (SPEC §6.5, oracle middle length,
              greedy) and held-out corpus paragraphs (middle third masked); ROUGE-1/2/L.
              --cloze_path (default ../shared/data/rocstories-cloze-val-2016.csv).
  speed       tokens/s, tokens/step and forward calls of the run's sampler per setting (W, tau)
              and batch size (--batch_sizes, default 1,8); unconditional, N = L - 1
              (--max_new_tokens).
              --policy=NAME --policy_args=X,Y sweeps a commit policy's parameter instead of tau
              (speed, samples, accuracy; see setdiff_jax/sampling/policies.py).
  samples     unconditional samples: unigram entropy, distinct-n and, with --judge_workdir=AR_RUN,
              generative perplexity under that AR model.
  accuracy    conditional decoding of every test prompt (the run's prompt/answer eval split, or
              --accuracy_data=FILE.jsonl) with the run's sampler, greedy, EOS stop per row, per
              setting (--window, --thresholds; --preset=gsm8k_shell|gsm8k_repro for SPEC §6.4):
              exact match of the final answer (--extractor hash|boxed|auto|gsm8k), generated tokens,
              tokens/step, forward calls, tokens/s at batch 1 and at --accuracy_batch_size.
              BD3LM / block-wise MDLM blocks sit on the block grid (--align_to_blocks, default
              on, as the official harness); --noalign_to_blocks starts them at each prompt's end.

Parameters: those the run's training evaluated (its eval_params; --use_ema / --nouse_ema choose),
named in the printed header. Results are merged into DIR/eval_results.json (or --output; timed
evals keyed by the machine and mesh too) and printed as markdown tables.
All logic lives in `setdiff_jax.evaluation` (`evaluate_workdir`, `format_results`).
"""

import os

from absl import flags

from setdiff_jax import cli

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Run directory written by launch/train.py.", required=True)
flags.DEFINE_list(
  "eval", ["likelihood"], "Evaluations: likelihood, infill, speed, samples, accuracy."
)
flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
flags.DEFINE_bool(
  "use_ema",
  None,
  "Evaluate the EMA (--use_ema) or raw (--nouse_ema) parameters (default: those the run's "
  "training evaluated, its eval_params).",
)
flags.DEFINE_string("output", None, "JSON results file (default: WORKDIR/eval_results.json).")
# likelihood
flags.DEFINE_integer("seed", 1, "Seed of the order / t draws (the reference uses 1).")
flags.DEFINE_integer("num_orders", 4, "K of the K-order (K-draw) estimate.")
flags.DEFINE_integer("batch_size", 32, "Likelihood rows per call (results do not depend on it).")
flags.DEFINE_integer("max_rows", None, "Evaluate the first rows of the eval split only.")
# infill
flags.DEFINE_string(
  "cloze_path",
  os.path.join("..", "shared", "data", "rocstories-cloze-val-2016.csv"),
  "Story Cloze validation CSV.",
)
flags.DEFINE_list("infill_settings", ["1sent", "3sent", "corpus"], "Infill example sets.")
flags.DEFINE_integer("num_infill", 100, "Examples per infill set (-1: all that fit).")
flags.DEFINE_integer("infill_batch_size", 8, "Infill examples decoded together.")
flags.DEFINE_list("infill_thresholds", ["off"], "Confidence thresholds for infilling.")
flags.DEFINE_float("repetition_penalty", 1.0, "Repetition penalty of the infill decoders.")
flags.DEFINE_string(
  "penalty_history",
  "auto",
  "Set-sampler infill penalty history: auto "
  "(cached tokens) | visible (prefix, suffix and commits; the paper's runs).",
)
# speed / samples
flags.DEFINE_integer("window", None, "Set-sampler window W (default: the run's S).")
flags.DEFINE_list("thresholds", ["off", "0.9"], "Confidence thresholds tau ('off' = none).")
flags.DEFINE_string(
  "policy",
  "threshold",
  "Commit policy of speed/samples/accuracy "
  "(setdiff_jax/sampling/policies.py): threshold (tau = --thresholds), "
  "entropy_bound, factor, margin, topk, dilated, stable.",
)
flags.DEFINE_list(
  "policy_args",
  ["default"],
  "Parameters of --policy to sweep (gamma, f, tau, k or d; 'default' = the policy's own).",
)
flags.DEFINE_list("batch_sizes", ["1", "8"], "Batch sizes for the speed eval.")
flags.DEFINE_integer("repeats", 2, "Timed calls per speed setting (after a compiling one).")
flags.DEFINE_integer("max_new_tokens", None, "Tokens to generate (default: seq_len - 1).")
flags.DEFINE_float("top_p", 0.95, "Nucleus mass for speed and samples.")
flags.DEFINE_integer("num_samples", 16, "Unconditional samples per setting.")
flags.DEFINE_string("judge_workdir", None, "AR run used to score samples (generative PPL).")
flags.DEFINE_integer("sampling_seed", 0, "Seed of the samplers.")
# data location (the run's config.json stores absolute paths; override them if the data moved)
flags.DEFINE_list("eval_paths", None, "Replace the run's data.eval_paths (text/jsonl runs).")
flags.DEFINE_string("tfds_data_dir", None, "Replace the run's data.tfds_data_dir (TFDS runs).")
# accuracy
flags.DEFINE_string(
  "accuracy_data",
  None,
  "JSONL of prompt/answer pairs (default: the run's eval split of its pair source).",
)
flags.DEFINE_integer("num_examples", None, "Evaluate the first test pairs only.")
flags.DEFINE_integer("accuracy_batch_size", 32, "Prompts decoded per call (or slots).")
flags.DEFINE_bool(
  "continuous",
  True,
  "Accuracy: continuous batching (--accuracy_batch_size slots refilled as rows end) for the set "
  "sampler and AR, the same greedy tokens; --nocontinuous decodes static batches.",
)
flags.DEFINE_integer("speed_examples", 16, "Prompts timed one per call (batch 1).")
flags.DEFINE_enum(
  "extractor",
  "auto",
  ["hash", "boxed", "auto", "gsm8k"],
  "Final-answer extractor (--preset: gsm8k).",
)
flags.DEFINE_enum("preset", None, ["gsm8k_shell", "gsm8k_repro"], "GSM8K decode setting.")
flags.DEFINE_string(
  "mesh",
  None,
  "Decoding mesh: AXIS=SIZE,... over data, fsdp, tensor (one "
  "may be -1), e.g. "
  "data=2,tensor=4; parameters placed by the training sharding rules, the batch "
  "over data x fsdp, the KV cache over batch and heads (default: data=-1).",
)
flags.DEFINE_bool(
  "align_to_blocks",
  None,
  "Accuracy: BD3LM / block-wise MDLM decode blocks on the "
  "block grid (the official harness's align_inputs_to_blocks; default on); "
  "--noalign_to_blocks starts them at each prompt's end. Other methods have no block grid.",
)


# flag -> its field in the launchers' shared range table (setdiff_jax/config/fields.py); --window and
# --max_new_tokens are checked against the run's seq_len (decoding.check_sampling_flags)
RANGED = {
  "step": "step",
  "seed": "seed",
  "sampling_seed": "seed",
  "batch_size": "batch_size",
  "batch_sizes": "batch_size",
  "infill_batch_size": "batch_size",
  "accuracy_batch_size": "batch_size",
  "num_samples": "num_samples",
  "top_p": "top_p",
  "repetition_penalty": "repetition_penalty",
}


def main(argv):
  del argv  # cli.run rejects positional arguments
  from setdiff_jax import sharding
  from setdiff_jax.evaluation import generation, run
  from setdiff_jax.sampling import policies

  check_lists()
  cli.check_flag_ranges(RANGED)
  if FLAGS.preset and FLAGS["thresholds"].present:  # the preset sets tau
    raise ValueError(f"--preset={FLAGS.preset} sets tau, so --thresholds would be unused; give one")
  if FLAGS.preset and FLAGS["extractor"].present:  # the preset scores as the reference does
    raise ValueError(
      f"--preset={FLAGS.preset} scores as the reference does (--extractor=gsm8k), so "
      "--extractor would be unused; give one"
    )
  sharding.initialize_distributed()
  check_flags_used()
  # None: the default taus (run.EvalOptions.taus); an explicit tau is refused for AR
  thresholds = FLAGS.thresholds if FLAGS["thresholds"].present else None
  policy_args = tuple(policies.parse_arg(a) for a in FLAGS.policy_args)
  if FLAGS.policy == policies.DEFAULT and FLAGS["policy_args"].present:
    # --policy_args of the threshold policy are its tau values: one setting, one name
    if FLAGS["thresholds"].present:
      raise ValueError(
        "--thresholds and --policy_args both set tau of --policy=threshold; give one"
      )
    thresholds, policy_args = list(FLAGS.policy_args), (None,)
  opts = run.EvalOptions(
    seed=FLAGS.seed,
    num_orders=FLAGS.num_orders,
    batch_size=FLAGS.batch_size,
    max_rows=FLAGS.max_rows,
    cloze_path=FLAGS.cloze_path,
    infill_settings=tuple(FLAGS.infill_settings),
    num_infill=None if FLAGS.num_infill == -1 else FLAGS.num_infill,  # -5: refused, not 'all'
    infill_batch_size=FLAGS.infill_batch_size,
    infill_thresholds=tuple(
      generation.parse_thresholds(FLAGS.infill_thresholds, "--infill_thresholds")
    ),
    repetition_penalty=FLAGS.repetition_penalty,
    penalty_history=FLAGS.penalty_history,
    window=FLAGS.window,
    thresholds=None if thresholds is None else tuple(generation.parse_thresholds(thresholds)),
    policy=FLAGS.policy,
    policy_args=policy_args,
    batch_sizes=tuple(int(b) for b in FLAGS.batch_sizes),
    repeats=FLAGS.repeats,
    max_new_tokens=FLAGS.max_new_tokens,
    top_p=FLAGS.top_p,
    num_samples=FLAGS.num_samples,
    judge_workdir=FLAGS.judge_workdir,
    sampling_seed=FLAGS.sampling_seed,
    accuracy_data=FLAGS.accuracy_data,
    num_examples=FLAGS.num_examples,
    accuracy_batch_size=FLAGS.accuracy_batch_size,
    continuous=FLAGS.continuous,
    speed_examples=FLAGS.speed_examples,
    extractor=FLAGS.extractor,
    preset=FLAGS.preset,
    align_to_blocks=FLAGS.align_to_blocks,
  )
  record = run.evaluate_workdir(
    FLAGS.workdir,
    FLAGS.eval,
    opts,
    step=FLAGS.step,
    use_ema=FLAGS.use_ema,
    output=FLAGS.output,
    data_overrides=data_overrides(),
    show=lambda text: print(text, flush=True),  # before the write
    mesh=sharding.parse_mesh(FLAGS.mesh),
  )
  print(f"\nresults written to {record['path']}")


LIST_FLAGS = (
  "eval",
  "thresholds",
  "policy_args",
  "batch_sizes",
  "infill_settings",
  "infill_thresholds",
  "eval_paths",
)


def check_lists():
  """An empty list flag (--thresholds=) is refused: it would evaluate nothing, or the defaults.
  So is a value given twice (--thresholds=off,none): its setting would run twice, the second
  time warm, and be stored twice."""
  for name in LIST_FLAGS:
    if not FLAGS[name].present:
      continue
    values = FLAGS[name].value
    if not values:
      raise ValueError(f"--{name} is empty: give at least one value, or leave the flag out")
    seen = {}
    for v in values:
      same = _list_value(name, v)
      if same in seen:
        twice = repr(v) if str(seen[same]) == str(v) else f"{seen[same]!r} and {v!r}"
        raise ValueError(
          f"--{name}={','.join(map(str, values))} gives {twice} (one setting) twice: give "
          "each value once"
        )
      seen[same] = v


def _list_value(name: str, value):
  """What a list flag's value means, so that two spellings of one setting compare equal (a value
  that does not parse is left to the flag's own check)."""
  from setdiff_jax.evaluation import generation
  from setdiff_jax.sampling import policies

  text = str(value).strip()
  try:
    if name == "batch_sizes":
      return int(text)
    if name in ("thresholds", "infill_thresholds"):
      return generation.parse_thresholds([text], f"--{name}")[0]
    if name == "policy_args":
      return policies.parse_arg(text, "--policy_args")
    if name == "eval_paths":
      return os.path.abspath(text) if "://" not in text else text
  except ValueError:
    return text
  return text.lower() if name in ("eval", "infill_settings") else text


# flag -> the evals that read it (setdiff_jax/evaluation/run.py): a flag given on the command line
# that no requested eval reads is refused, never ignored (nor stored in the history key as if it
# had mattered). Flags not listed (workdir, eval, step, use_ema, output, mesh) serve every eval.
DECODE = ("speed", "samples", "accuracy")
EVAL_FLAGS = {
  "seed": ("likelihood",),
  "num_orders": ("likelihood",),
  "batch_size": ("likelihood",),
  "max_rows": ("likelihood",),
  "eval_paths": ("likelihood", "accuracy"),
  "tfds_data_dir": ("likelihood", "accuracy"),
  "cloze_path": ("infill",),
  "infill_settings": ("infill",),
  "num_infill": ("infill",),
  "infill_batch_size": ("infill",),
  "infill_thresholds": ("infill",),
  "repetition_penalty": ("infill",),
  "penalty_history": ("infill",),
  "window": ("infill",) + DECODE,
  "sampling_seed": ("infill",) + DECODE,
  "thresholds": DECODE,
  "policy": DECODE,
  "policy_args": DECODE,
  "max_new_tokens": DECODE,
  "batch_sizes": ("speed", "samples"),
  "top_p": ("speed", "samples"),
  "repeats": ("speed",),
  "num_samples": ("samples",),
  "judge_workdir": ("samples",),
  "accuracy_data": ("accuracy",),
  "num_examples": ("accuracy",),
  "accuracy_batch_size": ("accuracy",),
  "continuous": ("accuracy",),
  "speed_examples": ("accuracy",),
  "extractor": ("accuracy",),
  "preset": ("accuracy",),
  "align_to_blocks": ("accuracy",),
}


def check_flags_used():
  from setdiff_jax.data import data_flags

  for flag, readers in EVAL_FLAGS.items():
    if FLAGS[flag].present and not set(readers) & set(FLAGS.eval):
      raise ValueError(
        f"--{flag} is read by --eval={' or '.join(readers)} only, not by --eval="
        f"{','.join(FLAGS.eval)}: drop it, or add that eval"
      )
  check_seed_read()
  if FLAGS.accuracy_data is not None:  # accuracy reads that file, not the run's eval split
    for flag in ("eval_paths", "tfds_data_dir"):
      others = set(EVAL_FLAGS[flag]) - {"accuracy"}
      if FLAGS[flag].present and not others & set(FLAGS.eval):
        raise ValueError(
          f"--{flag} would be unused: --eval=accuracy reads --accuracy_data, not the run's eval "
          f"split; drop --{flag}, or add --eval={' or '.join(sorted(others))}"
        )
  if FLAGS.accuracy_data is not None:
    data_flags.check_text_file(FLAGS.accuracy_data, "--accuracy_data")
  if FLAGS["cloze_path"].present:
    data_flags.check_text_file(FLAGS.cloze_path, "--cloze_path")


def check_seed_read():
  """--sampling_seed read by greedy evals only: accuracy and infill decode greedily with the cache
  in position order, so the seed draws nothing but the cache order of an accuracy preset with
  cache_order=fht; elsewhere it would be ignored, yet recorded in the history key as a setting of
  its own."""
  from setdiff_jax.evaluation import gsm8k

  readers = set(EVAL_FLAGS["sampling_seed"]) & set(FLAGS.eval)
  if not FLAGS["sampling_seed"].present or not readers or readers - {"accuracy", "infill"}:
    return
  fht = sorted(n for n, p in gsm8k.PRESETS.items() if p.get("cache_order") == "fht")
  if "accuracy" in readers and FLAGS.preset in fht:
    return
  evals = " and ".join(f"--eval={e}" for e in sorted(readers))
  raise ValueError(
    f"--sampling_seed={FLAGS.sampling_seed} changes nothing in {evals}: greedy decoding with the "
    f"cache in position order draws nothing from it (only --eval=accuracy with --preset="
    f"{' or '.join(fht)} draws a cache order from the seed); drop it, or add --eval=speed or "
    "samples"
  )


def data_overrides():
  out = {}
  if FLAGS.eval_paths is not None:
    value = ",".join(p if "://" in p else os.path.abspath(p) for p in FLAGS.eval_paths)
    out["eval_paths"] = ("--eval_paths", value)
  if FLAGS.tfds_data_dir is not None:
    out["tfds_data_dir"] = ("--tfds_data_dir", FLAGS.tfds_data_dir)
  return out


if __name__ == "__main__":
  cli.run(main)
