"""What a run's last lines say (issue 24): sample.py's header names the parameters actually used;
train.py's last line suggests the next command that fits the run (a prompt for a conditional
run, --nouse_ema where training evaluated the raw parameters)."""

import os
import subprocess
import sys

import ml_collections
import pytest

from setdiff_jax import decoding

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(ema_decay, eval_params, source="embedded"):
  return ml_collections.ConfigDict(
    {"ema_decay": ema_decay, "eval_params": eval_params, "data": {"source": source}}
  )


def test_params_label_says_what_is_sampled():
  assert decoding.params_label(_config(0.9999, "ema"), True) == "EMA"
  assert decoding.params_label(_config(0.9999, "ema"), False) == "raw"
  assert decoding.params_label(_config(0.0, "raw"), True) == "EMA = raw (ema_decay=0)"
  assert decoding.params_label(_config(0.999, "raw"), True).startswith(
    "EMA (training evaluated the raw ones; --nouse_ema"
  )


_SUMMARY = r"""
import runpy, sys
from setdiff_jax.config import run as run_config
train = runpy.run_path("launch/train.py", run_name="not_main")
def cfg(source, eval_params, ema_decay=0.999):
  c = run_config.default_config()
  c.eval_params, c.ema_decay, c.data.source = eval_params, ema_decay, source
  return run_config.from_config_dict(c, check_data=False)
result = {"step": 5, "eval/ppl": 12.0, "eval/nll": 2.4849}
for source, ev in (("embedded", "ema"), ("arithmetic", "ema"), ("text", "raw")):
  print(train["summary"](result, "/w", cfg(source, ev)))
print(train["summary"](result, "/w", cfg("embedded", "raw", 0.0)))  # EMA = raw: no choice
print(train["summary"](result, "gs://b/r l+1", cfg("arithmetic", "ema")))  # pasted into a shell
rl = runpy.run_path("launch/rl.py", run_name="not_main")
print(rl["summary"]({"step": 3}, "/tmp/a b"))
"""


