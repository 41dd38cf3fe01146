"""Every optional-dependency path ends in one `error:` line naming the extra to install: export
--verify / --format=bin without torch, the lm-eval launchers without lm_eval. Each case runs in a
subprocess whose import system refuses the extra's package (as if it were not installed)."""

import os
import subprocess
import sys

import pytest

from setdiff_jax import errors

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# argv: BLOCKED (comma separated top-level packages), then a script path or `-m module`, then its
# arguments. The finder runs before any other, so the package is "not installed".
_RUNNER = r"""
import importlib.abc, runpy, sys
blocked = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in blocked:
      raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
if sys.argv[2] == "-m":
  sys.argv = [sys.argv[3]] + sys.argv[4:]
  runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
  sys.argv = sys.argv[2:]
  runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _run(blocked, *args, cwd=REPO):
  env = dict(os.environ, PYTHONPATH=REPO)
  return subprocess.run(
    [sys.executable, "-c", _RUNNER, blocked, *args],
    cwd=cwd,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )


def _one_error_line(proc, *needles):
  assert proc.returncode != 0, proc.stdout + proc.stderr
  assert "Traceback" not in proc.stderr, proc.stderr
  lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(lines) == 1, proc.stderr
  for n in needles:
    assert n in lines[0], (n, lines[0])
  return lines[0]


def test_export_verify_and_bin_without_torch(tmp_path):
  """Refused before anything is restored or written (the workdir here has no checkpoint)."""
  work = tmp_path / "run"
  work.mkdir()
  for flag, what in (("--verify", "--verify"), ("--format=bin", "--format=bin")):
    out = tmp_path / f"out{flag[2:4]}"
    proc = _run("torch", "launch/export.py", f"--workdir={work}", f"--out={out}", flag)
    line = _one_error_line(proc, what, "'torch'", 'pip install -e ".[torch]"')
    assert line.startswith("error: ") and not out.exists()


def test_lm_eval_adapter_without_lm_eval(monkeypatch):
  """In-process: the adapter's import raises the one-line error (the launchers print it)."""
  import importlib

  for name in [m for m in sys.modules if m == "lm_eval" or m.startswith("lm_eval.")]:
    monkeypatch.delitem(sys.modules, name)
  monkeypatch.setitem(sys.modules, "lm_eval", None)  # "not installed"
  monkeypatch.delitem(sys.modules, "setdiff_jax.evaluation.lm_eval_model", raising=False)
  with pytest.raises(
    errors.MissingExtraError,
    match=r"lm-evaluation-harness adapter needs the "
    r"Python package 'lm_eval'.*pip install -e \"\.\[lmeval\]\"",
  ):
    importlib.import_module("setdiff_jax.evaluation.lm_eval_model")
  monkeypatch.delitem(sys.modules, "setdiff_jax.evaluation.lm_eval_model", raising=False)


@pytest.mark.slow  # two subprocesses that import jax (~25 s on 2 shared cores)
def test_lm_eval_launchers_without_lm_eval():
  for args in (["launch/lm_eval_harness.py"], ["-m", "setdiff_jax.evaluation.lm_eval_model"]):
    proc = _run(
      "lm_eval", *args, "--model", "setdiff_jax", "--model_args", "workdir=/nowhere", "--tasks", "x"
    )
    _one_error_line(proc, "lm-evaluation-harness", "'lm_eval'", 'pip install -e ".[lmeval]"')


def test_require_extra_names_the_extra_only_for_the_missing_package(monkeypatch):
  assert errors.require_extra("json", "x", "y").dumps([1]) == "[1]"
  with pytest.raises(
    errors.MissingExtraError,
    match=r"--thing needs the Python package 'no_such_pkg_1', which is not "
    r'installed: pip install -e "\.\[extra1\]"',
  ):
    errors.require_extra("no_such_pkg_1.sub", "extra1", "--thing")
  # A missing module *inside* an installed package is a broken install: its own error stays.
  broken = ModuleNotFoundError("No module named 'dep_of_pkg'", name="dep_of_pkg")
  assert errors.missing_extra(broken, "pkg", "extra1", "--thing") is None
  # MissingExtraError is an expected launcher error (one line) and still an ImportError.
  from setdiff_jax import cli

  assert issubclass(errors.MissingExtraError, cli.EXPECTED) or any(
    issubclass(errors.MissingExtraError, t) for t in cli.EXPECTED
  )
  assert issubclass(errors.MissingExtraError, ImportError)


def test_bin_weights_without_torch(tmp_path, monkeypatch):
  """Writing or reading pytorch_model.bin without torch: the extra, not a traceback."""
  import numpy as np
  from setdiff_jax.interop import weight_files

  monkeypatch.setitem(sys.modules, "torch", None)  # any `import torch` now fails
  with pytest.raises(errors.MissingExtraError, match=r"--format=bin.*'torch'.*\.\[torch\]"):
    weight_files.write_state_dict({"w": np.zeros(2, np.float32)}, str(tmp_path), "bin")
  (tmp_path / weight_files.BIN_FILE).write_bytes(b"not read")
  with pytest.raises(errors.MissingExtraError, match=r"pytorch_model.bin.*\.\[torch\]"):
    weight_files.read_state_dict(str(tmp_path))
