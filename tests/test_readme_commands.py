"""The README's marked command blocks (issue 37): which blocks are marked, how step limits are
added, and (slow tier) every block run as written by `.ci/readme_commands.py` in a fresh copy of
the repository with no ../shared beside it, training cut to 2 steps."""

import importlib.util
import json
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCKS = ["venv", "quickstart", "lm1b-cpu", "grpo", "sampling", "export", "qwen3-make", "qwen3-run"]


def _runner():
  spec = importlib.util.spec_from_file_location(
    "readme_commands", os.path.join(REPO, ".ci", "readme_commands.py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _readme_blocks():
  with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
    return _runner().blocks(f.read())


def test_the_marked_blocks_are_the_newcomers_path():
  blocks = _readme_blocks()
  assert [b[0] for b in blocks] == BLOCKS
  assert [b[0] for b in blocks if b[1]] == ["venv"]  # the one install step
  scripts = dict((b[0], b[2]) for b in blocks)
  assert "--config=configs/lm1b_sw.py:cpu" in scripts["lm1b-cpu"]
  assert scripts["qwen3-make"].startswith("python - <<'EOF'\n")
  assert "transformers.set_seed(0)" in scripts["qwen3-make"]  # the random model is seeded
  assert "/tmp/" not in "".join(scripts.values())  # every run lands in the copy's runs/


def test_marks_must_fence_shell_and_be_unique():
  runner = _runner()
  with pytest.raises(ValueError, match="'x' is marked to run but fenced 'python'"):
    runner.blocks("<!-- readme-run: x -->\n```python\nprint(1)\n```\n")
  with pytest.raises(ValueError, match="repeat an id"):
    runner.blocks("<!-- readme-run: x -->\n```bash\nls\n```\n" * 2)


def test_step_limits_go_on_training_commands_only():
  runner = _runner()
  script = (
    "python launch/train.py --config=c.py --workdir=runs/a   # SFT\n"
    "python launch/rl.py --config=r.py \\\n    --workdir=runs/b\n"
    "python launch/sample.py --workdir=runs/a\n"
  )
  train, rl, sample = runner.limit_steps(script, 3).splitlines()
  assert train == (
    "python launch/train.py --config=c.py --workdir=runs/a --config.num_train_steps=3 "
    "--config.eval_every_steps=3 --config.checkpoint_every_steps=3 --config.num_eval_steps=1 "
    "--config.num_eval_samples=0   # SFT"
  )
  assert rl == (
    "python launch/rl.py --config=r.py      --workdir=runs/b --config.num_train_steps=3 "
    "--config.checkpoint_every_steps=3"
  )
  assert sample == "python launch/sample.py --workdir=runs/a"


@pytest.mark.slow  # every README block, 2 training steps: 20 min on 2 cores at load ~14 (lm1b-cpu ~6)
def test_readme_commands_run_as_written(tmp_path, monkeypatch):
  runner = _runner()
  copy = str(tmp_path / "copy")
  runner.fresh_copy(copy)
  assert not os.path.exists(os.path.join(copy, "..", "shared"))
  monkeypatch.delenv("XLA_FLAGS", raising=False)  # one device, as a user's plain CPU run
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  lines = []
  blocks = [b for b in _readme_blocks() if not b[1]]
  ok = runner.run_blocks(blocks, copy, with_install=False, steps=2, log=lines.append)
  assert ok, "\n".join(lines)

  def log(block_id):
    with open(os.path.join(copy, "readme_runs", f"{block_id}.log")) as f:
      return f.read()

  quick = log("quickstart")
  assert "done: step 2; eval PPL" in quick and "=== sample 4 ===" in quick
  assert "done: step 2; eval PPL" in log("lm1b-cpu")
  assert re.search(r"accuracy", log("grpo"))
  sampling = log("sampling")
  assert "=== sample 2 ===" in sampling and "Elizabeth was" in sampling
  assert "verify: PASS" in log("export")
  assert re.search(
    r"data: \d+ of 4000 text train documents \([\d.]+%\) are longer than a row of "
    r"seq_len=32: continued on further rows",
    log("qwen3-run"),
  )
  assert "verify: PASS" in log("qwen3-run")
  demo = os.path.join(copy, "runs", "qwen3_demo")
  with open(os.path.join(demo, "export", "config.json")) as f:
    template = json.load(f)["backbone_config"]["pretrained_model_name_or_path"]
  assert template == os.path.join(os.path.realpath(demo), "export", "qwen3_config"), template
