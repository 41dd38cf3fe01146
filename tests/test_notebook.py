"""notebooks/colab_tpu.ipynb runs top to bottom on CPU (train 5 steps, sample, infill, export).

The notebook is executed by nbclient in a fresh `python3` kernel with SETDIFF_NOTEBOOK_STEPS=5 and
a temporary workdir; the kernel sees one CPU device (a CPU Colab runtime), not the 8 emulated
devices of the rest of the suite. Skipped when nbclient / nbformat / ipykernel are not installed
(`pip install -e ".[test]"` installs them).
"""

import json
import os
import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = pathlib.Path(__file__).resolve().parents[1] / "notebooks" / "colab_tpu.ipynb"


def _execute():
  """The notebook executed top to bottom in a fresh kernel (the environment set by the caller)."""
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = nbclient.NotebookClient(
    nb, kernel_name="python3", timeout=600, resources={"metadata": {"path": str(NOTEBOOK.parent)}}
  )
  try:
    client.execute()
  except nbclient.exceptions.CellExecutionError as e:
    pytest.fail(f"notebook cell failed:\n{e}")
  return nb


def _printed(nb) -> str:
  return "\n".join(
    out.get("text", "")
    for cell in nb.cells
    if cell.cell_type == "code"
    for out in cell.outputs
    if out.get("output_type") == "stream"
  )


def test_notebook_is_committed_without_outputs():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  for i, cell in enumerate(nb.cells):
    if cell.cell_type == "code":
      assert not cell.outputs and cell.execution_count is None, f"cell {i} has outputs"


@pytest.mark.slow
def test_notebook_runs_on_cpu(tmp_path, monkeypatch):
  workdir = tmp_path / "run"
  flags = " ".join(
    f
    for f in os.environ.get("XLA_FLAGS", "").split()
    if not f.startswith("--xla_force_host_platform_device_count")
  )
  # The kernel inherits this environment.
  monkeypatch.setenv("XLA_FLAGS", flags)
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv("SETDIFF_NOTEBOOK_STEPS", "5")
  monkeypatch.setenv("SETDIFF_NOTEBOOK_WORKDIR", str(workdir))
  monkeypatch.delenv("SETDIFF_REPO_URL", raising=False)

  nb = _execute()
  text = _printed(nb)
  assert "backend: cpu; 1 device(s)" in text
  assert "setdiff_jax is already installed" in text  # the install cell did not pip install
  assert "finished step 5" in text
  assert "=== sample 1 ===" in text and "=== sample 2 ===" in text and "tokens/s:" in text
  assert "when she read the letter." in text  # the infill kept the text around the gap
  assert "model.safetensors" in text and "config.json" in text

  # The run's files: 5 steps, a checkpoint, an eval, and the export.
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert max(r["step"] for r in rows) == 5 and any("eval/nll" in r for r in rows)
  assert (workdir / "checkpoints" / "5").is_dir()
  export = workdir.parent / f"{workdir.name}_export"  # outside the run directory
  for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json"):
    assert (export / name).is_file(), name

  # Run again on the same workdir (a user re-running every cell): the training cell finds the
  # run complete, and the export cell replaces the notebook's own export (it stopped with
  # "is not empty" before).
  (export / "model.safetensors").unlink()
  text = _printed(_execute())
  assert "finished step 5" in text and "model.safetensors" in text
  again = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert again == rows  # no step trained again
  assert (export / "model.safetensors").is_file()
