r"""Samples text from a trained run.

  python launch/sample.py --workdir=DIR [--prompt=TEXT] [--infill=TEXT] [--num_samples=N]
      [--batch_size=N] [--max_new_tokens=N] [--window=W] [--threshold=T] [--seed=S]
      [--mesh=data=2,tensor=4] [--policy=NAME --policy_arg=X]

Loads the checkpoint of DIR (latest step, EMA params by default), picks the sampler of the run's
objective (setdlm: KV-cached set sampler with W = S unless --window; ar, mdlm, bd3lm: their
baselines), prints every sample in its own block and ends with
`tokens/s: X  tokens/step: Y  compiled programs: C  wall s with compile: S` (tokens/s excludes
compilation: the first batch is run once untimed; S includes it). It first prints the workdir, the
step, EMA or raw parameters and the sampler settings. --seed=0 (the default) gives the same
samples on every call; --seed=-1 draws a random seed (printed in that first line).

--infill marks each span to generate as [GAP:n] (n tokens), e.g.
  --infill="The cat [GAP:4] on the mat." ; the text around the gaps is printed unchanged.
All logic lives in `setdiff_jax.decoding` (`sample_from_workdir`, `run_sampling`).
"""

from absl import flags

from setdiff_jax import cli

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Run directory written by launch/train.py.", required=True)
flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
flags.DEFINE_bool("use_ema", True, "Sample with the EMA parameters.")
flags.DEFINE_string("prompt", None, "Prompt text (default: unconditional, BOS only).")
flags.DEFINE_string("infill", None, "Text with [GAP:n] spans to fill (setdlm runs only).")
flags.DEFINE_integer("num_samples", 4, "Samples to draw.")
flags.DEFINE_integer("batch_size", 4, "Samples decoded together.")
flags.DEFINE_integer("max_new_tokens", None, "Tokens to generate (default: seq_len - prompt).")
flags.DEFINE_integer("window", None, "Set-sampler window W (default: the run's set size S).")
flags.DEFINE_float("threshold", None, "Confidence threshold tau (default: off).")
flags.DEFINE_string(
  "policy",
  "threshold",
  "Commit policy (setdiff_jax/sampling/policies.py): "
  "threshold (tau = --threshold), entropy_bound, factor, margin, topk, dilated, "
  "stable.",
)
flags.DEFINE_string(
  "policy_arg", None, "The policy's parameter (gamma, f, tau, k or d; default: the policy's own)."
)
flags.DEFINE_integer("seed", 0, "PRNG seed (the same seed gives the same samples); -1: random.")
flags.DEFINE_bool("greedy", False, "Argmax instead of sampling.")
flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass (1 = off).")
flags.DEFINE_float("temperature", 1.0, "Sampling temperature.")
flags.DEFINE_float("repetition_penalty", 1.0, "HF-style repetition penalty (1 = off).")
flags.DEFINE_enum(
  "prompt_style",
  None,
  ["plain", "gsm8k", "gsm8k_chat"],
  "How --prompt is wrapped (default: the run's data.prompt_style, as training and the accuracy "
  "eval wrap prompts; plain: as given).",
)
flags.DEFINE_string("dtype", "float32", "Compute dtype for sampling (the reference uses fp32).")
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
  False,
  "BD3LM / block-wise MDLM: decode blocks on the block "
  "grid (the official align_inputs_to_blocks; launch/evaluate.py's accuracy "
  "default) instead of starting at the prompt's end.",
)


# flag -> its field in the launchers' shared range table (setdiff_jax/config/fields.py); --window and
# --max_new_tokens are checked against the run's seq_len (decoding.check_sampling_flags)
RANGED = {
  "step": "step",
  "num_samples": "num_samples",
  "batch_size": "batch_size",
  "threshold": "threshold",
  "seed": "seed",
  "top_p": "top_p",
  "temperature": "temperature",
  "repetition_penalty": "repetition_penalty",
}


def main(argv):
  del argv  # cli.run rejects positional arguments
  from setdiff_jax import sharding
  from setdiff_jax.decoding import sample_from_workdir
  from setdiff_jax.sampling import policies

  cli.check_flag_ranges(RANGED, also={"seed": (-1,)})
  ignored = [f"--{n}" for n in ("temperature", "top_p") if FLAGS.greedy and FLAGS[n].present]
  if ignored:  # honoured or refused, never dropped
    raise ValueError(
      f"--greedy takes the argmax, so {' and '.join(ignored)} would be unused; give one"
    )
  sharding.initialize_distributed()
  import jax  # pylint: disable=g-import-not-at-top

  quiet = lambda text: None  # noqa: E731  every process samples the same texts; process 0 prints
  sample_from_workdir(
    FLAGS.workdir,
    write=print if jax.process_index() == 0 else quiet,
    step=FLAGS.step,
    use_ema=FLAGS.use_ema,
    dtype=FLAGS.dtype,
    prompt=FLAGS.prompt,
    prompt_style=FLAGS.prompt_style,
    infill=FLAGS.infill,
    num_samples=FLAGS.num_samples,
    batch_size=FLAGS.batch_size,
    max_new_tokens=FLAGS.max_new_tokens,
    window=FLAGS.window,
    threshold=FLAGS.threshold,
    policy=FLAGS.policy,
    policy_arg=policies.parse_arg(FLAGS.policy_arg),
    seed=FLAGS.seed,
    greedy=FLAGS.greedy,
    top_p=FLAGS.top_p,
    temperature=FLAGS.temperature,
    repetition_penalty=FLAGS.repetition_penalty,
    mesh=sharding.parse_mesh(FLAGS.mesh),
    align_to_blocks=FLAGS.align_to_blocks,
  )


if __name__ == "__main__":
  cli.run(main)
