"""LM1B as TFDS array_record, built from the released text files without TensorFlow.

`tfds build lm1b` needs TensorFlow (its builder globs with `tf.io.gfile`) and downloads the 1.8 GB
archive itself. This module writes the same dataset from an archive you downloaded and unpacked:
`lm1b/1.1.0/` under a TFDS data_dir, the features, split names and example keys of the TFDS
builder (`train`: `training-monolingual.tokenized.shuffled/news.en-*`;
`test`: `heldout-monolingual.tokenized.shuffled/news.en.heldout-*`; one example per
line, stripped; key `<file name>_<line index>`), so `data.source=tfds` reads it as if TFDS had
built it. `launch/prepare_lm1b.py` is the command.
"""

from __future__ import annotations

import glob
import os
import shutil

import tensorflow_datasets as tfds

from setdiff_jax.data import text_files

TOP_DIR = "1-billion-word-language-modeling-benchmark-r13output"
SPLIT_FILES = {
  "train": os.path.join("training-monolingual.tokenized.shuffled", "news.en-*"),
  "test": os.path.join("heldout-monolingual.tokenized.shuffled", "news.en.heldout-*"),
}
ARCHIVE_URL = (
  "http://www.statmt.org/lm-benchmark/1-billion-word-language-modeling-benchmark-r13output.tar.gz"
)


def split_files(text_dir: str) -> dict[str, list[str]]:
  """The text files of each split under `text_dir` (the unpacked archive's top folder, or the
  folder holding it); a missing split is a FileNotFoundError naming the pattern."""
  if os.path.isdir(os.path.join(text_dir, TOP_DIR)):
    text_dir = os.path.join(text_dir, TOP_DIR)
  files = {}
  for split, pattern in SPLIT_FILES.items():
    files[split] = sorted(glob.glob(os.path.join(text_dir, pattern)))
    if not files[split]:
      raise FileNotFoundError(
        f"no LM1B {split} files {os.path.join(text_dir, pattern)}: point --text_dir at the "
        f"unpacked {TOP_DIR}.tar.gz ({ARCHIVE_URL})"
      )
  return files


class _LocalInfo(tfds.core.DatasetInfo):
  """Split sizes come from the local files, never from gs://tfds-data: TFDS's bucket lookup would
  try the network and leave an empty `tmp*tfds` folder in the temp dir on every build."""

  def initialize_from_bucket(self) -> None:
    pass


class Lm1bFromFiles(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """TFDS's `lm1b` 1.1.0, generated from local files (reads back as `tfds.data_source('lm1b')`)."""

  name = "lm1b"
  VERSION = tfds.core.Version("1.1.0")

  def __init__(self, *, text_dir: str, **kwargs):
    self._files = split_files(text_dir)
    super().__init__(**kwargs)

  def _info(self):
    return _LocalInfo(
      builder=self,
      features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
      supervised_keys=("text", "text"),
      homepage="http://www.statmt.org/lm-benchmark/",
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing is downloaded
    return {split: self._generate_examples(files) for split, files in self._files.items()}

  def _generate_examples(self, files):
    for path in files:
      with open(path, encoding="utf-8") as f:
        try:
          for index, line in enumerate(f):
            yield f"{os.path.basename(path)}_{index}", {"text": line.strip()}
        except UnicodeDecodeError as e:
          raise ValueError(text_files.not_utf8(path, e)) from e


def build(text_dir: str, data_dir: str) -> str:
  """Writes lm1b/1.1.0 (array_record) under `data_dir`; returns the dataset folder. A data_dir
  that already holds a prepared lm1b/1.1.0 is refused (tfds would keep it, whatever --text_dir
  holds); a build that fails in a data_dir it created removes that folder again."""
  created = not os.path.exists(data_dir)
  builder = Lm1bFromFiles(text_dir=text_dir, data_dir=data_dir, file_format="array_record")
  if builder.is_prepared():
    raise ValueError(
      f"{builder.data_dir} already holds a prepared LM1B (tfds would keep it, not build it from "
      f"--text_dir={text_dir}): train from it with --config.data.tfds_data_dir={data_dir}, or "
      f"delete that folder (or pass another --data_dir) to build it again"
    )
  try:
    builder.download_and_prepare()
  except BaseException:
    if created:  # no half-built tree for a later run to mistake for data
      shutil.rmtree(data_dir, ignore_errors=True)
    raise
  return str(builder.data_dir)


__all__ = ["build", "split_files", "Lm1bFromFiles", "ARCHIVE_URL", "TOP_DIR"]
