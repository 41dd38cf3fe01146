"""benchmarks/official.py without the official code: argument checks, errors and the table.

The side-by-side run itself needs an extracted kuleshov-group/setdlms checkout and is a
benchmark (benchmarks/README.md); nothing here imports torch, jax or the official code.
"""
import importlib.util
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def bench():
  spec = importlib.util.spec_from_file_location(
      "official_bench", os.path.join(REPO, "benchmarks", "official.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _fake_checkout(bench, root, skip=()):
  """Empty files at the paths the benchmark checks for (all but `skip`)."""
  for rel in bench.REQUIRED_FILES:
    if rel not in skip:
      (root / rel).parent.mkdir(parents=True, exist_ok=True)
      (root / rel).write_text("")
  return root


def test_missing_official_dir_names_the_flag_and_the_fix(bench, tmp_path):
  with pytest.raises(SystemExit, match=r"--official_dir=.*no such directory.*setdlms"):
    bench.parse_args([f"--official_dir={tmp_path / 'absent'}"])


def test_official_dir_without_the_expected_files_lists_them(bench, tmp_path):
  root = _fake_checkout(bench, tmp_path / "setdlms", skip=("src/denoiser/setdlm.py",))
  with pytest.raises(SystemExit, match=r"lacks src/denoiser/setdlm\.py: not a setdlms checkout"):
    bench.check_official_dir(str(root))
  _fake_checkout(bench, root)
  assert bench.check_official_dir(str(root)) == str(root)


def test_official_dir_inside_the_repository_is_refused(bench):
  with pytest.raises(SystemExit, match="inside this repository"):
    bench.check_official_dir(os.path.join(REPO, "benchmarks"))


def test_arguments(bench, tmp_path):
  root = _fake_checkout(bench, tmp_path / "setdlms")
  args = bench.parse_args([f"--official_dir={root}", "--quick", "--train=ar", "--decode="])
  assert (args.rounds, args.steps, args.train, args.decode) == (1, 1, ["ar"], [])
  assert args.sizes["seq_len"] == 16 and args.threads >= 1
  args = bench.parse_args([f"--official_dir={root}", "--vocab_size=4096"])
  assert args.sizes == dict(num_layers=4, hidden_size=256, num_heads=4, seq_len=128,
                            batch_size=16, vocab_size=4096)
  with pytest.raises(SystemExit, match=r"--train: \['gpt'\] not in"):
    bench.parse_args([f"--official_dir={root}", "--train=ar,gpt"])
  with pytest.raises(SystemExit):  # argparse error: vocabulary below the random-token range
    bench.parse_args([f"--official_dir={root}", "--vocab_size=100"])


def test_transformers_5_is_refused_with_the_venv_recipe(bench):
  with pytest.raises(SystemExit, match=r"transformers 5\.24\.0.*4\.52\.4.*--official_python"):
    bench.check_official_env({"transformers": "5.24.0"}, "/usr/bin/python")
  bench.check_official_env({"transformers": "4.52.4"}, "/venv/bin/python")


def test_markdown_table(bench):
  rows = [{"work": "AR train step", "official": 1310.4, "ours": 978.0},
          {"work": "set W=4 decoding, batch 8", "official": 72.0, "ours": 418.0, "mark": " †"},
          {"work": "no official", "ours": 5.0}]
  assert bench.markdown(rows).splitlines() == [
      "| work | official | ours | ours / official |",
      "| --- | ---: | ---: | ---: |",
      "| AR train step | 1,310 | 978 | 0.75 |",
      "| set W=4 decoding, batch 8 | 72 † | 418 | 5.81 |",
      "| no official | – | 5 | – |"]
