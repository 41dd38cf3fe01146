r"""Export a trained checkpoint to the official PyTorch / Hugging Face layout (SPEC §9).

  python launch/export.py --workdir=/tmp/setdiff_tiny --out=/tmp/setdiff_tiny_hf \
      [--noema] [--step=N] [--format=safetensors|bin] [--verify]

Writes model.safetensors (or, for DiT runs, pytorch_model.bin, which needs torch) with `backbone.`-prefixed DiT
keys in PyTorch orientation, config.json, generation_config.json and the tokenizer files. A
model.backbone=qwen3 run is written in the official Qwen3-SetDLM layout (`backbone.model.*` keys,
safetensors only; SPEC §3.10). EMA
parameters are exported by default (--noema for the raw ones). --verify reloads the export in the
PyTorch reference and prints the max relative logits error for a two-stream input and a cached
decoding step, the likelihood-bound difference, and whether importing it back is bit-exact, then
one `verify: PASS` or `verify: FAIL (...)` line (exit status 1 on FAIL); it (and --format=bin) needs the torch extra, `pip install -e ".[torch]"` (without it: one error line,
before anything is written). --out must be a new or empty directory (--overwrite: a non-empty
one), never a training workdir. Load it back with `setdiff_jax.interop.import_checkpoint(OUT)`.
"""

import json
import sys

from absl import flags

from setdiff_jax import cli

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Training workdir (holds checkpoints/ and config.json).")
flags.DEFINE_string("out", None, "Output directory for the exported checkpoint.")
flags.DEFINE_bool("ema", True, "Export the EMA parameters (--noema: the raw training parameters).")
flags.DEFINE_integer("step", None, "Checkpoint step to export (default: the latest).")
flags.DEFINE_enum(
  "format",
  "safetensors",
  ["safetensors", "bin"],
  "Weight file: model.safetensors (numpy only) or pytorch_model.bin (needs torch).",
)
flags.DEFINE_bool(
  "overwrite",
  False,
  "Allow --out to be a non-empty directory (files there are "
  "replaced; a training workdir is always refused).",
)
flags.DEFINE_bool(
  "verify",
  False,
  "Check the export against the PyTorch reference (needs the "
  'torch extra: pip install -e ".[torch]").',
)
flags.mark_flags_as_required(["workdir", "out"])


def main(argv):
  del argv
  from setdiff_jax import errors

  cli.check_flag_ranges(
    {"step": "step"}
  )  # the launchers' shared range (setdiff_jax/config/fields.py)
  if FLAGS.verify or FLAGS.format == "bin":  # before jax loads: the line comes at once
    errors.require_extra(
      "torch",
      "torch",
      "--verify (the PyTorch reference)"
      if FLAGS.verify
      else "--format=bin (--format=safetensors needs only numpy)",
    )
  from setdiff_jax import sharding
  from setdiff_jax.interop.export import export_workdir
  from setdiff_jax.testing import verify

  sharding.initialize_distributed()  # every host of a multi-host run exports together

  _, report = export_workdir(
    FLAGS.workdir,
    FLAGS.out,
    use_ema=FLAGS.ema,
    step=FLAGS.step,
    fmt=FLAGS.format,
    verify=verify.export_report if FLAGS.verify else None,
    overwrite=FLAGS.overwrite,
  )
  if report is not None:
    print(json.dumps(report, indent=2))
    passed, line = verify.verdict(report)
    print(line, flush=True)
    if not passed:
      sys.exit(1)


if __name__ == "__main__":
  cli.run(main)
