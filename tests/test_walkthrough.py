"""The README's CPU Qwen3 walkthrough, run as written (issue 24): its Python block makes a tiny
local Qwen3 + tokenizer, its bash block trains, samples and exports. Paths are moved into a
temporary folder and training is cut to a few steps; nothing else is changed."""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTION = "### Walkthrough: a tiny local Qwen3 into a SetDLM on CPU"
FEW_STEPS = [
  "--config.num_train_steps=4",
  "--config.eval_every_steps=4",
  "--config.checkpoint_every_steps=4",
  "--config.num_eval_samples=0",
  "--config.num_eval_steps=1",
]


def _blocks():
  text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
  section = text[text.index(SECTION) :]
  section = section[: section.index("\n### ", len(SECTION))]
  python = re.findall(r"```python\npython - <<'EOF'\n(.*?)EOF\n```", section, re.S)
  bash = re.findall(r"```bash\n(.*?)```", section, re.S)
  assert len(python) == 1 and len(bash) == 1, (len(python), len(bash))
  commands = [shlex.split(c) for c in bash[0].replace("\\\n", " ").splitlines() if c.strip()]
  return python[0], commands


@pytest.mark.slow
def test_readme_qwen3_walkthrough(tmp_path):
  script, commands = _blocks()
  demo = str(tmp_path / "demo")
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO, HF_HUB_OFFLINE="1")
  env.pop("XLA_FLAGS", None)  # one device, as a user's plain CPU run

  def run(argv, stdin=None):
    proc = subprocess.run(
      argv, cwd=REPO, env=env, input=stdin, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc

  assert script.count('"runs/qwen3_demo"') == 1
  run([sys.executable, "-"], stdin=script.replace('"runs/qwen3_demo"', repr(demo)))
  assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(
    os.listdir(os.path.join(demo, "hf"))
  )
  assert [c[:2] for c in commands] == [
    ["python", "launch/train.py"],
    ["python", "launch/sample.py"],
    ["python", "launch/export.py"],
  ]
  outs = []
  for c in commands:
    argv = [a.replace("runs/qwen3_demo", demo) for a in c]
    argv[0] = sys.executable
    if argv[1] == "launch/train.py":
      argv += FEW_STEPS
    outs.append(run(argv))
  train, sample, export = outs
  assert re.search(
    r"data: \d+ of 4000 text train documents \([\d.]+%\) are longer than a row of "
    r"seq_len=32: continued on further rows",
    train.stderr,
  ), train.stderr[-3000:]
  assert "=== sample 2 ===" in sample.stdout
  report = json.loads(export.stdout[export.stdout.index("{") :])
  assert report["two_stream"] < 1e-5 and report["roundtrip"] is True
  cfg = json.load(open(os.path.join(demo, "export", "config.json")))
  assert cfg["backbone_config"]["pretrained_model_name_or_path"] == os.path.join(
    demo, "export", "qwen3_config"
  )