@pytest.mark.slow  # a subprocess that imports jax and the trainer (~10 s)
def test_train_summary_suggests_the_fitting_next_command():
  proc = subprocess.run(
    [sys.executable, "-c", _SUMMARY],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    env=dict(os.environ, PYTHONPATH=REPO),
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  plain, conditional, raw, no_ema, spaced, rl = proc.stdout.strip().splitlines()
  assert plain == (
    "done: step 5; eval PPL 12.00 (NLL 2.4849); checkpoint /w/checkpoints/5; "
    "sample with: python launch/sample.py --workdir=/w"
  )
  assert "evaluate with: python launch/evaluate.py --workdir=/w --eval=accuracy" in conditional
  assert "--prompt=" in conditional and conditional.count("sample") == 2
  assert raw.endswith("sample with: python launch/sample.py --workdir=/w --nouse_ema")
  assert no_ema.endswith("sample with: python launch/sample.py --workdir=/w")  # no --nouse_ema
  # probe 17c: a legal workdir with a space made the printed commands fail when pasted
  assert "python launch/evaluate.py --workdir='gs://b/r l+1' --eval=accuracy;" in spaced
  assert "python launch/sample.py --workdir='gs://b/r l+1' --prompt=" in spaced
  assert rl.endswith(
    "evaluate with: python launch/evaluate.py --workdir='/tmp/a b' --eval=accuracy"
  )


def test_export_label_and_verify_verdict():
  from setdiff_jax.interop import export
  from setdiff_jax.testing import verify

  assert export._params_label(_config(0.9999, "ema"), True) == "EMA"
  assert export._params_label(_config(0.0, "raw"), True) == "EMA = raw (ema_decay=0)"
  assert export._params_label(_config(0.9999, "ema"), False) == "raw"
  good = {"two_stream": 6e-7, "cached_step": 4e-7, "loss": 1e-8, "roundtrip": True}
  passed, line = verify.verdict(good)
  assert passed and line.startswith("verify: PASS: ") and "two-stream logits 6.0e-07" in line
  assert verify.verdict({"two_stream": 5e-7, "roundtrip": True})[0]  # a Qwen3 report
  for bad, why in (
    ({**good, "cached_step": 2e-5}, "cached step error 2.0e-05 >= 1e-05"),
    ({**good, "two_stream": float("nan")}, "two-stream logits error nan"),
    ({**good, "roundtrip": False}, "the re-imported parameters differ"),
  ):
    passed, line = verify.verdict(bad)
    assert not passed and line.startswith("verify: FAIL (") and why in line, line


def test_library_info_lines_are_told_apart_by_path():
  """The launchers' quiet logs keep INFO lines of the package and launch/ only, by absolute path:
  a clone named setdiff_jax with its venv inside (issue 37) showed orbax's INFO lines, whose
  files .../setdiff_jax/.venv/.../orbax/... contain '/setdiff_jax/'."""
  import logging

  from setdiff_jax import cli, cli_storage

  def record(path, level=logging.INFO):
    return logging.LogRecord("absl", level, path, 1, "message", None, None)

  clone = os.path.dirname(cli._PACKAGE_DIR)
  venv_orbax = os.path.join(clone, ".venv", "lib", "python3.11", "site-packages", "orbax", "x.py")
  assert not cli._FILTER.filter(record(venv_orbax))
  assert not cli._FILTER.filter(record("/elsewhere/setdiff_jax/orbax/checkpoint/x.py"))
  venv_grain = venv_orbax.replace("orbax", "grain")
  assert cli._FILTER.filter(record(venv_grain, logging.WARNING))  # other warnings pass
  held = len(cli_storage.HELD)  # the storage libraries' warnings go to the error log (issue 36)
  assert not cli._FILTER.filter(record(venv_orbax, logging.WARNING))
  assert len(cli_storage.HELD) == held + 1
  assert cli._FILTER.filter(record(os.path.join(cli._PACKAGE_DIR, "train.py")))
  assert cli._FILTER.filter(record(os.path.join(clone, "launch", "train.py")))


def test_storage_failures_reported_elsewhere_are_held_back():
  """A full disk made orbax's failed background writes come back through asyncio's "Task
  exception was never retrieved" log (a traceback each) and jax's compilation-cache write warn:
  27 stderr lines around the one EFBIG error line. Both are held for the error log; an asyncio
  error from elsewhere and a cache warning for another reason still show."""
  import asyncio
  import logging

  from setdiff_jax import cli, cli_storage

  def failed_task_record(filename):
    code = compile("raise OSError(27, 'File too large')", filename, "exec")
    try:
      exec(code, {})
    except OSError:
      info = sys.exc_info()
    return logging.LogRecord(
      "asyncio",
      logging.ERROR,
      asyncio.base_events.__file__,
      1,
      "Task exception was never retrieved",
      None,
      info,
    )

  orbax_file = os.path.join("site-packages", "orbax", "checkpoint", "serialization.py")
  held = len(cli_storage.HELD)
  assert not cli._FILTER.filter(failed_task_record(orbax_file))
  assert cli._FILTER.filter(failed_task_record(os.path.join("site-packages", "mylib", "x.py")))
  assert len(cli_storage.HELD) == held + 1

  shown = []
  saved, cli._SHOW_WARNING = cli._SHOW_WARNING, lambda *a: shown.append(str(a[0]))
  try:
    full = "Error writing persistent compilation cache entry: [Errno 27] File too large"
    cli._show_warning(UserWarning(full), UserWarning, "compiler.py", 1)
    other = "Error writing persistent compilation cache entry: permission denied"
    cli._show_warning(UserWarning(other), UserWarning, "compiler.py", 1)
  finally:
    cli._SHOW_WARNING = saved
  assert shown == [other] and cli_storage.HELD[-1].endswith(full)
