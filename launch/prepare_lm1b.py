r"""Builds LM1B as TFDS array_record from the released text files: no TensorFlow needed.

  curl -O http://www.statmt.org/lm-benchmark/1-billion-word-language-modeling-benchmark-r13output.tar.gz
  tar xzf 1-billion-word-language-modeling-benchmark-r13output.tar.gz
  python launch/prepare_lm1b.py --text_dir=1-billion-word-language-modeling-benchmark-r13output \
      --data_dir=$TFDS_DIR

writes `$TFDS_DIR/lm1b/1.1.0/` with what `tfds build lm1b --file_format=array_record` writes (the
same splits, example keys and records: `setdiff_jax/data/lm1b_files.py`), so the LM1B configs read
it with `--config.data.tfds_data_dir=$TFDS_DIR`. Nothing is downloaded.
"""

from absl import flags

from setdiff_jax import cli

FLAGS = flags.FLAGS
flags.DEFINE_string(
  "text_dir", None, "The unpacked archive's top folder (or the folder holding it).", required=True
)
flags.DEFINE_string("data_dir", None, "TFDS data_dir to write lm1b/1.1.0 into.", required=True)


def main(argv):
  del argv
  from setdiff_jax.data import lm1b_files

  out = lm1b_files.build(FLAGS.text_dir, FLAGS.data_dir)
  print(f"done: LM1B written to {out}; train with --config.data.tfds_data_dir={FLAGS.data_dir}")


if __name__ == "__main__":
  cli.run(main)
