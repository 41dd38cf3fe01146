"""Runs many command lines of one launcher in one process (tests/test_reliability.py).

  python tests/cli_harness.py launch/sample.py < cases.json > results.json

cases.json is a list of argument lists (without the program name). Each is run with
`setdiff_jax.cli.call` (the launcher's flags are parsed afresh every time) while file descriptors
1 and 2 go to temporary files, so everything a case prints, from Python or from C++, is captured.
Prints a JSON list of {"rc", "stdout", "stderr"}. One process per launcher: absl flags are global,
so two launchers cannot be imported together.
"""

import importlib.util
import json
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _captured(fn):
  files = [tempfile.TemporaryFile(mode="w+b") for _ in range(2)]
  saved = [os.dup(1), os.dup(2)]
  sys.stdout.flush()
  sys.stderr.flush()
  os.dup2(files[0].fileno(), 1)
  os.dup2(files[1].fileno(), 2)
  try:
    rc = fn()
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
    for fd in saved:
      os.close(fd)
  out = []
  for f in files:
    f.seek(0)
    out.append(f.read().decode("utf-8", "replace"))
    f.close()
  return rc, out[0], out[1]


def main():
  path = os.path.join(REPO, sys.argv[1])
  spec = importlib.util.spec_from_file_location("launcher", path)
  launcher = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(launcher)
  from absl import logging

  from setdiff_jax import cli

  logging.use_absl_handler()
  cases = json.load(sys.stdin)
  results = []
  for args in cases:
    logging.get_absl_handler().python_handler.stream = sys.stderr
    rc, out, err = _captured(lambda: cli.call(launcher.main, [path] + list(args)))
    results.append({"rc": rc, "stdout": out, "stderr": err})
  sys.stdout.write(json.dumps(results))


if __name__ == "__main__":
  main()
